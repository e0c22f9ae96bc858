#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package registry (the study's lent H100/H200 sessions): what
# restartbench needs beyond that machine's image (which has torch, numpy, pandas, jinja2, rich, pytest...),
# at the versions this checkout's .venv has, for that machine's Python (3.12 by default), into .whl/.
#   scripts/device-wheels.sh [DIR]        then, there: python3 -m pip install --no-index --no-deps --target
#                                         /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site   (bench/gpu-session.sh)
# Also fetches Debian's libaio .debs (DeepSpeed's async_io op for fastpersist), unpacked there with dpkg -x, and
# builds a static fio (scripts/build-fio.sh), which bench/gpu-session.sh puts on the PATH there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/.whl}"
PYVER="${DEVICE_PYTHON:-3.12}"
PY="${RESTARTBENCH_VENV:-$ROOT/.venv}/bin/python"
# What the image lacks (or has at a version nobody has seen), closed under each package's own Requires-Dist:
# tests/test_device_wheels.py checks every requirement of these (and of restartbench) against the three lists.
PURE=(deepspeed hjson einops py-cpuinfo tqdm pydantic annotated-types typing-inspection typing-extensions
      torchsnapshot aiofiles nest-asyncio importlib-metadata zipp lazy-importer)
BINARY=(pydantic-core psutil msgpack pyyaml orjson)
# On the image (FACTS: python 3.12, torch 2.11.0+cu130, ...; packaging comes with its pytest). typing-extensions is
# there too, for torch, at a version not known: pydantic needs >= 4.16, so it is shipped (PURE) and shadows it.
IMAGE=(torch numpy pandas jinja2 rich pytest packaging ninja)
# Declared but never imported where the study runs: aiohttp (torchsnapshot 0.1.0 names it; no module of it imports
# it), matplotlib and pyarrow (restartbench's analysis, run where the results come back).
NOT_IMPORTED=(aiohttp matplotlib pyarrow)
mkdir -p "$OUT"

pinned() {  # NAME==VERSION as installed in the venv, for each NAME
    "$PY" -c 'import sys; from importlib.metadata import version; print(*(f"{n}=={version(n)}" for n in sys.argv[1:]))' "$@"
}

# DeepSpeed is published as a source distribution: build its wheel here without ops (they JIT-build there).
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$(pinned deepspeed)"
# One pip call for each kind (a call per package took about a minute each on a loaded machine).
# shellcheck disable=SC2046  # the pins are words by design
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" $(pinned "${PURE[@]:1}")
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" $(pinned "${BINARY[@]}")
if command -v apt-get >/dev/null; then
    (cd "$OUT" && apt-get download -q libaio-dev 'libaio1t64' >/dev/null 2>&1 || apt-get download -q libaio-dev libaio1 >/dev/null 2>&1) \
        || echo "[device-wheels] note: libaio .debs not fetched: fastpersist will not build there" >&2
fi
# fio, which the image lacks: without it the probe's disk limits are dd's lower bounds (queue depth 1).
"$ROOT/scripts/build-fio.sh" "$OUT" || echo "[device-wheels] note: no fio built: the probe will measure with dd" >&2
du -sh "$OUT" >&2
echo "[device-wheels] from the image: ${IMAGE[*]}; declared but never imported, not shipped: ${NOT_IMPORTED[*]}" >&2
ls "$OUT"

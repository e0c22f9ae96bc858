#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package registry (the study's lent H100/H200 sessions): what
# restartbench needs beyond that machine's image (which has torch, numpy, pandas, jinja2, rich, pytest...),
# at the versions this checkout's .venv has, for that machine's Python (3.12 by default), into .whl/.
#   scripts/device-wheels.sh [DIR]        then, there: python3 -m pip install --no-index --no-deps --target
#                                         /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site   (bench/gpu-session.sh)
# Also fetches Debian's libaio .debs (DeepSpeed's async_io op for fastpersist), unpacked there with dpkg -x.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/.whl}"
PYVER="${DEVICE_PYTHON:-3.12}"
PY="${RESTARTBENCH_VENV:-$ROOT/.venv}/bin/python"
PURE=(deepspeed hjson pydantic annotated-types typing-inspection torchsnapshot nest-asyncio importlib-metadata zipp)
BINARY=(pydantic-core)
mkdir -p "$OUT"

pinned() {  # NAME==VERSION as installed in the venv
    echo "$1==$("$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}')"
}

# DeepSpeed is published as a source distribution: build its wheel here without ops (they JIT-build there).
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$(pinned deepspeed)"
for name in "${PURE[@]:1}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" "$(pinned "$name")"
done
for name in "${BINARY[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$OUT" "$(pinned "$name")"
done
if command -v apt-get >/dev/null; then
    (cd "$OUT" && apt-get download -q libaio-dev 'libaio1t64' >/dev/null 2>&1 || apt-get download -q libaio-dev libaio1 >/dev/null 2>&1) \
        || echo "[device-wheels] note: libaio .debs not fetched: fastpersist will not build there" >&2
fi
du -sh "$OUT" >&2
ls "$OUT"

#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install everything it needs.
# Usage: scripts/setup-env.sh [--test]     (--test adds the test dependencies)
# The order matters: torch first (pinned CPU build), then DeepSpeed from its sdist without
# compiling ops and without build isolation (which would download a second, CUDA, torch).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RESTARTBENCH_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
EXTRA=""
[[ "${1:-}" == "--test" ]] && EXTRA="[test]"

# libaio (system package): DeepSpeed's async_io op, which the fastpersist and decoupled engines
# JIT-build on first use, links against it. Checked on every call since it lives outside the venv.
if [[ ! -e /usr/include/libaio.h ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "[setup] installing libaio-dev (for DeepSpeed's async_io op: engines fastpersist, decoupled)" >&2
        apt-get install -y -q libaio-dev >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libaio-dev >/dev/null; } \
            || echo "[setup] note: apt-get could not install libaio-dev; engines fastpersist and decoupled will not run" >&2
    else
        echo "[setup] note: libaio-dev is missing and cannot be installed here (needs root and apt-get);" \
             "engines fastpersist and decoupled need it: ask for 'apt-get install libaio-dev' (or libaio-devel)" >&2
    fi
fi

# fio (system package): measures the checkpoint folder's raw bandwidth before each run (baseline.json,
# --baseline-mib). Optional: without it runs go on and the analysis says "no baseline measured".
if ! command -v fio >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "[setup] installing fio (for the storage baseline of each run)" >&2
        apt-get install -y -q fio >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q fio >/dev/null; } \
            || echo "[setup] note: apt-get could not install fio; runs will have no storage baseline" >&2
    else
        echo "[setup] note: fio is missing and cannot be installed here (needs root and apt-get); runs will have no storage baseline: ask for 'apt-get install fio'" >&2
    fi
fi

STAMP="$VENV/.restartbench-installed$EXTRA"
if [[ -f "$STAMP" && "$STAMP" -nt "$ROOT/pyproject.toml" && "$STAMP" -nt "$ROOT/constraints.txt" ]]; then
    exit 0
fi
echo "[setup] preparing $VENV (first run only: a minute or two)" >&2
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -c "$ROOT/constraints.txt" torch setuptools wheel ninja packaging numpy psutil py-cpuinfo pydantic hjson msgpack tqdm einops
DS_BUILD_OPS=0 "${PIP[@]}" install -c "$ROOT/constraints.txt" --no-build-isolation deepspeed
"${PIP[@]}" install -c "$ROOT/constraints.txt" -e "$ROOT$EXTRA"
touch "$STAMP"
echo "[setup] done" >&2

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

# System packages, checked on every call since they live outside the venv; installed with apt-get
# when running as root, else a note says what to ask for.
apt_install() {  # apt_install PACKAGE WHAT-IT-IS-FOR
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "[setup] installing $1 ($2)" >&2
        apt-get install -y -q "$1" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$1" >/dev/null; } \
            || echo "[setup] note: apt-get could not install $1 ($2)" >&2
    else
        echo "[setup] note: $1 is missing and cannot be installed here (needs root and apt-get): $2" >&2
    fi
}
# libaio: DeepSpeed's async_io op, which the fastpersist and decoupled engines JIT-build on first use.
[[ -e /usr/include/libaio.h ]] || apt_install libaio-dev "DeepSpeed's async_io op: engines fastpersist, decoupled"
# fio: the checkpoint folder's raw bandwidth before each run (baseline.json; optional).
command -v fio >/dev/null || apt_install fio "the storage baseline of each run; without it runs have none"

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

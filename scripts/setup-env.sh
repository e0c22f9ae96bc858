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

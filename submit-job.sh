#!/usr/bin/env bash
# Entry point of the restart study.
#   ./submit-job.sh                      the embedded default: tiny model, tp2pp2 on 4 CPU ranks
#   ./submit-job.sh 13B tp2pp4 [options] any preset and layout; options go to config-n-run.py (--help)
#   ./submit-job.sh --sweep FILE         a sweep (sweeps/*.yaml), resumable: rerun to finish what is missing
#   ./submit-job.sh --restore RUN_DIR [--repeat N] [--tag TAG]   restart a run again from its kept checkpoints
# Sets up the Python environment on first use (scripts/setup-env.sh), then hands over to Python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${RESTARTBENCH_VENV:-$ROOT/.venv}/bin/python"
"$ROOT/scripts/setup-env.sh"
if [[ "${1:-}" == "--sweep" ]]; then
    shift
    exec "$PYTHON" -m restartbench.sweep "$@"
fi
if [[ "${1:-}" == "--restore" ]]; then
    shift
    exec "$PYTHON" -m restartbench.relaunch "$@"
fi
if [[ $# -eq 0 || "$1" == -* ]]; then
    set -- "${PRESET:-tiny}" "${LAYOUT:-tp2pp2}" "$@"
fi
exec "$PYTHON" "$ROOT/config-n-run.py" "$@"

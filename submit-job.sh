#!/usr/bin/env bash
# Entry point of the restart study.
#   ./submit-job.sh                      the embedded default: tiny model, tp2pp2 on 4 CPU ranks
#   ./submit-job.sh 13B tp2pp4 [options] any preset and layout; options go to config-n-run.py (--help)
# Sets up the Python environment on first use (scripts/setup-env.sh), then hands over to config-n-run.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PRESET="${1:-${PRESET:-tiny}}"
LAYOUT="${2:-${LAYOUT:-tp2pp2}}"
shift $(( $# < 2 ? $# : 2 ))
"$ROOT/scripts/setup-env.sh"
exec "${RESTARTBENCH_VENV:-$ROOT/.venv}/bin/python" "$ROOT/config-n-run.py" "$PRESET" "$LAYOUT" "$@"

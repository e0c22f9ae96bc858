#!/usr/bin/env bash
# Install everything the tests need (into .venv, from scratch on a fresh machine) and run the suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not multirank".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup-env.sh" --test
cd "$ROOT"
exec "${RESTARTBENCH_VENV:-$ROOT/.venv}/bin/python" -m pytest -ra "$@"

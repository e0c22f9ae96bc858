#!/usr/bin/env bash
# The study's GPU work on a lent GPU machine, planned to the seconds left: bench/gpu_session.py does it (its
# docstring says how); this wrapper only puts the wheels' site and the checkout on the import path and runs it with
# the machine's python3. Make the wheels here first (scripts/device-wheels.sh), read status()'s budget_left_s = B,
# then make one call (the machine's start-up, 30 s on the first H100 visit, comes out of B; one command runs at
# most 600 s):
#   run(command="bash bench/gpu-session.sh --budget S --out $OUT", carry=[".whl"], timeout_s=S + 30)
#       with S = min(B - 60, 560); with over 200 s left after it, a second call at once (the machine goes back
#       after 30 s idle), --only the blocks the first did not reach and S = what is left - 30
# and, back here: python bench/gpu_session.py --import-results FILES_AT (the reply's files_at); commit the
# bench/results files it writes. The next visit skips the blocks bench/results holds and does the rest.
# Its first block, setup, installs .whl/*.whl into /tmp/site (--no-index) and unpacks .whl/*.deb, if any.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec python3 bench/gpu_session.py "$@"

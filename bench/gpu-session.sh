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
# This wrapper installs .whl/*.whl into /tmp/site (--no-index) before python starts: bench/gpu_session.py's own
# imports need some of them (restartbench's events need orjson, which the image lacks; the 2026-11-27 visit's first
# call stopped there), and puts .whl/fio (scripts/build-fio.sh) on the PATH. Its first block, setup, then unpacks
# .whl/*.deb, if any, and records the versions.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${RESTARTBENCH_WHEELS:-$PWD/.whl}"
SITE="${RESTARTBENCH_SITE:-/tmp/site}"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [[ " $* " != *" --import-results "* && ${#wheels[@]} -gt 0 ]]; then
    start=$SECONDS
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}"
    echo "[gpu-session.sh] ${#wheels[@]} wheels from $WHEELS installed into $SITE in $((SECONDS - start)) s" >&2
fi
if [[ -f "$WHEELS/fio" ]]; then  # scripts/build-fio.sh's static fio, for bench/limits.py: the image has none
    install -D -m 755 "$WHEELS/fio" "$SITE/bin/fio"
    export PATH="$SITE/bin:$PATH"
fi
exec "$PYTHON" bench/gpu_session.py "$@"

#!/usr/bin/env bash
# What the CPU machines cannot measure, in calls on a lent GPU machine (no package registry there): make the
# wheels here first (scripts/device-wheels.sh), then one call per step, each within the tool's 10 minutes:
#   run(command="bash bench/gpu-session.sh smoke", carry=[".whl"])     small tp1pp1 on cuda/NCCL, torch and lazy
#   run(command="bash bench/gpu-session.sh tests", carry=[".whl"])     tests/test_gpu.py: every engine on CUDA
#   run(command="bash bench/gpu-session.sh engines lazy", carry=[".whl"])
#                                   bench/engines.py on 3B tp1pp1 bf16, the engines named: about 5 minutes each, so
#                                   one or two per call. 3B fits 80 GB with activation checkpointing (69 GiB estimated,
#                                   79 GiB without) and keeps one 47 GiB checkpoint (the disk is 64 GiB); PRESET=small
#                                   to try the steps quickly first.
# Logs and results land in $OUT (they come back); copy the results into bench/results/ with the date and machine.
set -euo pipefail
OUT="${OUT:-/tmp/gpu-session}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
for deb in .whl/*.deb; do dpkg -x "$deb" /; done
ldconfig
nvidia-smi -L | tee "$OUT/machine.txt"
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)" | tee -a "$OUT/machine.txt"

case "${1:-smoke}" in
    smoke)
        for engine in torch lazy; do
            python3 config-n-run.py small tp1pp1 --device cuda --engine "$engine" --baseline-mib 256 \
                --logs /tmp/gpu-logs 2>&1 | tee -a "$OUT/smoke.log"
        done
        python3 analysis/summarize.py /tmp/gpu-logs --no-plots 2>&1 | tee "$OUT/smoke-summary.txt"
        cp /tmp/gpu-logs/summary/study.csv "$OUT/smoke-study.csv"
        ;;
    tests)
        python3 -m pytest -q -ra -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/tests.log"
        ;;
    engines)
        python3 bench/engines.py --preset "${PRESET:-3B}" --layout tp1pp1 --dtype bf16 --engines "${2:-lazy}" \
            --iters 2 --save-interval 2 --logs /tmp/gpu-bench --out "$OUT" \
            --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | tr ' ' '-')" \
            --timeout 540 -- --activation-checkpoint-interval 1 2>&1 | tee "$OUT/engines.log"
        ;;
    *)
        echo "usage: bench/gpu-session.sh smoke|tests|engines" >&2
        exit 2
        ;;
esac

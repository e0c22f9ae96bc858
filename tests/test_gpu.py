"""On a CUDA GPU: the study end to end over NCCL with each engine's GPU side (device-to-host copies, pinned
buffers, CUDA streams), restored exactly. Skipped without a GPU; run on a lent GPU machine with
``bench/gpu-session.sh tests``."""

import json

import pytest
import torch
from conftest import run_study

from restartbench.events import read_events

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("engine", ["torch", "lazy", "dcp", "dcp-async", "torchsnapshot", "fastpersist"])
def test_engine_restores_exactly_on_cuda(tmp_path, engine):
    proc, run = run_study(tmp_path / "logs", "small", "tp1pp1", "--device", "cuda", "--dtype", "bf16",
                          "--iters", "4", "--save-interval", "2", "--engine", engine, "--baseline-mib", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["device"], plan["backend"]) == ("cuda", "nccl")
    assert json.loads((run / "metadata.json").read_text())["status"] == "complete"
    results = [e for e in read_events(run) if e["event"] == "restore.result"]
    assert results and all(e["exact"] for e in results)

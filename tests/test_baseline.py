"""The storage baseline of a run is measured at its checkpoint's concurrency (issue 18: limits that bound)."""

import json
import shutil

import pytest

from restartbench import baseline
from restartbench.baseline import MiB, concurrency, record_for_run
from restartbench.rundir import RunPlan

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


def plan(tmp_path, *, world_size: int, nproc_per_node: int, checkpoint_bytes: int) -> RunPlan:
    return RunPlan(preset={"name": "tiny"}, layout={"tp": 1, "pp": 1, "dp": world_size},
                   layout_name=f"tp1pp1dp{world_size}", world_size=world_size, nnodes=world_size // nproc_per_node,
                   nproc_per_node=nproc_per_node, device="cpu", backend="gloo", grad_accum=1, run_dir=str(tmp_path),
                   checkpoint_dir=str(tmp_path / "ckpt"), master_port=29500,
                   checkpoint_bytes_estimate=checkpoint_bytes, memory_per_rank_estimate="1 GiB", launcher="local")


def test_one_job_per_rank_of_a_node_each_a_ranks_share(tmp_path):
    """16 ranks on 2 nodes, 80 GiB: 8 jobs at once, each 5 GiB = 5120 MiB, capped at --baseline-mib."""
    big = plan(tmp_path, world_size=16, nproc_per_node=8, checkpoint_bytes=80 * 2**30)
    assert concurrency(big, 64) == (8, 64)
    assert concurrency(big, 10_000) == (8, 5120)
    # 4.2 MiB on 2 ranks: 2.1 MiB each, rounded up to 3 so the file is at least a rank's share; never below 1 MiB
    assert concurrency(plan(tmp_path, world_size=2, nproc_per_node=2, checkpoint_bytes=int(4.2 * MiB)), 64) == (2, 3)
    assert concurrency(plan(tmp_path, world_size=4, nproc_per_node=4, checkpoint_bytes=1000), 64) == (4, 1)


def test_record_for_run_measures_with_the_plans_concurrency(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(baseline, "record_baseline", lambda *args, **kwargs: calls.append((args, kwargs)))
    run = plan(tmp_path, world_size=4, nproc_per_node=2, checkpoint_bytes=40 * MiB)
    record_for_run(tmp_path, run, 64)
    (run_dir, target, size_mib), kwargs = calls[0]
    assert (run_dir, str(target), size_mib, kwargs["jobs"]) == (tmp_path, run.checkpoint_dir, 10, 2)
    assert kwargs["sizing"] == baseline.SIZING


@needs_fio
def test_baseline_json_says_how_it_was_sized(tmp_path):
    run = plan(tmp_path, world_size=2, nproc_per_node=2, checkpoint_bytes=6 * MiB)
    data = json.loads(record_for_run(tmp_path, run, 64).read_text())
    assert data["jobs"] == 2 and data["size_bytes"] == 3 * MiB and data["sizing"] == baseline.SIZING
    assert data["write_MBps"] > 0 and data["read_MBps"] > 0

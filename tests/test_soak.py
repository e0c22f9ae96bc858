"""Repeated checkpoints and relaunches leak nothing: file handles, memory, threads, processes (measured)."""

import json

import psutil
import pytest
from conftest import run_study

from restartbench.events import read_events

pytestmark = pytest.mark.multirank


def test_twenty_checkpoints_leak_no_handles_threads_or_memory(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", "--dtype", "fp32", "--iters", "40",
                              "--save-interval", "2", "--baseline-mib", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    samples = [e for e in read_events(run_dir) if e["event"] == "rank.resources"]
    for rank in (0, 1):
        mine = [e for e in samples if e["rank"] == rank]
        assert len(mine) == 20
        steady = mine[2:]  # the first checkpoints warm up allocator pools and caches
        assert max(e["open_fds"] for e in steady) == min(e["open_fds"] for e in steady), "file handles grow"
        assert max(e["threads"] for e in steady) == min(e["threads"] for e in steady), "threads grow"
        assert max(e["children"] for e in mine) == 0
        growth = steady[-1]["rss_bytes"] - steady[0]["rss_bytes"]
        assert growth < 32 * 2**20, f"rank {rank} memory grew {growth / 2**20:.1f} MiB over {len(steady)} checkpoints"
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "complete"
    leftovers = [p for p in psutil.process_iter(["pid", "cmdline"])
                 if p.pid not in before and str(run_dir) in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(leftovers, timeout=15)  # a launcher still tearing down is not a leak
    assert not alive, [p.info["cmdline"] for p in alive]

"""The lazy engine's early read on a relaunch (--lazy-prefetch, restartbench/engines/lazy/prefetch.py): the files are
read before the load, the load takes them from the host buffer, and the records say so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, run_study
from test_engine_lazy import BASE, fake_engine, options, restore_result, train_step

from restartbench import pagecache, results
from restartbench.analysis import collect
from restartbench.engines import prefetcher
from restartbench.engines.base import RankPlace
from restartbench.engines.lazy.engine import LazyEngine
from restartbench.events import read_events
from restartbench.harness import process_read_bytes
from restartbench.verify import training_state_digest

HERE = RankPlace(pp=0, tp=0, dp=0, dp_size=1, device="cpu")


def saved(tmp_path, direct: bool = False):
    """A fake engine's state trained 2 steps and saved as step2 (12 MB of files), evicted from the page cache."""
    source = fake_engine(hidden=2**16)
    train_step(source, 1)
    train_step(source, 2)
    saver = LazyEngine(options(lazy_direct_io=direct))
    saver.save(source, str(tmp_path), "step2")
    saver.wait_until_durable()
    pagecache.evict(sorted((tmp_path / "step2").iterdir()))
    return source


@pytest.mark.parametrize("direct", [False, True])
def test_the_load_takes_the_prefetched_bytes_and_restores_exactly(tmp_path, direct):
    """The prefetch reads the files before the engine exists; the load then reads only the headers (the kernel's
    count of the process's reads during it is a few kB, not the 12 MB of data) and the state is exact."""
    source = saved(tmp_path, direct)
    opts = options(lazy_direct_io=direct, lazy_prefetch=True)
    early = prefetcher("lazy")
    assert early.enabled(opts) and not early.enabled(options())
    started = early.start(opts, str(tmp_path), "step2", HERE)
    assert started.fields() == {"files": ["optim_pp00_tp00_dp000.lazy", "model_pp00_tp00.lazy"], "direct_io": direct,
                                "pinned": False}
    started.wait()
    fresh, loader = fake_engine(seed=1, hidden=2**16), LazyEngine(opts)
    assert loader.prepare(fresh, started)["host_buffer_by_prefetch"] is True
    before = process_read_bytes()
    loader.load(fresh, str(tmp_path), "step2")
    during = process_read_bytes() - before
    assert training_state_digest(fresh) == training_state_digest(source)
    fields = loader.load_fields()
    data = sum(record.bytes for record in loader.read())
    assert fields["prefetched"] is True and fields["prefetch_bytes"] == data > 10e6
    assert fields["prefetch_read_s"] > 0 and fields["prefetch_started"] <= fields["prefetch_ended"]
    assert during < data / 100, (during, data)
    train_step(fresh, 3)  # and it trains on, saving again from the buffer the prefetch set up
    loader.save(fresh, str(tmp_path), "step3")
    loader.wait_until_durable()


def test_a_prefetch_of_another_checkpoint_is_not_used_and_says_why(tmp_path):
    source = saved(tmp_path)
    opts = options(lazy_prefetch=True)
    saver = LazyEngine(opts)
    saver.save(source, str(tmp_path), "step9")  # the same files under another tag
    saver.wait_until_durable()
    fresh, loader = fake_engine(seed=1, hidden=2**16), LazyEngine(opts)
    loader.prepare(fresh, prefetcher("lazy").start(opts, str(tmp_path), "step9", HERE))
    loader.load(fresh, str(tmp_path), "step2")
    fields = loader.load_fields()
    assert fields["prefetched"] is False
    assert "step9" in fields["prefetch_unused"] and "step2" in fields["prefetch_unused"]
    assert training_state_digest(fresh) == training_state_digest(source)


def test_a_failed_prefetch_is_recorded_and_the_load_reads_as_without_it(tmp_path):
    source = saved(tmp_path)
    opts = options(lazy_prefetch=True)
    fresh, loader = fake_engine(seed=1, hidden=2**16), LazyEngine(opts)
    loader.prepare(fresh, prefetcher("lazy").start(opts, str(tmp_path), "step7", HERE))  # no such checkpoint
    loader.load(fresh, str(tmp_path), "step2")
    fields = loader.load_fields()
    assert fields["prefetched"] is False and fields["prefetch_error"].startswith("FileNotFoundError")
    assert fields["prefetch_unused"] == fields["prefetch_error"]
    assert training_state_digest(fresh) == training_state_digest(source)


def test_a_replica_prefetches_no_module_file_under_dp_read_once():
    place = RankPlace(pp=1, tp=1, dp=2, dp_size=3, device="cpu")
    opts = options(lazy_prefetch=True, dp_read_once=True)
    started = prefetcher("lazy").start(opts, "/nonexistent", "step1", place)
    started.wait()
    assert started.names == ["optim_pp01_tp01_dp002.lazy"]
    assert prefetcher("torch") is None


@pytest.mark.multirank
def test_a_relaunch_reads_the_checkpoint_before_the_model_is_built_and_restores_exactly(tmp_path):
    """tiny tp2pp1dp2 with --dp-read-once: each rank's prefetch names the files its place in the grid reads (the
    tensor slice and the data-parallel rank from DeepSpeed's own topology, before the model exists); it starts after
    the checkpoint is chosen and evicted and before the model build, the load takes it on every rank, and the
    analysis takes the read's throughput from the prefetch's own time."""
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp2pp1dp2", *BASE[1:], "--dp-read-once", "--lazy-prefetch")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert restore_result(run_dir)["exact"] is True
    events = [e for e in read_events(run_dir) if e["phase"] == "restore"]
    of = {(e["event"], e["rank"]): e for e in events}
    assert not [e for e in read_events(run_dir) if e["phase"] == "train" and e["event"] == "restore.prefetch"]
    for rank in range(4):
        started, load = of["restore.prefetch", rank], of["restore.load", rank]
        assert of["restore.cache", rank]["cache"] == "cold"
        assert of["restore.cache", rank]["start"] < started["start"] < of["startup.model_build", rank]["start"]
        assert load["prefetched"] is True and load["bytes"] == load["prefetch_bytes"] > 0
        assert load["process_read_bytes"] < load["bytes"] / 10
    files = {rank: of["restore.prefetch", rank]["files"] for rank in range(4)}
    assert files == {0: ["optim_pp00_tp00_dp000.lazy", "model_pp00_tp00.lazy"],
                     1: ["optim_pp00_tp01_dp000.lazy", "model_pp00_tp01.lazy"],
                     2: ["optim_pp00_tp00_dp001.lazy"], 3: ["optim_pp00_tp01_dp001.lazy"]}
    info = results.restart(read_events(run_dir))
    assert info["prefetched"] is True and info["prefetch_read_s"] > 0
    row = collect(tmp_path / "logs").table().query("kind == 'restart'").iloc[0]
    assert row["read_MBps"] == pytest.approx(info["bytes_read"] / 1e6 / info["prefetch_read_s"])
    assert "read ran from before the model build (prefetch)" in "\n".join(results.summarize_run(run_dir))



@pytest.mark.multirank
def test_the_prefetch_bench_runs_each_mode_and_only_the_prefetch_modes_prefetch(tmp_path):
    """bench/lazy_prefetch.py, tiny and one repeat: a whole study run in each of its four modes, each restore exact
    (the bench refuses one that is not), the prefetch's read time only where it was asked for, the savings from the
    medians."""
    out = tmp_path / "lazy-prefetch.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/lazy_prefetch.py"), "--preset", "tiny", "--repeats", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    medians = result["medians"]
    assert [mode for mode in medians if medians[mode]["prefetch_read_s"] is not None] == ["buffered + prefetch",
                                                                                          "O_DIRECT + prefetch"]
    assert all(medians[mode]["prefetch_read_s"] > 0 for mode in ("buffered + prefetch", "O_DIRECT + prefetch"))
    assert result["savings"]["O_DIRECT"]["saving_s"] == pytest.approx(
        medians["O_DIRECT"]["restart_less_checks_s"] - medians["O_DIRECT + prefetch"]["restart_less_checks_s"])
    assert "the prefetch saved" in done.stdout

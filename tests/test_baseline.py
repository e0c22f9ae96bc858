"""The storage baseline of a run is measured at its checkpoint's concurrency (issue 18), and its limits are the best
of several methods, with their spread (issue 26: limits that are limits); bench/limits.py runs the fuller set."""

import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from restartbench import baseline
from restartbench.baseline import FULL, QUICK, BaselineError, Method, MiB, concurrency, record_for_run
from restartbench.rundir import RunPlan

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
BENCH = Path(__file__).resolve().parent.parent / "bench"
CAPTURED = json.loads((Path(__file__).parent / "data" / "fio" / "outputs.json").read_text())


def _load_limits():
    sys.path.insert(0, str(BENCH))  # the script imports results_io from its folder
    spec = importlib.util.spec_from_file_location("bench_limits", BENCH / "limits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


limits_bench = _load_limits()


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
    assert (run_dir, str(target), size_mib, kwargs["jobs"]) == (tmp_path, run.checkpoint_dir, 64, 2)  # 10 raised
    record_for_run(tmp_path, plan(tmp_path, world_size=2, nproc_per_node=2, checkpoint_bytes=400 * MiB), 1000)
    assert calls[1][0][2] == 200  # a share above the rule's minimum is measured as it is
    record_for_run(tmp_path, run, 16)
    assert calls[2][0][2] == 16  # below the rule where --baseline-mib asks for less
    assert kwargs["sizing"] == baseline.SIZING


# -- fio's JSON, per method, from real outputs captured on this machine (tests/data/fio/outputs.json) -----------------

@pytest.mark.parametrize("name", sorted(CAPTURED["outputs"]))
def test_fio_json_of_each_method_is_read(name):
    """Each method's report gives the aggregate of its 2 jobs × 4 MiB: all bytes, bw_bytes in MB/s, fio's version;
    the command it came from is the method's own fio arguments."""
    captured = CAPTURED["outputs"][name]
    method = next(m for m in (*FULL, Method("read", direct=True, ioengine="libaio", iodepth=32, block_size="2M"))
                  if m.name == name)
    assert set(method.fio_args()) <= set(captured["command"]), "the capture is no longer what the method runs"
    parsed = baseline.parse_fio(captured["stdout"], method.rw)
    job = json.loads(captured["stdout"])["jobs"][0][method.rw]
    assert parsed == {"MBps": job["bw_bytes"] / 1e6, "io_bytes": 2 * 4 * MiB, "version": "fio-3.33"}
    assert parsed["MBps"] > 0
    other = "read" if method.rw == "write" else "write"
    with pytest.raises(BaselineError, match="moved no data"):
        baseline.parse_fio(captured["stdout"], other)


def test_method_arguments_say_what_the_name_says():
    queued = Method("read", direct=True, ioengine="libaio", iodepth=32, block_size="8M")
    assert queued.name == "read-direct-libaio-qd32-8M" and queued.family == baseline.READ_DIRECT
    assert queued.fio_args() == ["--ioengine=libaio", "--direct=1", "--iodepth=32"] and queued.block_bytes == 8 * MiB
    assert Method("write").fio_args() == ["--ioengine=psync", "--direct=0", "--end_fsync=1"]
    cached = Method("write", fsync=False)
    assert "--end_fsync=1" not in cached.fio_args() and not cached.is_limit and cached.name.endswith("-nofsync")
    assert Method("read", evict_first=True).family == baseline.READ_BUFFERED
    assert {m.rw for m in QUICK} == {m.rw for m in FULL} == {"read", "write"}
    assert all(m.block_size == "1M" for m in QUICK), "a run's tiny files must fit every quick method's block"
    assert len({m.name for m in FULL}) == len(FULL)


# -- the choice of the limit and the spread -------------------------------------------------------------------------

def test_spread_is_min_median_max():
    assert baseline.spread([300.0, 100.0, 200.0]) == {"n": 3, "min_MBps": 100.0, "median_MBps": 200.0,
                                                      "max_MBps": 300.0}
    assert baseline.spread([100.0, 400.0])["median_MBps"] == 250.0
    assert baseline.spread([]) == {"n": 0, "min_MBps": None, "median_MBps": None, "max_MBps": None}


def figures(**medians):
    """baseline.summarize() of scripted passes: name -> list of MB/s (None: an error)."""
    methods = {m.name: m for m in (*FULL, Method("write", fsync=False))}
    chosen = [methods[name.replace("_", "-")] for name in medians]
    passes = {m.name: [{"MBps": v} if v is not None else {"error": "fio said no"} for v in values]
              for m, values in zip(chosen, medians.values())}
    return baseline.summarize(chosen, passes, {})


def test_the_limit_is_the_method_with_the_highest_median():
    table = figures(**{"read-direct-psync-1M": [900, 1000, 1100], "read-direct-libaio-qd16-1M": [800, 1500, 1600],
                       "read-buffered-evicted-psync-1M": [2000, 700, 600], "write-buffered-psync-1M": [400, 500, 600]})
    assert baseline.best(table, "read")["name"] == "read-direct-libaio-qd16-1M"  # median 1500, not the single 2000
    assert baseline.best(table, "write")["name"] == "write-buffered-psync-1M"


def test_a_write_without_fsync_is_never_the_limit_and_ties_keep_the_first():
    table = figures(**{"write-buffered-psync-1M-nofsync": [5000, 6000], "write-buffered-psync-1M": [500, 500],
                       "write-direct-libaio-qd16-1M": [500, 500]})
    assert baseline.best(table, "write")["name"] == "write-buffered-psync-1M"


def test_no_method_measured_names_every_reason():
    table = figures(**{"read-direct-psync-1M": [None], "read-direct-libaio-qd16-1M": [None, None]})
    with pytest.raises(BaselineError, match="no read method measured: read-direct-psync-1M: fio said no"):
        baseline.best(table, "read")


def test_measure_runs_every_method_each_repeat_and_reports_the_winners(tmp_path, monkeypatch):
    """Scripted passes (no fio): every method runs each repeat in a rotated order, writes first (each making the
    files anew), a block that does not divide the file is skipped with the reason, an eviction is checked before
    each buffered read, and the baseline.json keys are the winners' medians."""
    rates = {"write-buffered-psync-1M": [300, 320, 340], "write-direct-libaio-qd16-4M": [500, 100, 510],
             "read-direct-psync-1M": [600, 610, 620], "read-buffered-evicted-psync-1M": [900, 950, 1000]}
    order, evicted = [], []

    def scripted(paths, method, size):
        order.append(method.name)
        if method.rw == "write":
            assert not any(p.exists() for p in paths), "a write must make its files anew"
            for path in paths:
                path.write_bytes(b"x" * size)
        return {"MBps": rates[method.name][sum(n == method.name for n in order) - 1], "io_bytes": size * len(paths),
                "version": "fio-test", "load_average": 1.0, "other_io_MB": 0.0}

    monkeypatch.setattr(baseline, "one_pass", scripted)
    methods = [m for m in FULL if m.name in rates] + [Method("read", direct=True, block_size="8M")]
    data = baseline.measure(tmp_path, 4, jobs=2, methods=methods, repeats=3,
                            check_evicted=lambda paths: evicted.append(len(paths)) or 0.0)
    assert order[:4] == ["write-buffered-psync-1M", "write-direct-libaio-qd16-4M", "read-direct-psync-1M",
                         "read-buffered-evicted-psync-1M"]
    assert order[4:6] == ["write-direct-libaio-qd16-4M", "write-buffered-psync-1M"]  # rotated in the next repeat
    assert (data["write_best"], data["write_MBps"]) == ("write-direct-libaio-qd16-4M", 500)
    assert (data["read_best"], data["read_MBps"]) == ("read-buffered-evicted-psync-1M", 950)
    assert data["read_spread_MBps"] == {"n": 3, "min_MBps": 900, "median_MBps": 950, "max_MBps": 1000}
    assert data["read_method"] == baseline.READ_BUFFERED and data["write_method"] == baseline.WRITE_DIRECT
    skipped = next(m for m in data["methods"] if m["name"] == "read-direct-psync-8M")
    assert skipped["n"] == 0 and "8M block does not divide the 4 MiB file" in skipped["skipped"]
    assert evicted == [2, 2, 2] and data["repeats"] == 3 and data["probe_below_rule"]
    assert data["cost_bound"] is None  # not the quick set
    assert list(tmp_path.iterdir()) == []


def test_a_baseline_larger_than_the_free_disk_is_refused_before_writing(tmp_path, monkeypatch):
    """A full disk is said with what to lower, before any file is written."""
    monkeypatch.setattr(baseline.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * MiB, 9 * MiB, MiB))
    with pytest.raises(BaselineError, match=r"1 MiB free, less than the 8 MiB the baseline writes \(2 job\(s\) of "
                                            r"4 MiB\); lower --baseline-mib"):
        baseline.measure(tmp_path, 4, jobs=2, methods=QUICK)
    assert list(tmp_path.iterdir()) == []


def test_no_write_measured_names_each_write_methods_error_and_leaves_no_file(tmp_path, monkeypatch):
    """When every write fails (fio's error each), the reads are not tried and the message names every write's
    reason."""
    tried = []

    def failing(paths, method, size):
        tried.append(method.rw)
        return {"error": f"{method.name} refused", "io_bytes": 0}

    monkeypatch.setattr(baseline, "one_pass", failing)
    with pytest.raises(BaselineError, match="no write method measured 1 file\\(s\\) of 4 MiB: ") as raised:
        baseline.measure(tmp_path, 4, methods=QUICK)
    writes = [m.name for m in QUICK if m.rw == "write"]
    assert all(f"{name}: {name} refused" in str(raised.value) for name in writes)
    assert tried == ["write"] * len(writes)
    assert list(tmp_path.iterdir()) == []


# -- the probe's size ---------------------------------------------------------------------------------------------

def test_probe_size_rule():
    """A rank's share, raised to PROBE_MIN_MIB (smaller files time fio's start and the fsync's latency), capped at
    --baseline-mib."""
    assert baseline.PROBE_MIN_MIB == 64 and "at least 64 MiB" in baseline.PROBE_RULE
    assert baseline.probe_mib(3, 64) == 64
    assert baseline.probe_mib(3, 1000) == 64
    assert baseline.probe_mib(300, 1000) == 300
    assert baseline.probe_mib(300, 64) == 64
    assert baseline.probe_mib(3, 16) == 16  # the cap wins: a run that asks for less gets less, and the figure says so


# -- without fio ----------------------------------------------------------------------------------------------------

def test_bench_limits_without_fio_says_so_in_the_json_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(limits_bench, "run_meta", lambda *args: (_ for _ in ()).throw(OSError("no torch here")))
    out = tmp_path / "limits.json"
    code = limits_bench.main(["--dir", str(tmp_path / "d"), "--jobs", "2", "--mib-per-job", "8", "--repeats", "1",
                              "--json", str(out)])
    assert code == limits_bench.NO_FIO != 0
    data = json.loads(out.read_text())
    assert data["fio"] is None and "fio is not installed" in data["error"]
    assert data["meta"]["runtime_error"] == "OSError: no torch here" and data["meta"]["machine"].startswith("cpu")
    assert "fio is not installed" in capsys.readouterr().err
    assert "Not measured: fio is not installed" in limits_bench.markdown(data)
    assert not (tmp_path / "d").exists()


def test_no_fio_means_no_run_baseline_and_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert record_for_run(tmp_path, plan(tmp_path, world_size=2, nproc_per_node=2, checkpoint_bytes=MiB), 64) is None
    assert "fio is not installed" in capsys.readouterr().out and not (tmp_path / "baseline.json").exists()


# -- real fio, tiny sizes -------------------------------------------------------------------------------------------

@needs_fio
def test_baseline_json_says_how_it_was_sized_and_every_quick_method(tmp_path):
    """A tiny run's baseline (its 3 MiB share raised to the rule's 64 MiB): every QUICK method measured once, the
    limits their best, within the cost bound."""
    run = plan(tmp_path, world_size=2, nproc_per_node=2, checkpoint_bytes=6 * MiB)
    start = time.perf_counter()
    data = json.loads(record_for_run(tmp_path, run, 64).read_text())
    took = time.perf_counter() - start
    assert data["jobs"] == 2 and data["size_bytes"] == 64 * MiB and data["sizing"] == baseline.SIZING
    assert [m["name"] for m in data["methods"]] == [m.name for m in QUICK]
    measured = [m for m in data["methods"] if m["n"] == 1]
    assert measured, data["methods"]
    for side in ("write", "read"):
        medians = {m["name"]: m["median_MBps"] for m in measured if m["rw"] == side}
        assert data[f"{side}_MBps"] == max(medians.values()) > 0 and data[f"{side}_best"] in medians
    assert data["cost_bound"] == baseline.COST_BOUND and not data["probe_below_rule"]
    assert took < len(QUICK) * baseline.PASS_TIMEOUT_S
    print(f"tiny run's baseline (2 jobs x 64 MiB, {len(QUICK)} methods): {took:.2f} s")


@needs_fio
def test_bench_limits_json_on_a_tiny_folder(tmp_path, monkeypatch):
    """The GPU session's call, at tiny sizes: the JSON holds the limits, every FULL method (the 4 and 8 MiB blocks
    skipped on 2 MiB files, with why) and the context; nothing is left in the folder."""
    monkeypatch.setattr(limits_bench, "run_meta", lambda *args: (_ for _ in ()).throw(OSError("skip torch import")))
    out = tmp_path / "limits.json"
    folder = tmp_path / "d"
    assert limits_bench.main(["--dir", str(folder), "--jobs", "2", "--mib-per-job", "2", "--repeats", "1",
                              "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    limits = data["limits"]
    assert [m["name"] for m in limits["methods"]] == [m.name for m in FULL]
    assert limits["write_MBps"] > 0 and limits["read_MBps"] > 0 and data["sweep"] == []
    for side in ("write", "read"):  # what bench/gpu_results.py reads
        assert data[side]["best_MBps"] == limits[f"{side}_MBps"] and data[side]["method"] == limits[f"{side}_best"]
    assert all("does not divide" in m["skipped"] for m in limits["methods"] if m["block_size"] in ("4M", "8M"))
    evicted = next(m for m in limits["methods"] if m["name"] == "read-buffered-evicted-psync-1M")
    assert evicted["passes"][0]["resident_fraction_before"] == 0.0  # mincore: the eviction held on ext4
    assert list(folder.iterdir()) == []
    assert "write limit" in limits_bench.markdown(data)

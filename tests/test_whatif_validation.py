"""bench/whatif_validation.py without running anything: the held-out list cannot overlap the calibration set, every
case is run once, a run's measured parts, the error summary against the target, and the Markdown of a hand-made
result."""

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from restartbench.whatif import validation

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load():
    sys.path.insert(0, str(BENCH))  # the script imports results_io from its folder
    spec = importlib.util.spec_from_file_location("bench_whatif_validation", BENCH / "whatif_validation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_the_held_out_configurations_are_in_no_calibration_run():
    assert bench.overlap() == set()
    calibrated = {c.key for c in bench.CALIBRATION}
    assert all(c.key not in calibrated for c in bench.HELD_OUT)
    # the check itself sees an overlap
    assert bench.overlap(bench.CALIBRATION, (*bench.HELD_OUT, bench.CALIBRATION[0])) == {bench.CALIBRATION[0].key}


def test_the_held_out_set_has_what_the_issue_asks_for():
    real = [c for c in bench.HELD_OUT if c.scale is None]
    calibrated_layouts = {(c.preset, c.layout) for c in bench.CALIBRATION if c.scale is None}
    assert real and all((c.preset, c.layout) not in calibrated_layouts for c in real)
    emulated = {(c.preset, c.engine) for c in bench.HELD_OUT if c.scale is not None}
    assert {"7B", "70B"} <= {p for p, _ in emulated} and {"torch", "lazy", "dcp"} <= {e for _, e in emulated}


def test_every_case_runs_once_in_the_run_order():
    order = bench.run_order()
    assert sorted(map(repr, (c for _, c in order))) == sorted(map(repr, (*bench.CALIBRATION, *bench.HELD_OUT,
                                                                         *bench.HELD_OUT_2NODES)))
    assert {name for name, _ in order} == {"calibration", "held-out", "held-out-2nodes"}


def test_a_case_launches_the_configuration_it_names(tmp_path):
    emulated = bench.Case("70B", "tp8pp8dp1", "lazy", 0.016, 32).argv(tmp_path)
    assert emulated[:3] == ["70B", "tp8pp8dp1", "--engine"] and "--emulate" in emulated
    assert emulated[emulated.index("--ranks-per-process") + 1] == "32"
    assert "--emulate" not in bench.Case("small", "tp1pp2dp2", "torch").argv(tmp_path)


def test_measured_parts_are_medians_and_the_total_leaves_out_verify():
    rows = pd.DataFrame([
        {"kind": "checkpoint", "stall_max_s": 1.0, "durable_rank_max_s": 3.0},
        {"kind": "checkpoint", "stall_max_s": 2.0, "durable_rank_max_s": 5.0},
        {"kind": "restart", "restart_ckpt_load_s": 0.5, "restart_s": 10.0, "path_verify_s": 1.5,
         "restart_launch_s": 0.2}])
    parts = validation.measured_parts(rows)
    assert parts["stall"] == 1.5 and parts["durable"] == 4.0 and parts["restart total"] == 8.5
    assert parts["ckpt load"] == 0.5 and parts["launch"] == 0.2


def test_the_measured_total_leaves_out_every_harness_check_where_the_table_has_them():
    """A table with restart_less_checks_s (less the manifest check, the page-cache eviction and verify, whose time the
    fit's gaps no longer hold): the measured total is its median."""
    rows = pd.DataFrame([
        {"kind": "checkpoint", "stall_max_s": 1.0, "durable_rank_max_s": 3.0},
        {"kind": "restart", "restart_ckpt_load_s": 0.5, "restart_s": 10.0, "path_verify_s": 1.5,
         "restart_less_checks_s": 7.0},
        {"kind": "restart", "restart_ckpt_load_s": 0.5, "restart_s": 12.0, "path_verify_s": 1.5,
         "restart_less_checks_s": 9.0}])
    assert validation.measured_parts(rows)["restart total"] == 8.0


def test_the_summary_judges_the_target():
    rows = [{"part": p, "predicted_s": 1.0, "measured_s": 1.0, "error": e} for p, e in
            (("a", 0.1), ("b", -0.05), ("c", 0.4))]
    summary = validation.summary(rows)
    assert summary["median_abs_error"] == pytest.approx(0.1) and summary["max_abs_error"] == pytest.approx(0.4)
    assert not summary["meets_target"] and [m["part"] for m in summary["misses"]] == ["c"]
    assert validation.summary(rows[:2])["meets_target"]


def test_the_markdown_says_every_part_and_the_misses():
    meta = {"benchmark": "whatif-validation", "date": "2026-11-26", "command": "python bench/whatif_validation.py",
            "machine": "cpu2", "host": "vm", "cpus": 2, "cpu": "x86_64", "memory_bytes": 2**34, "device": "cpu",
            "python": "3.11", "torch": "2.13", "deepspeed": "0.19.8", "commit": None, "load_average_at_start": 3.0}
    spread = {"min": 1.0, "median": 2.0, "max": 3.0}
    part = {"run": "r1", "part": "durable", "predicted_s": 2.0, "measured_s": 1.0, "error": 1.0}
    result = {"meta": meta, "runs_s": 60.0, "calibration_cases": [{}], "held_out_cases": [{}], "not_run": [],
              "miss_reasons": {"durable": "the page cache"},
              "limits": {"storage": {side: {"best": "m", "methods": {"m": spread}} for side in ("write", "read")}},
              "held_out": [{"run": "r1", "spec": {"preset": "7B", "layout": "tp2pp2dp1", "engine": "torch",
                                                  "scale": 0.04}, "parts": [part]}],
              "summary": validation.summary([part]),
              "h100": {"d2h_s": 1.1, "rows": [{"part": "stall", "s": 16.0, "low_s": 15.0, "high_s": 17.0,
                                              "measured_s": 17.9, "error": -0.1, "bound": "host CPU"}]}}
    text = bench.markdown(result)
    assert "| r1 | 7B | tp2pp2dp1 | torch | scale 0.04 | durable | 2 | 1 | +100 % |" in text
    assert "- r1, durable: predicted 2 s, measured 1 s (+100 %)" in text and "missed" in text
    assert "- durable: the page cache" in text
    assert "| stall | 16 | 15–17 | 17.9 | -10 % | host CPU |" in text
    assert "the load average was 3.0 when this script started" in text
    refit = bench.markdown({**result, "collect_only": True})
    assert "before this --collect-only fit, which started at a load average of 3.0 (not the runs')" in refit
    assert "the load average was 3.0 when this script started" not in refit


def test_summarize_refuses_an_unusable_cluster_file_before_writing_anything(tmp_path):
    path = BENCH.parent / "analysis" / "summarize.py"
    spec = importlib.util.spec_from_file_location("summarize_for_whatif", path)
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    (tmp_path / "logs").mkdir()
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes: {value: -1, basis: cited, source: x}\n")
    out = tmp_path / "out"
    assert summarize.main([str(tmp_path / "logs"), "--out", str(out), "--what-if", str(bad)]) == 2
    assert not out.exists()


def test_slurm_nodes_on_one_host_share_its_disk():
    from dataclasses import replace

    from restartbench.whatif import terms
    from restartbench.whatif.cluster import load_cluster

    cpu2 = replace(load_cluster(Path(__file__).resolve().parent.parent / "clusters" / "cpu2.yaml"),
                   local_write_GBps=0.4, local_read_GBps=1.6)
    two = validation.nodes_on_one_host(cpu2, 2)
    assert terms.node_write_limit(two, 2).GBps == pytest.approx(0.2)
    assert terms.node_read_limit(two, 2).GBps == pytest.approx(0.8)
    assert validation.nodes_on_one_host(cpu2, 1) is cpu2
    # the same checkpoint on one node or on two that share the disk: the same seconds at the limit
    one_job = terms.Job(4, 1, 2, 1e8, 20, 4e8, 80, 1e9, sequential=2)
    two_job = terms.Job(4, 2, 1, 1e8, 20, 2e8, 40, 1e9, sequential=2)
    line = terms.Line(0.1, {"files": 0.01, "at_limit": 1.0}, intercept_per="in_turn")
    assert terms.durable_s(line, "torch", two_job, two) == pytest.approx(terms.durable_s(line, "torch", one_job, cpu2))
    assert terms.read_seconds(two_job, terms.node_read_limit(two, 2)) == pytest.approx(
        terms.read_seconds(one_job, terms.node_read_limit(cpu2, 1)))


def test_a_two_node_case_is_submitted_to_slurm_and_not_run_without_one(tmp_path, monkeypatch):
    case = bench.HELD_OUT_2NODES[0]
    argv = case.argv(tmp_path)
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--launcher") + 1] == "slurm"
    assert "--submit" in argv and int(argv[argv.index("--master-port") + 1]) > 0
    assert all(c.nodes == 2 and c.scale is not None for c in bench.HELD_OUT_2NODES)
    assert {c.preset for c in bench.HELD_OUT_2NODES} >= {"7B", "13B", "70B"}
    assert {c.engine for c in bench.HELD_OUT_2NODES} == {"torch", "lazy", "dcp"}
    monkeypatch.delenv("SLURM_CONF", raising=False)
    step = bench.run_case(case, tmp_path, timeout=5)
    assert step["exit"] is None and step["note"].startswith("not run: no Slurm")
    assert not any(tmp_path.iterdir())


def test_a_runs_spec_says_whether_its_restart_was_prefetched():
    rows = pd.DataFrame([{"run_id": "r", "preset": "small", "layout": "tp1pp2dp2", "engine": "lazy", "dtype": "fp32",
                          "iteration_s": 0.5}])
    assert validation.spec_from_rows(rows, {"engine": {"lazy_prefetch": True}}).prefetch
    assert not validation.spec_from_rows(rows, {"engine": {}}).prefetch
    assert not validation.spec_from_rows(rows, {}).prefetch  # a config of before the option

"""bench/engines_sweep.py without running anything: the Markdown of a hand-made result, the cells of a sweep from their
metadata.json, and the check that no throughput above 1.05 of its limit is left unflagged."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load():
    sys.path.insert(0, str(BENCH))  # the script imports results_io from its folder
    spec = importlib.util.spec_from_file_location("bench_engines_sweep", BENCH / "engines_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep_bench = _load()

META = {
    "benchmark": "engines-sweep", "date": "2026-11-24", "started": "2026-11-24T10:00:00+00:00",
    "argv": ["--repetitions", "3"], "command": "python bench/engines_sweep.py --repetitions 3", "machine": "cpu2",
    "cpus": 2, "memory_bytes": 25 * 2**30, "load_average_at_start": 0.5, "host": "vm", "cpu": "x86_64",
    "device": "cpu", "python": "3.11.7", "torch": "2.13.0+cpu", "deepspeed": "0.19.8", "commit": "a" * 40,
    "uncommitted_changes": False, "sweep": "sweeps/engines.yaml",
    "sweep_content": {"presets": ["tiny"], "layouts": ["tp1pp1dp2", "pp2dp2"],
                      "engines": ["torch", "lazy", "decoupled", "datastates"], "repetitions": 1,
                      "options": {"dtype": "fp32", "iters": 4, "save_interval": 2}},
    "repetitions": 3, "logs": "/logs/engines", "collect_only": False, "summary": "/logs/engines/summary/report.html",
    "failures_per_gpu_hour": 1.97e-5, "goodput_assumptions": "Young/Daly model: failures at 1.97e-05 per GPU-hour",
}
BASE = {"tool": "fio", "jobs": [2], "ranks_per_node": [2], "runs_without_own": 0}


def _cell(engine, repetition, status, reason=None, issue=None):
    return {"preset": "tiny", "layout": "tp1pp1dp2", "engine": engine, "repetition": repetition,
            "run_dir": f"tiny/tp1pp1dp2/{engine}/rep{repetition}", "status": status, "reason": reason,
            "known_issue": issue, "earlier_attempts": 1 if status == "failed" else 0}


def _checkpoint(engine, ratio, flag):
    return {"preset": "tiny", "layout": "tp1pp1dp2", "engine": engine, "runs": 3, "checkpoints": 6,
            "seen_checkpoints": 3, "ranks": 2, "bytes": 5.1e6, "bytes_per_rank_max": 3e6, "files": 10,
            "stall_s": 0.0123, "stall_min_s": 0.01, "stall_max_s": 0.02, "slowdown_s": 0.25, "cost_s": 0.2623,
            "overlapped_iterations": 1, "durable_s": 0.3, "iteration_s": 0.05, "write_MBps": 68.0,
            "baseline_write_MBps": 1049.0, "write_ratio": ratio, "write_limit": flag, "baseline": BASE}


def _restart(engine, ratio, flag):
    parts = {"launch": 3.2, "imports": 4.4, "dist init": 0.9, "model build": 2.3, "ds init": 1.6,
             "engine setup": 0.005, "convert": None, "ckpt load": 0.056, "1st iter": 0.05}
    return {"preset": "tiny", "layout": "tp1pp1dp2", "engine": engine, "runs": 3, "attempts": 3,
            "verdicts": "3 exact", "ranks": 2, "restart_s": 11.807, "restart_min_s": 11.5, "restart_max_s": 12.0,
            "rank_spread_s": 0.001, "parts": parts, "critical_path": parts, "restores_checkpoint": True,
            "bytes_read": 9e6, "files_read": 34, "read_MBps": 159.0, "baseline_read_MBps": 572.0,
            "read_ratio": ratio, "read_limit": flag, "cache": "cold", "exact": True,
            "restore_peak_rss_bytes": 4.07e8, "resume_spike": 1.31, "baseline": BASE}


RESULT = {
    "meta": META,
    "steps": {"sweep": {"argv": ["-m", "restartbench.sweep", "/logs/engines/sweep.yaml"], "exit": 1, "wall_s": 1800.0},
              "summarize": {"argv": ["analysis/summarize.py", "/logs/engines"], "exit": 0, "wall_s": 20.0}},
    "cells": [_cell("torch", 1, "complete"), _cell("lazy", 1, "complete"),
              _cell("decoupled", 1, "failed", "checkpoint(s) failed: RuntimeError: Cowardly refusing | ...",
                    "as shipped, DeepSpeed's decoupled writer fails with ZeRO-1 in a PipelineEngine"),
              _cell("datastates", 1, "skipped", "no datastates here"), _cell("torch", 2, "missing")],
    "figures": {
        "complete_runs": 2, "excluded": [], "runs_started": ["2026-11-24T10:00:00+00:00", "2026-11-24T10:30:00+00:00"],
        "run_versions": [{"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "python": "3.11.7"}],
        "checkpoints": [_checkpoint("torch", 0.06, None), _checkpoint("lazy", 1.2, "limit underestimated (3 of 3)")],
        "restarts": [_restart("torch", 1.67, "limit underestimated (1 of 3)"), _restart("lazy", 1.08, None)],
        "ds_init": [{"preset": "tiny", "layout": "tp1pp1dp2", "engine": "torch",
                     "stages": {"optimizer_sanity_check": 1.444, "ds_config": 0.014}, "other_stages_s": 0.003,
                     "collective_wait_s": 0.186, "other_s": 0.0001, "parts_sum_s": 1.647}],
        "goodput": [{"preset": "tiny", "layout": "tp1pp1dp2", "engine": "torch", "runs": 3, "cost_s": 0.022,
                     "cost_basis": "stall + slowdown", "restart_s": 11.8, "iteration_s": 0.05,
                     "failures_per_gpu_hour": 1.97e-5, "gpus": 2, "mtbf_s": 9.1e7, "interval_s": 1996.0,
                     "interval_iterations": 39671.0, "checkpoint_pct": 0.0011, "rework_pct": 0.0011,
                     "restart_pct": 1.3e-5, "goodput_pct": 99.9978}],
        "unflagged": [], "warnings": [],
        "limit_flags": {"write": {"measured": 12, "above": 6, "flagged": 6, "notes": ["limit underestimated"]},
                        "read": {"measured": 6, "above": 3, "flagged": 3, "notes": ["limit underestimated"]}},
    },
}


def test_markdown_says_what_each_figure_is():
    text = sweep_bench.markdown(json.loads(json.dumps(RESULT)))
    assert text.startswith("# Engines sweep — cpu2, 2026-11-24\n")
    for said in ("**max over ranks**", "**median over the repetitions**", "**cold cache**", "host vm, 2 CPUs",
                 "repetitions 3", "exit 1 after 1800 s"):
        assert said in text
    # every cell state with its reason; a failure as shipped names the known issue, not the traceback
    assert "| tiny | tp1pp1dp2 | torch | 1 | 0 | 0 | 1 | — | 0 |" in text
    assert "`decoupled` failed: fails as shipped: as shipped, DeepSpeed's decoupled writer" in text
    assert "`datastates` skipped: no datastates here" in text
    # stall, slowdown, whole cost; the limit flag beside its ratio, an unflagged ratio above 1.05 marked
    assert "| 0.012 (0.010–0.020) | 0.250 | 0.262 |" in text
    assert "1.20 (limit underestimated (3 of 3))" in text
    assert "1.67 (limit underestimated (1 of 3))" in text and "1.08 (**unflagged**)" in text
    assert "fio 2 jobs, 2 ranks/node" in text
    # restart parts (convert left out: no restart converted), resume spike, ds init stages, goodput
    assert "| ckpt load s | 1st iter s |" in text and "convert s" not in text
    assert "| 0.41 | 1.31 |" in text
    assert "| optimizer_sanity_check | ds_config | other stages | collective wait | other | sum |" in text
    assert "| 2 | 25278 | 1996 (39671) |" in text and "99.9978" in text
    assert "Above it without a note: none." in text
    for table in text.split("\n\n"):  # every table's rows, separator included, have as many columns as its header
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert len({row.count("|") - row.count("\\|") for row in rows}) <= 1, table


def test_collect_only_markdown_says_so():
    result = json.loads(json.dumps(RESULT))
    result["meta"].update(collect_only=True, summary=None)
    result["steps"] = {"sweep": None, "summarize": None}
    text = sweep_bench.markdown(result)
    assert "Collected only (`--collect-only`)" in text and "not made in this invocation" in text


def test_cells_are_read_from_their_run_folders(tmp_path):
    logs = tmp_path / "logs"
    sweep = tmp_path / "one.yaml"
    sweep.write_text(yaml.safe_dump({"presets": ["tiny"], "layouts": ["tp1pp1dp2"],
                                     "engines": ["torch", "decoupled", "datastates", "lazy"], "repetitions": 1}))
    copy = sweep_bench.sweep_copy(sweep, 2, logs, logs)
    written = yaml.safe_load(copy.read_text())
    assert written["repetitions"] == 2 and written["logs"] == str(logs) and written["engines"][0] == "torch"
    folders = {"torch": {"status": "complete"}, "decoupled": {"status": "failed", "error": "Cowardly refusing"},
               "datastates": {"status": "skipped", "error": "no datastates here"}}
    for engine, meta in folders.items():
        run = logs / "tiny" / "tp1pp1dp2" / engine / "rep1"
        run.mkdir(parents=True)
        (run / "metadata.json").write_text(json.dumps(meta))
    (logs / "tiny" / "tp1pp1dp2" / "decoupled" / "rep1.attempt1").mkdir()
    cells = {(c["engine"], c["repetition"]): c for c in sweep_bench.sweep_cells(copy, logs)}
    assert len(cells) == 8
    assert cells["torch", 1]["status"] == "complete" and cells["torch", 2]["status"] == "missing"
    assert cells["decoupled", 1]["status"] == "failed" and "Cowardly" in cells["decoupled", 1]["reason"]
    assert "as shipped" in cells["decoupled", 1]["known_issue"]  # from the registry where metadata has none
    assert cells["decoupled", 1]["earlier_attempts"] == 1
    assert cells["datastates", 1]["status"] == "skipped"
    assert cells["datastates", 1]["reason"] == "no datastates here"
    assert cells["lazy", 1]["run_dir"] == "tiny/tp1pp1dp2/lazy/rep1"


def test_values_become_json():
    assert sweep_bench.clean(np.float64(1.5)) == 1.5 and isinstance(sweep_bench.clean(np.int64(3)), int)
    assert sweep_bench.clean(float("nan")) is None and sweep_bench.clean(math.inf) is None
    assert sweep_bench.clean(None) is None and sweep_bench.clean("x") == "x"


def test_a_ratio_above_the_tolerance_without_a_flag_is_found():
    table = pd.DataFrame([
        {"run_id": "a", "kind": "checkpoint", "tag": "step2", "attempt": None, "write_pct_of_storage": 120.0,
         "write_limit": "limit underestimated", "read_pct_of_storage": None, "read_limit": None},
        {"run_id": "b", "kind": "checkpoint", "tag": "step2", "attempt": None, "write_pct_of_storage": 110.0,
         "write_limit": None, "read_pct_of_storage": None, "read_limit": None},
        {"run_id": "b", "kind": "restart", "tag": "step4", "attempt": 1, "write_pct_of_storage": None,
         "write_limit": None, "read_pct_of_storage": 104.0, "read_limit": None},
    ])
    assert sweep_bench.unflagged(table) == [{"run_id": "b", "kind": "checkpoint", "tag": "step2", "attempt": None,
                                             "side": "write", "ratio": 1.1}]
    counts = sweep_bench.flag_counts(table)
    assert counts["write"] == {"measured": 2, "above": 2, "flagged": 1, "notes": ["limit underestimated"]}
    assert counts["read"] == {"measured": 1, "above": 0, "flagged": 0, "notes": []}

"""A restart on another parallel layout (issue 19): ``./submit-job.sh --restore RUN --restore-layout LAYOUT``.

A tiny fp32 run trained as tp2pp2 (global batch: 4 micro-batches, so dp 1, 2 and 4 all keep it) restarts as dp4 and
as pp2dp2, both changing tp: DeepSpeed's default engine converts with DeepSpeed's shipped ds_to_universal.py (a
restart part of its own, ``restore.convert``) and loads with ``load_universal``; the lazy engine reshards at load,
each new rank reading the byte ranges it needs. The proof is the consolidated state (every parameter's fp32 weights
and Adam moments at full shape), equal to phase 1's digest at the save."""

import json
import shutil

import pandas as pd
import pytest
from conftest import last_attempt_events, relaunch, run_study

from restartbench import analysis, results
from restartbench.events import read_events


def tp2pp2_run(logs, engine: str, *options: str):
    proc, run_dir = run_study(logs, "tiny", "tp2pp2", "--engine", engine, "--dtype", "fp32", "--iters", "4",
                              "--save-interval", "2", "--grad-accum", "4", "--consolidated-digest",
                              "--baseline-mib", "0", *options)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tp2pp2_run(tmp_path_factory.mktemp("relayout") / "logs", "torch")


def restarts(run_dir):
    return json.loads((run_dir / "metadata.json").read_text())["restarts"]


@pytest.mark.multirank
def test_torch_restarts_on_dp4_through_a_universal_checkpoint_proven_on_the_consolidated_state(run):
    done = relaunch(run, "--restore-layout", "dp4")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    events = last_attempt_events(run)
    converts = [e for e in events if e["event"] == "restore.convert"]
    pt_files = list((run / "checkpoints" / "step4").glob("*.pt"))
    assert len(converts) == 4 and {e["converted_tag"] for e in converts} == {"step4_universal"}
    assert converts[0]["bytes_read"] == sum(p.stat().st_size for p in pt_files) and converts[0]["files_written"] > 0
    [result] = [e for e in events if e["event"] == "restore.result" and e["rank"] == 0]
    assert (result["exact"], result["verified"], result["restore_layout"], result["saved_layout"]) == \
        (True, True, "tp1pp1dp4", "tp2pp2dp1")
    assert abs(result["loss_diff"]) < 1e-4 and result["reference_loss"] == result["loss"] - result["loss_diff"]
    assert any(e["event"] == "restore.verify" and e.get("consolidated") for e in events)
    # DeepSpeed's universal load reads zero/<param>/*.pt with torch.load, outside the files the engine reports
    loads = [e for e in events if e["event"] == "restore.load"]
    universal = sum(p.stat().st_size for p in (run / "checkpoints" / "step4_universal" / "zero").rglob("*.pt"))
    assert all(e["process_read_bytes"] > e["bytes"] for e in loads)
    assert sum(e["process_read_bytes"] for e in loads) >= universal
    info = results.restart(read_events(run), restarts(run)[-1]["attempt"])
    assert info["parts"]["convert"] == max(e["duration_s"] for e in converts) and info["verdict"] == "exact"
    assert restarts(run)[-1]["restore_layout"] == "tp1pp1dp4"
    assert json.loads((run / "layouts" / "tp1pp1dp4" / "ds_config.json").read_text())["checkpoint"] == \
        {"load_universal": True}


@pytest.mark.multirank
def test_a_consolidated_state_unlike_the_saved_one_is_not_exact(run):
    """step2's recorded digest, one entry changed: the restart on pp2dp2 of step2 must find it."""
    path = run / "digests" / "step2" / "consolidated.json"
    digest = json.loads(path.read_text())
    name = next(key for key in digest if key.endswith(".exp_avg"))
    path.write_text(json.dumps({**digest, name: "0" * 24}))
    done = relaunch(run, "--restore-layout", "pp2dp2", "--tag", "step2")
    assert done.returncode == 1
    assert restarts(run)[-1]["verdict"] == "not exact"
    assert f"consolidated state: {name}" in done.stdout + done.stderr


def test_an_engine_that_cannot_restart_on_another_layout_is_a_skipped_attempt_with_the_reason(run, tmp_path):
    """A DCP run (its registry entry says why it cannot), as a copy of the run with its engine renamed: nothing is
    launched, the attempt is recorded as skipped with the reason."""
    copy = tmp_path / "dcp-run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    (copy / "checkpoints").symlink_to(run / "checkpoints")
    for name in ("config.json", "metadata.json"):
        value = json.loads((copy / name).read_text())
        (value["engine"] if name == "config.json" else value)["engine"] = "dcp"
        (copy / name).write_text(json.dumps(value))
    plan = json.loads((copy / "plan.json").read_text())
    (copy / "plan.json").write_text(json.dumps({**plan, "run_dir": str(copy)}))
    done = relaunch(copy, "--restore-layout", "dp4")
    assert done.returncode == 0, done.stderr[-2000:]
    entry = restarts(copy)[-1]
    assert entry["verdict"] == "skipped" and "keyed by the rank's (pp, tp, dp) coordinates" in entry["reason"]
    assert "skipped" in done.stdout + done.stderr and not list((copy / "events").glob(f"restore-{entry['attempt']}-*"))


@pytest.mark.multirank
def test_a_run_asked_to_restore_on_a_layout_its_engine_cannot_load_trains_and_records_the_restore_skipped(tmp_path):
    """config-n-run.py --restore-layout with an engine that cannot restart on another layout: phase 1 runs and
    commits, the restore is not launched, and the run is complete with its restart recorded as skipped and why."""
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", "--engine", "torchsnapshot", "--iters", "2",
                              "--save-interval", "2", "--baseline-mib", "0", "--restore-layout", "dp1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    meta = json.loads((run_dir / "metadata.json").read_text())
    [entry] = meta["restarts"]
    assert meta["status"] == "complete" and entry["verdict"] == "skipped" and "rank-local" in entry["reason"]
    assert list(meta["phases"]) == ["train"] and not list((run_dir / "events").glob("restore-*"))
    assert "restore on tp1pp1dp1: skipped, engine torchsnapshot" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("layout", "message"), [
    ("dp3", "global batch is 4 micro-batches"),
    ("tp2pp2", "is the run's own layout"),
    ("tp3", "not divisible by tp=3"),
])
def test_a_layout_the_run_cannot_restart_on_is_refused_before_anything_launches(run, layout, message):
    before = len(restarts(run))
    done = relaunch(run, "--restore-layout", layout)
    assert done.returncode == 2 and message in done.stdout + done.stderr
    assert len(restarts(run)) == before


@pytest.mark.multirank
def test_the_summary_sets_each_layouts_restart_beside_the_same_layouts(run):
    """After the tests above: the run's own restart, dp4 (exact, converted) and pp2dp2 (not exact) each a row of
    ``relayout_summary``; the same-layout medians (``restart_summary``) keep the run's own restart only."""
    table = analysis.collect(run.parents[3]).table()
    rows = analysis.relayout_summary(table).set_index("restore_layout")
    assert rows.loc["tp2pp2dp1", "verdicts"] == "1 exact" and pd.isna(rows.loc["tp2pp2dp1", "restart_convert_s"])
    assert rows.loc["tp1pp1dp4", "verdicts"] == "1 exact" and rows.loc["tp1pp1dp4", "restart_convert_s"] > 0
    assert rows.loc["tp1pp1dp4", "convert_bytes_written"] > 0 and rows.loc["tp1pp2dp2", "verdicts"] == "1 not exact"
    [same] = analysis.restart_summary(table).to_dict("records")
    assert same["attempts"] == 1 and same["restart_s"] == rows.loc["tp2pp2dp1", "restart_s"]


@pytest.mark.multirank
def test_lazy_reshards_at_load_onto_dp4_reading_less_than_the_checkpoint_per_rank(tmp_path):
    """The run's own restore on another layout (config-n-run.py --restore-layout), with the engine that reshards at
    load: no conversion, each rank reading less than the checkpoint, proven on the consolidated state."""
    run_dir = tp2pp2_run(tmp_path / "logs", "lazy", "--restore-layout", "dp4")
    assert json.loads((run_dir / "config.json").read_text())["launch"]["restore_layout"] == "tp1pp1dp4"
    events = last_attempt_events(run_dir)
    assert not [e for e in events if e["event"] == "restore.convert"], "no offline pass"
    results_ = [e for e in events if e["event"] == "restore.result"]
    assert len(results_) == 4 and all(e["exact"] and e["verified"] for e in results_)
    checkpoint = sum(p.stat().st_size for p in (run_dir / "checkpoints" / "step4").glob("*.lazy"))
    loads = [e for e in events if e["event"] == "restore.load"]
    assert len(loads) == 4 and all(0 < e["bytes"] <= e["process_read_bytes"] and e["bytes"] < checkpoint
                                   for e in loads)
    assert restarts(run_dir)[-1]["verdict"] == "exact"

"""analysis/summarize.py, restartbench.analysis and restartbench.report over real run folders (the session's tiny
runs), plus runs derived from them: skipped, failed, killed, malformed, another engine, engine none, a baseline."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from restartbench import analysis, goodput, report
from restartbench.analysis import collect, collecting
from restartbench.analysis.records import decode_column
from restartbench.analysis.runs import TRAINING_KEPT
from restartbench.events import Event, EventFileError, EventLog, read_events

ROOT = Path(__file__).resolve().parent.parent
multirank = pytest.mark.multirank


# -- runs derived from real ones (cheap: a copy and an edit, no launch) ------------------------------------


def _edit_meta(run: Path, **changes) -> None:
    meta = json.loads((run / "metadata.json").read_text())
    meta.update(changes)
    (run / "metadata.json").write_text(json.dumps(meta))


def _rewrite_events(run: Path, edit) -> None:
    """edit(record) -> record or None (dropped), for every event of the run."""
    for path in (run / "events").glob("*.jsonl"):
        kept = [edit(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(r) + "\n" for r in kept if r is not None))


def copy_as_engine(run: Path, engine: str, *, stall: float = 1.0, durable: float = 1.0) -> Path:
    """The run as if made by another engine (durations scaled): the analysis must treat any engine name alike."""
    copy = run.parent.parent / engine / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    _edit_meta(copy, engine=engine)

    def edit(e):
        if e["event"] == "checkpoint.save":
            e["duration_s"] *= stall
        if e["event"] in ("checkpoint.durable", "checkpoint.commit"):
            e["since_save_start_s"] *= durable
        return e
    _rewrite_events(copy, edit)
    return copy


def copy_as_none(run: Path) -> Path:
    """The run as engine none records it: no checkpoint events, a restart that loads nothing (tag None)."""
    copy = run.parent.parent / "none" / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", "digests"))
    _edit_meta(copy, engine="none")
    (copy / "inventory.json").write_text("[]")

    def edit(e):
        if e["event"].startswith("checkpoint.") or e["event"] in ("restore.load", "restore.verify"):
            return None
        if e["event"] == "restore.result":
            e.update(tag=None, exact=None, verified=False, note="engine none: nothing was saved, nothing restored")
        return e
    _rewrite_events(copy, edit)
    return copy


def real_runs(logs: Path) -> list[Path]:
    return sorted(p.parent for p in logs.glob("*/*/*/*/metadata.json"))


#: restart part column -> the event whose duration it is (README "Run folder")
PART_EVENTS = {"restart_launch_s": "process.start", "restart_imports_s": "startup.imports",
               "restart_dist_init_s": "startup.dist_init", "restart_model_build_s": "startup.model_build",
               "restart_ds_init_s": "startup.ds_initialize", "restart_engine_setup_s": "startup.engine",
               "restart_ckpt_load_s": "restore.load", "restart_1st_iter_s": "train.iteration"}


def rank_events(run: Path, phase: str) -> list[list[dict]]:
    """Every rank's events of one phase, read here straight from the JSON lines (not through the analysis)."""
    return [[json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted((run / "events").glob(f"{phase}-rank*.jsonl"))]


@pytest.fixture
def mixed_logs(study_logs, tmp_path):
    """The session's real runs, plus: a failed, a killed, a skipped and a malformed run, a run with a truncated event
    line, one whose event lacks a field, a second engine, engine none, a foreign file and a baseline for one layout."""
    logs = tmp_path / "logs"
    # Each real run measured its own baseline.json; this fixture places one baseline for one layout instead.
    shutil.copytree(study_logs, logs, ignore=shutil.ignore_patterns("checkpoints", "baseline.json"))
    runs = real_runs(logs)
    real = runs[0]
    for name, status, error in (("failed", "failed", "phase train failed: rank 0: boom"), ("killed", "running", None),
                                ("skipped", "skipped", "engine 'datastates' needs the Python module 'datastates'")):
        copy = real.parent / name
        shutil.copytree(real, copy)
        _edit_meta(copy, status=status, error=error)
    # failed in its training (rank 0 raised: no restore launched); killed during its restore (its training kept)
    for path in (real.parent / "failed" / "events").glob("restore-*.jsonl"):
        path.unlink()
    _rewrite_events(real.parent / "failed", lambda e: {**e, "event": Event.PHASE_ERROR, "error": "boom"} if (
        e["event"] == Event.PHASE_END and e["phase"] == "train" and e["rank"] == 0) else e)
    _rewrite_events(real.parent / "killed", lambda e: None if e["phase"] == "restore" and e["event"] in (
        Event.RESTORE_RESULT, Event.PHASE_END, Event.RANK_MEMORY) or e["phase"] == "restore" and e.get("step") else e)
    broken = real.parent / "broken"
    shutil.copytree(real, broken)
    (broken / "metadata.json").write_text("{not json")
    truncated = real.parent / "truncated"
    shutil.copytree(real, truncated)
    events = truncated / "events" / "train-rank00001.jsonl"
    events.write_text(events.read_text() + '{"event": "checkpoint.save", "phase"\n')
    lacking = real.parent / "lacking"
    shutil.copytree(real, lacking)
    _rewrite_events(lacking, lambda e: {k: v for k, v in e.items() if not (e["event"] == "checkpoint.durable"
                                                                          and k == "bytes")})
    for run in runs:
        copy_as_engine(run, "fake-async", stall=0.2, durable=5.0)
    copy_as_none(runs[-1])
    (logs / "notes.txt").write_text("not a run")
    (runs[-1].parent.parent / "baseline.json").write_text(json.dumps(
        {"tool": "fio", "write_MBps": 321.0, "read_MBps": 654.0, "target": "/tmp", "block_size": "1M"}))
    return logs


# -- collect ---------------------------------------------------------------------------------------------


@multirank
def test_collect_skips_bad_runs_with_reasons(mixed_logs):
    collected = collect(mixed_logs)
    by_name = {e.run.name: e for e in collected.excluded}
    assert by_name["failed"].status == "failed" and "boom" in by_name["failed"].reason
    assert by_name["killed"].status == "incomplete" and "never finished" in by_name["killed"].reason
    assert by_name["killed"].reason.endswith(TRAINING_KEPT) and not by_name["failed"].reason.endswith(TRAINING_KEPT)
    assert by_name["skipped"].status == "skipped" and "datastates" in by_name["skipped"].reason
    assert by_name["broken"].status == "unreadable"
    assert "broken/metadata.json is not valid JSON" in by_name["broken"].reason
    assert "truncated/events/train-rank00001.jsonl:" in by_name["truncated"].reason
    assert "not a JSON event line" in by_name["truncated"].reason
    assert "lacking/events/train-rank" in by_name["lacking"].reason
    assert "'checkpoint.durable' lacks field(s) bytes" in by_name["lacking"].reason
    table = collected.table()
    assert set(table["layout"]) == {"tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp2"}
    assert set(table["engine"]) == {"torch", "fake-async", "none"}
    restored = table[(table["kind"] == "restart") & table["restores_checkpoint"]]
    assert (restored["exact"] == True).all()  # noqa: E712
    excluded = collected.excluded_table()
    assert set(excluded["status"]) == {"failed", "incomplete", "skipped", "unreadable"}
    killed = table[table["run"] == str(by_name["killed"].run)]  # its training kept, no restart row
    assert list(killed["kind"]) == ["checkpoint", "checkpoint"] and list(killed["tag"]) == ["step2", "step4"]


@multirank
def test_checkpoint_rows_follow_the_aggregation_rules(study_logs):
    """The real runs' checkpoint rows against figures taken here from every rank's events: stall (save plus any copy
    wait) and durable = max over ranks, bytes and files = sum, committed = rank 0's commit, throughput = bytes /
    durable. tests/test_results.py proves each rule on hand-chosen numbers; this proves them on DeepSpeed's."""
    collected = collect(study_logs)
    table, ranks = collected.table(), collected.rank_table()
    ckpt = table[table["kind"] == "checkpoint"]
    assert len(ckpt) == 3 * 2  # three layouts, checkpoints after iterations 2 and 4
    for _, row in ckpt.iterrows():
        train = rank_events(Path(row["run"]), "train")
        tagged = [[e for e in events if e.get("tag") == row["tag"]] for events in train]
        stalls = [sum(e["duration_s"] for e in events if e["event"] in ("checkpoint.save", "checkpoint.copy_wait"))
                  for events in tagged]
        durable = [e for events in tagged for e in events if e["event"] == "checkpoint.durable"]
        commit = [e for events in tagged for e in events if e["event"] == "checkpoint.commit"]
        assert len(tagged) == len(durable) == row["ranks"] == row["ranks_saved"]
        assert row["stall_max_s"] == max(stalls) and row["stall_min_s"] == min(stalls)
        assert row["durable_rank_max_s"] == max(e["since_checkpoint_start_s"] for e in durable)
        assert row["bytes"] == sum(e["bytes"] for e in durable) and row["files"] == sum(e["n_files"] for e in durable)
        assert row["bytes_per_rank_max"] == max(e["bytes"] for e in durable)
        assert [e["rank"] for e in commit] == [0] and row["committed_s"] == commit[0]["since_checkpoint_start_s"]
        assert row["write_MBps"] == pytest.approx(row["bytes"] / 1e6 / row["durable_rank_max_s"])
        assert row["stall_max_s"] <= row["durable_rank_max_s"] <= row["committed_s"]
        assert row["predicted_bytes"] > 0 and 0.8 < row["bytes"] / row["predicted_bytes"] < 1.5
        per_rank = ranks[(ranks["run_id"] == row["run_id"]) & (ranks["tag"] == row["tag"])
                         & (ranks["kind"] == "checkpoint")]
        assert sorted(per_rank["rank"]) == list(range(row["ranks"]))


@multirank
def test_restart_rows_and_critical_path(study_logs):
    """The real runs' restart rows against figures taken here from every rank's events: the total = max over ranks of
    launch -> end of the first resumed iteration, each part its max over ranks, bytes and files read summed."""
    collected = collect(study_logs)
    table, ranks = collected.table(), collected.rank_table()
    restarts = table[table["kind"] == "restart"]
    assert len(restarts) == 3
    for _, row in restarts.iterrows():
        spans = [{e["event"]: e for e in events if e["event"] != "train.iteration" or e.get("first_after_restore")}
                 for events in rank_events(Path(row["run"]), "restore")]
        totals = [s["train.iteration"]["start"] + s["train.iteration"]["duration_s"] - s["process.start"]["start"]
                  for s in spans]
        assert len(spans) == row["ranks"]
        assert row["restart_s"] == pytest.approx(max(totals)) and row["restart_min_s"] == pytest.approx(min(totals))
        for column, event in PART_EVENTS.items():
            assert row[column] == max(s[event]["duration_s"] for s in spans), column
        loads = [s["restore.load"] for s in spans]
        assert row["tag"] == "step4" and {e["tag"] for e in loads} == {"step4"}
        assert row["bytes_read"] == sum(e["bytes"] for e in loads)
        assert row["files_read"] == sum(e["n_files"] for e in loads)
        assert row["read_MBps"] == pytest.approx(row["bytes_read"] / 1e6 / row["restart_ckpt_load_s"])
        assert {e["cache"] for e in loads} == {row["cache"]} == {"cold" if row["resident_fraction"] == 0 else "warm"}
        assert all(s["restore.result"]["exact"] and s["restore.result"]["verified"] for s in spans)
        assert row["exact"] == True and row["restores_checkpoint"]  # noqa: E712 - a numpy bool
        per_rank = ranks[(ranks["run_id"] == row["run_id"]) & (ranks["kind"] == "restart")]
        assert sorted(per_rank["rank"]) == list(range(row["ranks"]))
        path = sum(row[column] for column, _ in analysis.PATH_COLUMNS if pd.notna(row[column]))
        assert path == pytest.approx(row["restart_s"], rel=1e-6)  # the stacked bars add up to the total


@multirank
def test_engine_none_is_the_start_up_floor(mixed_logs):
    table = collect(mixed_logs).table()
    none = table[table["engine"] == "none"]
    assert list(none["kind"]) == ["restart"]
    row = none.iloc[0]
    assert pd.isna(row["tag"]) and not row["restores_checkpoint"] and pd.isna(row["restart_ckpt_load_s"])
    floor = analysis.start_up_floor(table)
    assert len(floor) == 1 and floor.iloc[0]["floor_s"] == row["restart_s"]
    summary = analysis.restart_summary(table)
    assert not summary.loc[summary["engine"] == "none", "restores_checkpoint"].iloc[0]


@multirank
def test_runs_of_one_engine_with_other_options_are_other_configurations(study_logs, tmp_path):
    """Two lazy runs, one of them with --lazy-direct-io (its config.json's engine section): they are not pooled as
    repetitions of one configuration; each summary row says its options."""
    logs = tmp_path / "logs"
    shutil.copytree(study_logs, logs, ignore=shutil.ignore_patterns("checkpoints", "baseline.json"))
    run = real_runs(logs)[0]
    buffered, direct = copy_as_engine(run, "lazy"), run.parent.parent / "lazy" / "direct"
    shutil.copytree(buffered, direct)
    config = json.loads((direct / "config.json").read_text())
    config["engine"].update(engine="lazy", lazy_direct_io=True)
    (direct / "config.json").write_text(json.dumps(config))
    table = collect(logs).table()
    lazy = table[table["engine"] == "lazy"]
    assert dict(zip(lazy["run_id"].str.rsplit("/", n=1).str[-1], lazy["engine_options"])) == {
        buffered.name: "", "direct": "--lazy-direct-io"}
    assert "engine_options" in analysis.group_keys(table)
    summary = analysis.checkpoint_summary(table)
    assert sorted(summary.loc[summary["engine"] == "lazy", "engine_options"]) == ["", "--lazy-direct-io"]
    assert set(table.loc[table["engine"] == "torch", "engine_options"]) == {""}


@multirank
def test_summaries_and_engine_comparison(mixed_logs):
    collected = collect(mixed_logs)
    table = collected.table()
    summary = analysis.checkpoint_summary(table)
    assert set(summary["engine"]) == {"torch", "fake-async"}
    keys = analysis.group_keys(table)
    assert keys[:2] == ["preset", "layout"] and keys[-1] == "engine" and list(summary.columns[:len(keys)]) == keys
    assert (summary["stall_rank_spread_s"] >= 0).all()
    comparison = analysis.engine_comparison(table, "tiny", "tp1pp2")  # short layout name: dp from the table
    assert comparison["layout"].unique().tolist() == ["tp1pp2dp2"]
    assert {"torch", "fake-async"} <= set(comparison["engine"])
    fast = comparison.set_index("engine").loc["fake-async"]
    assert fast["stall_vs_best"] == 1.0  # its stall was scaled by 0.2
    with_none = table.loc[table["engine"] == "none", "layout"].iloc[0]
    assert analysis.pick_configuration(table)[1] == with_none  # the layout with three engines (none included)
    lines = report.findings(table)
    assert lines[0].startswith("Least training stall: fake-async")
    assert any("fake-async" in line and "durable after" in line and "window" in line for line in lines)
    assert any("start-up floor" in line for line in lines)


@multirank
def test_file_statistics_per_checkpoint_rank_and_kind(study_logs):
    collected = collect(study_logs)
    table, files = collected.table(), collected.file_table()
    stats = analysis.file_statistics(files)
    assert {"layer", "model", "optimizer"} <= set(stats["kind"])
    assert (stats["min_bytes"] <= stats["median_bytes"]).all() and (stats["median_bytes"] <= stats["max_bytes"]).all()
    per_rank = analysis.files_per_rank(files)
    kinds = per_rank[[f"{k}_bytes" for k in analysis.FILE_KINDS]].sum(axis=1)
    assert (kinds == per_rank["bytes"]).all()
    ckpt = table[table["kind"] == "checkpoint"].set_index(["run_id", "tag"])
    totals = per_rank.groupby(["run_id", "tag"])[["bytes", "files"]].sum()
    joined = totals.merge(ckpt[["bytes", "files"]], left_index=True, right_index=True, suffixes=("", "_events"))
    assert (joined["bytes"] == joined["bytes_events"]).all() and (joined["files"] == joined["files_events"]).all()
    summary = analysis.file_summary(files)
    assert set(summary["kind"]) >= {"layer", "model", "optimizer", "all"}
    size = analysis.size_check(table, files)
    assert len(size) == 3 and size["measured_vs_predicted"].between(0.9, 1.3).all()
    assert (size["measured_weights_bytes"] + size["measured_optimizer_bytes"] + size["measured_other_bytes"]
            == size["measured_bytes"]).all()


@multirank
def test_baseline_from_the_run_folder_or_a_parent(mixed_logs):
    collected = collect(mixed_logs)
    table = collected.table()
    with_baseline = table[table["baseline_tool"].notna()]
    assert set(with_baseline["layout"]) == {with_baseline["layout"].iloc[0]}  # only the layout folder that has one
    assert (with_baseline["baseline_write_MBps"] == 321.0).all()
    assert (with_baseline["baseline_read_MBps"] == 654.0).all()
    assert table["baseline_tool"].isna().any()
    ckpt, rest = with_baseline[with_baseline["kind"] == "checkpoint"], with_baseline[with_baseline["kind"] == "restart"]
    assert (ckpt["write_pct_of_storage"] - 100 * ckpt["write_MBps"] / 321.0).abs().max() < 1e-9
    assert (rest["read_pct_of_storage"] - 100 * rest["read_MBps"] / 654.0).abs().max() < 1e-9
    assert table.loc[table["baseline_tool"].isna(), ["write_pct_of_storage", "read_pct_of_storage"]].isna().all().all()
    comparison = analysis.engine_comparison(with_baseline)
    wrote = comparison["write_MBps"].notna()
    assert wrote.any() and comparison.loc[wrote, "write_pct_of_storage"].notna().all()
    assert comparison["read_pct_of_storage"].notna().any()
    (mixed_logs / "tiny" / "baseline.json").write_text('{"tool": "fio"}')
    collected = collect(mixed_logs)
    assert any("needs a positive write_MBps" in w for w in collected.warnings)


# -- the command -----------------------------------------------------------------------------------------


@multirank
def test_summarize_writes_tables_plots_and_report(mixed_logs, tmp_path):
    out = tmp_path / "summary"
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(mixed_logs), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stdout = proc.stdout
    assert "Checkpoints" in stdout and "Restarts" in stdout and "Findings" in stdout
    assert "skipped (run marked skipped)" in stdout and "skipped (failed run)" in stdout
    assert "skipped (unreadable run)" in stdout and "train-rank00001.jsonl" in stdout
    for name in ("study.csv", "study.parquet", "ranks.csv", "ranks.parquet", "files.csv", "files_per_rank.csv",
                 "file_inventory.parquet", "excluded.csv", "report.html"):
        assert (out / name).stat().st_size > 0, name
    for figure in report.FIGURES:
        for suffix in (".png", ".svg"):
            assert (out / f"{figure}{suffix}").stat().st_size > 1000, figure + suffix
    table = pd.read_parquet(out / "study.parquet")
    ckpt = table[table["kind"] == "checkpoint"]
    assert (ckpt["stall_max_s"] <= ckpt["durable_rank_max_s"]).all()
    assert (ckpt["durable_rank_max_s"] <= ckpt["committed_s"]).all()
    assert table.loc[table["engine"] == "none", "tag"].isna().all()
    files = pd.read_csv(out / "files.csv")
    assert set(files["kind"]) >= {"layer", "model", "optimizer"}
    excluded = pd.read_csv(out / "excluded.csv")
    assert set(excluded["status"]) == {"failed", "incomplete", "skipped", "unreadable"}

    html = (out / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == len(report.FIGURES)  # self-contained
    assert "http://" not in html.replace("https://github.com/DataStates", "") and "<link" not in html
    for words in ("max over ranks", "fsync", "Skipped by design", "datastates", "start-up floor", "warm",
                  "Findings", "Least training stall", "Failed, incomplete or unreadable", "baseline.json"):
        assert words in html, words


@multirank
def test_summarize_without_a_baseline_says_so(study_logs, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(study_logs, logs, ignore=shutil.ignore_patterns("checkpoints", "baseline.json"))
    outputs = report.write_outputs(collect(logs), tmp_path / "out")
    assert "No baseline measured" in outputs.report.read_text()


@multirank
def test_each_run_measures_its_own_baseline(study_logs):
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (scripts/setup-env.sh installs it when run as root)")
    table = collect(study_logs).table()
    assert (table["baseline_write_MBps"] > 0).all() and (table["baseline_tool"] == "fio").all()


def test_summarize_on_a_missing_folder_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "is not a folder" in proc.stdout


#: gloo's timeout message: its brackets once read as rich markup ended summarize.py in a MarkupError traceback
GLOO_TIMEOUT = ("phase train failed: rank 0: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                "unbound_buffer.cc:129] Timed out waiting 600000ms for send operation to complete")


def test_summarize_on_a_folder_without_complete_runs(tmp_path):
    for engine, status, error in (("datastates", "skipped", "no datastates here"),
                                  ("decoupled", "failed", GLOO_TIMEOUT)):
        run = tmp_path / "logs" / "tiny" / "tp2pp2dp1" / engine / "20260101-000000"
        run.mkdir(parents=True)
        (run / "metadata.json").write_text(json.dumps({"status": status, "error": error, "preset": "tiny",
                                                       "layout": "tp2pp2dp1", "engine": engine}))
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(tmp_path / "logs")],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no datastates here" in proc.stdout and "no complete runs" in proc.stdout
    assert "[/__w/pytorch/pytorch/third_party/gloo" in " ".join(proc.stdout.split()), "printed as it is, not as markup"


# -- small pieces without runs ----------------------------------------------------------------------------


def test_event_reader_names_file_and_line(tmp_path):
    events = tmp_path / "run" / "events"
    events.mkdir(parents=True)
    good = {"event": "checkpoint.save", "phase": "train", "rank": 0, "time": 1.0, "start": 1.0, "duration_s": 0.5,
            "tag": "step2", "step": 2}
    path = events / "train-rank00000.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "duration_s": "slow"}) + "\n")
    with pytest.raises(EventFileError, match=r"train-rank00000.jsonl:3: .*'duration_s' should be a number"):
        read_events(tmp_path / "run")
    path.write_text(json.dumps(good) + "\n" + json.dumps({"phase": "train"}) + "\n")
    with pytest.raises(EventFileError, match=r"train-rank00000.jsonl:2: event record lacks event, rank"):
        read_events(tmp_path / "run")
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "event": "something.new", "x": 1}) + "\n")
    assert len(read_events(tmp_path / "run")) == 2  # events no reader checks are kept, unchecked


def test_run_folders_stop_at_run_folders(tmp_path):
    for name in ("a/run1", "a/run1/checkpoints/nested", "b/c/run2"):
        (tmp_path / name).mkdir(parents=True)
    for name in ("a/run1", "a/run1/checkpoints/nested", "b/c/run2"):
        (tmp_path / name / "metadata.json").write_text("{}")
    assert analysis.run_folders(tmp_path) == [tmp_path / "a/run1", tmp_path / "b/c/run2"]


def test_formatting():
    assert report.fmt_s(0.0042) == "4.2 ms" and report.fmt_s(0.057) == "57 ms" and report.fmt_s(1.234) == "1.23 s"
    assert report.fmt_s(None) == "—" and report.fmt_s(float("nan")) == "—"
    assert report.fmt_bytes(5_091_033) == "5.09 MB" and report.fmt_bytes(2122) == "2.12 kB"
    assert analysis.engine_order(["zeta", "dcp", "torch", "none"]) == ["none", "torch", "dcp", "zeta"]


# -- goodput and limits from hand-built tables (issue 18) ---------------------------------------------------


def tidy(*rows: dict) -> pd.DataFrame:
    """A tidy table as collect() makes it, every column absent from ``rows`` missing (NaN)."""
    base = {column: float("nan") for column in analysis.TABLE_COLUMNS} | {"preset": "tiny", "layout": "tp1pp1dp8",
                                                                         "ranks": 8, "iteration_s": 2.0}
    return pd.DataFrame([base | row for row in rows])


def one_config(engine: str, stalls: list[float], restart: float, slowdowns: list[float] | None = None,
               **common) -> list[dict]:
    """An engine's checkpoints (one row per stall, with its slowdown: 0 unless given) and its restart, in one run."""
    run = {"run_id": f"{engine}/run", "engine": engine, **common}
    slowdowns = slowdowns or [0.0] * len(stalls)
    return [*({**run, "kind": "checkpoint", "tag": f"step{i}", "stall_max_s": stall, "stall_min_s": stall,
               "slowdown_s": slowdown, "cost_s": stall + slowdown, "background_seen": True}
              for i, (stall, slowdown) in enumerate(zip(stalls, slowdowns))),
            {**run, "kind": "restart", "restart_s": restart, "restart_min_s": restart, "restores_checkpoint": True}]


def test_goodput_table_by_hand():
    """C = 18 s (median of the stalls 16, 18, 29), R = 120 s, 2 s iterations, F = 0.001 per GPU-hour on 1000 GPUs:
    M = 3600 s; τ* = √(2·18·3600) · (1 + √0.0025/3 + 0.0025/9) − 18 = 360 · 1.016944 − 18 = 348.10 s = 174.05
    iterations; checkpoints 18 / 366.10 = 4.917 %, re-done work 366.10 / 7200 = 5.085 %, restarts 120 / 3600 =
    3.333 %; goodput 86.665 %."""
    table = tidy(*one_config("torch", [16.0, 29.0, 18.0], 120.0), *one_config("none", [], 30.0))
    rows = analysis.goodput_table(table, failures_per_gpu_hour=0.001, gpus=1000)
    assert list(rows["engine"]) == ["torch"]  # engine none saves nothing: no interval to choose
    row = rows.iloc[0]
    assert (row["cost_s"], row["cost_basis"], row["restart_s"], row["iteration_s"]) == (18.0, "stall + slowdown",
                                                                                        120.0, 2.0)
    assert (row["gpus"], row["mtbf_s"]) == (1000, pytest.approx(3600.0))
    assert row["interval_s"] == pytest.approx(348.10, abs=0.005)
    assert row["interval_iterations"] == pytest.approx(174.05, abs=0.003)
    assert row["checkpoint_pct"] == pytest.approx(100 * 18 / 366.10, abs=1e-3)
    assert row["rework_pct"] == pytest.approx(100 * 366.10 / 7200, abs=1e-3)
    assert row["restart_pct"] == pytest.approx(100 / 30)
    assert row["goodput_pct"] == pytest.approx(86.665, abs=1e-3)
    assert set(rows.columns) == {*analysis.group_keys(table), *analysis.GOODPUT_COLUMNS}


def test_goodput_takes_the_whole_cost_not_the_stall():
    """An asynchronous engine that stalls 1 s but slows the iterations after it by 17 s costs what a synchronous one
    stalling 18 s costs: C = 18 s, the figures of test_goodput_table_by_hand. Without a measured slowdown (no clean
    iteration to compare with) C is unknown and the configuration has no goodput, rather than the stall alone."""
    table = tidy(*one_config("lazy", [1.0, 1.0, 1.0], 120.0, slowdowns=[15.0, 28.0, 17.0]))
    row = analysis.goodput_table(table, failures_per_gpu_hour=0.001, gpus=1000).iloc[0]
    assert (row["cost_s"], row["cost_basis"]) == (18.0, "stall + slowdown")
    assert row["interval_s"] == pytest.approx(348.10, abs=0.005) and row["goodput_pct"] == pytest.approx(86.665,
                                                                                                        abs=1e-3)
    unknown = tidy(*[{**r, "slowdown_s": float("nan"), "cost_s": float("nan")} if r["kind"] == "checkpoint" else r
                     for r in one_config("lazy", [1.0], 120.0)])
    assert analysis.goodput_table(unknown).empty


def test_goodput_on_the_runs_own_gpus_by_default():
    """No --gpus: each configuration's world size. 8 ranks at 125 failures per GPU-hour: M = 3600 / 1000 = 3.6 s;
    C = 0.5 s: τ* = √3.6 · (1 + √(0.5/7.2)/3 + 0.5/64.8) − 0.5 = 1.3879 s, below one 2 s iteration, so 2 s."""
    rows = analysis.goodput_table(tidy(*one_config("torch", [0.5], 1.0)), failures_per_gpu_hour=125)
    row = rows.iloc[0]
    assert (row["gpus"], row["mtbf_s"]) == (8, pytest.approx(3.6))
    assert (row["interval_s"], row["interval_iterations"]) == (2.0, 1.0)
    assert row["checkpoint_pct"] == pytest.approx(20.0) and row["rework_pct"] == pytest.approx(2.5 / 7.2 * 100)
    assert analysis.goodput_table(tidy(*one_config("torch", [0.5], 1.0)))["failures_per_gpu_hour"].iloc[0] \
        == goodput.LLAMA3_FAILURES_PER_GPU_HOUR


def test_goodput_needs_a_cost_a_restart_and_an_iteration():
    emulated = [{**r, "iteration_s": float("nan")} for r in one_config("torch", [1.0], 5.0)]
    no_restart = one_config("lazy", [1.0], float("nan"))
    assert analysis.goodput_table(tidy(*emulated, *no_restart)).empty
    assert analysis.goodput_table(tidy()).empty and analysis.goodput_table(pd.DataFrame()).empty


def test_goodput_assumptions_in_one_line():
    line = analysis.goodput_assumptions(goodput.LLAMA3_FAILURES_PER_GPU_HOUR, None)
    assert "1.97e-05 per GPU-hour (Llama 3" in line and "each run's own world size" in line
    assert "C = the whole cost of a checkpoint: its stall plus the slowdown" in line
    assert "R = the restart as measured on this machine" in line and "not yet" not in line
    assert "on 64 GPUs" in analysis.goodput_assumptions(0.001, 64) and "Llama" not in analysis.goodput_assumptions(
        0.001, 64)


def test_a_throughput_above_its_limit_is_flagged():
    """Above 105 % of the storage's measured bandwidth the baseline was measured too low; a warm restore is read
    from memory, which no disk limit bounds."""
    assert analysis.limit_note(None) is None and analysis.limit_note(104.9) is None
    assert analysis.limit_note(105.0) is None and analysis.limit_note(105.1) == "limit underestimated"
    assert analysis.limit_note(178.0, "cold") == "limit underestimated"
    assert analysis.limit_note(178.0, "remote") == "limit underestimated"
    assert analysis.limit_note(178.0, "warm") == "warm cache"
    flagged = tidy(*one_config("torch", [1.0, 1.0, 1.0], 5.0))
    flagged["write_limit"] = ["limit underestimated", None, None, None]
    flagged["read_limit"] = [None, None, None, "limit underestimated"]
    assert analysis.checkpoint_summary(flagged)["write_limit"].iloc[0] == "limit underestimated (1 of 3)"
    assert analysis.restart_summary(flagged)["read_limit"].iloc[0] == "limit underestimated (1 of 1)"
    assert analysis.checkpoint_summary(tidy(*one_config("torch", [1.0], 5.0)))["write_limit"].isna().all()


def hand_made_run(logs: Path) -> Path:
    """A complete one-rank run folder written through EventLog with chosen durations: iterations of 2 s, stalls of
    16 s and 20 s (C = 18 s), 1 GB written in 17 s (59 MB/s against a 10 MB/s baseline: 588 %), a restart of 120 s."""
    run = logs / "tiny" / "tp1pp1dp1" / "torch" / "20260101-000000-abcdef"
    run.mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({"status": "complete", "preset": "tiny", "layout": "tp1pp1dp1",
                                                   "engine": "torch", "world_size": 1, "device": "cpu"}))
    (run / "config.json").write_text(json.dumps({"model": {"preset": "tiny", "dtype": "fp32"},
                                                 "train": {"iters": 4, "save_interval": 2}}))
    (run / "baseline.json").write_text(json.dumps({"tool": "fio", "write_MBps": 10.0, "read_MBps": 1000.0}))
    train = EventLog(run, "train", 0)
    for step in range(1, 5):
        train.emit(Event.TRAIN_ITERATION, start=100.0 * step, duration_s=2.0, step=step)
        if step % 2 == 0:
            tag = f"step{step}"
            train.emit(Event.CHECKPOINT_SAVE, start=100.0 * step + 2, duration_s=2.0 * step + 12, tag=tag,
                       step=step)
            train.emit(Event.CHECKPOINT_DURABLE, tag=tag, step=step, since_save_start_s=17.0, bytes=10**9, n_files=1,
                       files=[{"path": f"{tag}/model.pt", "bytes": 10**9, "seconds": 1.0}])
            train.emit(Event.CHECKPOINT_COMMIT, tag=tag, step=step, since_save_start_s=17.5)
    train.close()
    restore = EventLog(run, "restore", 0)
    restore.emit(Event.PROCESS_START, start=1000.0, duration_s=1.0)
    restore.emit(Event.RESTORE_LOAD, start=1010.0, duration_s=5.0, tag="step4", bytes=10**9, n_files=1, cache="cold")
    restore.emit(Event.RESTORE_RESULT, tag="step4", exact=True, verified=True)
    restore.emit(Event.TRAIN_ITERATION, start=1118.0, duration_s=2.0, step=5, first_after_restore=True)
    restore.close()
    return run


def summarize(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_summarize_goodput_and_limits_from_a_hand_made_run(tmp_path):
    """The CLI on a run whose figures are known: the goodput table of test_goodput_table_by_hand (F = 0.001 on 1000
    GPUs), the checkpoint write flagged against its too-low baseline; then the defaults: Llama 3's rate on the run's
    own world size (1 GPU), and the goodput figure in the report."""
    hand_made_run(tmp_path / "logs")
    proc = summarize(tmp_path / "logs", "--out", tmp_path / "out", "--no-plots",
                     "--failures-per-gpu-hour", "0.001", "--gpus", "1000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stdout = " ".join(proc.stdout.split())
    assert "Goodput at the optimal checkpoint interval" in stdout and "0.001 per GPU-hour on 1000 GPUs" in stdout
    assert "C = the whole cost of a checkpoint: its stall plus the slowdown" in stdout
    assert "Limit underestimated: tiny · tp1pp1dp1 · torch wrote at 588% of the storage's measured bandwidth " \
           "(median; 2 of 2 above 105 %)" in stdout
    row = pd.read_csv(tmp_path / "out" / "goodput.csv").iloc[0]
    assert (row["cost_s"], row["restart_s"], row["iteration_s"], row["gpus"]) == (18.0, 120.0, 2.0, 1000)
    assert row["interval_s"] == pytest.approx(348.10, abs=0.005)
    assert row["goodput_pct"] == pytest.approx(86.665, abs=1e-3)
    study = pd.read_csv(tmp_path / "out" / "study.csv")
    assert study["write_limit"].dropna().tolist() == ["limit underestimated"] * 2 and study["read_limit"].isna().all()

    proc = summarize(tmp_path / "logs", "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = pd.read_csv(tmp_path / "report" / "goodput.csv").iloc[0]
    assert row["gpus"] == 1 and row["failures_per_gpu_hour"] == goodput.LLAMA3_FAILURES_PER_GPU_HOUR
    assert row["mtbf_s"] == pytest.approx(54 * 24 * 3600 * 16_384 / 419)
    assert (tmp_path / "report" / "goodput.png").stat().st_size > 1000
    html = (tmp_path / "report" / "report.html").read_text()
    assert "Goodput: the checkpoint interval" in html and "Llama 3: 419 interruptions" in html
    assert "each run&#x27;s own world size" in html and "Limit underestimated" in html


@pytest.mark.parametrize("option, value, words", [("--gpus", "0", "'0' is not a whole number above 0"),
                                                  ("--gpus", "2.5", "'2.5' is not a whole number"),
                                                  ("--failures-per-gpu-hour", "-1", "'-1' is not a number above 0"),
                                                  ("--failures-per-gpu-hour", "nan", "'nan' is not a number above 0")])
def test_summarize_refuses_a_bad_failure_model(tmp_path, option, value, words):
    proc = summarize(tmp_path, option, value)
    assert proc.returncode == 2 and words in proc.stderr


# -- the per-run record (restartbench.analysis.records) ------------------------------------------------------------


def backdate(logs: Path, seconds: float = 60.0) -> None:
    """Every file under ``logs`` modified ``seconds`` ago: a record is not kept beside inputs written within
    records.RACY_NS of it (an edit in the same clock tick could keep their modification time), and these fixtures
    were written just now."""
    when = time.time() - seconds
    for path in logs.rglob("*"):
        os.utime(path, (when, when))


def all_tables(collected: analysis.Collected) -> dict[str, pd.DataFrame]:
    return {name: getattr(collected, name)() for name in ("table", "rank_table", "file_table", "span_table",
                                                          "memory_table", "excluded_table")}


def assert_same_tables(expected: analysis.Collected, got: analysis.Collected) -> None:
    for name, frame in all_tables(expected).items():
        pd.testing.assert_frame_equal(frame, getattr(got, name)(), check_exact=True, obj=name)
    assert got.warnings == expected.warnings


def counting_reads(monkeypatch) -> list[Path]:
    """The folders the analysis reads from their events from now on (not from a record)."""
    read = []
    original = collecting.read_run

    def counted(run_dir):
        read.append(run_dir)
        return original(run_dir)
    monkeypatch.setattr(collecting, "read_run", counted)
    return read


def test_the_records_path_equals_the_events_path_table_for_table(mixed_logs, monkeypatch):
    """Real runs and the bad ones derived from them: the first collect keeps a record in every readable folder, the
    second reads those records and no events, and every table equals, cell for cell, the tables read from the
    events alone (and read in two worker processes)."""
    for record in mixed_logs.rglob(analysis.RECORD_FILE):  # kept in the real runs by tests before, and copied
        record.unlink()
    backdate(mixed_logs)
    events = collect(mixed_logs, keep_records=False)
    assert not list(mixed_logs.rglob(analysis.RECORD_FILE))
    first = collect(mixed_logs)
    unreadable = {e.run for e in first.excluded if e.status == "unreadable"}
    recorded = {p.parent for p in mixed_logs.rglob(analysis.RECORD_FILE)}
    assert recorded == set(analysis.run_folders(mixed_logs)) - unreadable and len(unreadable) == 3
    read = counting_reads(monkeypatch)
    second = collect(mixed_logs)
    assert set(read) == unreadable  # everything else came from its record
    for got in (first, second, collect(mixed_logs, keep_records=False, workers=2)):
        assert_same_tables(events, got)
    assert not events.table().empty and not events.memory_table().empty


def test_a_stale_record_is_never_used(study_logs, tmp_path, monkeypatch):
    """An event edited after the record was written (same size: only its modification time tells), an events file
    added, a record of other code, or a record whose inputs are not its run's: each is read from the events again."""
    run = tmp_path / "logs" / "run"
    shutil.copytree(real_runs(study_logs)[0], run, ignore=shutil.ignore_patterns("checkpoints", analysis.RECORD_FILE))
    backdate(run)
    before = collect(run).table()
    assert (run / analysis.RECORD_FILE).exists()
    stall = repr(float(before.loc[before["kind"] == "checkpoint", "stall_max_s"].iloc[0]))
    longer = "9" + stall[1:]  # the same length, a longer stall: its checkpoint's new maximum
    path = next(p for p in (run / "events").glob("train-rank*.jsonl") if stall in p.read_text())
    path.write_text(path.read_text().replace(stall, longer, 1))
    read = counting_reads(monkeypatch)
    after = collect(run).table()
    assert read == [run] and after.loc[after["kind"] == "checkpoint", "stall_max_s"].iloc[0] == float(longer)
    backdate(run)
    collect(run)  # read again (the edit was too recent to keep a record), its record kept
    assert collect(run).table().equals(after) and read == [run, run]  # then used
    (run / "events" / "restore-9-rank00000.jsonl").write_text("")  # an events file more
    collect(run)
    assert read == [run, run, run]


def test_a_record_of_other_code_or_other_inputs_is_not_used(study_logs, tmp_path, monkeypatch):
    """A planted figure in a current record shows (the record is what is read), but not once the record's code stamp
    or input fingerprint is not this code's and these inputs'."""
    run = tmp_path / "logs" / "run"
    shutil.copytree(real_runs(study_logs)[0], run, ignore=shutil.ignore_patterns("checkpoints", analysis.RECORD_FILE))
    backdate(run)
    truth = collect(run).table()["restart_s"].max()
    stored = json.loads((run / analysis.RECORD_FILE).read_text())
    rows = stored["record"]["tables"]["rows"]
    keys, columns = next(block for block in rows if "restart_s" in block[0] and "read_MBps" in block[0])
    columns[keys.index("restart_s")] = [123456.0] * len(decode_column(columns[0]))  # a plain list is a column too

    def planted(**changes) -> float:
        (run / analysis.RECORD_FILE).write_text(json.dumps({**stored, **changes}))
        return collect(run).table()["restart_s"].max()
    assert planted() == 123456.0
    assert planted(code="0" * 32) == truth
    inputs = [list(entry) for entry in stored["inputs"]]
    inputs[0][2] += 1  # metadata.json one nanosecond newer
    assert planted(inputs=inputs) == truth
    assert planted(inputs=stored["inputs"][:-1]) == truth  # an events file the record did not read


def test_no_record_beside_inputs_written_just_now(study_logs, tmp_path):
    """A folder written within records.RACY_NS has no record kept: an edit in the same clock tick could keep the
    modification time the record saw."""
    run = tmp_path / "logs" / "run"
    shutil.copytree(real_runs(study_logs)[0], run, ignore=shutil.ignore_patterns("checkpoints", analysis.RECORD_FILE))
    (run / "metadata.json").write_text((run / "metadata.json").read_text())
    assert not collect(run).table().empty
    assert not (run / analysis.RECORD_FILE).exists()
    assert not list(run.glob(f".{analysis.RECORD_FILE}.*"))  # no temporary file left either


def test_a_runs_own_baseline_is_kept_in_its_record(study_logs, tmp_path, monkeypatch):
    """A run folder's own baseline.json is read into its record, its rows kept with the baseline's columns filled in,
    and from there on every later collect reads them (a planted figure shows); one that warns is read again each time,
    its warning the same; editing it makes the record stale."""
    logs = tmp_path / "logs"
    own, bad = logs / "a" / "run", logs / "b" / "run"
    for run in (own, bad):
        shutil.copytree(real_runs(study_logs)[0], run,
                        ignore=shutil.ignore_patterns("checkpoints", analysis.RECORD_FILE))
    (own / "baseline.json").write_text(json.dumps({"tool": "fio", "write_MBps": 10.0, "read_MBps": 1000.0}))
    (bad / "baseline.json").write_text('{"tool": "fio"}')
    backdate(logs)
    events = collect(logs, keep_records=False)
    assert len(events.warnings) == 1 and (events.table()["baseline_write_MBps"] == 10.0).sum() > 0
    collect(logs)
    read = counting_reads(monkeypatch)
    assert_same_tables(events, collect(logs))
    assert read == []
    stored = json.loads((own / analysis.RECORD_FILE).read_text())
    assert stored["record"]["based"] and stored["record"]["baseline"]["write_MBps"] == 10.0
    for keys, columns in stored["record"]["tables"]["rows"]:
        columns[keys.index("baseline_write_MBps")] = [12.5] * len(decode_column(columns[0]))
    (own / analysis.RECORD_FILE).write_text(json.dumps(stored))
    assert set(collect(logs).table()["baseline_write_MBps"].dropna()) == {12.5}  # the record's, not the file's
    (own / "baseline.json").write_text(json.dumps({"tool": "fio", "write_MBps": 20.0, "read_MBps": 1000.0}))
    assert set(collect(logs).table()["baseline_write_MBps"].dropna()) == {20.0} and read == [own]

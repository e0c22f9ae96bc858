"""The restart's memory over time and deepspeed.initialize's stages, from the events to the report (issue 18): the
analysis puts every rank's memory timeline on the restart's clock, each sample in the part it fell in, and takes the
critical rank's stages; the restart figure splits its ds init bar into them and the memory figure draws the
timelines with the parts shaded. Real runs: the session's tiny runs (conftest.study_logs), read, never launched
here."""

import json
from pathlib import Path

import pandas as pd
import pytest

from restartbench import analysis, report
from restartbench.analysis import collect

multirank = pytest.mark.multirank


def _rank_events(run: Path, rank: int) -> list[dict]:
    """One rank's events of the run's own restore, read here straight from the JSON lines."""
    path = run / "events" / f"restore-rank{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def collected(study_logs):
    return collect(study_logs)


# -- the analysis: hand-made events ------------------------------------------------------------------------------


def test_a_timeline_moves_to_the_launch_clock_and_each_sample_to_its_part():
    """process.start began at 100 (the launch) and the process at 101; the timeline counts from the process's start,
    so its sample 0.5 s in is 1.5 s after the launch, inside imports (1.2-2.2 s); one 2.0 s in (3.0 s) is between
    parts. The train phase's timeline is not the restore's."""
    def event(name, phase="restore", **fields):
        return {"event": name, "phase": phase, "rank": 0, "attempt": 1, **fields}

    events = [event("process.start", start=100.0, duration_s=1.0),
              event("startup.imports", start=101.2, duration_s=1.0, start_rss_bytes=10, peak_rss_bytes=30),
              event("rank.memory", process_start=101.0, timeline=[[0.5, 20], [2.0, 40]], resolution_s=0.01),
              event("rank.memory", phase="train", process_start=50.0, timeline=[[0.1, 99]])]
    spans = analysis.restart_spans(events)
    assert [s["part"] for s in spans] == ["launch", "imports"]
    assert [t for s in spans for t in (s["start_s"], s["end_s"])] == pytest.approx([0.0, 1.0, 1.2, 2.2])
    samples = analysis.restart_memory(events, 1, spans)
    assert [(s["rss_bytes"], s["part"]) for s in samples] == [(20, "imports"), (40, None)]
    assert [s["t_s"] for s in samples] == pytest.approx([1.5, 3.0])


def test_the_max_over_ranks_holds_each_rank_between_its_samples():
    samples = pd.DataFrame({"rank": [0, 0, 0, 1, 1], "t_s": [0.0, 1.0, 2.0, 0.5, 1.5],
                            "rss_bytes": [10, 30, 5, 20, 8]})
    line = analysis.max_over_ranks(samples)
    assert line["t_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert line["rss_bytes"].tolist() == [10, 20, 30, 30, 5]  # rank 1 counts from 0.5 s to its last sample, 1.5 s


# -- the analysis: real runs -------------------------------------------------------------------------------------


@multirank
def test_every_ranks_restore_timeline_is_on_the_restart_clock_in_its_parts(collected):
    """Each rank's samples are its restore's rank.memory timeline, all of it, after its launch; a sample inside a
    part is never above the peak the rank measured for that part (unthinned): samples moved to the wrong time, or
    taken from the training phase, would land in parts whose peak they exceed."""
    table, memory, spans = collected.table(), collected.memory_table(), collected.span_table()
    restarts = table[table["kind"] == "restart"]
    assert len(restarts) == 3
    for _, row in restarts.iterrows():
        for rank in range(int(row["ranks"])):
            raw = [e for e in _rank_events(Path(row["run"]), rank) if e["event"] == "rank.memory"]
            mine = memory[(memory["run_id"] == row["run_id"]) & (memory["rank"] == rank)]
            assert len(raw) == 1 and len(mine) == len(raw[0]["timeline"]) > 10, (row["run_id"], rank)
            launch = spans[(spans["run_id"] == row["run_id"]) & (spans["rank"] == rank) & (spans["part"] == "launch")]
            assert mine["t_s"].is_monotonic_increasing and mine["t_s"].min() >= launch["end_s"].iloc[0]
            assert set(mine["part"].dropna()) >= {"imports", "model build", "ds init"}  # the parts of seconds
    inside = memory.dropna(subset=["part"]).merge(spans, on=["run_id", "attempt", "rank", "part"])
    assert len(inside) == memory["part"].notna().sum()
    over = inside[inside["rss_bytes"] > inside["peak_rss_bytes"]]
    assert over.empty, over[["run_id", "rank", "part", "t_s", "rss_bytes", "peak_rss_bytes"]]
    peaks = restarts.set_index("run_id")["restore_peak_rss_bytes"]
    assert (inside.groupby("run_id")["rss_bytes"].max() <= peaks.loc[inside["run_id"].unique()]).all()


@multirank
def test_the_critical_ranks_ds_init_stages_add_up_to_its_ds_init_part(collected):
    """The critical rank's stages are its own startup.ds_initialize's (collective wait and other included), and
    add up to its ds init part less what the span does around the timed call (milliseconds)."""
    restarts = collected.table().query("kind == 'restart'")
    for _, row in restarts.iterrows():
        [span] = [e for e in _rank_events(Path(row["run"]), int(row["path_rank"]))
                  if e["event"] == "startup.ds_initialize"]
        stages = row["path_ds_init_parts"]
        assert stages == {**span["parts"], "collective wait": span["collective_wait_s"], "other": span["other_s"]}
        assert row["path_ds_init_s"] == span["duration_s"]
        assert 0 <= row["path_ds_init_s"] - sum(stages.values()) <= max(0.03, 0.03 * row["path_ds_init_s"])
    summary = analysis.ds_init_summary(collected.table(), column="path_ds_init_parts")
    keys = analysis.group_keys(collected.table())
    merged = summary.merge(analysis.restart_summary(collected.table())[[*keys, "path_ds_init_s"]], on=keys)
    assert len(merged) == 3
    # one run each: its own call, less what the span does around it (the per-row bound above; it grows with load)
    around = merged["path_ds_init_s"] - merged["parts_sum_s"]
    assert ((around >= 0) & (around <= (0.03 * merged["path_ds_init_s"]).clip(lower=0.03))).all(), around


# -- the figures ---------------------------------------------------------------------------------------------------


def _gids(ax, prefix: str) -> list:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


@multirank
def test_the_restart_figure_splits_its_ds_init_bar_into_the_stages(collected):
    """Under each bar's ds init part, its stages fill exactly its width from its left edge; the collective waits are
    hatched on white (not work), and the legend names every stage drawn."""
    table = collected.table()
    fig = report.plot_restart_phases(table)
    strips = 0
    for ax in fig.axes:
        bars = sorted(_gids(ax, "part:ds init"), key=lambda p: p.get_y())
        stages = _gids(ax, "ds init stage:")
        for bar in bars:
            below = [p for p in stages if bar.get_y() - 0.5 < p.get_y() < bar.get_y()]
            assert below, "a ds init bar without its stages"
            assert min(p.get_x() for p in below) == pytest.approx(bar.get_x())
            assert sum(p.get_width() for p in below) == pytest.approx(bar.get_width())
            strips += 1
            waits = [p for p in below if p.get_gid() == "ds init stage:collective wait"]
            assert waits and all(p.get_hatch() and p.get_facecolor()[:3] == (1, 1, 1) for p in waits)
            assert all(not p.get_hatch() for p in below if p not in waits)
    assert strips == 3
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"collective wait (for other ranks)", "optimizer_sanity_check"} <= legend


@multirank
def test_the_memory_figure_draws_each_restart_with_its_parts(collected):
    """One panel per configuration: the black line is the max over ranks of that restart's samples, the shaded spans
    are its critical rank's parts where the span table has them, and the subtitle says what was measured."""
    table, memory, spans = collected.table(), collected.memory_table(), collected.span_table()
    fig = report.plot_restart_memory(table, memory, spans)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    drawn = analysis.typical_restarts(table)
    assert len(panels) == len(drawn) == 3
    for ax, (_, row) in zip(panels, drawn.iterrows()):
        samples = memory[(memory["run_id"] == row["run_id"]) & (memory["attempt"] == row["attempt"])]
        [line] = [line for line in ax.lines if line.get_gid() == "max over ranks"]
        envelope = analysis.max_over_ranks(samples)  # itself checked by hand above
        assert list(line.get_xdata()) == list(envelope["t_s"]) and list(line.get_ydata()) == list(envelope["rss_bytes"])
        assert max(line.get_ydata()) == samples["rss_bytes"].max()
        critical = spans[(spans["run_id"] == row["run_id"]) & (spans["rank"] == row["path_rank"])]
        shaded = {p.get_gid().removeprefix("part:"): (p.get_x(), p.get_x() + p.get_width())
                  for p in _gids(ax, "part:")}
        assert shaded == {s["part"]: (pytest.approx(s["start_s"]), pytest.approx(s["end_s"]))
                          for _, s in critical.iterrows()}
        assert row["engine"] in ax.get_title() and f"{row['cache']} cache" in ax.get_title()
    subtitle = " ".join(t.get_text() for t in fig.texts)
    assert "host RSS sampled at 100 Hz" in subtitle and "critical rank's restart parts" in subtitle


def test_without_timelines_the_memory_figure_says_so():
    empty = pd.DataFrame(columns=list(analysis.MEMORY_COLUMNS))
    fig = report.plot_restart_memory(pd.DataFrame(), empty, pd.DataFrame(columns=list(analysis.SPAN_COLUMNS)))
    assert "No memory over time" in fig.axes[0].texts[0].get_text()


@multirank
def test_the_report_shows_both_with_their_tables(collected, tmp_path):
    outputs = report.write_outputs(collected, tmp_path / "out")
    html = outputs.report.read_text()
    assert "<h2>Host memory during the restart</h2>" in html and "steady training's peak" in html
    assert "splits <code>deepspeed.initialize</code> into DeepSpeed's own set-up stages" in html
    assert "deepspeed.initialize in its stages, the critical rank" in html
    written = pd.read_csv(outputs.out / "restart_memory.csv")
    assert len(written) == len(collected.memory_table()) and set(analysis.MEMORY_COLUMNS) <= set(written.columns)
    assert (outputs.out / "restart_spans.csv").stat().st_size > 0

"""The aggregation rules (README "Run folder" and "Analysis", restartbench.results) checked on a run folder
written by hand: four ranks on two nodes whose figures all differ, so that max, min, mean, median, the first
rank and the last rank give different numbers and any aggregation but the rule fails. Every expected figure
is a literal worked out by hand from the per-rank numbers below, never one computed by the code under test."""

import json
from pathlib import Path

import pandas as pd
import pytest

from restartbench import analysis, results
from restartbench.events import EventLog, RecordsExistError, events_file, read_events
from restartbench.rundir import RunFolderError, RunPlan

RANKS = (0, 1, 2, 3)
NODES = ("a", "a", "b", "b")

# -- phase 1: iterations 1-6, a checkpoint after 2, 4 and 6 (engine lazy) ----------------------------------

#: per step: the iteration time of rank 0; rank r takes 0.01·r longer. Step 1 (warm-up) is not counted.
ITERATION_S = {1: 5.00, 2: 0.17, 3: 0.22, 4: 0.37, 5: 0.12, 6: 0.27}
CHECKPOINTS = {"step2": 2, "step4": 4, "step6": 6}
#: per tag, per rank
SAVE_S = {"step2": (0.40, 0.20, 0.10, 0.60), "step4": (0.25, 0.35, 0.15, 0.05), "step6": (0.15, 0.20, 0.30, 0.10)}
WAIT_DURABLE_S = {"step2": (0.05, 0.15, 0.02, 0.08), "step4": (0.03, 0.01, 0.04, 0.02),
                  "step6": (0.06, 0.07, 0.05, 0.04)}
DURABLE_S = {"step2": (1.20, 1.60, 1.00, 1.50), "step4": (0.70, 0.50, 0.90, 0.60), "step6": (0.60, 0.80, 0.70, 0.65)}
#: (tag, rank): the lazy engine's later waits of training for that save's copies
COPY_WAIT_S = {("step2", 2): (0.30, 0.50)}
COMMITTED_S = {"step2": 1.75, "step4": 1.05, "step6": 0.95}
CHECKSUM_S = 2.00  # hashing for the manifest: an integrity cost, in neither the stall nor the durable time
#: per rank: (files, bytes), the same for every checkpoint
WRITTEN = ((3, 3_000_000), (1, 9_000_000), (5, 1_000_000), (2, 4_000_000))

# -- phase 2: the restore of step6, each rank's spans back to back from its node's launch ---------------------

LAUNCH = (1000.0, 1000.0, 1000.5, 1000.5)  # launch.sh's timestamp: node b started 0.5 s after node a
RESTORE_SPANS_S = {
    "process.start": (1.00, 1.50, 1.20, 1.10),
    "startup.imports": (2.00, 2.50, 2.20, 2.10),
    "startup.dist_init": (0.10, 0.30, 0.20, 0.15),
    "startup.model_build": (0.20, 0.10, 0.40, 0.30),
    "startup.ds_initialize": (3.00, 1.50, 2.50, 3.20),
    "startup.engine": (0.05, 0.02, 0.01, 0.03),
    "restore.check_files": (0.10, 0.10, 0.10, 0.10),
    "restore.load": (0.50, 0.90, 0.70, 0.60),
    "restore.verify": (0.10, 0.10, 0.20, 0.10),
    "train.iteration": (0.40, 0.30, 0.90, 0.10),
}
# launch -> end of the first resumed iteration, the sums of each rank's spans: 7.45, 7.32, 8.41, 7.78 s;
# ready to train (launch -> start of that iteration): 7.05, 7.02, 7.51, 7.68 s.
READ = ((5, 4_000_000), (7, 6_000_000), (2, 1_000_000), (3, 2_000_000))  # per rank: (files, bytes)
READ_DESERIALIZE_S = (0.40, 0.60, 0.65, 0.50)
RESTORED = "step6"  # the latest checkpoint
RESIDENT_FRACTION = 0.25  # the largest of the nodes', the same on every rank (gathered before the load)

BASELINE = {"tool": "fio", "write_MBps": 42.5, "read_MBps": 130.0}


# -- the run folder --------------------------------------------------------------------------------------------


def write_checkpoint(log: EventLog, tag: str, rank: int) -> None:
    step = CHECKPOINTS[tag]
    n_files, total = WRITTEN[rank]
    files = [{"path": f"{tag}/rank{rank}-part{i}.pt", "bytes": total // n_files, "seconds": 0.01}
             for i in range(n_files)]
    log.emit("checkpoint.begin", step=step, tag=tag, engine="lazy")
    log.emit("checkpoint.save", start=10.0 * step, duration_s=SAVE_S[tag][rank], step=step, tag=tag, engine="lazy")
    log.emit("checkpoint.wait_durable", start=10.0 * step + 0.5, duration_s=WAIT_DURABLE_S[tag][rank], step=step,
             tag=tag)
    log.emit("checkpoint.durable", step=step, tag=tag, since_save_start_s=DURABLE_S[tag][rank], files=files,
             bytes=total, n_files=n_files)
    log.emit("checkpoint.checksum", start=10.0 * step + 2.0, duration_s=CHECKSUM_S, step=step, tag=tag)
    if rank == 0:
        log.emit("checkpoint.commit", step=step, tag=tag, since_save_start_s=COMMITTED_S[tag])
    for seconds in COPY_WAIT_S.get((tag, rank), ()):
        log.emit("checkpoint.copy_wait", tag=tag, step=step, duration_s=seconds)


def write_training(run_dir: Path, rank: int) -> None:
    """Phase 1 of one rank. Span starts are arbitrary here: no phase-1 figure reads them."""
    log = EventLog(run_dir, "train", rank)
    for step, seconds in ITERATION_S.items():
        log.emit("train.iteration", start=10.0 * step - 1.0, duration_s=seconds + 0.01 * rank, step=step, loss=7.0)
        for tag in (t for t, s in CHECKPOINTS.items() if s == step):
            write_checkpoint(log, tag, rank)
    log.emit("phase.end")
    log.close()


def write_restore(run_dir: Path, rank: int, exact: bool, attempt: int = 1, later_s: float = 0.0) -> None:
    """Phase 2 of one rank: its spans back to back from its node's launch, in the order a rank runs them (a
    relaunch's ``attempt`` ``later_s`` seconds after the first)."""
    log = EventLog(run_dir, "restore", rank, attempt)
    n_files, total = READ[rank]
    fields = {
        "process.start": {"host": NODES[rank], "node": NODES[rank], "node_rank": rank // 2,
                          "local_rank": rank % 2, "pid": 100 + rank},
        "startup.engine": {"engine": "lazy"},
        "restore.check_files": {"tag": RESTORED, "problems": []},
        "restore.load": {"tag": RESTORED, "engine": "lazy", "cache": "warm", "resident_fraction": RESIDENT_FRACTION,
                         "cache_requested": "cold", "n_files": n_files, "bytes": total,
                         "read_deserialize_s": READ_DESERIALIZE_S[rank]},
        "restore.verify": {"tag": RESTORED},
        "train.iteration": {"step": 7, "first_after_restore": True, "loss": 6.5},
    }
    clock = LAUNCH[rank] + later_s
    for event, durations in RESTORE_SPANS_S.items():
        log.emit(event, start=clock, duration_s=durations[rank], **fields.get(event, {}))
        clock += durations[rank]
    log.emit("restore.result", tag=RESTORED, exact=exact, verified=True, problems=[] if exact else ["weights differ"],
             loss=6.5)
    log.emit("phase.end")
    log.close()


def write_run(root: Path, inexact_rank: int | None = None) -> Path:
    """A complete run folder with what ``analysis.collect`` reads: metadata.json (status and identity), config.json
    (the save interval, for the stall overhead), baseline.json and every rank's events of both phases."""
    run_dir = root / "tiny" / "tp1pp2dp2" / "lazy" / "20260101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "metadata.json").write_text(json.dumps({"status": "complete", "preset": "tiny", "layout": "tp1pp2dp2",
                                                       "engine": "lazy", "world_size": len(RANKS)}))
    (run_dir / "config.json").write_text(json.dumps({"train": {"save_interval": 2}}))
    (run_dir / "baseline.json").write_text(json.dumps(BASELINE))
    for rank in RANKS:
        write_training(run_dir, rank)
        write_restore(run_dir, rank, exact=rank != inexact_rank)
    return run_dir


@pytest.fixture
def run(tmp_path) -> Path:
    return write_run(tmp_path / "logs")


def table_row(run_dir: Path, kind: str, tag: str) -> dict:
    table = analysis.collect(run_dir.parents[3]).table()
    row = table[(table["kind"] == kind) & (table["tag"] == tag)]
    assert len(row) == 1
    return row.iloc[0].to_dict()


# -- expected figures, by hand ---------------------------------------------------------------------------------

#: step2: stalls per rank 0.40, 0.20, 0.10 + 0.30 + 0.50 = 0.90 (rank 2's copy waits), 0.60
STEP2 = {
    "tag": "step2", "step": 2, "stall_max_s": 0.90, "stall_min_s": 0.20, "wait_durable_max_s": 0.15,
    "durable_rank_max_s": 1.60, "committed_s": 1.75, "bytes": 17_000_000, "files": 11, "bytes_per_rank_max": 9_000_000,
}
STEP4 = {
    "tag": "step4", "step": 4, "stall_max_s": 0.35, "stall_min_s": 0.05, "wait_durable_max_s": 0.04,
    "durable_rank_max_s": 0.90, "committed_s": 1.05, "bytes": 17_000_000, "files": 11, "bytes_per_rank_max": 9_000_000,
}
STEP6 = {
    "tag": "step6", "step": 6, "stall_max_s": 0.30, "stall_min_s": 0.10, "wait_durable_max_s": 0.07,
    "durable_rank_max_s": 0.80, "committed_s": 0.95, "bytes": 17_000_000, "files": 11, "bytes_per_rank_max": 9_000_000,
}
RESTART_PARTS = {"launch": 1.50, "imports": 2.50, "dist init": 0.30, "model build": 0.40, "ds init": 3.20,
                 "engine setup": 0.05, "convert": None, "ckpt load": 0.90, "1st iter": 0.90}  # convert: none


#: A restart on the run's own layout: no other layout, no conversion; and no prefetch (--lazy-prefetch).
NO_RELAYOUT = {"restore_layout": None, "loss_diff": None, "convert_files_read": None, "convert_bytes_read": None,
               "convert_files_written": None, "convert_bytes_written": None,
               "prefetched": False, "prefetch_read_s": None, "prefetch_wait_s": None}


# -- restartbench.results ----------------------------------------------------------------------------------------


def test_checkpoints_take_the_max_over_ranks_and_sum_what_they_wrote(run):
    rows = results.checkpoints(read_events(run))
    assert rows == [pytest.approx({**step, "ranks": 4}) for step in (STEP2, STEP4, STEP6)]


def test_restart_is_the_slowest_rank_and_each_part_its_max_over_ranks(run):
    info = results.restart(read_events(run))
    assert info["total_s"] == pytest.approx(8.41)  # rank 2, launched with node b at 1000.5
    assert info["parts"] == pytest.approx(RESTART_PARTS)
    assert info.pop("checks") == pytest.approx({"check files": 0.10, "cache": None, "verify": 0.20})
    assert {k: v for k, v in info.items() if k not in ("total_s", "parts")} == pytest.approx({
        "attempt": 1, "tag": RESTORED, "fell_back_from": None, "bytes_read": 13_000_000, "files_read": 17,
        "process_bytes_read": None,
        "cache": "warm", "resident_fraction": 0.25, "exact": True, "verdict": "exact", "peak_rss_bytes": None,
        "peak_rss_part": None, "ds_init": None, **NO_RELAYOUT})


def test_a_restore_is_exact_only_if_every_rank_restored_exactly(tmp_path):
    run_dir = write_run(tmp_path / "logs", inexact_rank=2)
    assert results.restart(read_events(run_dir))["exact"] is False
    assert table_row(run_dir, "restart", RESTORED)["exact"] == False  # noqa: E712 - a numpy bool


def test_iteration_time_is_the_median_over_steps_of_the_slowest_rank(run):
    # slowest rank (3) per step: 0.20, 0.25, 0.40, 0.15, 0.30; step 1 is warm-up
    assert results.iteration_time(read_events(run)) == pytest.approx(0.25)


def test_the_study_prints_the_rules_figures(run):
    write_plan(run, run / "checkpoints")
    assert results.summarize_run(run) == [
        "iteration time without checkpoint: 0.250 s (median; max over ranks)",
        "checkpoint step2: 17.0 MB in 11 files from 4 ranks; training stalled 0.900 s (max over ranks); "
        "since the first rank began its save, durable after 1.600 s (fsync'd, max over ranks), committed after "
        "1.750 s",
        "checkpoint step4: 17.0 MB in 11 files from 4 ranks; training stalled 0.350 s (max over ranks); "
        "since the first rank began its save, durable after 0.900 s (fsync'd, max over ranks), committed after "
        "1.050 s",
        "checkpoint step6: 17.0 MB in 11 files from 4 ranks; training stalled 0.300 s (max over ranks); "
        "since the first rank began its save, durable after 0.800 s (fsync'd, max over ranks), committed after "
        "0.950 s",
        "restart from step6 (warm page cache): 8.41 s from launch to end of first iteration (max over ranks); "
        "parts (s, max over ranks): launch 1.50, imports 2.50, dist init 0.30, model build 0.40, ds init 3.20, "
        "engine setup 0.05, ckpt load 0.90, 1st iter 0.90; besides them the harness's own checks, which a job's "
        "restart does not make: check files 0.10, verify 0.20",
        "restore exact (state and resumed loss verified)",
    ]


# -- restartbench.analysis ---------------------------------------------------------------------------------------


def test_checkpoint_row_of_the_table(run):
    row = table_row(run, "checkpoint", "step2")
    expected = {
        **STEP2, "ranks_saved": 4, "ranks": 4, "iteration_s": 0.25,
        "stall_median_s": 0.50, "stall_rank": 2,
        "stall_iterations": 0.90 / 0.25, "stall_overhead_pct": 100 * 0.90 / (2 * 0.25 + 0.90),
        "durable_rank_min_s": 1.00, "durable_rank": 1,
        "bytes_per_rank_min": 1_000_000, "files_per_rank_max": 5, "files_per_rank_min": 1,
        "write_MBps": 17 / 1.60, "write_pct_of_storage": 100 * (17 / 1.60) / 42.5,
        "save_MiBps": 17_000_000 / 2**20 / 1.60, "baseline_write_MBps": 42.5,
    }
    assert {column: row[column] for column in expected} == pytest.approx(expected)


def test_restart_row_of_the_table(run):
    row = table_row(run, "restart", RESTORED)
    expected = {
        "restart_s": 8.41, "restart_min_s": 7.32, "restart_rank": 2,
        **{column: RESTART_PARTS[label] for column, label in analysis.RESTART_PART_COLUMNS
           if RESTART_PARTS[label] is not None},
        "restores_checkpoint": True, "bytes_read": 13_000_000, "files_read": 17, "read_deserialize_max_s": 0.65,
        "read_MBps": 13 / 0.90, "read_pct_of_storage": 100 * (13 / 0.90) / 130.0,
        "load_MiBps": 13_000_000 / 2**20 / 0.90, "cache": "warm", "resident_fraction": 0.25, "exact": True,
    }
    assert {column: row[column] for column in expected} == pytest.approx(expected)
    assert pd.isna(row["restart_convert_s"]) and row["restore_layout"] == row["layout"], "no conversion, same layout"


def test_critical_path_is_the_last_rank_ready_and_adds_up_to_the_restart(run):
    row = table_row(run, "restart", RESTORED)
    # rank 3 started its first iteration last (7.68 s after launch); the rest of the 8.41 s is that iteration
    # (these spans are back to back: no gaps; no restore.cache span here, as in a run from before it was recorded)
    path = {"launch": 1.10, "imports": 2.10, "dist init": 0.15, "model build": 0.30, "ds init": 3.20,
            "engine setup": 0.03, "check files": 0.10, "ckpt load": 0.60, "verify": 0.10, "gaps": 0.0,
            "1st iter": 0.73}
    assert row["path_rank"] == 3 and pd.isna(row["path_convert_s"]) and pd.isna(row["path_cache_s"])
    assert {label: row[column] for column, label in analysis.PATH_COLUMNS
            if label not in ("convert", "cache")} == pytest.approx(path)
    # without the harness's checks: 8.41 less rank 3's manifest check (0.10) and verify (0.10)
    assert row["restart_less_checks_s"] == pytest.approx(8.21)


def _span(rank: int, event: str, start: float, duration: float, **fields) -> dict:
    return {"event": event, "phase": "restore", "rank": rank, "attempt": 1, "time": start + duration,
            "start": start, "duration_s": duration, **fields}


def test_the_harness_checks_are_path_parts_and_left_out_of_restart_less_checks():
    """One rank's restore with every harness span (two manifest checks: a fallback), gaps between the spans and a
    verify after the first resumed iteration (not on the path): the path parts add up to the restart, and
    restart_less_checks_s is the restart less the checks on the path."""
    events = [_span(0, "process.start", 100.0, 1.0), _span(0, "startup.imports", 101.0, 2.0),
              _span(0, "startup.engine", 103.0, 0.5),
              _span(0, "restore.check_files", 103.75, 0.25, problems=["damaged"]),  # 0.25 s gap before it
              _span(0, "restore.check_files", 104.0, 0.5, problems=[]),
              _span(0, "restore.cache", 104.5, 1.5, cache="cold"), _span(0, "restore.load", 106.0, 3.0),
              _span(0, "restore.verify", 109.25, 0.75),  # 0.25 s gap before it
              _span(0, "train.iteration", 110.0, 2.0, step=7, first_after_restore=True),
              _span(0, "restore.verify", 112.0, 9.0)]  # after the first resumed iteration: not in the restart
    ranks = analysis.rank_restarts(events)
    assert {key: ranks[0][key] for key in ("check_files_s", "cache_s", "verify_s", "restart_s", "ready_s")} \
        == pytest.approx({"check_files_s": 0.75, "cache_s": 1.5, "verify_s": 0.75, "restart_s": 12.0,
                          "ready_s": 10.0})
    assert results.harness_checks(events) == pytest.approx({"check files": 0.75, "cache": 1.5, "verify": 0.75})
    path = analysis.critical_path(ranks, 12.0)
    parts = {label: path[column] for column, label in analysis.PATH_COLUMNS if path[column] is not None}
    assert parts == pytest.approx({"launch": 1.0, "imports": 2.0, "engine setup": 0.5, "check files": 0.75,
                                   "cache": 1.5, "ckpt load": 3.0, "verify": 0.75, "gaps": 0.5, "1st iter": 2.0})
    assert sum(parts.values()) == pytest.approx(12.0)
    assert path["restart_less_checks_s"] == pytest.approx(12.0 - 0.75 - 1.5 - 0.75)
    # a run without the harness's spans (engine none, an older run): the restart less what it has, nothing
    bare = [e for e in events if not e["event"].startswith(("restore.check", "restore.cache", "restore.verify"))]
    assert analysis.critical_path(analysis.rank_restarts(bare), 12.0)["restart_less_checks_s"] == pytest.approx(12.0)


def test_rank_table_keeps_every_ranks_own_figures(run):
    ranks = analysis.collect(run.parents[3]).rank_table()
    step2 = ranks[(ranks["kind"] == "checkpoint") & (ranks["tag"] == "step2")].sort_values("rank")
    restart = ranks[ranks["kind"] == "restart"].sort_values("rank")
    assert list(step2["rank"]) == list(RANKS) and list(restart["rank"]) == list(RANKS)
    assert list(step2["stall_s"]) == pytest.approx([0.40, 0.20, 0.90, 0.60])
    assert list(step2["copy_wait_s"]) == pytest.approx([0.0, 0.0, 0.80, 0.0])
    assert list(step2["durable_s"]) == pytest.approx([1.20, 1.60, 1.00, 1.50])
    assert list(step2["bytes"]) == [3_000_000, 9_000_000, 1_000_000, 4_000_000]
    assert list(restart["restart_s"]) == pytest.approx([7.45, 7.32, 8.41, 7.78])
    assert list(restart["bytes_read"]) == [4_000_000, 6_000_000, 1_000_000, 2_000_000]


def test_summaries_the_console_prints(run):
    """analysis/summarize.py's tables. Each checkpoint figure is the median over the run's three checkpoints, which
    here is always step4's (neither the first nor the last checkpoint, nor the mean)."""
    table = analysis.collect(run.parents[3]).table()
    checkpoints = analysis.checkpoint_summary(table).iloc[0].to_dict()
    expected = {
        "runs": 1, "checkpoints": 3, "ranks": 4, "stall_s": 0.35, "stall_rank_spread_s": 0.35 - 0.05,
        "durable_s": 0.90, "committed_s": 1.05, "bytes": 17_000_000, "files": 11,
        "write_MBps": 17 / 0.90, "write_pct_of_storage": 100 * (17 / 0.90) / 42.5,
        "stall_overhead_pct": 100 * 0.35 / (2 * 0.25 + 0.35),
    }
    assert {column: checkpoints[column] for column in expected} == pytest.approx(expected)
    restart = analysis.restart_summary(table).iloc[0].to_dict()
    expected = {
        "runs": 1, "restart_s": 8.41, "rank_spread_s": 8.41 - 7.32,
        **{column: RESTART_PARTS[label] for column, label in analysis.RESTART_PART_COLUMNS
           if RESTART_PARTS[label] is not None},
        "bytes_read": 13_000_000, "read_MBps": 13 / 0.90, "read_pct_of_storage": 100 * (13 / 0.90) / 130.0,
        "cache": "warm", "exact": True,
    }
    assert {column: restart[column] for column in expected} == pytest.approx(expected)


# -- runs that did not go to plan, and the run folder's other readers ---------------------------------------------


def write_events(run_dir: Path, phase: str, rank: int, *records: tuple[str, dict]) -> None:
    """One rank's events of one phase, as (event, fields) in the order the rank emitted them."""
    log = EventLog(run_dir, phase, rank)
    for event, fields in records:
        log.emit(event, **fields)
    log.close()


def back_to_back(launch: float, *spans: tuple[str, float, dict]) -> list[tuple[str, dict]]:
    """Spans as a rank runs them, each starting where the one before ended, the first at its node's launch."""
    records, clock = [], launch
    for event, seconds, fields in spans:
        records.append((event, {"start": clock, "duration_s": seconds, **fields}))
        clock += seconds
    return records


def write_plan(run_dir: Path, checkpoint_dir: str | Path, remote: dict | None = None) -> None:
    """The plan.json of a one-node CPU run of this file's layout; its readers here use the checkpoint folder."""
    RunPlan(preset={"name": "tiny"}, layout={"tp": 1, "pp": 2, "dp": 2}, layout_name="tp1pp2dp2", world_size=4,
            nnodes=1, nproc_per_node=4, device="cpu", backend="gloo", grad_accum=2, run_dir=str(run_dir),
            checkpoint_dir=str(checkpoint_dir), master_port=29500, checkpoint_bytes_estimate=17_000_000,
            memory_per_rank_estimate="0.1 GiB", launcher="local", remote=remote).save(run_dir)


def write_files(folder: Path, sizes: dict[str, int]) -> None:
    """Files of the given sizes under ``folder`` (sparse: only the size is set)."""
    for name, size in sizes.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        with open(folder / name, "wb") as handle:
            handle.truncate(size)


#: A two-rank phase 1 that died: step1 committed; step2 failed (rank 1 could not make its files durable, rank 0
#: recorded why); step3 begun on both ranks, which were killed before either recorded its save.
STEP1_WRITTEN = ({"path": "step1/mp_rank_00_model_states.pt", "bytes": 100, "seconds": 0.01},
                 {"path": "step1/zero_pp_rank_1_mp_rank_00_optim_states.pt", "bytes": 300, "seconds": 0.01})
STEP2_ERRORS = ["the checkpoint folder /ckpt is full: 0.1 MB free", "rank 1: OSError: No space left on device"]


def died_rank(rank: int) -> list[tuple[str, dict]]:
    """One rank's events of the died phase 1; rank 0 alone commits, makes step2 durable and records its failure."""
    step1, step2 = {"step": 1, "tag": "step1"}, {"step": 2, "tag": "step2"}
    written = STEP1_WRITTEN[rank]
    records = [
        ("train.iteration", {"start": 0.0, "duration_s": 0.5, "step": 1, "loss": 7.0}),
        ("checkpoint.begin", step1),
        ("checkpoint.save", {"start": 1.0, "duration_s": (0.30, 0.20)[rank], **step1}),
        ("checkpoint.wait_durable", {"start": 1.5, "duration_s": (0.02, 0.03)[rank], **step1}),
        ("checkpoint.durable", {"since_save_start_s": (0.80, 0.90)[rank], "files": [written],
                                "bytes": written["bytes"], "n_files": 1, **step1}),
    ]
    if rank == 0:
        records.append(("checkpoint.commit", {"since_save_start_s": 1.00, **step1}))
    records += [
        ("train.iteration", {"start": 3.0, "duration_s": 0.5, "step": 2, "loss": 6.9}),
        ("checkpoint.begin", step2),
        ("checkpoint.save", {"start": 4.0, "duration_s": (0.25, 0.45)[rank], **step2}),
    ]
    if rank == 0:
        files = [{"path": "step2/mp_rank_00_model_states.pt", "bytes": 100, "seconds": 0.01}]
        records += [
            ("checkpoint.wait_durable", {"start": 4.5, "duration_s": 0.04, **step2}),
            ("checkpoint.durable", {"since_save_start_s": 0.70, "files": files, "bytes": 100, "n_files": 1, **step2}),
            ("checkpoint.failed", {"errors": STEP2_ERRORS, "target": "/ckpt", **step2}),
        ]
    else:
        records.append(("checkpoint.wait_durable", {"start": 4.5, "duration_s": 0.06,
                                                    "error": "OSError: No space left on device", **step2}))
    return [*records, ("train.iteration", {"start": 6.0, "duration_s": 0.5, "step": 3, "loss": 6.8}),
            ("checkpoint.begin", {"step": 3, "tag": "step3"})]


@pytest.fixture
def died(tmp_path) -> Path:
    """The died phase 1's run folder: what the checkpoint folder holds afterwards is step1, its manifest, ``latest``
    and the partial file a killed rank left of step3 (the failed step2 was removed)."""
    run_dir = tmp_path / "died"
    for rank in (0, 1):
        write_events(run_dir, "train", rank, *died_rank(rank))
    write_plan(run_dir, run_dir / "checkpoints")
    write_files(run_dir / "checkpoints", {"step1/mp_rank_00_model_states.pt": 100, "step1/manifest.json": 50,
                                          "step1/zero_pp_rank_1_mp_rank_00_optim_states.pt": 300,
                                          "step3/layer_01-model_00-model_states.pt": 20})
    (run_dir / "checkpoints" / "latest").write_text("step1\n")
    return run_dir


def test_a_died_phase_loses_its_failed_and_its_uncommitted_checkpoints(died):
    lost = "begun, never committed: the phase died during the save"
    assert results.failed_checkpoints(died, phase_failed=True) == [
        {"tag": "step2", "error": "; ".join(STEP2_ERRORS), "latest_kept": "step1"},
        {"tag": "step3", "error": lost, "latest_kept": "step1"},
    ]


def test_a_phase_that_ended_loses_only_its_failed_checkpoints(died):
    assert results.failed_checkpoints(died, phase_failed=False) == [
        {"tag": "step2", "error": "; ".join(STEP2_ERRORS), "latest_kept": "step1"}]


def test_no_checkpoint_is_kept_when_none_was_committed(tmp_path):
    run_dir = tmp_path / "run"
    write_events(run_dir, "train", 0, ("checkpoint.begin", {"step": 2, "tag": "step2"}))
    write_plan(run_dir, run_dir / "checkpoints")
    write_files(run_dir / "checkpoints", {"step2/mp_rank_00_model_states.pt": 10})
    assert results.failed_checkpoints(run_dir, phase_failed=True) == [
        {"tag": "step2", "error": "begun, never committed: the phase died during the save", "latest_kept": None}]


def test_checkpoints_give_none_for_what_no_rank_recorded(died):
    """step2 was never committed and rank 1 never made it durable; nobody recorded step3's save, so its row has
    no step and comes first."""
    absent = {"stall_max_s": None, "stall_min_s": None, "wait_durable_max_s": None, "durable_rank_max_s": None,
              "committed_s": None}
    assert results.checkpoints(read_events(died)) == [
        {"tag": "step3", "step": None, "ranks": 0, **absent, "bytes": 0, "files": 0, "bytes_per_rank_max": 0},
        pytest.approx({"tag": "step1", "step": 1, "ranks": 2, "stall_max_s": 0.30, "stall_min_s": 0.20,
                       "wait_durable_max_s": 0.03, "durable_rank_max_s": 0.90, "committed_s": 1.00, "bytes": 400,
                       "files": 2, "bytes_per_rank_max": 300}),
        pytest.approx({"tag": "step2", "step": 2, "ranks": 2, "stall_max_s": 0.45, "stall_min_s": 0.25,
                       "wait_durable_max_s": 0.06, "durable_rank_max_s": 0.70, "committed_s": None, "bytes": 100,
                       "files": 1, "bytes_per_rank_max": 100}),
    ]


def test_checkpoint_rows_are_ordered_by_step_whatever_the_order_of_the_events(run):
    rows = results.checkpoints(list(reversed(read_events(run))))
    assert [row["tag"] for row in rows] == ["step2", "step4", "step6"]


def test_inventory_lists_every_file_with_its_writer_but_not_the_manifest(died):
    """A file no durable record names (step3's, left by a killed rank) has no writer; ``latest`` has no tag."""
    expected = [
        {"tag": None, "path": "latest", "bytes": 6, "kind": "other", "rank": None},
        {"tag": "step1", "path": "step1/mp_rank_00_model_states.pt", "bytes": 100, "kind": "model", "rank": 0},
        {"tag": "step1", "path": "step1/zero_pp_rank_1_mp_rank_00_optim_states.pt", "bytes": 300,
         "kind": "optimizer", "rank": 1},
        {"tag": "step3", "path": "step3/layer_01-model_00-model_states.pt", "bytes": 20, "kind": "layer",
         "rank": None},
    ]
    assert results.inventory(died) == expected
    results.write_inventory(died)
    assert json.loads((died / "inventory.json").read_text()) == expected


@pytest.mark.parametrize(("name", "kind"), [
    ("step2/layer_01-model_00-model_states.pt", "layer"),
    ("step2/mp_rank_01_model_states.pt", "model"),
    ("step2/zero_pp_rank_3_mp_rank_01_optim_states.pt", "optimizer"),
    ("step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer"),
    ("step2/model_pp1_tp0.lazy", "model"),
    ("step2/optim_dp1_pp0_tp0.lazy", "optimizer"),
    ("step2/__0_0.distcp", "other"),
    ("step2/copy_of_mp_rank_00_model_states.pt", "other"),
])
def test_file_kind_follows_the_engines_file_names(name, kind):
    assert results.file_kind(name) == kind


REMOTE = {"scheme": "s3://", "endpoint": "http://127.0.0.1:9000", "region": "us-east-1", "force_path_style": True,
          "credentials": "environment variables", "client": "fsspec"}


def test_an_object_store_run_is_read_through_the_settings_it_recorded(tmp_path, monkeypatch):
    """A one-rank run checkpointing to S3 (a local folder stands in for the bucket): the inventory and the lost
    checkpoints come from the store plan.json names, opened with the client settings it recorded, and the summary
    says the files were uploaded and the restore read from S3. 1.35 MB prints as 1.4: MB are 10^6 bytes."""
    from restartbench import storage

    opened = []

    def open_recorded(location, remote=None):
        opened.append((location, remote))
        return storage.LocalStore(tmp_path / "bucket")

    monkeypatch.setattr(storage, "open_store", open_recorded)
    run_dir = tmp_path / "run"
    files = [{"path": "step1/mp_rank_00_model_states.pt", "bytes": 1_000_000, "seconds": 0.1},
             {"path": "step1/zero_pp_rank_0_mp_rank_00_optim_states.pt", "bytes": 350_000, "seconds": 0.1}]
    write_events(run_dir, "train", 0,
                 ("train.iteration", {"start": 0.0, "duration_s": 4.0, "step": 1, "loss": 7.0}),
                 ("checkpoint.begin", {"step": 1, "tag": "step1"}),
                 ("checkpoint.save", {"start": 5.0, "duration_s": 0.125, "step": 1, "tag": "step1"}),
                 ("checkpoint.durable", {"step": 1, "tag": "step1", "since_save_start_s": 2.5, "files": files,
                                         "bytes": 1_350_000, "n_files": 2}),
                 ("checkpoint.commit", {"step": 1, "tag": "step1", "since_save_start_s": 2.75}))
    write_events(run_dir, "restore", 0, *back_to_back(
        100.0, ("process.start", 1.0, {}), ("startup.imports", 2.0, {}), ("startup.ds_initialize", 1.5, {}),
        ("restore.load", 3.0, {"tag": "step1", "cache": "remote", "resident_fraction": None, "n_files": 2,
                               "bytes": 1_350_000}),
        ("train.iteration", 0.5, {"step": 2, "first_after_restore": True})),
        ("restore.result", {"tag": "step1", "exact": True, "verified": True}))
    write_files(tmp_path / "bucket", {f["path"]: f["bytes"] for f in files})
    (tmp_path / "bucket" / "latest").write_text("step1")
    write_plan(run_dir, "s3://ckpt/run", remote=REMOTE)

    assert [f["path"] for f in results.inventory(run_dir)] == ["latest"] + [f["path"] for f in files]
    assert results.failed_checkpoints(run_dir, phase_failed=False) == []
    assert opened == [("s3://ckpt/run", REMOTE)] * 2
    assert results.summarize_run(run_dir) == [
        ("checkpoint step1: 1.4 MB in 2 files from 1 ranks; training stalled 0.125 s (max over ranks); "
         "since the first rank began its save, durable after 2.500 s (uploaded, max over ranks), committed after "
         "2.750 s"),
        ("restart from step1 (read from S3): 8.00 s from launch to end of first iteration (max over ranks); "
         "parts (s, max over ranks): launch 1.00, imports 2.00, ds init 1.50, ckpt load 3.00, 1st iter 0.50"),
        "restore exact (state and resumed loss verified)",
    ]


def test_a_restart_without_a_checkpoint_reads_nothing_and_is_not_verified(tmp_path):
    """Engine none: the relaunch's start-up and a first iteration from fresh weights, no load."""
    run_dir = tmp_path / "run"
    write_events(run_dir, "restore", 0, *back_to_back(
        50.0, ("process.start", 1.0, {}), ("startup.imports", 2.0, {}), ("startup.dist_init", 0.25, {}),
        ("startup.model_build", 0.5, {}), ("startup.ds_initialize", 1.25, {}),
        ("train.iteration", 0.5, {"step": 1, "first_after_restore": True})),
        ("restore.result", {"tag": None, "exact": None, "verified": False}))
    write_plan(run_dir, run_dir / "checkpoints")
    info = results.restart(read_events(run_dir))
    assert info == {"total_s": 5.5, "parts": {"launch": 1.0, "imports": 2.0, "dist init": 0.25, "model build": 0.5,
                                              "ds init": 1.25, "engine setup": None, "convert": None,
                                              "ckpt load": None,
                                              "1st iter": 0.5},
                    "attempt": 1, "tag": None, "fell_back_from": None, "bytes_read": 0, "files_read": 0, "cache": None,
                    "process_bytes_read": None,
                    "resident_fraction": None, "exact": None, "verdict": "not verified", "peak_rss_bytes": None,
                    "peak_rss_part": None, "ds_init": None,
                    "checks": {"check files": None, "cache": None, "verify": None}, **NO_RELAYOUT}
    assert results.summarize_run(run_dir) == [
        ("restart without a checkpoint (engine none): 5.50 s from launch to end of first iteration "
         "(max over ranks); parts (s, max over ranks): launch 1.00, imports 2.00, dist init 0.25, model build 0.50, "
         "ds init 1.25, 1st iter 0.50"),
        "restore not verified",
    ]


def test_a_restore_that_died_in_the_load_has_no_restart_time(tmp_path):
    """Rank 0's load failed (its span has the error and no sizes), rank 1's succeeded; no rank resumed."""
    run_dir = tmp_path / "run"
    load = {"tag": "step4", "cache": "cold", "resident_fraction": 0.0}
    write_events(run_dir, "restore", 0, *back_to_back(
        10.0, ("process.start", 1.0, {}), ("restore.load", 0.5, {**load, "error": "RuntimeError: bad file"})))
    write_events(run_dir, "restore", 1, *back_to_back(
        10.0, ("process.start", 1.5, {}), ("restore.load", 2.0, {**load, "n_files": 3, "bytes": 2_000_000})))
    write_plan(run_dir, run_dir / "checkpoints")
    info = results.restart(read_events(run_dir))
    assert (info["total_s"], info["parts"]["ckpt load"], info["parts"]["1st iter"]) == (None, 2.0, None)
    assert (info["bytes_read"], info["files_read"], info["tag"], info["exact"]) == (2_000_000, 3, "step4", None)
    assert results.summarize_run(run_dir) == []


def test_only_the_first_resumed_iteration_counts_in_the_restart(run):
    for rank in RANKS:  # a restore phase that went on training after its first iteration
        with events_file(run, "restore", rank).open("a") as records:
            records.write(json.dumps({"event": "train.iteration", "phase": "restore", "rank": rank, "attempt": 1,
                                      "time": 1025.0, "start": 1020.0, "duration_s": 5.0, "step": 8}) + "\n")
    info = results.restart(read_events(run))
    assert (info["total_s"], info["parts"]["1st iter"]) == pytest.approx((8.41, 0.90))


def test_the_summary_says_when_a_restore_is_not_exact(tmp_path):
    run_dir = write_run(tmp_path / "logs", inexact_rank=1)
    write_plan(run_dir, run_dir / "checkpoints")
    assert results.summarize_run(run_dir)[-1] == "RESTORE NOT EXACT"


# -- restore attempts: each its own records -----------------------------------------------------------------------


def test_an_event_log_never_appends_to_an_attempts_records(run):
    with pytest.raises(RecordsExistError, match="never appended to.*submit-job.sh --restore"):
        EventLog(run, "restore", 0)
    log = EventLog(run, "restore", 0, attempt=2)
    log.emit("phase.end")
    log.close()
    assert events_file(run, "restore-2", 0).is_file()
    assert [e["attempt"] for e in read_events(run, "restore-2")] == [2]


def test_each_restore_attempt_is_a_restart_of_its_own(run):
    for rank in RANKS:
        write_restore(run, rank, exact=rank != 3, attempt=2, later_s=500.0)
    events = read_events(run)
    assert results.restore_attempts(events) == [1, 2]
    first, second = results.restart(events, 1), results.restart(events, 2)
    assert (first["total_s"], second["total_s"]) == pytest.approx((8.41, 8.41)), "never mixed, never negative"
    assert (first["verdict"], second["verdict"]) == ("exact", "not exact")
    assert results.restart(events, 3) is None


def test_records_of_two_launches_in_one_attempt_are_refused_not_mixed(run):
    """What an earlier version wrote when a restore was relaunched into the same files: restart times that mixed
    the launches (a restart of -191.8 s). Such records are refused with a message, never reported."""
    with events_file(run, "restore", 0).open("a") as records:
        records.write(json.dumps({"event": "process.start", "phase": "restore", "rank": 0, "time": 1300.0,
                                  "start": 1200.0, "duration_s": 1.0}) + "\n")
    with pytest.raises(RunFolderError, match="records of 2 launches of rank 0"):
        results.restart(read_events(run))
    collected = analysis.collect(run.parents[3])
    assert collected.table().empty and "2 launches of rank 0" in collected.excluded[0].reason


@pytest.mark.parametrize(("records", "verdict"), [
    ([{"event": "phase.error", "refused": True}], "refused"),
    ([{"event": "phase.error"}], "failed"),
    ([], "failed"),
    ([{"event": "restore.result", "verified": False}], "not verified"),
    ([{"event": "restore.result", "verified": True, "exact": True}] * 2, "exact"),
    ([{"event": "restore.result", "verified": True, "exact": True},
      {"event": "restore.result", "verified": True, "exact": False}], "not exact"),
    # every rank records what its proof found, then stops with the mismatch: the attempt is not exact, not failed
    ([{"event": "restore.result", "verified": True, "exact": False}, {"event": "phase.error"}], "not exact"),
])
def test_an_attempts_verdict(records, verdict):
    assert results.verdict(records) == verdict


# -- interference: an asynchronous save's background work slows the iterations it overlaps (issue 18) -------------

#: Two ranks, iterations 1-8 and the reference 9, a save after 4 and after 8 (the last). Per step, each rank's
#: iteration time; step 1 (warm-up, 3 s) is never counted. Steps 5 and 6 are slow.
OVERLAP_ITERATION_S = {2: (1.00, 1.05), 3: (1.20, 1.10), 4: (0.90, 1.00), 5: (1.50, 2.40), 6: (1.70, 1.60),
                       7: (1.00, 1.10), 8: (1.10, 1.00), 9: (1.00, 0.95)}
OVERLAP_SAVE_S = {"step4": (0.02, 0.03), "step8": (0.04, 0.01)}
#: lazy: save start -> durable, per rank. step4: rank 0's save ends at 106.12 and its files are durable at 107.10,
#: inside its iteration 5 (106.12-107.62); rank 1's save ends at 106.18, durable at 108.75, inside its iteration 6
#: (108.58-110.18): iterations 5 and 6 overlap step4's background work. step8's work outlasts training: the harness
#: waits for it (0.5 s) and it is durable 0.40 s after the save began, inside that wait.
LAZY_DURABLE_S = {"step4": (1.00, 2.60), "step8": (0.40, 0.40)}
LAZY_COPY_WAIT = (1, 106.50, 0.30)  # rank 1's optimizer step in iteration 5 waited 0.30 s for step4's copies
# Per step, the max over ranks less the copy wait: 2: 1.05, 3: 1.20, 4: 1.00, 5: max(1.50, 2.40 - 0.30) = 2.10,
# 6: 1.70, 7: 1.10, 8: 1.10, 9: 1.00. Clean (overlapping nothing): 2, 3, 4, 7, 8, 9 -> median (1.05 + 1.10) / 2.
LAZY_CLEAN_S = 1.075
LAZY_STEP4 = {"overlapped_iterations": 2, "slowdown_s": (2.10 - 1.075) + (1.70 - 1.075),  # 1.65
              "cost_s": 0.03 + 0.30 + 1.65, "background_seen": True}  # stall: rank 1's save and its copy wait
LAZY_STEP8 = {"overlapped_iterations": 0, "slowdown_s": 0.0, "cost_s": 0.04, "background_seen": False}


def overlap_rank(rank: int, engine: str) -> list[tuple[str, dict]]:
    """One rank's phase 1, its spans back to back from 100 s. lazy: each save's durability is waited for at the
    next save or after training; synchronous (torch): right after the save (0.5 s, durable 0.3 s into it)."""
    records, clock, pending = [], 100.0, []

    def wait(tag: str, step: int, save_start: float, since: float) -> None:
        nonlocal clock
        records.append(("checkpoint.wait_durable", {"start": clock, "duration_s": 0.5, "step": step, "tag": tag}))
        clock += 0.5
        records.append(("checkpoint.durable", {"since_save_start_s": since, "step": step, "tag": tag, "bytes": 10,
                                               "n_files": 1, "files": []}))

    for step, seconds in {1: (3.0, 3.0), **OVERLAP_ITERATION_S}.items():
        if step == 9:
            for args in pending:
                wait(*args)
        records.append(("train.iteration", {"start": clock, "duration_s": seconds[rank], "step": step,
                                            "reference": step == 9}))
        clock += seconds[rank]
        if step in (4, 8):
            tag, stall = f"step{step}", OVERLAP_SAVE_S[f"step{step}"][rank]
            for args in pending:
                wait(*args)
            pending = []
            records.append(("checkpoint.save", {"start": clock, "duration_s": stall, "step": step, "tag": tag}))
            if engine == "lazy":
                pending.append((tag, step, clock, LAZY_DURABLE_S[tag][rank]))
                clock += stall
            else:
                save_start, clock = clock, clock + stall
                wait(tag, step, save_start, stall + 0.3)
    if engine == "lazy" and rank == LAZY_COPY_WAIT[0]:
        records.append(("checkpoint.copy_wait", {"tag": "step4", "step": 4, "time": LAZY_COPY_WAIT[1],
                                                 "duration_s": LAZY_COPY_WAIT[2]}))
    return records


def write_overlap_run(root: Path, engine: str) -> Path:
    run_dir = root / "tiny" / "tp1pp1dp2" / engine / "20260101-000000-abcdef"
    run_dir.mkdir(parents=True)
    (run_dir / "metadata.json").write_text(json.dumps({"status": "complete", "preset": "tiny", "layout": "tp1pp1dp2",
                                                       "engine": engine, "world_size": 2}))
    (run_dir / "config.json").write_text(json.dumps({"train": {"iters": 8, "save_interval": 4}}))
    for rank in (0, 1):
        write_events(run_dir, "train", rank, *overlap_rank(rank, engine))
    return run_dir


def test_an_asynchronous_saves_slowdown_is_what_the_iterations_it_overlapped_took_beyond_the_clean_median(tmp_path):
    events = read_events(write_overlap_run(tmp_path / "logs", "lazy"))
    assert results.clean_iteration_time(events) == pytest.approx(LAZY_CLEAN_S)
    costs = results.interference(events)
    assert costs == {"step4": pytest.approx(LAZY_STEP4), "step8": pytest.approx(LAZY_STEP8)}
    windows = results.background_windows(events)
    assert windows["step4", 0] == pytest.approx((106.12, 107.10)) and windows["step4", 1] == pytest.approx(
        (106.18, 108.75))


def test_a_synchronous_engines_slowdown_is_zero_by_construction(tmp_path):
    """The same iterations, steps 5 and 6 as slow, but the harness waits for every save's durability before the next
    iteration: no iteration overlaps a save's work, so the slow ones are the engine's pace (clean median over every
    step: 1.00, 1.00, 1.05, 1.10, 1.10, 1.20, 1.70, 2.40 -> 1.10) and each cost is the stall."""
    events = read_events(write_overlap_run(tmp_path / "logs", "torch"))
    assert results.clean_iteration_time(events) == pytest.approx(1.10)
    assert results.interference(events) == {
        "step4": {"overlapped_iterations": 0, "slowdown_s": 0.0, "cost_s": pytest.approx(0.03),
                  "background_seen": False},
        "step8": {"overlapped_iterations": 0, "slowdown_s": 0.0, "cost_s": pytest.approx(0.04),
                  "background_seen": False}}


def test_the_table_and_the_summary_carry_the_whole_cost(tmp_path):
    """Per checkpoint the columns of ``interference``, iteration_s the clean median; the summary's slowdown and cost
    are over the checkpoints whose background work training saw end (lazy: step4; step8's was waited for after
    training), over all where none was (torch); C of the goodput is the whole cost."""
    for engine in ("lazy", "torch"):
        write_overlap_run(tmp_path / "logs", engine)
    table = analysis.collect(tmp_path / "logs").table()
    row = table[(table["engine"] == "lazy") & (table["tag"] == "step4")].iloc[0]
    assert {c: row[c] for c in (*LAZY_STEP4, "iteration_s")} == pytest.approx({**LAZY_STEP4,
                                                                               "iteration_s": LAZY_CLEAN_S})
    summary = analysis.checkpoint_summary(table).set_index("engine")
    assert summary.loc["lazy", ["stall_s", "slowdown_s", "cost_s", "overlapped_iterations", "seen_checkpoints"]] \
        .tolist() == pytest.approx([(0.33 + 0.04) / 2, 1.65, (0.33 + 0.04) / 2 + 1.65, 2, 1])
    assert summary.loc["torch", ["stall_s", "slowdown_s", "cost_s", "seen_checkpoints"]].tolist() == pytest.approx(
        [0.035, 0.0, 0.035, 0])
    cost, basis = analysis.checkpoint_cost(analysis.checkpoint_summary(table))
    assert sorted(cost.tolist()) == pytest.approx([0.035, 1.835]) and basis == "stall + slowdown"


def test_a_save_no_training_followed_is_never_seen(tmp_path):
    """No training followed step8 (as phase 1's last save before the harness trained on after it): even where the
    harness recorded no wait for it (its work ended before), it overlapped nothing it could slow, so it is left out
    of the summaries' slowdown."""
    events = [e for e in read_events(write_overlap_run(tmp_path / "logs", "lazy"))
              if not (e["event"] == "checkpoint.wait_durable" and e["tag"] == "step8")]
    costs = results.interference(events)
    assert (costs["step4"]["background_seen"], costs["step8"]["background_seen"]) == (True, False)


def test_a_save_whose_engine_said_its_work_had_ended_as_the_wait_began_is_seen(tmp_path):
    """Training went on after step8 (iteration 10), and its files were durable only inside the harness's wait (DCP's
    async write ends in training, the harness's fsync of the folder in the wait): unseen by the clock alone, seen
    where the engine said its background work had ended as the wait began (``background_done``), never where it
    said it had not."""
    events = read_events(write_overlap_run(tmp_path / "logs", "lazy"))
    events += [{"event": "train.iteration", "phase": "train", "rank": rank, "start": 200.0, "duration_s": 1.0,
                "step": 10} for rank in (0, 1)]

    def said(done):
        return [{**e, "background_done": done} if e["event"] == "checkpoint.wait_durable" and e["tag"] == "step8"
                else e for e in events]

    assert results.interference(events)["step8"]["background_seen"] is False
    assert results.interference(said(True))["step8"]["background_seen"] is True
    assert results.interference(said(False))["step8"]["background_seen"] is False


def test_the_restarts_memory_peak_and_the_resume_spike_against_steady_training():
    def span(phase, event, rank, peak, **fields):
        return {"event": event, "phase": phase, "rank": rank, "start": 0.0, "duration_s": 1.0,
                "peak_rss_bytes": peak, **fields}

    train = [span("train", "train.iteration", r, peak, step=s) for r, s, peak in
             ((0, 2, 900), (1, 2, 1000), (0, 3, 950))] + [span("train", "checkpoint.save", 0, 5000, step=2, tag="a")]
    restore = [span("restore", "startup.ds_initialize", 0, 1200, attempt=1),
               span("restore", "restore.load", 1, 2500, attempt=1, tag="step2"),
               span("restore", "train.iteration", 1, 2400, attempt=1, step=3, first_after_restore=True)]
    info = results.restart(train + restore)
    assert (info["peak_rss_bytes"], info["peak_rss_part"]) == (2500, "ckpt load")
    assert results.training_peak_rss(train + restore) == 1000, "iterations only: a save's buffers are not training's"
    assert results.training_peak_rss([{**e, "peak_rss_bytes": None} for e in train]) is None


def test_deepspeed_initialize_in_its_stages_max_over_ranks_and_the_slowest_named():
    def init(rank, parts, wait, other):
        return {"event": "startup.ds_initialize", "phase": "restore", "rank": rank, "attempt": 1, "start": 0.0,
                "duration_s": 9.0, "parts": parts, "collective_wait_s": wait, "other_s": other}

    events = [init(0, {"optimizer_sanity_check": 1.5, "zero_optimizer": 0.2, "lr_scheduler": 0.01}, 0.3, 0.05),
              init(1, {"optimizer_sanity_check": 1.2, "zero_optimizer": 0.4}, 0.9, 0.02)]
    breakdown = results.ds_init_breakdown(events)
    assert breakdown == {"optimizer_sanity_check": 1.5, "zero_optimizer": 0.4, "lr_scheduler": 0.01,
                         "collective wait": 0.9, "other": 0.05}
    assert results.ds_init_breakdown([{**events[0], "parts": None}]) is None

    table = pd.DataFrame([{"kind": "restart", "preset": "tiny", "layout": "tp1pp1dp2", "engine": "torch",
                           "ds_init_parts": parts} for parts in (breakdown, {**breakdown, "zero_optimizer": 0.6})])
    [row] = analysis.ds_init_summary(table, top=1).to_dict("records")
    assert row["optimizer_sanity_check"] == 1.5 and row["other stages"] == pytest.approx(0.5 + 0.01)
    assert (row["collective wait"], row["other"]) == (0.9, 0.05)
    assert row["parts_sum_s"] == pytest.approx(1.5 + 0.51 + 0.9 + 0.05)


def test_a_negative_slowdown_is_noise_and_never_brings_the_cost_below_the_stall():
    """Overlapped iterations that ran faster than the clean median (noise) gave a goodput C below zero and ended
    summarize.py in a ValueError; the whole cost is the stall then."""
    assert results.whole_cost(0.5, -0.2) == 0.5
    assert results.whole_cost(0.5, 0.25) == 0.75
    assert results.whole_cost(None, 0.25) is None and results.whole_cost(0.5, None) is None


# -- restart figures of a relayout, a prefetch, a fallback (mutation survivors of 2026-12-07) ------------------------

#: What rank 1's restore.convert span says the conversion read and wrote; rank 0's span (first in the events) has no
#: figures (as a record from before they were taken), and rank 0's startup.engine carries a stray bytes_read: only a
#: convert span with figures is the conversion's.
CONVERTED = {"files_read": 4, "bytes_read": 4096, "files_written": 2, "bytes_written": 3072}


def relayout_rank(rank: int, prefetched: bool = True) -> list[tuple[str, dict]]:
    """One rank's restore on another layout after a fallback from step6 (then step4) to step2, the load taken from
    an early read (prefetch) and from what the conversion had just written."""
    load = {"tag": "step2", "cache": "converted", "resident_fraction": None, "n_files": 2, "bytes": 900 + rank,
            "process_read_bytes": (1000, 2000)[rank], "prefetched": prefetched,
            "prefetch_read_s": (2.5, 3.0)[rank], "prefetch_wait_s": (0.5, 0.25)[rank]}
    if not prefetched:
        load = {k: v for k, v in load.items() if not k.startswith("prefetch")}
    return [("restore.fallback", {"wanted": "step6", "restored": "step4"}),
            ("restore.fallback", {"wanted": "step4", "restored": "step2"}),
            *back_to_back(100.0, ("process.start", 1.0, {}), ("startup.engine", 0.5, {"bytes_read": 7} if rank == 0
                                                                                  else {}),
                          ("restore.convert", 2.0, CONVERTED if rank == 1 else {}), ("restore.load", 1.5, load),
                          ("train.iteration", 0.5, {"step": 3, "first_after_restore": True})),
            ("restore.result", {"tag": "step2", "exact": True, "verified": True, "restore_layout": "tp1pp1dp2",
                                "loss_diff": 1e-3})]


def write_relayout_run(root: Path, prefetched_ranks: tuple[int, ...] = (0, 1)) -> Path:
    run_dir = root / "run"
    for rank in (0, 1):
        write_events(run_dir, "restore", rank, *relayout_rank(rank, rank in prefetched_ranks))
    write_plan(run_dir, run_dir / "checkpoints")
    return run_dir


def test_a_relayout_restart_reports_the_layout_the_loss_the_conversion_the_prefetch_and_the_fallback(tmp_path):
    """The first fallback's wanted tag, the process's bytes read summed over ranks, the max over ranks of the
    prefetch's read and wait, and the conversion's figures from the one convert span that has them."""
    info = results.restart(read_events(write_relayout_run(tmp_path)))
    assert {key: info[key] for key in ("fell_back_from", "process_bytes_read", "bytes_read", "cache",
                                       *NO_RELAYOUT)} == pytest.approx({
        "fell_back_from": "step6", "process_bytes_read": 3000, "bytes_read": 1801, "cache": "converted",
        "restore_layout": "tp1pp1dp2", "loss_diff": 1e-3,
        **{f"convert_{name}": value for name, value in CONVERTED.items()},
        "prefetched": True, "prefetch_read_s": 3.0, "prefetch_wait_s": 0.5})
    assert info["prefetched"] is True


def test_a_prefetch_on_some_ranks_only_is_not_a_prefetched_restart(tmp_path):
    info = results.restart(read_events(write_relayout_run(tmp_path, prefetched_ranks=(0,))))
    assert (info["prefetched"], info["prefetch_read_s"], info["prefetch_wait_s"]) == (False, 2.5, 0.5)


def test_the_process_bytes_read_are_none_where_a_rank_did_not_record_them(tmp_path):
    run_dir = write_relayout_run(tmp_path)
    events = [{k: v for k, v in e.items() if not (k == "process_read_bytes" and e["rank"] == 1)}
              for e in read_events(run_dir)]
    assert results.restart(events)["process_bytes_read"] is None


def test_the_summary_of_a_relayout_restart_names_the_layout_the_conversion_and_the_prefetch(tmp_path):
    assert results.summarize_run(write_relayout_run(tmp_path)) == [
        "restart from step2 (loaded from what the conversion had just written) on tp1pp1dp2: 5.50 s from launch to "
        "end of first iteration (max over ranks); parts (s, max over ranks): launch 1.00, engine setup 0.50, "
        "convert 2.00, ckpt load 1.50, 1st iter 0.50; the read ran from before the model build (prefetch): 3.00 s, "
        "of which the load waited 0.50 s",
        "restore exact (consolidated state verified; resumed loss +1.00e-03 from the uninterrupted run's)",
    ]


def test_records_of_two_launches_are_refused_with_their_attempt_named(run):
    """The message names the attempt whose records mix launches and says why and what to do."""
    for rank in RANKS:
        write_restore(run, rank, exact=True, attempt=2, later_s=500.0)
    with events_file(run, "restore-2", 1).open("a") as records:
        records.write(json.dumps({"event": "process.start", "phase": "restore", "rank": 1, "attempt": 2,
                                  "time": 1700.0, "start": 1600.0, "duration_s": 1.0}) + "\n")
    message = ("restore attempt 2 holds the records of 2 launches of rank 1: an earlier restartbench appended each "
               "relaunch to the same events file, so its restart times would mix launches (even below zero); measure "
               "it again in a new run")
    with pytest.raises(RunFolderError) as refused:
        results.restart(read_events(run), 2)
    assert str(refused.value) == message


def test_an_attempt_with_a_proof_that_found_nothing_beside_an_unverified_rank_is_not_exact():
    """The first rank verified exactly, another recorded an inexact result it did not verify: not exact."""
    records = [{"event": "restore.result", "verified": True, "exact": True},
               {"event": "restore.result", "verified": False, "exact": False}]
    assert results.verdict(records) == "not exact"


def test_deepspeed_initialize_without_waits_or_rest_recorded_counts_them_as_zero():
    events = [{"event": "startup.ds_initialize", "phase": "restore", "rank": 0, "attempt": 1, "start": 0.0,
               "duration_s": 2.0, "parts": {"zero_optimizer": 0.5}}]
    assert results.ds_init_breakdown(events) == {"zero_optimizer": 0.5, "collective wait": 0.0, "other": 0.0}


def test_records_without_an_attempt_are_the_first_attempt():
    assert results.restore_attempts([{"event": "process.start", "phase": "restore", "rank": 0}]) == [1]


def test_a_check_that_began_with_the_first_resumed_iteration_is_not_on_the_path():
    """A verify span that began as the first resumed iteration did, and one inside a later iteration: neither on the
    path; only the first resumed iteration bounds it."""
    events = [_span(0, "process.start", 100.0, 1.0), _span(0, "restore.verify", 101.0, 0.25),
              _span(0, "train.iteration", 102.0, 1.0, step=7, first_after_restore=True),
              _span(0, "restore.verify", 102.0, 4.0),
              _span(0, "restore.verify", 104.5, 8.0),
              _span(0, "train.iteration", 104.0, 1.0, step=8)]
    assert results.harness_checks(events) == {"check files": None, "cache": None, "verify": 0.25}


def test_a_checkpoints_times_are_on_its_own_clock_where_recorded(died):
    """since_checkpoint_start_s, where a record has it, wins over the rank's own save start."""
    events = [{**e, "since_checkpoint_start_s": e["since_save_start_s"] + 1.0}
              if e["event"] in ("checkpoint.durable", "checkpoint.commit") else e for e in read_events(died)]
    step1 = next(row for row in results.checkpoints(events) if row["tag"] == "step1")
    assert (step1["durable_rank_max_s"], step1["committed_s"]) == pytest.approx((1.90, 2.00))


# -- interference at the windows' edges (mutation survivors of 2026-12-07) ---------------------------------------


def train_event(event: str, rank: int, **fields) -> dict:
    return {"event": event, "phase": "train", "rank": rank, **fields}


def iteration(rank: int, step: int, start: float, seconds: float, **fields) -> dict:
    return train_event("train.iteration", rank, step=step, start=start, duration_s=seconds, **fields)


def saved(rank: int, tag: str, step: int, start: float, stall: float, durable_after: float | None) -> list[dict]:
    """A save span and, unless ``durable_after`` is None (the files never became durable), its durable record."""
    records = [train_event("checkpoint.save", rank, tag=tag, step=step, start=start, duration_s=stall)]
    if durable_after is not None:
        records.append(train_event("checkpoint.durable", rank, tag=tag, step=step, since_save_start_s=durable_after,
                                   bytes=10, n_files=1, files=[]))
    return records


def test_an_iteration_touching_a_window_does_not_overlap_it_and_a_copy_wait_on_an_edge_is_its_iterations():
    """Rank 0: iteration 2 ends as save s2 returns (11.0) and iteration 4 begins as its files are durable (13.0):
    neither overlaps the window (11, 13), iteration 3 does. The two copy waits of iteration 5 were written at its
    start and at its end (a gap on both sides): both are its. Rank 1 saved too but recorded no iteration (its window
    overlaps nothing, and training never went on after its save: not seen).
    Step times: 2: 1.0, 3: 2.0, 4: 1.5, 5: 1.75 - 0.25 - 0.25 = 1.25, 6: 1.375, 7: 1.125; clean (all but 3):
    median 1.25. s2's slowdown 2.0 - 1.25; its stall rank 0's copy waits, 0.5."""
    events = [iteration(0, 2, 10.0, 1.0), *saved(0, "s2", 2, 11.0, 0.0, 2.0), iteration(0, 3, 11.0, 2.0),
              iteration(0, 4, 13.0, 1.5), iteration(0, 5, 15.0, 1.75),
              train_event("checkpoint.copy_wait", 0, tag="s2", step=2, time=15.0, duration_s=0.25),
              train_event("checkpoint.copy_wait", 0, tag="s2", step=2, time=16.75, duration_s=0.25),
              iteration(0, 6, 17.0, 1.375), iteration(0, 7, 18.5, 1.125), *saved(1, "s2", 2, 11.0, 0.0, 1.0)]
    assert results.clean_iteration_time(events) == 1.25
    assert results.interference(events) == {"s2": {"overlapped_iterations": 1, "slowdown_s": 0.75, "cost_s": 1.25,
                                                   "background_seen": False}}


def test_a_copy_wait_that_begins_as_one_iteration_ends_and_the_next_begins_is_the_next_ones_only():
    """s3's window (13.0, 13.5) holds iteration 4 (13.0-14.5); iteration 5 begins as 4 ends, at 14.5, and a 0.5 s copy
    wait begins then: it is 5's (2.0 s, 1.5 s without it), not subtracted from 4 as well. Every step then took 1.5 s:
    s3 slowed training by 0.0 s (-0.5 s if 4 lost the wait too)."""
    events = [iteration(0, 2, 10.0, 1.5), iteration(0, 3, 11.5, 1.5), *saved(0, "s3", 3, 13.0, 0.0, 0.5),
              iteration(0, 4, 13.0, 1.5), iteration(0, 5, 14.5, 2.0),
              train_event("checkpoint.copy_wait", 0, tag="s3", step=3, time=14.5, duration_s=0.5),
              iteration(0, 6, 16.5, 1.5)]
    assert results.clean_iteration_time(events) == 1.5
    assert results.interference(events)["s3"]["slowdown_s"] == 0.0


def test_an_iteration_is_the_earliest_checkpoints_whatever_the_order_of_the_tags_or_the_events():
    """step9's window (11, 15) holds iterations 10-12; step10's (12, 12.5) lies inside it: iteration 11 overlaps both
    and is step9's, although "step10" sorts before "step9" and the events come in reverse (step10's records first,
    the last iteration first). Training went on after both saves: both seen."""
    events = [iteration(0, 9, 10.0, 1.0), *saved(0, "step9", 9, 11.0, 0.0, 4.0), iteration(0, 10, 11.0, 1.0),
              *saved(0, "step10", 10, 12.0, 0.0, 0.5), iteration(0, 11, 12.0, 1.0), iteration(0, 12, 13.0, 1.0),
              iteration(0, 13, 16.0, 1.0), iteration(0, 14, 17.0, 1.0)]
    costs = results.interference(list(reversed(events)))
    assert {tag: (row["overlapped_iterations"], row["background_seen"]) for tag, row in costs.items()} == {
        "step9": (3, True), "step10": (0, True)}


def test_background_seen_at_its_edges_and_only_where_every_rank_saw_it():
    """Rank 0's last iteration begins as save s2 returns (11.5) and its files are durable (12.5) as the harness
    begins waiting: seen. Rank 1's files were durable only inside the wait: not seen, so s2 is not, whichever rank's
    records come first."""
    def rank_records(rank, durable_after):
        return [iteration(rank, 2, 10.0, 1.0), *saved(rank, "s2", 2, 11.0, 0.5, durable_after),
                iteration(rank, 3, 11.5, 1.0),
                train_event("checkpoint.wait_durable", rank, tag="s2", step=2, start=12.5, duration_s=0.5),
                iteration(rank, 4, 13.0, 1.0, reference=True)]

    assert results.interference(rank_records(0, 1.5))["s2"]["background_seen"] is True
    assert results.interference(rank_records(1, 2.0) + rank_records(0, 1.5))["s2"]["background_seen"] is False


def test_no_clean_iteration_no_slowdown_and_no_iterations_no_figures():
    """Every counted iteration overlapped step1's window: no clean median, so no slowdown or cost (a save that
    never became durable overlaps nothing: slowdown 0, never seen). Without phase-1 iterations (emulated) the three
    figures are None, and no save is seen."""
    events = [*saved(0, "step1", 1, 9.0, 0.0, 5.0), iteration(0, 2, 10.0, 1.0), iteration(0, 3, 11.0, 1.0),
              *saved(0, "step3", 3, 12.0, 0.125, None)]
    assert results.clean_iteration_time(events) is None
    assert results.interference(events) == {
        "step1": {"overlapped_iterations": 2, "slowdown_s": None, "cost_s": None, "background_seen": True},
        "step3": {"overlapped_iterations": 0, "slowdown_s": 0.0, "cost_s": 0.125, "background_seen": False}}
    emulated = [e for e in events if e["event"] != "train.iteration"]
    assert results.interference(emulated)["step1"] == {"overlapped_iterations": None, "slowdown_s": None,
                                                       "cost_s": None, "background_seen": False}

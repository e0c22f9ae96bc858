"""A run whose restart never finished (killed during its restore, or its restore failed) keeps its training's
checkpoint rows, and the excluded table says so; a run whose training did not finish whole is left out whole."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from restartbench.analysis import collect
from restartbench.analysis.runs import TRAINING_KEPT
from restartbench.events import Event, EventLog

ROOT = Path(__file__).resolve().parent.parent
KILLED = ("running", None)
RESTORE_FAILED = ("failed", "phase restore failed: timed out after 600 s (--phase-timeout-s); the ranks were killed")


def two_rank_run(logs: Path, status: tuple[str, str | None] = KILLED, *, ended: tuple[int, ...] = (0, 1),
                 committed: tuple[str, ...] = ("step2", "step4"), failed_checkpoints: list | None = None) -> Path:
    """A two-rank run written through EventLog: saves at steps 2 and 4 (stalls 1 s and 2 s on rank 1, committed at
    5 s), the ranks in ``ended`` ending their training, then a restore that loads and stops there (no result)."""
    run = logs / "tiny" / "tp1pp1dp2" / "torch" / "20260101-000000-abcdef"
    run.mkdir(parents=True)
    meta = {"status": status[0], "error": status[1], "preset": "tiny", "layout": "tp1pp1dp2", "engine": "torch",
            "world_size": 2, "device": "cpu"}
    if failed_checkpoints is not None:
        meta["failed_checkpoints"] = failed_checkpoints
    (run / "metadata.json").write_text(json.dumps(meta))
    (run / "config.json").write_text(json.dumps({"model": {"preset": "tiny", "dtype": "fp32"},
                                                 "train": {"iters": 4, "save_interval": 2}}))
    for rank in (0, 1):
        train = EventLog(run, "train", rank)
        for step in range(1, 5):
            train.emit(Event.TRAIN_ITERATION, start=10.0 * step, duration_s=1.0, step=step)
            if step % 2:
                continue
            tag = f"step{step}"
            train.emit(Event.CHECKPOINT_BEGIN, tag=tag, step=step)
            train.emit(Event.CHECKPOINT_SAVE, start=10.0 * step + 1, duration_s=step / 2 * (rank + 1) / 2, tag=tag,
                       step=step)
            train.emit(Event.CHECKPOINT_DURABLE, tag=tag, step=step, since_save_start_s=4.0, bytes=1000, n_files=1,
                       files=[{"path": f"{tag}/rank{rank}.pt", "bytes": 1000, "seconds": 0.1}])
            if rank == 0 and tag in committed:
                train.emit(Event.CHECKPOINT_COMMIT, tag=tag, step=step, since_save_start_s=5.0)
        if rank in ended:
            train.emit(Event.PHASE_END)
        train.close()
        restore = EventLog(run, "restore", rank)
        restore.emit(Event.PROCESS_START, start=100.0, duration_s=1.0)
        restore.emit(Event.RESTORE_LOAD, start=110.0, duration_s=5.0, tag="step4", bytes=1000, n_files=1,
                     cache="cold")
        restore.close()
    return run


@pytest.mark.parametrize("status", [KILLED, RESTORE_FAILED], ids=["killed-in-restore", "restore-failed"])
def test_a_run_whose_restart_never_finished_keeps_its_trainings_checkpoints(tmp_path, status):
    run = two_rank_run(tmp_path / "logs", status)
    collected = collect(tmp_path / "logs", keep_records=False)
    [excluded] = collected.excluded
    assert excluded.status == {"running": "incomplete", "failed": "failed"}[status[0]]
    assert excluded.reason.endswith(TRAINING_KEPT) and excluded.training_kept
    table = collected.table()
    assert list(table["kind"]) == ["checkpoint", "checkpoint"], "no restart row: the restart did not finish"
    assert list(table["tag"]) == ["step2", "step4"] and list(table["stall_max_s"]) == [1.0, 2.0]
    assert set(table["run_id"]) == {str(run.relative_to(tmp_path / "logs"))}
    assert len(collected.rank_table()) == 4 and len(collected.file_table()) == 4
    assert collected.span_table().empty and collected.memory_table().empty


def test_the_kept_training_is_the_same_from_the_runs_record(tmp_path):
    two_rank_run(tmp_path / "logs")
    first = collect(tmp_path / "logs")  # writes the record
    again = collect(tmp_path / "logs")
    assert again.table().equals(first.table()) and again.skipped == first.skipped
    assert len(again.table()) == 2


@pytest.mark.parametrize("case", [
    {"ended": (0,)},  # rank 1 never ended its training
    {"committed": ("step2",)},  # step4 begun, never committed
    {"failed_checkpoints": [{"tag": "step4", "error": "disk full"}]},
], ids=["a-rank-did-not-end-training", "a-checkpoint-never-committed", "a-checkpoint-failed"])
def test_a_run_whose_training_did_not_finish_whole_is_left_out_whole(tmp_path, case):
    two_rank_run(tmp_path / "logs", RESTORE_FAILED, **case)
    collected = collect(tmp_path / "logs", keep_records=False)
    [excluded] = collected.excluded
    assert excluded.status == "failed" and not excluded.reason.endswith(TRAINING_KEPT) and not excluded.training_kept
    assert collected.table().empty and collected.file_table().empty


def test_a_skipped_run_keeps_nothing(tmp_path):
    two_rank_run(tmp_path / "logs", ("skipped", "engine 'datastates' is CUDA only"))
    collected = collect(tmp_path / "logs", keep_records=False)
    assert [e.status for e in collected.excluded] == ["skipped"] and collected.table().empty


def test_a_failed_run_whose_files_cannot_be_read_keeps_its_own_reason(tmp_path):
    run = two_rank_run(tmp_path / "logs", RESTORE_FAILED)
    (run / "config.json").write_text("{not json")
    collected = collect(tmp_path / "logs", keep_records=False)
    [excluded] = collected.excluded
    assert (excluded.status, excluded.reason) == ("failed", RESTORE_FAILED[1]) and collected.table().empty


def test_summarize_on_runs_whose_restarts_never_finished_reports_their_training(tmp_path):
    """A study whose every run lacks a restart (the GPU visit whose time ran out in the restore): the tables, plots,
    findings and report are made from the checkpoints, and the console says what was kept."""
    two_rank_run(tmp_path / "logs")
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(tmp_path / "logs"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 complete run(s) and 1 whose training only is kept" in proc.stdout
    assert "restart left out (incomplete run)" in proc.stdout
    assert "torch stalls training least: 1.50 s per checkpoint" in proc.stdout
    excluded = pd.read_csv(tmp_path / "out" / "excluded.csv")
    assert excluded["training_kept"].tolist() == [True]
    assert (tmp_path / "out" / "report.html").stat().st_size > 0

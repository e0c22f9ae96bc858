"""The per-rank harness (restartbench.harness) that real and emulated ranks share, and one clock per checkpoint
(issue 18 item 5): every rank's durable time and the commit are measured from the first rank's save start."""

import json
import time

import pytest
import torch.distributed as dist

from restartbench import analysis, harness, results
from restartbench.engines.base import FileRecord
from restartbench.events import EventLog, read_events
from restartbench.integrity import committed_tags
from restartbench.storage import LocalStore


@pytest.fixture(scope="module")
def one_process_group():
    """A one-process gloo group: settling a checkpoint is a collective."""
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def old_rule(row_events: list[dict]) -> tuple[float, float]:
    """(durable_rank_max_s, committed_s) as results.checkpoints gave them before one clock: each rank's durable time
    from its own save start, the commit from rank 0's."""
    durable = max(e["since_save_start_s"] for e in row_events if e["event"] == "checkpoint.durable")
    commit = next(e["since_save_start_s"] for e in row_events if e["event"] == "checkpoint.commit")
    return durable, commit


def test_hand_built_events_where_each_rank_own_start_put_the_commit_first():
    """The 13B tp2pp4 case: rank 1 began its save 0.2 s before rank 0 and was durable 0.96 s after its own start;
    rank 0 committed 0.902 s after its own start. On each rank's own clock the commit comes first (impossible); on
    the checkpoint's clock (since rank 1's start) rank 1 is durable at 0.96 s and the commit is at 1.102 s."""
    step = {"step": 4, "tag": "step4"}
    files = {"files": [], "bytes": 10, "n_files": 1}
    events = [
        {"event": "checkpoint.save", "phase": "train", "rank": 0, "start": 100.2, "duration_s": 0.3, **step},
        {"event": "checkpoint.save", "phase": "train", "rank": 1, "start": 100.0, "duration_s": 0.4, **step},
        {"event": "checkpoint.durable", "phase": "train", "rank": 0, "since_save_start_s": 0.5,
         "since_checkpoint_start_s": 0.7, **files, **step},
        {"event": "checkpoint.durable", "phase": "train", "rank": 1, "since_save_start_s": 0.96,
         "since_checkpoint_start_s": 0.96, **files, **step},
        {"event": "checkpoint.commit", "phase": "train", "rank": 0, "since_save_start_s": 0.902,
         "since_checkpoint_start_s": 1.102, **step},
    ]
    durable, committed = old_rule(events)
    assert committed < durable
    [row] = results.checkpoints(events)
    assert row["durable_rank_max_s"] == 0.96 and row["committed_s"] == 1.102
    assert row["committed_s"] >= row["durable_rank_max_s"]
    per_rank = {r["rank"]: r["durable_s"] for r in analysis.rank_checkpoints(events)}
    assert per_rank == {0: 0.7, 1: 0.96}, "the per-rank spread is on the same clock"


def test_records_without_the_checkpoint_clock_keep_their_figures():
    """Run folders written before since_checkpoint_start_s read as they did."""
    step = {"step": 2, "tag": "step2", "phase": "train"}
    events = [{"event": "checkpoint.durable", "rank": r, "since_save_start_s": s, "bytes": 1, "n_files": 1, **step}
              for r, s in ((0, 0.8), (1, 0.9))]
    events.append({"event": "checkpoint.commit", "rank": 0, "since_save_start_s": 1.0, **step})
    [row] = results.checkpoints(events)
    assert row["durable_rank_max_s"] == 0.9 and row["committed_s"] == 1.0


class Saved:
    """A rank's save, done: its file is written, durable at ``durable_at`` (perf_counter)."""

    def __init__(self, root, tag, rank, durable_at):
        self.path = root / tag / f"rank{rank}.pt"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(bytes([rank]) * (100 + rank))
        self.durable_at = durable_at

    def wait_until_durable(self):
        return self.durable_at

    def written(self):
        return [FileRecord(str(self.path), self.path.stat().st_size, 0.01)]


def two_rank_logs(run_dir):
    return {rank: EventLog(run_dir, "train", rank) for rank in (0, 1)}


def test_settle_measures_every_durable_time_and_the_commit_from_the_first_save_start(tmp_path, one_process_group):
    """Two ranks in one process (as an emulating process holds them): rank 1 began its save 2 s ago and was durable
    1.96 s later, rank 0 began 1 s ago. From rank 0's own start the commit (about 1 s) would precede rank 1's
    durability; on the checkpoint's clock it follows it, and the checkpoint is committed."""
    store, logs = LocalStore(tmp_path / "ckpt"), two_rank_logs(tmp_path / "run")
    now = harness.SaveStart(time.time(), time.perf_counter())
    starts = {rank: harness.SaveStart(now.wall - ago, now.perf - ago) for rank, ago in ((0, 1.0), (1, 2.0))}
    saved = {rank: Saved(tmp_path / "ckpt", "step4", rank, now.perf - ago) for rank, ago in ((0, 0.5), (1, 0.04))}
    shares = [harness.durable_share(logs[r], store, r, 4, "step4", starts[r], saved[r].wait_until_durable,
                                    saved[r].written) for r in (0, 1)]
    assert harness.settle(logs, store, shares, 4, "step4", needed_bytes=201) == []
    for log in logs.values():
        log.close()
    events = read_events(tmp_path / "run")
    durable = {e["rank"]: e for e in events if e["event"] == "checkpoint.durable"}
    assert durable[1]["since_save_start_s"] == pytest.approx(1.96)
    assert durable[1]["since_checkpoint_start_s"] == pytest.approx(1.96)  # rank 1 began first
    assert durable[0]["since_save_start_s"] == pytest.approx(0.5)
    assert durable[0]["since_checkpoint_start_s"] == pytest.approx(1.5)  # rank 0 began 1 s after rank 1
    old_durable, old_committed = old_rule(events)
    assert old_committed < old_durable
    [row] = results.checkpoints(events)
    assert row["committed_s"] >= row["durable_rank_max_s"] == pytest.approx(1.96)
    assert store.read_text("latest") == "step4"
    manifest = json.loads(store.read_text("step4/manifest.json"))["files"]
    assert [(f["path"], f["rank"], f["bytes"]) for f in manifest] == [("step4/rank0.pt", 0, 100),
                                                                       ("step4/rank1.pt", 1, 101)]
    assert sorted(e["rank"] for e in events if e["event"] == "rank.resources") == [0, 1]


def test_settle_discards_a_checkpoint_a_rank_failed(tmp_path, one_process_group):
    """A rank whose save failed: nothing committed, the partial files removed, the error named with its rank; the
    durable rank still records its durability."""
    store, logs = LocalStore(tmp_path / "ckpt"), two_rank_logs(tmp_path / "run")
    start = harness.SaveStart(time.time() - 0.5, time.perf_counter() - 0.5)
    saved = Saved(tmp_path / "ckpt", "step2", 0, start.perf + 0.4)
    shares = [harness.durable_share(logs[0], store, 0, 2, "step2", start, saved.wait_until_durable, saved.written),
              harness.failed_share(1, start, "OSError: No space left on device")]
    errors = harness.settle(logs, store, shares, 2, "step2", needed_bytes=0)
    for log in logs.values():
        log.close()
    assert errors == ["rank 1: OSError: No space left on device"]
    events = read_events(tmp_path / "run")
    assert [e["rank"] for e in events if e["event"] == "checkpoint.durable"] == [0]
    [failed] = [e for e in events if e["event"] == "checkpoint.failed"]
    assert failed["errors"] == errors and failed["rank"] == 0
    assert not [e for e in events if e["event"] == "checkpoint.commit"]
    assert not store.exists("latest") and not (tmp_path / "ckpt" / "step2").exists()


def test_keep_checkpoints_removes_the_older_committed_ones_once_a_newer_commits(tmp_path, one_process_group):
    """--keep-checkpoints 2 over three checkpoints: nothing is removed until the third commits, then the oldest
    goes, manifest and files, recorded as checkpoint.removed with its bytes; 'latest' and the kept two stay."""
    store, logs = LocalStore(tmp_path / "ckpt"), two_rank_logs(tmp_path / "run")
    kept_after = []
    for step in (2, 4, 6):
        tag, start = f"step{step}", harness.SaveStart(time.time(), time.perf_counter())
        shares = []
        for rank in (0, 1):
            saved = Saved(tmp_path / "ckpt", tag, rank, start.perf)
            shares.append(harness.durable_share(logs[rank], store, rank, step, tag, start, saved.wait_until_durable,
                                                saved.written))
        assert harness.settle(logs, store, shares, step, tag, needed_bytes=0, keep=2) == []
        kept_after.append(committed_tags(store))
    for log in logs.values():
        log.close()
    assert kept_after == [["step2"], ["step4", "step2"], ["step6", "step4"]]
    assert store.read_text("latest") == "step6" and not (tmp_path / "ckpt" / "step2").exists()
    [removed] = [e for e in read_events(tmp_path / "run") if e["event"] == "checkpoint.removed"]
    assert (removed["tag"], removed["step"], removed["committed"], removed["keep"]) == ("step2", 2, "step6", 2)
    assert (removed["rank"], removed["bytes"], removed["n_files"]) == (0, 201, 2)
    assert removed["duration_s"] > 0 and removed["start"] <= removed["time"]  # a span: the removal's time


def test_the_process_read_counter_counts_a_files_bytes(tmp_path):
    """``process_read_bytes`` (rchar): reading a 3 MB file, page cache or not, adds at least its size."""
    path = tmp_path / "blob"
    path.write_bytes(b"\x01" * 3_000_000)
    before = harness.process_read_bytes()
    assert len(path.read_bytes()) == 3_000_000
    assert harness.process_read_bytes() - before >= 3_000_000

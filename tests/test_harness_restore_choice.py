"""The harness's side of every save and restore (restartbench.harness), on real objects: a local checkpoint store in
tmp_path, the ranks' real event logs, real manifests. Which checkpoint a restore takes (``--tag``, ``latest``, the
newest committed one; refused or fallen back from when its files fail the manifest check, ``--on-corrupt``), the
words of each refusal, a failed save's discard and its disk-full message, and the fields each event records for the
analysis. Collectives run in a one-process gloo group, or in two forked processes joined as two ranks (a few tenths
of a second) where what matters is what each rank of a job does."""

import contextlib
import dataclasses
import multiprocessing
import random
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from restartbench import harness
from restartbench.config import LaunchConfig
from restartbench.engines.base import Conversion, FileRecord
from restartbench.events import Event, EventLog, read_events
from restartbench.integrity import MANIFEST, committed_tags, read_manifest, write_manifest
from restartbench.memwatch import MemoryWatch
from restartbench.storage import LocalStore, open_store
from restartbench.storage.filehash import FORMAT

CORRUPT = f"its {FORMAT} hash differs from the manifest (corrupt)"
REFUSE_HINT = "rerun with --on-corrupt fallback to restore the newest earlier checkpoint that checks out"
SIZES = (1500, 2500)
"""Each rank's files of a checkpoint: two, of these sizes."""


@contextlib.contextmanager
def one_process_group():
    """A one-process gloo group (settling a checkpoint, checking files and the page-cache step are collectives),
    gone afterwards so that a test may fork ranks of its own."""
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def one_process():
    with one_process_group():
        yield


def on_two_ranks(tmp_path: Path, work) -> dict[int, object]:
    """``work(rank)`` in two forked processes joined in a gloo group as ranks 0 and 1 of one job; what each returned.
    A rank that raised fails the test with its error."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def rank_main(rank: int) -> None:
        try:
            dist.init_process_group("gloo", world_size=2, rank=rank, timeout=timedelta(seconds=20),
                                    store=dist.FileStore(str(tmp_path / "rendezvous"), 2))
            try:
                answers.put((rank, None, work(rank)))
            finally:
                dist.destroy_process_group()
        except BaseException as error:  # noqa: BLE001 - the parent reports it
            answers.put((rank, f"{type(error).__name__}: {error}", None))

    processes = [context.Process(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for process in processes:
        process.start()
    try:
        got = [answers.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    errors = {rank: error for rank, error, _ in got if error is not None}
    assert not errors, errors
    return {rank: value for rank, _, value in got}


# -- saving: a real checkpoint through begin_save, durable_share and settle -------------------------------------


def rank_files(root: Path, tag: str, rank: int) -> list[FileRecord]:
    """A rank's files of ``tag``, written (random bytes), as its engine reports them."""
    records = []
    for index, size in enumerate(SIZES):
        path = root / tag / f"rank{rank}-part{index}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(f"{tag}/{rank}/{index}").randbytes(size))
        records.append(FileRecord(str(path), size, 0.01 * (index + 1)))
    return records


def save(store: LocalStore, logs: dict[int, EventLog], step: int, ranks=(0, 1), **settle_options) -> list[str]:
    """Save checkpoint ``step<step>`` of ``ranks`` (those in ``logs``: this process's) as the harness does."""
    tag = f"step{step}"
    shares = []
    for rank in ranks:
        start = harness.begin_save(logs[rank], step, tag, engine="test")
        records = rank_files(store.root, tag, rank)
        shares.append(harness.durable_share(logs[rank], store, rank, step, tag, start, time.perf_counter,
                                            lambda records=records: records, background_done=True))
    return harness.settle(logs, store, shares, step, tag, needed_bytes=0, **settle_options)


def train_logs(run_dir: Path, ranks=(0, 1)) -> dict[int, EventLog]:
    return {rank: EventLog(run_dir, "train", rank) for rank in ranks}


def restore_logs(run_dir: Path, ranks=(0, 1)) -> dict[int, EventLog]:
    return {rank: EventLog(run_dir, "restore", rank) for rank in ranks}


def close(logs: dict[int, EventLog]) -> None:
    for log in logs.values():
        log.close()


def events_of(run_dir: Path, name: str) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == name]


def committed(tmp_path: Path, steps=(2, 4)) -> LocalStore:
    """A checkpoint folder with ``steps`` committed by two ranks of one process, ``latest`` naming the last."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "train-run")
    for step in steps:
        assert save(store, logs, step) == []
    close(logs)
    return store


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_begin_save_records_the_begun_checkpoint_and_returns_its_start_on_both_clocks(tmp_path):
    """``checkpoint.begin`` (a begun, never committed checkpoint is a lost one) with its step, tag and the caller's
    fields; the start is this moment on the wall clock (comparable across ranks) and on perf_counter (the clock of
    the rank's durable time)."""
    log = EventLog(tmp_path, "train", 3)
    wall, perf = time.time(), time.perf_counter()
    start = harness.begin_save(log, 6, "step6", engine="torch", emulated=True)
    assert wall <= start.wall <= time.time() and perf <= start.perf <= time.perf_counter()
    log.close()
    [begin] = read_events(tmp_path)
    assert (begin["event"], begin["rank"], begin["step"], begin["tag"]) == (Event.CHECKPOINT_BEGIN, 3, 6, "step6")
    assert (begin["engine"], begin["emulated"]) == ("torch", True)


def test_a_committed_checkpoint_records_each_ranks_files_and_the_commit_on_the_checkpoints_clock(tmp_path,
                                                                                               one_process):
    """Two ranks of one process save step4: each rank's wait, checksum and durability are recorded with the step,
    the durable record lists the rank's files relative to the store; the commit comes after every durable time and
    no later than now, measured from the first save start; each rank's resources follow, not marked per process;
    the manifest written checks out against the files."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run")
    first_start = time.time()
    assert save(store, logs, 4) == []
    elapsed = time.time() - first_start
    close(logs)
    events = read_events(tmp_path / "run")
    for name in (Event.CHECKPOINT_WAIT_DURABLE, Event.CHECKPOINT_CHECKSUM, Event.CHECKPOINT_DURABLE):
        assert sorted((e["rank"], e["step"], e["tag"]) for e in events if e["event"] == name) == \
            [(0, 4, "step4"), (1, 4, "step4")], name
    assert all(e["background_done"] is True for e in events if e["event"] == Event.CHECKPOINT_WAIT_DURABLE)
    durable = {e["rank"]: e for e in events if e["event"] == Event.CHECKPOINT_DURABLE}
    for rank, record in durable.items():
        assert record["files"] == [{"path": f"step4/rank{rank}-part{index}.pt", "bytes": size,
                                    "seconds": 0.01 * (index + 1)} for index, size in enumerate(SIZES)]
        assert (record["bytes"], record["n_files"]) == (sum(SIZES), 2)
    [commit] = [e for e in events if e["event"] == Event.CHECKPOINT_COMMIT]
    assert (commit["rank"], commit["step"], commit["tag"]) == (0, 4, "step4")
    assert max(d["since_checkpoint_start_s"] for d in durable.values()) <= commit["since_checkpoint_start_s"] <= elapsed
    resources = [e for e in events if e["event"] == Event.RANK_RESOURCES]
    assert sorted((e["rank"], e["tag"]) for e in resources) == [(0, "step4"), (1, "step4")]
    for record in resources:
        assert "per_process" not in record
        assert all(isinstance(record[key], int) and record[key] >= 0
                   for key in ("open_fds", "rss_bytes", "threads", "children"))
        assert record["open_fds"] > 0 and record["rss_bytes"] > 0 and record["threads"] > 0
    assert store.read_text("latest") == "step4"
    assert {f["hash"] for f in read_manifest(store, "step4")} != {None}
    assert harness.check_files(restore_logs(tmp_path / "run"), store, "step4") == []


def test_without_keep_checkpoints_every_committed_checkpoint_stays(tmp_path, one_process):
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run")
    assert save(store, logs, 2) == [] and save(store, logs, 4) == []
    close(logs)
    assert committed_tags(store) == ["step4", "step2"]
    assert not events_of(tmp_path / "run", Event.CHECKPOINT_REMOVED)


def test_an_emulating_process_marks_its_resources_as_the_whole_process(tmp_path, one_process):
    """``per_process``: the figures are one process's, recorded on each of its ranks."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run")
    assert save(store, logs, 2, per_process=True) == []
    close(logs)
    resources = events_of(tmp_path / "run", Event.RANK_RESOURCES)
    assert sorted((e["rank"], e["tag"], e["per_process"]) for e in resources) == [(0, "step2", True),
                                                                                  (1, "step2", True)]


def test_record_resources_marks_nothing_unless_asked(tmp_path):
    log = EventLog(tmp_path, "train", 0)
    harness.record_resources({0: log}, "step2")
    log.close()
    [record] = read_events(tmp_path)
    assert record["event"] == Event.RANK_RESOURCES and record["tag"] == "step2" and "per_process" not in record


def test_a_process_that_runs_only_rank_0_commits(tmp_path, one_process):
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run", ranks=(0,))
    assert save(store, logs, 2, ranks=(0,)) == []
    close(logs)
    assert store.read_text("latest") == "step2" and committed_tags(store) == ["step2"]


def test_a_rank_whose_files_never_became_durable_fails_the_save_naming_its_error(tmp_path, one_process):
    """The wait's error is the rank's share's error, as every rank learns it; rank 0 discards the checkpoint and
    records ``checkpoint.failed`` with the step, tag, errors, target, free space and the estimate it needed."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run")
    start = harness.begin_save(logs[0], 2, "step2")
    records = rank_files(store.root, "step2", 0)

    def never_durable():
        raise OSError("fsync failed: input/output error")

    share = harness.durable_share(logs[0], store, 0, 2, "step2", start, never_durable, lambda: records)
    assert share.error == "OSError: fsync failed: input/output error" and share.durable_at is None
    errors = harness.settle({0: logs[0]}, store, [share], 2, "step2", needed_bytes=5000)
    close(logs)
    assert errors == ["rank 0: OSError: fsync failed: input/output error"]
    [failed] = events_of(tmp_path / "run", Event.CHECKPOINT_FAILED)
    assert (failed["rank"], failed["step"], failed["tag"], failed["errors"]) == (0, 2, "step2", errors)
    assert failed["target"] == store.location and failed["needed_bytes_estimate"] == 5000
    assert isinstance(failed["free_bytes"], int) and failed["free_bytes"] > 5000
    assert not (store.root / "step2").exists() and not store.exists("latest")


def test_a_failed_save_on_a_full_folder_names_the_folder_first_with_free_and_needed_megabytes(tmp_path, one_process):
    """A person reads the first error: the folder is full, how much was free after the failed save (before the
    partial files went) and about how much the checkpoint needs; the ranks' own error follows."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run")
    start = harness.begin_save(logs[0], 2, "step2")
    rank_files(store.root, "step2", 0)
    shares = [harness.failed_share(0, start, "OSError: [Errno 28] No space left on device")]
    needed = 10**15
    errors = harness.settle({0: logs[0]}, store, shares, 2, "step2", needed_bytes=needed)
    close(logs)
    [failed] = events_of(tmp_path / "run", Event.CHECKPOINT_FAILED)
    free = failed["free_bytes"]
    assert free > 10**7, "the test needs a folder with some room, for the figures to differ in MB"
    assert errors == [f"the checkpoint folder {store.location} is full: {free / 1e6:.1f} MB free after the failed "
                      "save, the checkpoint needs about 1000000000.0 MB (no space left on device)",
                      "rank 0: OSError: [Errno 28] No space left on device"]
    assert failed["errors"] == errors and failed["needed_bytes_estimate"] == needed
    assert not (store.root / "step2").exists()


def test_a_folder_with_exactly_the_room_the_checkpoint_needs_is_not_called_full(tmp_path, one_process):
    """Full means less free than needed. The discard reads the free space again after the event log's writes:
    tried until no other writer on the disk changed it in between."""
    store, logs = LocalStore(tmp_path / "ckpt"), train_logs(tmp_path / "run", ranks=(0,))
    store.root.mkdir()
    for attempt in range(50):
        start = harness.begin_save(logs[0], attempt, f"step{attempt}")
        shares = [harness.failed_share(0, start, "OSError: input/output error")]
        free = store.free_bytes()
        errors = harness.settle(logs, store, shares, attempt, f"step{attempt}", needed_bytes=free)
        if events_of(tmp_path / "run", Event.CHECKPOINT_FAILED)[-1]["free_bytes"] == free:
            break
    else:
        pytest.fail("the disk's free space changed during every attempt")
    close(logs)
    assert errors == ["rank 0: OSError: input/output error"]


# -- restoring: which checkpoint ----------------------------------------------------------------------------------


def launch(**options) -> LaunchConfig:
    return dataclasses.replace(LaunchConfig(), **options)


def choose(tmp_path: Path, store: LocalStore, requested: str | None = None, **options) -> tuple[str, list[str]]:
    """restore_tag for ranks 0 and 1 of one process: the tag and what it said."""
    said: list[str] = []
    logs = restore_logs(tmp_path / "run")
    try:
        return harness.restore_tag(logs, store, launch(**options), requested, said.append), said
    finally:
        close(logs)


def refusal(tmp_path: Path, store: LocalStore, kind, requested: str | None = None, **options) -> str:
    logs = restore_logs(tmp_path / "run")
    try:
        with pytest.raises(kind) as refused:
            harness.restore_tag(logs, store, launch(**options), requested, lambda line: None)
    finally:
        close(logs)
    return str(refused.value)


def test_latest_is_restored_when_its_files_check_out(tmp_path, one_process):
    """Every rank records the check of the chosen checkpoint (``restore.check_files``, no problem); no fallback."""
    store = committed(tmp_path)
    assert choose(tmp_path, store) == ("step4", ["restore: checking step4's files against its manifest"])
    checks = events_of(tmp_path / "run", Event.RESTORE_CHECK_FILES)
    assert sorted((e["rank"], e["tag"], e["problems"]) for e in checks) == [(0, "step4", []), (1, "step4", [])]
    assert all(e["duration_s"] >= 0 for e in checks)
    assert not events_of(tmp_path / "run", Event.RESTORE_FALLBACK)


def test_without_check_files_latest_is_restored_unchecked(tmp_path, one_process):
    store = committed(tmp_path)
    flip_a_byte(store.root / "step4" / "rank1-part0.pt")
    assert choose(tmp_path, store, check_files=False) == ("step4", [])
    assert not events_of(tmp_path / "run", Event.RESTORE_CHECK_FILES)


def test_a_requested_earlier_checkpoint_is_restored_instead_of_latest(tmp_path, one_process):
    store = committed(tmp_path, steps=(2, 4, 6))
    assert choose(tmp_path, store, "step4") == ("step4", ["restore: checking step4's files against its manifest"])


def test_a_requested_tag_that_was_never_committed_is_refused_naming_the_committed_ones(tmp_path, one_process):
    store = committed(tmp_path)
    (store.root / "step6").mkdir()  # begun, never committed: no manifest
    assert refusal(tmp_path, store, harness.NoCheckpoint, "step6") == (
        f"--tag step6 is not a committed checkpoint in {store.location} "
        "(the committed checkpoints here are step4, step2)")


def test_a_requested_tag_in_a_folder_without_checkpoints_is_refused_saying_none_has_a_manifest(tmp_path):
    store = LocalStore(tmp_path / "ckpt")
    store.root.mkdir()
    assert refusal(tmp_path, store, harness.NoCheckpoint, "step2") == (
        f"--tag step2 is not a committed checkpoint in {store.location} (no checkpoint here has a manifest)")


def test_no_latest_and_no_committed_checkpoint_is_refused_saying_what_to_do(tmp_path):
    store = LocalStore(tmp_path / "ckpt")
    (store.root / "step2").mkdir(parents=True)
    assert refusal(tmp_path, store, harness.NoCheckpoint, on_corrupt="fallback") == (
        f"no complete checkpoint in {store.location}: 'latest' is missing and no checkpoint has its manifest (phase 1 "
        "never committed one); rerun phase 1 or point --checkpoint-dir elsewhere")


def test_a_missing_latest_is_refused_by_default_naming_the_committed_checkpoints(tmp_path, one_process):
    store = committed(tmp_path)
    (store.root / "latest").unlink()
    assert refusal(tmp_path, store, harness.CorruptCheckpoint) == (
        f"'latest' is missing in {store.location}, but the committed checkpoints here are step4, step2; rerun with "
        "--on-corrupt fallback to restore the newest that checks out")
    assert not events_of(tmp_path / "run", Event.RESTORE_CHECK_FILES)


def test_a_missing_latest_under_fallback_restores_the_newest_committed_checkpoint(tmp_path, one_process):
    store = committed(tmp_path, steps=(2, 4, 6))
    (store.root / "latest").unlink()
    assert choose(tmp_path, store, on_corrupt="fallback") == ("step6", [
        "restore: 'latest' is missing; trying the newest committed checkpoint, step6",
        "restore: checking step6's files against its manifest"])


def test_a_damaged_latest_is_refused_naming_each_bad_file_and_the_committed_checkpoints(tmp_path, one_process):
    """Refused at the first damaged checkpoint: nothing earlier is checked."""
    store = committed(tmp_path)
    for name in ("rank0-part1.pt", "rank1-part0.pt"):
        flip_a_byte(store.root / "step4" / name)
    root = store.root
    assert refusal(tmp_path, store, harness.CorruptCheckpoint) == (
        f"checkpoint step4 in {store.location} fails its manifest check:\n"
        f"  {root}/step4/rank0-part1.pt: {CORRUPT}\n"
        f"  {root}/step4/rank1-part0.pt: {CORRUPT}\n"
        f"the committed checkpoints here are step4, step2; {REFUSE_HINT}")
    checks = events_of(tmp_path / "run", Event.RESTORE_CHECK_FILES)
    assert [(e["rank"], e["tag"]) for e in checks] == [(0, "step4"), (1, "step4")]
    assert checks[0]["problems"] == [f"{root}/step4/rank0-part1.pt: {CORRUPT}",
                                     f"{root}/step4/rank1-part0.pt: {CORRUPT}"]


def test_a_latest_whose_manifest_is_gone_is_refused_as_never_committed(tmp_path, one_process):
    store = committed(tmp_path, steps=(2,))
    (store.root / "step2" / MANIFEST).unlink()
    assert refusal(tmp_path, store, harness.CorruptCheckpoint) == (
        f"checkpoint step2 in {store.location} fails its manifest check:\n"
        f"  checkpoint step2 in {store.location} has no {MANIFEST}: it was never committed\n"
        f"no checkpoint here has a manifest; {REFUSE_HINT}")


def test_fallback_restores_the_newest_earlier_checkpoint_that_checks_out(tmp_path, one_process):
    """``--tag step6`` damaged (a truncated file), step4 damaged too (a missing file), step2 whole: step2 is restored
    and step8, newer than the one asked for, is never tried. Each checkpoint is checked once; the fallback is said
    naming the wanted checkpoint's own damage, and recorded on every rank."""
    store = committed(tmp_path, steps=(2, 4, 6, 8))
    truncated = store.root / "step6" / "rank1-part1.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    (store.root / "step4" / "rank0-part0.pt").unlink()
    first_damage = f"{truncated}: 100 bytes, manifest says {SIZES[1]} (truncated or overwritten)"
    tag, said = choose(tmp_path, store, "step6", on_corrupt="fallback")
    assert tag == "step2"
    assert said == [f"restore: checking {t}'s files against its manifest" for t in ("step6", "step4", "step2")] + [
        f"restore: step6 is damaged ({first_damage}); falling back to step2"]
    checks = events_of(tmp_path / "run", Event.RESTORE_CHECK_FILES)
    assert [(e["rank"], e["tag"]) for e in checks] == [(r, t) for r in (0, 1) for t in ("step6", "step4", "step2")]
    assert [e["problems"] for e in checks if e["rank"] == 0] == [
        [first_damage], [f"{store.root}/step4/rank0-part0.pt: missing"], []]
    fallback = events_of(tmp_path / "run", Event.RESTORE_FALLBACK)
    assert [(e["rank"], e["wanted"], e["restored"]) for e in fallback] == [(0, "step6", "step2"), (1, "step6", "step2")]


def test_a_missing_latest_under_fallback_falls_back_from_a_damaged_newest(tmp_path, one_process):
    store = committed(tmp_path)
    (store.root / "latest").unlink()
    flip_a_byte(store.root / "step4" / "rank0-part0.pt")
    tag, said = choose(tmp_path, store, on_corrupt="fallback")
    assert tag == "step2" and said[-1] == (f"restore: step4 is damaged ({store.root}/step4/rank0-part0.pt: {CORRUPT}); "
                                           "falling back to step2")


def test_fallback_refuses_when_no_committed_checkpoint_checks_out(tmp_path, one_process):
    store = committed(tmp_path)
    for tag in ("step2", "step4"):
        flip_a_byte(store.root / tag / "rank1-part1.pt")
    assert refusal(tmp_path, store, harness.CorruptCheckpoint, on_corrupt="fallback") == (
        f"no committed checkpoint in {store.location} passes its manifest check "
        "(the committed checkpoints here are step4, step2)")
    assert not events_of(tmp_path / "run", Event.RESTORE_FALLBACK)


def test_two_ranks_share_the_check_and_both_learn_every_problem(tmp_path):
    """Two ranks of a job (two processes) save step2 and step4 (only the process of rank 0 commits), then restore
    under fallback: step4's damaged file is in rank 1's share of the check (the manifest's files are dealt out in
    turn: rank 0 checks the 1st and 3rd, rank 1 the 2nd and 4th), and both ranks learn of it, fall back to step2
    and record the same problems."""
    store_root, run_dir = tmp_path / "ckpt", tmp_path / "run"

    def saving(rank):
        store, logs = LocalStore(store_root), train_logs(run_dir, ranks=(rank,))
        errors = [save(store, logs, step, ranks=(rank,)) for step in (2, 4)]
        close(logs)
        return errors

    assert on_two_ranks(tmp_path / "a", saving) == {0: [[], []], 1: [[], []]}
    assert committed_tags(store_root) == ["step4", "step2"]
    assert [f["path"] for f in read_manifest(store_root, "step4")][1] == "step4/rank0-part1.pt"
    flip_a_byte(store_root / "step4" / "rank0-part1.pt")

    def restoring(rank):
        logs = restore_logs(run_dir, ranks=(rank,))
        tag = harness.restore_tag(logs, LocalStore(store_root), launch(on_corrupt="fallback"), None, lambda _: None)
        close(logs)
        return tag

    assert on_two_ranks(tmp_path / "b", restoring) == {0: "step2", 1: "step2"}
    checks = events_of(run_dir, Event.RESTORE_CHECK_FILES)
    assert sorted((e["rank"], e["tag"], tuple(e["problems"])) for e in checks) == [
        (rank, tag, problems) for rank in (0, 1)
        for tag, problems in (("step2", ()), ("step4", (f"{store_root}/step4/rank0-part1.pt: {CORRUPT}",)))]
    with one_process_group():  # one rank checking every file itself comes to the same
        assert choose(tmp_path / "alone", LocalStore(store_root), on_corrupt="fallback")[0] == "step2"
    alone = events_of(tmp_path / "alone" / "run", Event.RESTORE_CHECK_FILES)
    assert [e["problems"] for e in alone if e["rank"] == 0] == [[f"{store_root}/step4/rank0-part1.pt: {CORRUPT}"], []]


def test_each_of_two_ranks_reads_only_its_share_of_the_files_it_checks(tmp_path):
    """The check is shared, not repeated: of a checkpoint of four 1 MB files, each of two ranks reads two (about
    2 MB, as the kernel counts the process's reads), and both find every file whole; one rank alone reads all four."""
    store = LocalStore(tmp_path / "ckpt")
    entries = []
    for index in range(4):
        path = store.root / "step2" / f"part{index}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(index).randbytes(2**20))
        entries.append({"path": f"step2/{path.name}", "bytes": 2**20, "rank": index,
                        "hash": store.file_hash(f"step2/{path.name}")})
    write_manifest(store, "step2", entries)

    def checking(rank, run_dir=tmp_path / "run"):
        logs = restore_logs(run_dir, ranks=(rank,))
        before = harness.process_read_bytes()
        problems = harness.check_files(logs, store, "step2")
        read = harness.process_read_bytes() - before
        close(logs)
        return problems, read

    checked = on_two_ranks(tmp_path / "a", checking)
    assert [problems for problems, _ in checked.values()] == [[], []]
    assert all(2 * 2**20 <= read < 3 * 2**20 for _, read in checked.values()), checked
    with one_process_group():
        alone, read = checking(0, tmp_path / "alone")
    assert alone == [] and read >= 4 * 2**20


# -- restoring: the page cache, a conversion, the load and its result ----------------------------------------------


def test_a_cold_restore_evicts_the_checkpoint_and_records_it_on_every_rank(tmp_path, one_process):
    store = committed(tmp_path, steps=(2,))
    logs = restore_logs(tmp_path / "run")
    cache = harness.page_cache_before_load(logs, store, "step2", "cold")
    close(logs)
    assert cache == {"cache": "cold", "resident_fraction": 0.0, "cache_requested": "cold"}
    records = events_of(tmp_path / "run", Event.RESTORE_CACHE)
    assert [(e["rank"], e["tag"], e["cache"], e["resident_fraction"], e["cache_requested"]) for e in records] == [
        (0, "step2", "cold", 0.0, "cold"), (1, "step2", "cold", 0.0, "cold")]


def test_a_warm_restore_leaves_the_cache_and_says_what_was_resident(tmp_path, one_process):
    store = committed(tmp_path, steps=(2,))
    for path in (store.root / "step2").iterdir():
        path.read_bytes()
    logs = restore_logs(tmp_path / "run", ranks=(0,))
    cache = harness.page_cache_before_load(logs, store, "step2", "warm")
    close(logs)
    assert cache["cache"] == "warm" and cache["resident_fraction"] > 0 and cache["cache_requested"] == "warm"


def test_an_object_store_restore_has_no_page_cache(tmp_path):
    """Every byte comes over the network: nothing is evicted or measured, and the store is not contacted."""
    store = open_store("s3://bucket/run")
    logs = restore_logs(tmp_path / "run")
    cache = harness.page_cache_before_load(logs, store, "step4", "cold")
    close(logs)
    assert cache == {"cache": "remote", "resident_fraction": None, "cache_requested": "cold"}
    records = events_of(tmp_path / "run", Event.RESTORE_CACHE)
    assert [(e["rank"], e["tag"], e["cache"], e["resident_fraction"], e["cache_requested"]) for e in records] == [
        (0, "step4", "remote", None, "cold"), (1, "step4", "remote", None, "cold")]


@dataclasses.dataclass
class CopyingConverter:
    """An offline conversion that writes ``<tag>``'s files again under ``<tag>_universal``, reading each once."""

    ds_config: dict = dataclasses.field(default_factory=dict)

    def convert(self, load_dir: str, tag: str) -> Conversion:
        source, target = Path(load_dir) / tag, Path(load_dir) / f"{tag}_universal"
        target.mkdir()  # a second conversion of the same tag fails
        files = sorted(path for path in source.iterdir() if path.is_file() and path.name != MANIFEST)
        for path in files:
            shutil.copyfile(path, target / path.name)
        total = sum(path.stat().st_size for path in files)
        return Conversion(target.name, len(files), total, len(files), total, ["copy", str(source), str(target)])


class FailingConverter:
    ds_config: dict = {}

    def convert(self, load_dir: str, tag: str) -> Conversion:
        raise RuntimeError(f"no universal checkpoint could be made of {Path(load_dir) / tag}")


def test_a_conversion_returns_the_tag_to_load_and_records_what_it_read_and_wrote(tmp_path, one_process):
    store = committed(tmp_path, steps=(4,))
    log = EventLog(tmp_path / "run", "restore", 0)
    assert harness.convert(log, CopyingConverter(), str(store.root), "step4") == "step4_universal"
    log.close()
    assert sorted(p.name for p in (store.root / "step4_universal").iterdir()) == [
        f"rank{r}-part{i}.pt" for r in (0, 1) for i in (0, 1)]
    [record] = events_of(tmp_path / "run", Event.RESTORE_CONVERT)
    assert (record["tag"], record["converted_tag"]) == ("step4", "step4_universal")
    assert (record["files_read"], record["bytes_read"], record["files_written"], record["bytes_written"]) == (
        4, 2 * sum(SIZES), 4, 2 * sum(SIZES))
    assert record["command"] == ["copy", str(store.root / "step4"), str(store.root / "step4_universal")]
    assert record["duration_s"] >= 0 and "error" not in record


def test_a_failed_conversion_is_named_with_the_error_of_rank_0(tmp_path, one_process):
    log = EventLog(tmp_path / "run", "restore", 0)
    with pytest.raises(harness.ConversionFailed) as failed:
        harness.convert(log, FailingConverter(), str(tmp_path / "ckpt"), "step4")
    log.close()
    cause = f"RuntimeError: no universal checkpoint could be made of {tmp_path / 'ckpt' / 'step4'}"
    assert str(failed.value) == f"the conversion of step4 for another layout failed on rank 0: {cause}"
    [record] = events_of(tmp_path / "run", Event.RESTORE_CONVERT)
    assert record["tag"] == "step4" and record["error"] == f"ConversionFailed: {failed.value}"


def test_rank_0_converts_once_and_every_rank_loads_its_result(tmp_path):
    """Two ranks: rank 0 converts while rank 1 waits; both learn the tag to load and record what was converted. A
    conversion that fails on rank 0 fails on rank 1 too, naming rank 0's error."""
    store = LocalStore(tmp_path / "ckpt")
    for rank in (0, 1):
        rank_files(store.root, "step4", rank)
    run_dir = tmp_path / "run"

    def converting(rank):
        log = EventLog(run_dir, "restore", rank)
        try:
            return harness.convert(log, CopyingConverter(), str(store.root), "step4")
        finally:
            log.close()

    assert on_two_ranks(tmp_path / "a", converting) == {0: "step4_universal", 1: "step4_universal"}
    records = events_of(run_dir, Event.RESTORE_CONVERT)
    assert sorted((e["rank"], e["converted_tag"], e["files_written"]) for e in records) == [
        (0, "step4_universal", 4), (1, "step4_universal", 4)]

    def failing(rank):
        log = EventLog(run_dir, "restore", rank, attempt=2)
        try:
            harness.convert(log, FailingConverter(), str(store.root), "step6")
        except harness.ConversionFailed as failure:
            return str(failure)
        finally:
            log.close()

    said = (f"the conversion of step6 for another layout failed on rank 0: RuntimeError: no universal checkpoint "
            f"could be made of {store.root / 'step6'}")
    assert on_two_ranks(tmp_path / "b", failing) == {0: said, 1: said}
    run_dir = tmp_path / "alone"
    with one_process_group():  # the same words from a job of one rank
        assert failing(0) == said


def test_the_load_records_what_the_engine_and_the_kernel_say_it_read(tmp_path):
    """``restore.load`` with the caller's fields and the page-cache state, the engine's files (count, bytes, read
    and deserialize time), the bytes the process read meanwhile (at least the file it read, not the process's whole
    history) and the engine's own fields; returns what the load restored."""
    blob = tmp_path / "blob.pt"
    blob.write_bytes(b"\x07" * 3_000_000)
    assert len(blob.read_bytes()) == 3_000_000  # the process has read at least this much before the load
    log = EventLog(tmp_path / "run", "restore", 0)

    def load():
        assert len(blob.read_bytes()) == 3_000_000
        return [FileRecord(str(blob), 3_000_000, 0.25), FileRecord(str(blob) + ".meta", 1000, 0.5)], "the state"

    cache = {"cache": "cold", "resident_fraction": 0.0, "cache_requested": "cold"}
    restored = harness.timed_load(log, "step4", cache, load, lambda: {"prefetched": False}, engine="torch")
    log.close()
    assert restored == "the state"
    [record] = events_of(tmp_path / "run", Event.RESTORE_LOAD)
    assert (record["tag"], record["engine"], record["cache"], record["resident_fraction"],
            record["cache_requested"]) == ("step4", "torch", "cold", 0.0, "cold")
    assert (record["n_files"], record["bytes"], record["read_deserialize_s"]) == (2, 3_001_000, 0.75)
    assert 3_000_000 <= record["process_read_bytes"] < 4_000_000
    assert record["prefetched"] is False and record["duration_s"] > 0


def test_the_load_records_no_read_count_where_the_kernel_keeps_none(tmp_path, monkeypatch):
    """Off Linux (no /proc/self/io) the process's reads are unknown: None, and the load is still recorded."""
    monkeypatch.setattr(harness, "process_read_bytes", lambda: None)
    log = EventLog(tmp_path / "run", "restore", 0)
    assert harness.timed_load(log, "step4", {}, lambda: ([FileRecord("a", 10, 0.1)], 5)) == 5
    log.close()
    [record] = events_of(tmp_path / "run", Event.RESTORE_LOAD)
    assert record["process_read_bytes"] is None and (record["n_files"], record["bytes"]) == (1, 10)


def test_a_read_count_the_kernel_stops_giving_during_the_load_is_unknown(tmp_path, monkeypatch):
    """/proc/self/io readable before the load and not after (the load left the process without a free descriptor):
    the process's reads are unknown, not a crash of the restore."""
    readings = iter([1000, None])
    monkeypatch.setattr(harness, "process_read_bytes", lambda: next(readings))
    log = EventLog(tmp_path / "run", "restore", 0)
    assert harness.timed_load(log, "step4", {}, lambda: ([], "state")) == "state"
    log.close()
    [record] = events_of(tmp_path / "run", Event.RESTORE_LOAD)
    assert record["process_read_bytes"] is None and (record["n_files"], record["bytes"]) == (0, 0)


@pytest.mark.parametrize(("problems", "verified", "exact"), [
    ([], True, True), (["module.0.weight differs"], True, False), ([], False, None)])
def test_the_result_is_exact_only_when_verified_and_nothing_differs(tmp_path, problems, verified, exact):
    log = EventLog(tmp_path / "run", "restore", 1)
    harness.record_result(log, "step4", problems, 2.5, verified, emulated=True)
    log.close()
    [record] = events_of(tmp_path / "run", Event.RESTORE_RESULT)
    assert (record["rank"], record["tag"], record["exact"], record["verified"], record["problems"], record["loss"],
            record["emulated"]) == (1, "step4", exact, verified, problems, 2.5, True)


def test_the_memory_timeline_and_peak_are_recorded_on_every_rank_of_the_process(tmp_path):
    """``rank.memory``: the process's RSS since it started (what the report draws) and the phase's peak, with the
    sampling resolution."""
    process_start = time.time()
    watch = MemoryWatch(interval_s=0.005).start()
    time.sleep(0.05)
    logs = restore_logs(tmp_path / "run")
    harness.record_memory(logs, watch, process_start)
    watch.stop()
    close(logs)
    records = events_of(tmp_path / "run", Event.RANK_MEMORY)
    assert [e["rank"] for e in records] == [0, 1]
    for record in records:
        assert record["process_start"] == process_start and record["resolution_s"] == 0.005
        assert len(record["timeline"]) >= 2 and all(0 <= t < 5 and rss > 0 for t, rss in record["timeline"])
        assert record["peak_rss_bytes"] >= max(rss for _, rss in record["timeline"])

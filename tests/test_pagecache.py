"""Page-cache eviction and measurement on real files (mincore reports what the kernel holds).

A restore is labelled cold only when mincore shows no page of the checkpoint resident. The tests that
evict first check, with ``posix_fadvise`` called here directly, that the test folder's file system drops
pages at all; where it does not (tmpfs, some overlays), they are skipped naming the file system.
Only what a single process cannot produce is stood in for: a failing mincore, and the other ranks of a job.
"""

import ctypes
import errno
import os
import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

from restartbench import pagecache
from restartbench.integrity import write_manifest
from restartbench.storage import filehash

SIZE = 4 * 2**20


def _written(path, size=SIZE):
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
    return path


def _file_system_of(path):
    """'<type> at <mount point>' of the mount holding ``path``, from /proc/mounts (the longest matching mount)."""
    fs_type, mount_point = "unknown", "/"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        point = point.replace("\\040", " ")
        if Path(path).resolve().is_relative_to(point) and len(point) >= len(mount_point):
            fs_type, mount_point = kind, point
    return f"{fs_type} at {mount_point}"


@pytest.fixture
def evictable(tmp_path):
    """``tmp_path``, once a fsync'd file there is seen to leave the page cache on POSIX_FADV_DONTNEED."""
    probe = _written(tmp_path / "probe")
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    resident, total = pagecache.resident_pages(probe)
    probe.unlink()
    if resident:
        pytest.skip(f"{_file_system_of(tmp_path)} keeps {resident} of {total} pages of a fsync'd file after "
                    "POSIX_FADV_DONTNEED: eviction cannot be tested on it")
    return tmp_path


@pytest.fixture(scope="module")
def single_rank_group():
    """A one-process gloo group: ``before_restore`` is a collective."""
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def _checkpoint(root, tag="step4", n_files=3):
    """Files under ``root/tag`` with their manifest, as a commit leaves them."""
    (root / tag).mkdir()
    entries = []
    for index in range(n_files):
        path = _written(root / tag / f"zero_pp_rank_{index}_mp_rank_00_optim_states.pt")
        data = path.read_bytes()
        entries.append({"path": f"{tag}/{path.name}", "bytes": len(data), "hash": filehash.hash_file(path),
                        "rank": index})
    write_manifest(root, tag, entries)
    return [root / entry["path"] for entry in entries]


def test_a_just_written_file_is_resident_and_labelled_warm(tmp_path):
    state = pagecache.measure([_written(tmp_path / "shard.pt")])
    assert state.resident_fraction > 0.5 and state.label == "warm"


def test_eviction_leaves_no_page_resident_and_the_label_cold(evictable):
    paths = [_written(evictable / f"shard{i}.pt") for i in range(3)]
    pagecache.evict(paths)
    state = pagecache.measure(paths)
    assert state.resident_fraction == 0 and state.label == "cold"


def test_a_file_still_dirty_in_the_cache_is_evicted_too(evictable):
    """A run folder copied a moment ago has its checkpoint dirty in the page cache, where POSIX_FADV_DONTNEED alone
    drops nothing (tests/test_restore_attempts.py restores such a copy): eviction writes the pages first."""
    path = evictable / "copied.pt"
    path.write_bytes(os.urandom(SIZE))  # no fsync: dirty, as shutil.copytree leaves it
    pagecache.evict([path])
    assert pagecache.measure([path]).resident_fraction == 0


def test_a_page_the_first_eviction_left_is_dropped_by_another_pass(evictable, monkeypatch):
    paths = [_written(evictable / "shard.pt")]
    calls = []

    def held_once(files):
        calls.append(files)
        if len(calls) > 1:
            evict(files)

    evict = pagecache.evict
    monkeypatch.setattr(pagecache, "evict", held_once)
    assert pagecache.evict_and_measure(paths).label == "cold" and len(calls) == 2


def test_pages_no_pass_can_drop_are_measured_and_labelled_warm(evictable, monkeypatch):
    paths = [_written(evictable / "shard.pt")]
    calls = []
    monkeypatch.setattr(pagecache, "evict", calls.append)
    monkeypatch.setattr(pagecache.time, "sleep", lambda _: None)
    state = pagecache.evict_and_measure(paths)
    assert state.label == "warm" and state.resident_fraction == 1.0 and len(calls) == pagecache.EVICT_PASSES


def test_one_resident_page_makes_the_restore_warm(evictable):
    path = _written(evictable / "shard.pt")
    pagecache.evict([path])
    with open(path, "rb") as handle:
        handle.read(pagecache.PAGE)
    state = pagecache.measure([path])
    assert 0 < state.resident_fraction < 1 and state.label == "warm"


def test_reading_a_file_makes_it_warm_again(evictable):
    path = _written(evictable / "shard.pt")
    pagecache.evict([path])
    path.read_bytes()
    state = pagecache.measure([path])
    assert state.resident_fraction == pytest.approx(1.0) and state.label == "warm"


def test_pages_are_counted_whole_and_a_never_read_page_is_not_resident(tmp_path):
    """A sparse file was never read or written: none of its pages is in the cache; a file just read is."""
    sparse, size = tmp_path / "sparse", 3 * pagecache.PAGE + 1
    with open(sparse, "wb") as handle:
        handle.truncate(size)
    assert pagecache.resident_pages(sparse) == (0, 4)
    _written(tmp_path / "read", size).read_bytes()
    assert pagecache.resident_pages(tmp_path / "read") == (4, 4)


def test_a_failed_measurement_is_an_error_naming_the_file_never_a_label(tmp_path, monkeypatch):
    """Nothing is known of residency when mincore fails: read as 'nothing resident', it would label a warm restore
    cold."""
    class FailingLibc:
        @staticmethod
        def mincore(*_):
            ctypes.set_errno(errno.ENOMEM)
            return -1

    path = _written(tmp_path / "shard.pt")
    monkeypatch.setattr(pagecache, "libc", FailingLibc)
    with pytest.raises(OSError) as failure:
        pagecache.measure([path])
    assert (failure.value.errno, failure.value.strerror) == (errno.ENOMEM, f"mincore failed on {path}")


def test_empty_files_and_no_files_count_as_nothing_resident(tmp_path):
    empty = tmp_path / "empty"
    empty.touch()
    assert pagecache.resident_pages(empty) == (0, 0)
    assert pagecache.measure([]).label == "cold"


def test_a_cold_restore_evicts_the_checkpoint_and_says_cold(evictable, single_rank_group):
    paths = _checkpoint(evictable)
    assert pagecache.before_restore(evictable, "step4", "cold") == {
        "cache": "cold", "resident_fraction": 0.0, "cache_requested": "cold"}
    assert pagecache.measure(paths).resident_fraction == 0


def test_a_warm_restore_leaves_the_checkpoint_resident_and_says_warm(evictable, single_rank_group):
    paths = _checkpoint(evictable)
    pagecache.evict(paths[:1])  # one file read back, two never left the cache: what is resident is measured
    paths[0].read_bytes()
    assert pagecache.before_restore(evictable, "step4", "warm") == {
        "cache": "warm", "resident_fraction": 1.0, "cache_requested": "warm"}


@pytest.fixture
def another_rank(monkeypatch):
    """Joins this process to a stand-in second rank of the job: ``before_restore``'s all-gather returns this rank's
    resident fraction and ``theirs`` (``None`` from a rank that is not its node's first)."""
    def join(theirs):
        monkeypatch.setattr(dist, "get_world_size", lambda: 2)
        monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), [mine, theirs]))
    return join


def test_a_page_resident_on_another_node_makes_the_restore_warm(evictable, another_rank):
    _checkpoint(evictable)
    another_rank(0.25)
    assert pagecache.before_restore(evictable, "step4", "cold") == {
        "cache": "warm", "resident_fraction": 0.25, "cache_requested": "cold"}


def test_a_nodes_other_ranks_leave_the_files_to_its_first(tmp_path, another_rank, monkeypatch):
    """Each node has one page cache, evicted and measured by its LOCAL_RANK 0: the others do not even read the
    manifest (there is none here), and take the label from what the first ranks found."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    another_rank(0.0)
    assert pagecache.before_restore(tmp_path, "step4", "cold") == {
        "cache": "cold", "resident_fraction": 0.0, "cache_requested": "cold"}


@pytest.fixture
def in_memory_dir(tmp_path):
    """A folder on tmpfs, which holds files in memory by design (/dev/shm where it is tmpfs)."""
    if not _file_system_of("/dev/shm").startswith("tmpfs at /dev/shm"):
        pytest.skip(f"/dev/shm is not a tmpfs here ({_file_system_of('/dev/shm')})")
    folder = Path("/dev/shm") / f"restartbench-test-{os.getpid()}-{tmp_path.name}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


def test_a_checkpoint_that_stays_resident_is_warm_although_cold_was_asked(in_memory_dir, single_rank_group):
    """Only what mincore shows decides the label: tmpfs ignores the eviction."""
    _checkpoint(in_memory_dir)
    assert pagecache.before_restore(in_memory_dir, "step4", "cold") == {
        "cache": "warm", "resident_fraction": 1.0, "cache_requested": "cold"}

"""Page-cache eviction and measurement on real files (no mocks: mincore reports what the kernel holds)."""

import os

import pytest

from restartbench import pagecache


def _written(path, size=4 * 2**20):
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
    return path


def test_a_just_written_file_is_resident_and_eviction_makes_it_cold(tmp_path):
    path = _written(tmp_path / "shard.pt")
    assert pagecache.measure([path]).resident_fraction > 0.5  # just written: in the page cache
    pagecache.evict([path])
    state = pagecache.measure([path])
    if state.resident_fraction:  # some file systems (overlay on tmpfs) keep pages: then the label must say warm
        assert state.label == "warm"
    else:
        assert state.label == "cold"


def test_reading_a_file_makes_it_warm_again(tmp_path):
    path = _written(tmp_path / "shard.pt")
    pagecache.evict([path])
    path.read_bytes()
    state = pagecache.measure([path])
    assert state.resident_fraction == pytest.approx(1.0) and state.label == "warm"


def test_empty_files_and_no_files_count_as_nothing_resident(tmp_path):
    empty = tmp_path / "empty"
    empty.touch()
    assert pagecache.resident_pages(empty) == (0, 0)
    assert pagecache.measure([]).label == "cold"

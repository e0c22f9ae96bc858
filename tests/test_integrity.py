"""The manifest check a restore relies on, on real files: every damaged file is named with what is wrong."""

import hashlib
import json
import os
import threading

import pytest
from conftest import chunked_sha256

from restartbench import integrity
from restartbench.integrity import (
    check_share,
    committed_tags,
    hash_each,
    read_manifest,
    write_manifest,
)
from restartbench.storage import LocalStore, filehash

CORRUPT = f"its {filehash.FORMAT} hash differs from the manifest (corrupt)"


def _commit(root, tag, contents):
    """Write ``contents`` ({file name: bytes}) under ``root/tag`` and its manifest, hashed here independently.
    The entries are handed over in reverse order: the manifest sorts them, so every rank splits the same list."""
    (root / tag).mkdir(parents=True)
    entries = []
    for rank, (name, data) in enumerate(contents.items()):
        (root / tag / name).write_bytes(data)
        entries.append({"path": f"{tag}/{name}", "bytes": len(data), "hash": chunked_sha256(data), "rank": rank})
    write_manifest(root, tag, entries[::-1])
    return [root / tag / name for name in contents]


def _shards(count=3, size=4096):
    return {f"zero_pp_rank_{i}_mp_rank_00_optim_states.pt": bytes([i + 1]) * size for i in range(count)}


def test_an_intact_checkpoint_has_no_problems(tmp_path):
    _commit(tmp_path, "step4", _shards())
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == []


def test_a_flipped_byte_of_the_same_size_is_named_as_corrupt(tmp_path):
    victim = _commit(tmp_path, "step4", _shards())[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == [
        f"{victim}: {CORRUPT}"]


def test_a_truncated_file_reports_both_byte_counts(tmp_path):
    victim = _commit(tmp_path, "step4", _shards(size=4096))[2]
    victim.write_bytes(victim.read_bytes()[:1000])
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == [
        f"{victim}: 1000 bytes, manifest says 4096 (truncated or overwritten)"]


def test_a_missing_file_is_named(tmp_path):
    victim = _commit(tmp_path, "step4", _shards())[0]
    victim.unlink()
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == [f"{victim}: missing"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 7, 9])
def test_the_ranks_shares_cover_every_file_exactly_once(tmp_path, world_size):
    """With every file gone, each rank's problems name exactly the files it checked: every world_size-th."""
    paths = sorted(str(p) for p in _commit(tmp_path, "step4", _shards(count=7)))
    for path in paths:
        (tmp_path / path).unlink()
    checked = [[line.removesuffix(": missing") for line in check_share(tmp_path, "step4", rank, world_size)]
               for rank in range(world_size)]
    assert checked == [paths[rank::world_size] for rank in range(world_size)]
    assert sorted(path for share in checked for path in share) == paths


def test_committed_tags_are_newest_step_first_and_skip_tags_without_a_manifest(tmp_path):
    for tag in ("step2", "step10", "step4"):
        _commit(tmp_path, tag, _shards(count=1))
    (tmp_path / "step12").mkdir()  # begun, never committed
    (tmp_path / "step12" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"partial")
    (tmp_path / "latest").write_text("step10")
    assert committed_tags(tmp_path) == ["step10", "step4", "step2"]


def test_a_committed_folder_without_a_step_in_its_name_sorts_after_every_step(tmp_path):
    for tag in ("final", "step0", "step3"):
        _commit(tmp_path, tag, _shards(count=1))
    assert committed_tags(tmp_path) == ["step3", "step0", "final"]


def test_the_manifest_names_its_tag_its_hash_format_and_lists_every_file_sorted_by_path(tmp_path):
    """The file itself, for every reader and not only ``read_manifest``: ``tag``, ``hash_format`` and ``files``, each
    with its path relative to the checkpoint folder, size, hash and the rank that wrote it."""
    shards = _shards(count=2)
    _commit(tmp_path, "step4", shards)
    expected = [{"path": f"step4/{name}", "bytes": len(data), "hash": chunked_sha256(data), "rank": rank}
                for rank, (name, data) in enumerate(shards.items())]
    assert json.loads((tmp_path / "step4" / "manifest.json").read_text()) == {
        "tag": "step4", "hash_format": "sha256-chunked-v1", "files": expected}


def test_a_manifest_from_before_the_chunked_hash_is_checked_with_the_whole_files_sha256(tmp_path):
    """Written with each file's whole SHA-256 as ``sha256`` and no format: still restored, and a damage still named."""
    paths = _commit(tmp_path, "step4", _shards(count=2))
    old = {"tag": "step4", "files": [{"path": f"step4/{p.name}", "bytes": p.stat().st_size,
                                      "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "rank": 0}
                                     for p in paths]}
    (tmp_path / "step4" / "manifest.json").write_text(json.dumps(old))
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == []
    paths[1].write_bytes(b"x" * paths[1].stat().st_size)
    assert check_share(tmp_path, "step4", rank=0, world_size=1) == [
        f"{paths[1]}: its sha256 hash differs from the manifest (corrupt)"]


def test_reading_the_manifest_of_an_uncommitted_tag_says_never_committed(tmp_path):
    (tmp_path / "step6").mkdir()
    with pytest.raises(FileNotFoundError, match="step6 .* has no manifest.json: it was never committed"):
        read_manifest(tmp_path, "step6")


@pytest.mark.parametrize("threads", [None, 1, 2, 5])
def test_files_hashed_several_at_once_come_back_in_their_order(tmp_path, threads):
    """What a commit records (``hash_each``: a rank's files on threads, through the store), each file's hash in the
    order asked, whichever file finishes first."""
    sizes = [5 * 2**20 + 3, 0, 1, 2**20, 77]
    data = [os.urandom(size) for size in sizes]
    names = [f"step4/file{index}.pt" for index in range(len(sizes))]
    (tmp_path / "step4").mkdir()
    for name, content in zip(names, data):
        (tmp_path / name).write_bytes(content)
    store = LocalStore(tmp_path)
    assert hash_each(names, store.file_hash, threads=threads) == [chunked_sha256(content) for content in data]
    assert hash_each(names, lambda name: store.file_hash(name, filehash.WHOLE), threads=threads) == [
        hashlib.sha256(content).hexdigest() for content in data]
    assert hash_each([], store.file_hash, threads=threads) == []


def test_a_file_that_cannot_be_hashed_fails_the_whole_share(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"a")
    with pytest.raises(FileNotFoundError):
        hash_each(["a.pt", "gone.pt"], LocalStore(tmp_path).file_hash, threads=2)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_a_share_checked_on_threads_names_each_damaged_file_in_the_manifests_order(tmp_path, threads, monkeypatch):
    """Corrupt, truncated, missing and intact files mixed: each problem is named once, in the manifest's order."""
    monkeypatch.setattr(integrity, "FILE_THREADS", 1)  # threads= decides, not the default
    paths = _commit(tmp_path, "step4", _shards(count=7))
    for victim in paths[1], paths[4], paths[6]:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    paths[3].write_bytes(paths[3].read_bytes()[:10])
    paths[5].unlink()
    assert check_share(tmp_path, "step4", rank=0, world_size=1, threads=threads) == [
        f"{paths[1]}: {CORRUPT}",
        f"{paths[3]}: 10 bytes, manifest says 4096 (truncated or overwritten)",
        f"{paths[4]}: {CORRUPT}",
        f"{paths[5]}: missing",
        f"{paths[6]}: {CORRUPT}"]


@pytest.mark.parametrize("threads, default", [(1, 4), (3, 1)])
def test_a_share_is_hashed_on_the_threads_it_is_given_not_the_default(tmp_path, monkeypatch, threads, default):
    """check_share's ``threads`` decides, not FILE_THREADS: one thread hashes every file on the caller's own thread,
    more hash them on a pool of at most that many (``filehash.map_on_threads``)."""
    monkeypatch.setattr(integrity, "FILE_THREADS", default)
    _commit(tmp_path, "step4", _shards(count=4))
    hashed_on = []

    class RecordingStore(LocalStore):
        def file_hash(self, relative, fmt=filehash.FORMAT):
            hashed_on.append(threading.get_ident())
            return super().file_hash(relative, fmt)

    assert check_share(RecordingStore(tmp_path), "step4", rank=0, world_size=1, threads=threads) == []
    assert len(hashed_on) == 4
    if threads == 1:
        assert set(hashed_on) == {threading.get_ident()}
    else:
        assert threading.get_ident() not in hashed_on and len(set(hashed_on)) <= threads

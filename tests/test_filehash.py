"""The manifest's file hash (restartbench.storage.filehash): SHA-256 in chunks, the same from a file's chunks read on
threads as from a stream met in order, checked against a reference written here from hashlib alone."""

import hashlib
import os
import random
import subprocess
import sys

import pytest
from conftest import chunked_sha256

from restartbench.storage import filehash

SMALL = 4096


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(filehash, "CHUNK_BYTES", SMALL)


SIZES = [0, 1, SMALL - 1, SMALL, SMALL + 1, 7 * SMALL, 9 * SMALL + 123]


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_a_files_hash_is_the_formats_whatever_the_threads(tmp_path, size, threads):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert filehash.hash_file(tmp_path / "f", threads=threads) == chunked_sha256(data, SMALL)


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("size", SIZES)
def test_a_stream_in_pieces_of_any_size_hashes_as_the_file(size):
    """An object store's reader meets the chunks in order, in parts that do not line up with them."""
    data, pieces, hasher = os.urandom(size), random.Random(size), filehash.ChunkedHash()
    at = 0
    while at < size:
        step = pieces.randint(1, 3 * SMALL)
        hasher.update(memoryview(data)[at:at + step])
        at += step
    assert hasher.hexdigest() == chunked_sha256(data, SMALL)


def test_at_the_real_chunk_size_a_byte_in_any_chunk_changes_the_hash(tmp_path):
    data = bytearray(os.urandom(2 * filehash.CHUNK_BYTES + 5))
    (tmp_path / "f").write_bytes(data)
    whole = filehash.hash_file(tmp_path / "f")
    assert whole == chunked_sha256(bytes(data), 64 * 2**20)
    for byte in (0, filehash.CHUNK_BYTES, len(data) - 1):
        data[byte] ^= 1
        (tmp_path / "f").write_bytes(data)
        assert filehash.hash_file(tmp_path / "f", threads=2) != whole, byte
        data[byte] ^= 1


def test_the_whole_file_format_is_sha256sums_and_an_unknown_one_is_refused(tmp_path):
    data = os.urandom(3 * SMALL + 1)
    (tmp_path / "f").write_bytes(data)
    assert filehash.hash_file(tmp_path / "f", filehash.WHOLE) == hashlib.sha256(data).hexdigest()
    stream = filehash.new_hasher(filehash.WHOLE)
    stream.update(data)
    assert stream.hexdigest() == hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError, match="unknown file hash format 'md5'.*sha256-chunked-v1"):
        filehash.hash_file(tmp_path / "f", "md5")


def test_the_command_prints_what_a_manifest_records(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    done = subprocess.run([sys.executable, "-m", "restartbench.storage.hashsum", str(tmp_path / "a")],
                          capture_output=True, text=True, check=True)
    assert done.stdout == f"{chunked_sha256(b'abc', filehash.CHUNK_BYTES)}  {tmp_path / 'a'}\n" and not done.stderr


def test_the_command_names_a_file_it_cannot_read_and_hashes_the_others(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    done = subprocess.run([sys.executable, "-m", "restartbench.storage.hashsum", str(tmp_path / "gone"),
                           str(tmp_path / "a")], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == f"hashsum: {tmp_path / 'gone'}: No such file or directory\n"
    assert done.stdout == f"{chunked_sha256(b'abc')}  {tmp_path / 'a'}\n"

"""The hash a manifest records for each checkpoint file: SHA-256 in chunks, so that one large file is hashed on
several threads.

A rank's files reach 18 GB (a 1B model's optimizer partition). SHA-256 of a whole file is one stream, so one thread
hashes it: about 1 GB/s on the H100 machine, 19 s per 1B save and 19 s more before its restore (2026-11-27), the
harness's own time on the critical path of every commit. ``FORMAT`` hashes each CHUNK_BYTES chunk on its own, then
the header (format, chunk size, file size) and the chunks' digests in order:

    SHA-256( "sha256-chunked-v1 67108864 <size>\\n" || SHA-256(chunk 0) || SHA-256(chunk 1) || ... )

It is the same whether the chunks are read at once from a local file (``hash_file``, on threads) or met in order
in a stream (``ChunkedHash``, for an object store's reader). ``sha256sum`` does not print it;
``python -m restartbench.storage.hashsum FILE...`` does. A manifest names its format, so one written with the
whole file's SHA-256 (``WHOLE``, before this format) is still checked as it was written.
"""

from __future__ import annotations

import hashlib
import os
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

FORMAT = "sha256-chunked-v1"
WHOLE = "sha256"
"""The whole file's SHA-256 (what ``sha256sum`` prints): the manifests' format before FORMAT."""
CHUNK_BYTES = 64 * 2**20
"""Part of the hash (its header names it): a chunk size of another value gives another hash."""
THREADS = min(8, os.cpu_count() or 1)
"""Chunks read and hashed at once by ``hash_file``: ``os.preadv`` and hashlib release the GIL."""
READ_BYTES = 2**20
"""Each thread reads its chunk this much at a time into one buffer of its own: small enough that what it hashes is
still in the CPU's cache (a whole 64 MiB chunk read at once hashed at 1.33 GB/s on the 2-core machine, against
1.57 GB/s for hashlib's whole-file reads of 256 KiB)."""


T = TypeVar("T")
R = TypeVar("R")


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


class ChunkedHash:
    """FORMAT's hash of bytes fed in order, in pieces of any size (``update``), like hashlib's objects."""

    def __init__(self) -> None:
        self._digests: list[bytes] = []
        self._chunk = hashlib.sha256()
        self._filled = 0
        self._size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._size += len(view)
        while len(view):
            take = min(len(view), CHUNK_BYTES - self._filled)
            self._chunk.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == CHUNK_BYTES:
                self._digests.append(self._chunk.digest())
                self._chunk, self._filled = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        tail = [self._chunk.digest()] if self._filled else []
        return combine(self._size, self._digests + tail)


def combine(size: int, chunk_digests: list[bytes]) -> str:
    """FORMAT's hash of a file of ``size`` bytes from its chunks' SHA-256 digests, in order."""
    whole = hashlib.sha256(f"{FORMAT} {CHUNK_BYTES} {size}\n".encode())
    for digest in chunk_digests:
        whole.update(digest)
    return whole.hexdigest()


HASHERS: dict[str, type[Hasher]] = {FORMAT: ChunkedHash, WHOLE: hashlib.sha256}  # type: ignore[dict-item]
"""Each format's incremental hasher, for a stream (an object store's reader)."""


def new_hasher(fmt: str) -> Hasher:
    try:
        return HASHERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown file hash format {fmt!r}: this restartbench knows {sorted(HASHERS)}") from None


def hash_file(path: str | Path, fmt: str = FORMAT, threads: int | None = None) -> str:
    """``fmt``'s hash of a local file: FORMAT's chunks read and hashed on up to ``threads`` threads (default
    THREADS), each thread reading into a buffer of its own; another format's in one stream."""
    if fmt != FORMAT:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, lambda: new_hasher(fmt)).hexdigest()  # type: ignore[arg-type]
    size = os.path.getsize(path)
    starts = list(range(0, size, CHUNK_BYTES))
    threads = max(1, min(threads or THREADS, len(starts)))
    buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(threads):
        buffers.put(bytearray(READ_BYTES))
    fd = os.open(path, os.O_RDONLY)
    try:
        def chunk_digest(start: int) -> bytes:
            buffer = buffers.get()
            try:
                return _chunk_digest(fd, memoryview(buffer), start, min(start + CHUNK_BYTES, size), path)
            finally:
                buffers.put(buffer)

        digests = map_on_threads(chunk_digest, starts, threads)
    finally:
        os.close(fd)
    return combine(size, digests)


def map_on_threads(function: Callable[[T], R], items: list[T], threads: int) -> list[R]:
    """``function`` of every item, in their order, up to ``threads`` at once (on the calling thread when one is
    enough); the first failure is raised, as one thread's would."""
    threads = min(threads, len(items))
    if threads <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="filehash") as pool:
        return list(pool.map(function, items))


def _chunk_digest(fd: int, buffer: memoryview, start: int, stop: int, path: str | Path) -> bytes:
    """SHA-256 of the file's bytes [start, stop), read READ_BYTES at a time into ``buffer`` (``os.preadv`` may read
    less than asked); a file that shrank is an error."""
    digest, offset = hashlib.sha256(), start
    while offset < stop:
        count = os.preadv(fd, [buffer[:min(len(buffer), stop - offset)]], offset)
        if count == 0:
            raise OSError(f"{path}: ended at {offset} bytes while hashing it (the file shrank)")
        digest.update(buffer[:count])
        offset += count
    return digest.digest()

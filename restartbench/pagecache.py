"""Page-cache state of checkpoint files: evict them before a cold restore, and measure what stayed.

Eviction uses ``posix_fadvise(POSIX_FADV_DONTNEED)`` per file, which needs no privileges and
drops the file's clean pages only: a dirty page, or one under writeback, stays. A checkpoint is
fsync'd at commit, but a run folder copied since (``cp -r``, ``shutil.copytree``) has its files
dirty in the page cache for up to half a minute, so each file is ``fsync``'d first. Some
file systems ignore it (tmpfs and /dev/shm keep files in memory by design, some network file
systems cache elsewhere), so the result is measured with ``mincore`` over a mapping of each
file: a restore is labelled ``cold`` only when none of its bytes were resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

from restartbench import baseline
from restartbench.integrity import read_manifest

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
"""The C library ``resident_pages`` calls ``mincore`` in. Public: tests replace it."""
libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
PAGE = mmap.PAGESIZE


EVICT_PASSES = 3
"""Evictions tried before a restore is labelled by what stayed: a page the kernel holds for a moment (its journal's
buffers, a read in flight) is dropped by a second pass."""


def evict(paths: list[Path]) -> None:
    """Write each file's dirty pages, then drop its pages from the page cache (``baseline.evict``, the baseline's
    own cold read)."""
    for path in paths:
        baseline.evict(path)


def resident_pages(path: Path) -> tuple[int, int]:
    """(resident pages, total pages) of one file."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        pages = (size + PAGE - 1) // PAGE
        vector = (ctypes.c_ubyte * pages)()
        anchor = ctypes.c_char.from_buffer(mapping)  # exports the mapping's address; released before close
        failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vector) != 0
        del anchor
        if failed:
            raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
        return sum(byte & 1 for byte in vector), pages


@dataclass(frozen=True)
class CacheState:
    resident_fraction: float

    @property
    def label(self) -> str:
        return "cold" if self.resident_fraction == 0 else "warm"


def measure(paths: list[Path]) -> CacheState:
    resident = total = 0
    for path in paths:
        r, t = resident_pages(path)
        resident, total = resident + r, total + t
    return CacheState(resident / total if total else 0.0)


def evict_and_measure(paths: list[Path]) -> CacheState:
    """Evict ``paths`` until none of their bytes is resident or ``EVICT_PASSES`` are spent; what stayed."""
    for passes in range(1, EVICT_PASSES + 1):
        evict(paths)
        state = measure(paths)
        if state.resident_fraction == 0 or passes == EVICT_PASSES:
            return state
        time.sleep(0.1 * passes)


def before_restore(ckpt_dir: str | Path, tag: str, wanted: str) -> dict:
    """On every rank (a collective): evict checkpoint ``tag``'s files if ``wanted`` is ``cold``, then measure
    what is resident. One rank per node does the work, since each node has its own page cache; the label
    is ``cold`` only if no byte of the checkpoint was resident on any node."""
    import torch.distributed as dist

    state = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        paths = [Path(ckpt_dir) / f["path"] for f in read_manifest(ckpt_dir, tag)]
        state = (evict_and_measure(paths) if wanted == "cold" else measure(paths)).resident_fraction
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    resident = max(s for s in states if s is not None)
    return {"cache": "cold" if resident == 0 else "warm", "resident_fraction": resident, "cache_requested": wanted}

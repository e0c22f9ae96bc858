"""This machine's limits for a cluster file: storage write and read at the checkpoint's concurrency, host copy.

Each limit is the best of the methods tried, repeated, with min, median and max kept:

- write: fio, one job per rank of the node at once, sequential 1 MiB buffered writes ending in fsync
  (``restartbench.baseline.measure``); the file per job is sized well above what the page cache absorbs
  quickly, so the fsync measures the disk;
- read: fio's O_DIRECT sequential read of the same files, and a buffered read of the files after
  ``posix_fadvise(DONTNEED)`` (readahead, as ``torch.load`` reads), one thread per job; the faster method wins and
  is named;
- host copy: memcpy into preallocated buffers, one per rank at once (on a CPU machine the state is already in host
  memory: this is the copy a staging engine makes).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from restartbench.baseline import BaselineError, evict, measure

MB = 1e6
MiB = 2**20


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def buffered_read_MBps(paths: list[Path], block: int = 8 * MiB) -> float:
    """Read every file at once (one thread each) after evicting it from the page cache; aggregate MB/s."""
    for path in paths:
        evict(path)

    def read(path: Path) -> int:
        total = 0
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(block):
                total += len(chunk)
        return total
    start = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        total = sum(pool.map(read, paths))
    return total / MB / (time.perf_counter() - start)


def write_files(paths: list[Path], size: int, block: int = 8 * MiB) -> float:
    """Write ``size`` bytes of random data to each path at once (one thread each), fsync'd; aggregate MB/s."""
    data = os.urandom(block)

    def write(path: Path) -> None:
        with open(path, "wb", buffering=0) as handle:
            for _ in range(0, size, block):
                handle.write(data)
            os.fsync(handle.fileno())
    start = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(write, paths))
    return len(paths) * size / MB / (time.perf_counter() - start)


def storage_limits(target: Path, jobs: int, size_mib: int, repeats: int) -> dict[str, Any]:
    """Write and read limits of ``target`` at ``jobs`` at once, each method ``repeats`` times."""
    target.mkdir(parents=True, exist_ok=True)
    fio_write, fio_read, plain_write, plain_read = [], [], [], []
    paths = [target / f".whatif-probe-{os.getpid()}-{job}" for job in range(jobs)]
    for _ in range(repeats):
        try:
            fio = measure(target, size_mib, jobs=jobs)
            fio_write.append(fio["write_MBps"])
            fio_read.append(fio["read_MBps"])
        except (BaselineError, OSError, FileNotFoundError):
            pass
        try:
            plain_write.append(write_files(paths, size_mib * MiB))
            plain_read.append(buffered_read_MBps(paths))
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
    methods = {"write": {"fio buffered write + fsync (1 MiB)": fio_write,
                         "threads, 8 MiB writes + fsync": plain_write},
               "read": {"fio O_DIRECT read (1 MiB, psync)": fio_read,
                        "threads, buffered 8 MiB reads after DONTNEED": plain_read}}
    result: dict[str, Any] = {"target": str(target), "jobs": jobs, "size_mib_per_job": size_mib, "repeats": repeats}
    for side, tried in methods.items():
        spreads = {name: _spread(values) for name, values in tried.items() if values}
        best = max(spreads, key=lambda name: spreads[name]["median"])
        result[side] = {"best": best, "MBps": spreads[best], "methods": spreads}
    return result


def host_copy_MBps(nbytes: int, jobs: int, repeats: int = 5) -> dict[str, Any]:
    """memcpy of ``nbytes`` per job into preallocated buffers, ``jobs`` at once: one copier's MB/s."""
    import numpy as np

    pairs = [(np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)) for _ in range(jobs)]
    rates = []
    for _ in range(repeats):
        with ThreadPoolExecutor(jobs) as pool:
            start = time.perf_counter()
            list(pool.map(lambda pair: np.copyto(pair[1], pair[0]), pairs))
            rates.append(nbytes / MB / (time.perf_counter() - start))
    return {"bytes": nbytes, "jobs": jobs, "MBps": _spread(rates), "method": "numpy copyto, one thread per job"}


class ProbeError(ValueError):
    """A probe that could not measure what it measures; the message says why."""


def d2h_probe(nbytes: int = 2**30, repeats: int = 3) -> dict[str, Any]:
    """One GPU's device-to-host copy into pinned and into pageable memory (best of ``repeats`` after a warm-up, the
    device synchronized around each) and the rate of pinning fresh host memory (cudaHostRegister), GB/s. The method
    of bench/gpu_probe.py (FACTS.md's H100 probe)."""
    import torch

    def best(copy: Callable[[], object]) -> float:
        copy()
        seconds = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        return nbytes / 1e9 / min(seconds)

    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    figures = {"d2h_pinned_GBps": best(lambda: pinned.copy_(device, non_blocking=True)),
               "d2h_pageable_GBps": best(lambda: pageable.copy_(device))}
    cudart, pin_s = torch.cuda.cudart(), []
    for _ in range(min(repeats, 3)):
        buffer = torch.ones(nbytes, dtype=torch.uint8)  # touched: the pages exist before they are pinned
        start = time.perf_counter()
        status = cudart.cudaHostRegister(buffer.data_ptr(), nbytes, 0)
        pin_s.append(time.perf_counter() - start)
        if int(status) != 0:
            raise ProbeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {int(status)}")
        cudart.cudaHostUnregister(buffer.data_ptr())
        del buffer
    return {**figures, "pin_GBps": nbytes / 1e9 / min(pin_s), "bytes": nbytes, "repeats": repeats,
            "gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
            "method": "one torch copy_ on the current stream, synchronized before and after, best of the repeats "
                      "after a warm-up; pinning: cudaHostRegister of a touched buffer, best of up to 3"}

"""The options of the lazy engine: fields of the run's ``EngineConfig``, options of ``config-n-run.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from restartbench.config_fields import AT_LEAST_1, for_device, opt

DIRECT_IO_BY_DEVICE = {"cpu": False, "cuda": True}
"""--lazy-direct-io's default by where the state lives. On CUDA the host buffer is pinned, so page-aligned, either
way, and the third H100 visit's 1B run (bench/results/2026-11-27-h100-gpu-engines-1B) was durable after 10.8 s with
O_DIRECT, at the disk's write speed, against 21.6 s buffered; its cold restore took as long either way. On the CPU
O_DIRECT needs a page-aligned buffer faulted in before the restart's reads (bench/results/2026-11-27-cpu2-lazy-io:
about 1 s per 2 GB more at set-up, for a durable 6.7 times faster). Before 2026-11-27 (the fourteenth session) the
default was off on every device."""


def direct_io(options: Any, device: str) -> bool:
    """Whether the lazy engine reads and writes its files' data regions with O_DIRECT where the state is on
    ``device`` ('cpu', 'cuda' or 'cuda:N'): as --lazy-direct-io or --no-lazy-direct-io say, else by device."""
    return bool(for_device(options.lazy_direct_io, DIRECT_IO_BY_DEVICE, device))


@dataclass
class LazyOptions:
    dp_read_once: bool = opt(
        False, "lazy: on restore, data-parallel rank 0 reads the replicated module weights and broadcasts them "
        "to its replicas, instead of every replica reading the same file.",
    )
    lazy_chunk_mb: int = opt(64, "lazy: size of each streamed write and of each read batch, MiB.", allowed=AT_LEAST_1)
    lazy_io_threads: int = opt(4, "lazy: threads issuing writes (save) and reads (restore) per rank.",
                               allowed=AT_LEAST_1)
    lazy_direct_io: bool | None = opt(
        None, "lazy: write and read each file's data region with O_DIRECT, between the host buffer and the device "
        "without the page cache (the header stays buffered; a load in another layout reads buffered). The file "
        "system must take O_DIRECT (tmpfs does not). Default: on where the state is on CUDA, off on the CPU.",
        by_device=DIRECT_IO_BY_DEVICE, before=False,
    )
    lazy_prefetch: bool = opt(
        False, "lazy: on a relaunch in the layout that saved, read this rank's files into the host buffer from just "
        "after the checkpoint is chosen (the process group up, the page cache evicted), while the model is built and "
        "DeepSpeed initializes; the load then waits for those reads and copies the tensors out. The restart's "
        "parts say so: the load's record holds the read's own time.",
    )

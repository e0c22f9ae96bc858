"""The options of the lazy engine: fields of the run's ``EngineConfig``, options of ``config-n-run.py``."""

from __future__ import annotations

from dataclasses import dataclass

from restartbench.config_fields import AT_LEAST_1, opt


@dataclass
class LazyOptions:
    dp_read_once: bool = opt(
        False, "lazy: on restore, data-parallel rank 0 reads the replicated module weights and broadcasts them "
        "to its replicas, instead of every replica reading the same file.",
    )
    lazy_chunk_mb: int = opt(64, "lazy: size of each streamed write and of each read batch, MiB.", allowed=AT_LEAST_1)
    lazy_io_threads: int = opt(4, "lazy: threads issuing writes (save) and reads (restore) per rank.",
                               allowed=AT_LEAST_1)
    lazy_direct_io: bool = opt(
        False, "lazy: write and read each file's data region with O_DIRECT, between the host buffer and the device "
        "without the page cache (the header stays buffered; a load in another layout reads buffered). The file "
        "system must take O_DIRECT (tmpfs does not).",
    )
    lazy_prefetch: bool = opt(
        False, "lazy: on a relaunch in the layout that saved, read this rank's files into the host buffer from just "
        "after the checkpoint is chosen (the process group up, the page cache evicted), while the model is built and "
        "DeepSpeed initializes; the load then waits for those reads and copies the tensors out. The restart's "
        "parts say so: the load's record holds the read's own time.",
    )

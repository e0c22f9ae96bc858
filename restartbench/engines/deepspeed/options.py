"""The options of DeepSpeed's writer engines (``fastpersist``, ``decoupled``) and of ``datastates``: fields of the
run's ``EngineConfig``, options of ``config-n-run.py``."""

from __future__ import annotations

from dataclasses import dataclass

from restartbench.config_fields import AT_LEAST_1, Allowed, opt


@dataclass
class DeepSpeedOptions:
    io_buffer_mb: int = opt(64, "fastpersist/decoupled: size of each aligned I/O buffer, MiB.", allowed=AT_LEAST_1)
    writer_data_parallel: str = opt(
        "replica", "fastpersist/decoupled: which data-parallel ranks write (DeepSpeed's writer.data_parallel).",
        choices=("replica", "socket", "machine"),
    )
    host_cache_gb: float = opt(4.0, "datastates: pinned host cache per rank, GB.",
                               allowed=Allowed(low=0, low_open=True))

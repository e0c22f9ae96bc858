"""restartbench's lazy engine: a reused host buffer, copies overlapped with the next forward and backward pass, a
streamed and fsync'd flush (format: docs/lazy-format.md)."""

from restartbench.engines.base import CostTraits, EngineInfo

ENGINES = (
    EngineInfo("lazy", "restartbench.engines.lazy.engine", "LazyEngine",
               "restartbench's lazy engine: reused host buffer, copies overlapped with the next fwd/bwd, "
               "streamed fsync'd flush", predictor="restartbench.engines.lazy.predict:PREDICTOR",
               emulator="restartbench.engines.lazy.emulate:LazyFiles",
               prefetcher="restartbench.engines.lazy.prefetch:PREFETCHER",  # --lazy-prefetch
               cost=CostTraits(asynchronous=True, side_stream=True, pins_at_setup=True),
               reshards_at_load=True,  # each new rank reads the byte ranges it needs (lazy/reshard.py)
               options=("dp_read_once", "lazy_chunk_mb", "lazy_io_threads", "lazy_direct_io", "lazy_prefetch")),
)

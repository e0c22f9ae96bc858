"""PyTorch Distributed Checkpoint: ``dcp.save`` (``dcp``) and ``dcp.async_save`` (``dcp-async``)."""

from restartbench.engines.base import EngineInfo

_ENGINE, _PREDICTOR = "restartbench.engines.dcp.engine", "restartbench.engines.dcp.predict:PREDICTOR"
_EMULATOR = "restartbench.engines.dcp.emulate:DCPFlat"

ENGINES = (
    EngineInfo("dcp", _ENGINE, "DCPEngine", "PyTorch Distributed Checkpoint, synchronous save", object_store=True,
               predictor=_PREDICTOR, emulator=_EMULATOR),
    EngineInfo("dcp-async", _ENGINE, "AsyncDCPEngine",
               "PyTorch Distributed Checkpoint, async_save (staging, then a background write)", object_store=True,
               predictor=_PREDICTOR, emulator=_EMULATOR),
)

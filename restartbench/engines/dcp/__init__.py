"""PyTorch Distributed Checkpoint: ``dcp.save`` (``dcp``) and ``dcp.async_save`` (``dcp-async``)."""

from restartbench.engines.base import EngineInfo

_ENGINE, _PREDICT = "restartbench.engines.dcp.engine", "restartbench.engines.dcp.predict"
_EMULATOR = "restartbench.engines.dcp.emulate:DCPFlat"
_NOT_RESHARDED = ("the study saves DCP's state per rank, keyed by the rank's (pp, tp, dp) coordinates as plain tensors "
                  "(not DTensors with their global offsets), so DCP's own load-time resharding has nothing to "
                  "redistribute: a rank on another layout finds no keys of its own")

ENGINES = (
    EngineInfo("dcp", _ENGINE, "DCPEngine", "PyTorch Distributed Checkpoint, synchronous save", object_store=True,
               predictor=f"{_PREDICT}:PREDICTOR", emulator=_EMULATOR, not_resharded=_NOT_RESHARDED),
    EngineInfo("dcp-async", _ENGINE, "AsyncDCPEngine",
               "PyTorch Distributed Checkpoint, async_save (staging, then a background write)", object_store=True,
               predictor=f"{_PREDICT}:ASYNC_PREDICTOR", emulator=_EMULATOR, not_resharded=_NOT_RESHARDED),
)

"""PyTorch Distributed Checkpoint: ``dcp.save`` (``dcp``) and ``dcp.async_save`` (``dcp-async``)."""

from restartbench.engines.base import CostTraits, EngineInfo

_ENGINE, _PREDICT = "restartbench.engines.dcp.engine", "restartbench.engines.dcp.predict"
_EMULATOR = "restartbench.engines.dcp.emulate:DCPFlat"
_NOT_RESHARDED = ("the study saves DCP's state per rank, keyed by the rank's (pp, tp, dp) coordinates as plain tensors "
                  "(not DTensors with their global offsets), so DCP's own load-time resharding has nothing to "
                  "redistribute: a rank on another layout finds no keys of its own")
#: Per tensor, collective, the module spread over the replicas by DCP's deduplication; both copy device tensors into
#: new pageable host memory (``save``'s writer, ``async_save``'s stager: ``DCPEngine.pinned_host_bytes`` says how).
_DCP_COST = dict(pageable_copy=True, collective=True, per_tensor=True, module_split=f"{_PREDICT}:dedup_owners")

ENGINES = (
    EngineInfo("dcp", _ENGINE, "DCPEngine", "PyTorch Distributed Checkpoint, synchronous save", object_store=True,
               predictor=f"{_PREDICT}:PREDICTOR", emulator=_EMULATOR, not_resharded=_NOT_RESHARDED,
               cost=CostTraits(**_DCP_COST)),
    EngineInfo("dcp-async", _ENGINE, "AsyncDCPEngine",
               "PyTorch Distributed Checkpoint, async_save (staging, then a background write)", object_store=True,
               predictor=f"{_PREDICT}:ASYNC_PREDICTOR", emulator=_EMULATOR, not_resharded=_NOT_RESHARDED,
               cost=CostTraits(asynchronous=True, **_DCP_COST)),
)

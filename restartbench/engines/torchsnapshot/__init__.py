"""TorchSnapshot 0.1.0 with the study's patch: every rank saves its own distinct state."""

from restartbench.engines.base import CostTraits, EngineInfo

ENGINES = (
    EngineInfo("torchsnapshot", "restartbench.engines.torchsnapshot.engine", "TorchSnapshotEngine",
               "TorchSnapshot 0.1.0 with the study's patch (every rank saves its own distinct state)",
               requires=(("torchsnapshot", "pip install torchsnapshot==0.1.0"),),
               predictor="restartbench.engines.torchsnapshot.predict:PREDICTOR",
               cost=CostTraits(pageable_copy=True, every_replica=True),
               not_emulated="TorchSnapshot's save is not emulated yet; run it for real without --emulate",
               not_resharded="the study's patch makes TorchSnapshot rank-local: one snapshot per rank "
                             "(rank<NNNNN>/), each the rank's own state with no global view of its tensors, so a "
                             "rank on another layout has no snapshot to load"),
)

"""Engine ``none``: no checkpoint at all (the iteration time without checkpoint cost, and the start-up floor of a
restart that restores nothing)."""

from restartbench.engines.base import EngineInfo

ENGINES = (
    EngineInfo("none", "restartbench.engines.none.engine", "NoCheckpoint",
               "no checkpoint: the baseline iteration time, and a relaunch that restores nothing",
               object_store=True, predictor="restartbench.engines.none.engine:PREDICTOR",
               not_emulated="engine none writes and reads nothing, so there is no checkpoint I/O to emulate",
               reshards_at_load=True,  # restores nothing, on any layout: the relaunch's start-up alone
               saves_state=False),
)

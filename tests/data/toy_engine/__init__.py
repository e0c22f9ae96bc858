"""Engine ``toy``: each rank torch.saves its training state into one file of its own (docs/adding-an-engine.md)."""

from restartbench.engines.base import EngineInfo

ENGINES = (
    EngineInfo("toy", "restartbench.engines.toy.engine", "ToyEngine",
               "a toy: each rank's training state torch.save'd into one file, synchronous",
               options=("toy_file_prefix",),
               not_predicted="the toy engine's files are not predicted (it has no predict.py)",
               not_emulated="the toy engine's I/O is not emulated (it has no emulate.py)",
               not_resharded="each rank's file holds its own state, with no global view of its tensors"),
)

"""The files of restartbench's lazy engine, predicted: the file plans and headers the engine computes itself.

The engine (torch) is imported inside the functions: the launcher and ``--dry-run`` read this module without torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from restartbench.shards import ShardSetup, TrainingState, cpu_resident, training_states
from restartbench.sizes import EnginePredictor, PlannedFile

LAZY_TOLERANCE_BYTES = 0
"""lazy: exact. The file is restartbench's own format: its header is computed by the engine's own functions from
the same values (the device each tensor lives on included), and the data region's size depends only on tensor
shapes."""


def lazy_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """restartbench's lazy format: the file plans and headers the lazy engine computes itself (``capture``,
    ``make_plan``, ``encode_header``) from each rank's state; a file is its header's pages plus its data region."""
    from restartbench.engines.lazy.capture import file_meta
    from restartbench.engines.lazy.format import encode_header, make_plan

    files = []
    for rank, coord, state in training_states(setup):
        layout, captured = lazy_capture(setup, rank, coord, state)
        for f in make_plan(captured.groups).files:
            _, data_offset = encode_header(f, file_meta(layout, setup.tag, captured, f.kind),
                                           captured.values if f.kind == "optim" else {})
            files.append(PlannedFile(f"{setup.tag}/{f.name}", rank, "model" if f.kind == "model" else "optimizer",
                                     sum(e.spec.nbytes for e in f.entries), data_offset + f.data_bytes))
    return files


def lazy_capture(setup: ShardSetup, rank: int, coord: Any, state: TrainingState) -> tuple[Any, Any]:
    """(the lazy engine's ``RankLayout`` of ``rank``, its ``capture`` of the rank's state), each tensor spec on the
    device the run's state lives on; the tensors are the state's own (meta tensors for a ``training_states`` one)."""
    from restartbench.engines.lazy.capture import RankLayout, capture
    from restartbench.model import parameter_splits

    layout = RankLayout(coord.pipe, coord.model, coord.data, setup.layout.dp,
                        dp_src=rank - coord.data * setup.layout.tp, dp_group=None, tp_size=setup.layout.tp,
                        pp_size=setup.layout.pp, rank=rank)
    captured = capture(state, layout, tp_dims={name: dim for name, dim, _ in parameter_splits(setup.preset)})
    return layout, replace(captured, groups=_lazy_on_device(captured.groups, setup.device))


def _lazy_on_device(groups: list[tuple[str, str, list[tuple[Any, bool]]]], device: str) -> list[Any]:
    """The lazy engine's file groups with each tensor on the device the run's state lives on (the header records
    it; the plan's tensors are meta tensors)."""
    return [(name, kind, [(replace(spec, device="cpu" if cpu_resident(spec.name) else device), sync)
                          for spec, sync in specs]) for name, kind, specs in groups]


PREDICTOR = EnginePredictor(lazy_files, LAZY_TOLERANCE_BYTES)

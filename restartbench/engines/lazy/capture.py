"""What one rank of the lazy engine saves: its place in the parallel layout (``RankLayout``: which files it
writes) and the capture of its training state, as tensors grouped per file and plain values.

Data-parallel rank 0 of each (pipeline stage, tensor slice) writes the module file, the state its replicas share;
every rank writes its own optimizer file (ZeRO partitions are distinct). ``state_to_come`` sizes the host buffer
for the optimizer state a first step will create.

The module's tensors and the step counters are read as every harness-level engine reads them
(``restartbench.engines.harness_state``); the optimizer is taken whole, as DeepSpeed's own ``state_dict``: why the
rest of that capture is not shared is said there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from restartbench.engines import harness_state
from restartbench.engines.lazy.format import LazyRestoreError, TensorSpec, encode_value, tensor_spec


@dataclass(frozen=True)
class RankLayout:
    pp: int
    tp: int
    dp: int
    dp_size: int
    dp_src: int
    """Global rank of data-parallel rank 0 of this rank's replica group (the one writing the module)."""
    dp_group: Any

    @property
    def model_file(self) -> str:
        return f"model_pp{self.pp:02d}_tp{self.tp:02d}.lazy"

    @property
    def optim_file(self) -> str:
        return f"optim_pp{self.pp:02d}_tp{self.tp:02d}_dp{self.dp:03d}.lazy"


def rank_layout(ds_engine: Any) -> RankLayout:
    """This rank's coordinates from DeepSpeed's pipeline grid; a single process without one is 0, 0, 0."""
    import torch.distributed as dist

    grid = getattr(ds_engine, "grid", None)
    if grid is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise LazyRestoreError("the lazy engine needs a DeepSpeed PipelineEngine (its grid gives the "
                                   "data-parallel groups); got an engine without a grid")
        return RankLayout(0, 0, 0, 1, 0, None)
    return RankLayout(grid.get_stage_id(), grid.get_slice_parallel_rank(), grid.get_data_parallel_rank(),
                      grid.get_data_parallel_world_size(), grid.get_data_parallel_group_ranks()[0],
                      grid.get_data_parallel_group())


def file_meta(layout: RankLayout, tag: str) -> dict[str, Any]:
    """The header fields that place a file in its checkpoint (also what restartbench.plan predicts headers with)."""
    return {"tag": tag, "pp": layout.pp, "tp": layout.tp, "dp": layout.dp, "dp_size": layout.dp_size}


@dataclass
class Capture:
    """References to the live tensors to save, grouped per file, and the plain values (already copied)."""
    groups: list[tuple[str, str, list[tuple[TensorSpec, bool]]]]
    tensors: dict[str, torch.Tensor]
    values: dict[str, Any]


def capture(ds_engine: Any, layout: RankLayout) -> Capture:
    """What this rank saves: the module state (data-parallel rank 0 only: it is replicated), and the
    optimizer state, scheduler state and step counters (every rank: ZeRO partitions are distinct)."""
    tensors: dict[str, torch.Tensor] = {}
    groups = []
    if layout.dp == 0:
        module = harness_state.module_tensors(ds_engine, prefix="module.")
        buffers = {f"module.{name}" for name, _ in ds_engine.module.named_buffers()}
        groups.append((layout.model_file, "model", [(tensor_spec(k, v), k in buffers) for k, v in module.items()]))
        tensors.update(module)
    optim_tensors: dict[str, torch.Tensor] = {}
    values = {
        "optimizer": encode_value(_optimizer_state(ds_engine), "optimizer", optim_tensors),
        "lr_scheduler": encode_value(ds_engine.lr_scheduler.state_dict() if ds_engine.lr_scheduler else {},
                                     "lr_scheduler", optim_tensors),
        "engine": harness_state.counters(ds_engine, missing_ok=True),
    }
    if any(name.startswith("lr_scheduler") for name in optim_tensors):
        raise LazyRestoreError("the lr scheduler's state holds tensors; the lazy engine saves only plain "
                               "scheduler state")
    optim_tensors = {k: v.detach() for k, v in optim_tensors.items()}
    groups.append((layout.optim_file, "optim", [(tensor_spec(k, v), False) for k, v in optim_tensors.items()]))
    tensors.update(optim_tensors)
    return Capture(groups, tensors, values)


def state_to_come(optimizer: Any) -> list[tuple[TensorSpec, bool]]:
    """The tensors a torch Adam/AdamW (the study's optimizer, inside DeepSpeed's ZeRO wrapper) creates at its
    first step for parameters without state yet: two moments each (three with amsgrad), of the parameter's
    shape and dtype, and a scalar step count. For sizing only: the names are placeholders. Other optimizers
    give none, and a save that needs a larger buffer allocates it then."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
        return []
    specs = []
    for g, group in enumerate(inner.param_groups):
        moments = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group.get("amsgrad") else ())
        for i, param in enumerate(group["params"]):
            if inner.state.get(param):
                continue
            specs += [tensor_spec(f"to-come/{g}/{i}/{moment}", param) for moment in moments]
            specs.append(TensorSpec(f"to-come/{g}/{i}/step", "float32", (), "cpu"))
    return [(spec, False) for spec in specs]


def _optimizer_state(ds_engine: Any) -> dict[str, Any]:
    return ds_engine.optimizer.state_dict() if ds_engine.optimizer is not None else {}

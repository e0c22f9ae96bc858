"""What one rank of the lazy engine saves: its place in the parallel layout (``RankLayout``: which files it
writes) and the capture of its training state, as tensors grouped per file and plain values.

Data-parallel rank 0 of each (pipeline stage, tensor slice) writes the module file, the state its replicas share;
every rank writes its own optimizer file (ZeRO partitions are distinct). ``state_to_come`` sizes the host buffer
for the optimizer state a first step will create.

The module's tensors and the step counters are read as every harness-level engine reads them
(``restartbench.engines.harness_state``); the optimizer is taken whole, as DeepSpeed's own ``state_dict``: why the
rest of that capture is not shared is said there.

Every header also says where the file's tensors lie in the whole model, what a load in another layout needs
(``layout_fields``, format version 2): the layout and writing rank, each module tensor's global name, full shape and
tensor-parallel slice, and the ZeRO-1 flat buffer of the (stage, slice): each parameter's offset in it and this rank's
partition of it (``ZeroGroup``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from restartbench.engines import harness_state
from restartbench.engines.lazy.format import LazyRestoreError, TensorSpec, encode_value, tensor_spec
from restartbench.model import TP_DIM


@dataclass(frozen=True)
class RankLayout:
    pp: int
    tp: int
    dp: int
    dp_size: int
    dp_src: int
    """Global rank of data-parallel rank 0 of this rank's replica group (the one writing the module)."""
    dp_group: Any
    tp_size: int = 1
    pp_size: int = 1
    rank: int = 0
    """Global rank."""

    @property
    def sizes(self) -> tuple[int, int, int]:
        """(tp, pp, dp): the layout's degrees."""
        return self.tp_size, self.pp_size, self.dp_size

    @property
    def model_file(self) -> str:
        return model_file_name(self.pp, self.tp)

    @property
    def optim_file(self) -> str:
        return optim_file_name(self.pp, self.tp, self.dp)


def model_file_name(pp: int, tp: int) -> str:
    """The module file of pipeline stage ``pp``, tensor slice ``tp``."""
    return f"model_pp{pp:02d}_tp{tp:02d}.lazy"


def optim_file_name(pp: int, tp: int, dp: int) -> str:
    """The optimizer file of the rank at (``pp``, ``tp``, ``dp``)."""
    return f"optim_pp{pp:02d}_tp{tp:02d}_dp{dp:03d}.lazy"


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
                      grid.get_data_parallel_group(), tp_size=grid.get_slice_parallel_world_size(),
                      pp_size=grid.get_pipe_parallel_world_size(), rank=dist.get_rank())


@dataclass
class Capture:
    """References to the live tensors to save, grouped per file, and the plain values (already copied); ``params``
    and ``zero``: the header's description of them in the whole model (``layout_fields``)."""
    groups: list[tuple[str, str, list[tuple[TensorSpec, bool]]]]
    tensors: dict[str, torch.Tensor]
    values: dict[str, Any]
    params: list[dict[str, Any]]
    zero: list[dict[str, Any]]


def file_meta(layout: RankLayout, tag: str, state: Capture, kind: str) -> dict[str, Any]:
    """The header fields that place a file in its checkpoint (also what restartbench.plan predicts headers with):
    the writer's coordinates, and ``layout_fields``."""
    return {"tag": tag, "pp": layout.pp, "tp": layout.tp, "dp": layout.dp, "dp_size": layout.dp_size,
            **layout_fields(layout, state, kind)}


def layout_fields(layout: RankLayout, state: Capture, kind: str) -> dict[str, Any]:
    """What a load in another layout reads (format version 2):

    - ``layout``: the degrees tp, pp, dp of the layout that wrote the checkpoint and the global rank that wrote
      this file;
    - ``params``: every tensor of the module's state_dict on this stage and slice, by its global name (the
      PipelineModule's ``<pipeline layer>.<name>``, the same in every layout) with its full shape, the dimension
      it is split along over tensor-parallel ranks (null: replicated) and where this slice starts along it;
    - ``zero``: per optimizer parameter group, ZeRO-1's flat buffer of this stage and slice: its length with
      padding (``numel``), each parameter's ``[name, offset, numel]`` in it (element e of the parameter's slice,
      flattened, is element offset + e of the buffer) and ``partition_numel``, the length of each data-parallel
      rank's partition (rank d holds [d * partition_numel, (d + 1) * partition_numel)). An optimizer file adds its
      own ``partition_start`` and ``tensors``: the names of its tensors that hold the partition element by element
      (``fp32``, the master weights, and Adam's moments by their state key) or one value for the group (Adam's
      ``step``). The model file, written by data-parallel rank 0, carries the same buffer description, so that a
      load in another layout plans from the model files which optimizer files and ranges it needs.
    """
    zero = state.zero if kind == "optim" else [
        {key: value for key, value in group.items() if key not in ("partition_start", "tensors")}
        for group in state.zero]
    return {"layout": {"tp": layout.tp_size, "pp": layout.pp_size, "dp": layout.dp_size, "rank": layout.rank},
            "params": state.params, "zero": zero}


def capture(ds_engine: Any, layout: RankLayout, tp_dims: dict[str, int | None] | None = None) -> Capture:
    """What this rank saves: the module state (data-parallel rank 0 only: it is replicated), and the
    optimizer state, scheduler state and step counters (every rank: ZeRO partitions are distinct).
    ``tp_dims``: each module parameter's tensor-parallel dimension by name, where the module's parameters do not
    carry it (``restartbench.model.TP_DIM``; the plan's meta states)."""
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
    zero = [group.header(optim_tensors) for group in zero_groups(ds_engine.optimizer, layout)]
    return Capture(groups, tensors, values, module_params(ds_engine, layout, tp_dims), zero)


def module_params(ds_engine: Any, layout: RankLayout, tp_dims: dict[str, int | None] | None = None
                  ) -> list[dict[str, Any]]:
    """The header's ``params``: each module state_dict tensor's global name, full shape, split dimension and offset."""
    if tp_dims is None:
        tp_dims = {name: getattr(param, TP_DIM, None) for name, param in ds_engine.module.named_parameters()}
    params = []
    for name, tensor in ds_engine.module.state_dict().items():
        dim = tp_dims.get(name)
        shape, offset = list(tensor.shape), 0
        if dim is not None:
            offset = layout.tp * shape[dim]
            shape[dim] *= layout.tp_size
        params.append({"name": name, "shape": shape, "tp_dim": dim, "tp_offset": offset})
    return params


@dataclass(frozen=True)
class ZeroGroup:
    """One optimizer parameter group's ZeRO-1 flat buffer on this rank: the buffer's length with padding, its
    parameters as (name, offset, numel) and this rank's partition of it, the fp32 master partition (a live tensor)
    and its place among the wrapped torch optimizer's parameters (its key in that optimizer's state_dict)."""
    index: int
    numel: int
    partition_start: int
    partition_numel: int
    params: tuple[tuple[str, int, int], ...]
    fp32: torch.Tensor
    state_index: int
    state: dict[str, torch.Tensor]
    """The wrapped optimizer's state of the partition (Adam: exp_avg, exp_avg_sq, step), as it is now."""

    def header(self, saved: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The optimizer file's ``zero`` entry of this group, naming the saved tensors of the partition."""
        names = {"fp32": f"optimizer.single_partition_of_fp32_groups[{self.index}]"}
        names.update({key: f"optimizer.base_optimizer_state.state.{self.state_index}.{key}" for key in self.state})
        return {"numel": self.numel, "partition_numel": self.partition_numel,
                "params": [list(param) for param in self.params], "partition_start": self.partition_start,
                "tensors": {key: name for key, name in names.items() if name in saved}}


def zero_groups(optimizer: Any, layout: RankLayout) -> list[ZeroGroup]:
    """The ZeRO-1 flat buffers of a DeepSpeed ZeRO stage 1/2 optimizer (``bit16_groups``) or BF16_Optimizer
    (``bf16_groups``), each parameter's offset read off its storage (a view into the buffer), or of the plan's
    stand-in (``restartbench.shards.ZeroOptimizer``: one group, its parameters packed in order). Empty for anything
    else (a torch optimizer used directly: no partitions)."""
    if optimizer is None:
        return []
    inner = getattr(optimizer, "optimizer", None)
    fp32s = _first_attr(optimizer, "single_partition_of_fp32_groups", "fp32_groups_flat_partition")
    lp_groups = _first_attr(optimizer, "bit16_groups", "bf16_groups")
    flats = _first_attr(optimizer, "bit16_groups_flat", "bf16_groups_flat")
    if fp32s is None or inner is None:
        return []
    if lp_groups is not None and flats is not None:
        names = optimizer.param_names
        layouts = []
        for lp, flat in zip(lp_groups, flats):
            base, size = flat.data_ptr(), flat.element_size()
            layouts.append((flat.numel(), tuple((names[p], (p.data_ptr() - base) // size, p.numel()) for p in lp)))
    elif hasattr(optimizer, "params") and hasattr(optimizer, "size"):  # the plan's stand-in
        offset, params = 0, []
        for name, tensor in optimizer.params.items():
            params.append((name, offset, tensor.numel()))
            offset += tensor.numel()
        layouts = [(optimizer.size * layout.dp_size, tuple(params))]
    else:
        return []
    order = [p for group in inner.param_groups for p in group["params"]]
    groups = []
    for index, ((numel, params), fp32) in enumerate(zip(layouts, fp32s)):
        state_index = next(i for i, p in enumerate(order) if p is fp32)
        state = {key: value for key, value in inner.state.get(fp32, {}).items() if isinstance(value, torch.Tensor)}
        size = fp32.numel()
        groups.append(ZeroGroup(index, numel, layout.dp * size, size, params, fp32, state_index, state))
    return groups


def _first_attr(obj: Any, *names: str) -> Any:
    return next((getattr(obj, name) for name in names if getattr(obj, name, None) is not None), None)


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

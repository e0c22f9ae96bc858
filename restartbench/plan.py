"""The checkpoint plan: every file each rank writes for a preset, layout and engine, predicted without running.

    python -m restartbench.plan 70B tp8pp4dp2 --engine torch        # files per rank, counts per kind, totals
    python -m restartbench.plan 70B tp8pp4dp2 --json                # the same, as JSON
    python -m restartbench.plan --all-presets --layouts tp1pp1,tp8pp8 > docs/plan.md   # presets x layouts

Options are the run options of ``config-n-run.py`` (``--dtype``, ``--micro-batch``, ``--grad-accum``, ...), plus
``--step`` (the checkpoint's iteration, default ``--save-interval``). Nothing here is copied from DeepSpeed by hand:

- parameter shapes come from the model itself: ``restartbench.model.layer_specs`` built on torch's meta device;
- the layers of each pipeline stage come from DeepSpeed's ``PipelineModule._partition_layers`` with the model's
  partition method, the rank coordinates from DeepSpeed's ``PipeModelDataParallelTopology``;
- file names come from DeepSpeed's ``PipelineModule.ckpt_layer_path``, ``DeepSpeedEngine._get_ckpt_name`` and
  ``DeepSpeedEngine._get_rank_zero_ckpt_name``; which rank writes what follows ``save_checkpoint``: data-parallel
  rank 0 of each (stage, tensor rank) writes the layer files and the model file, every rank its optimizer file;
- each file's content is the state dict DeepSpeed 0.19.8 builds (``PipelineModule.save_state_dict``,
  ``DeepSpeedEngine._common_checkpoint_state``, ``DeepSpeedZeroOptimizer.state_dict``), made of DeepSpeed's and
  torch's own objects (``CreateLossScaler``, ``ZeroStageEnum``, DeepSpeed's fragment mapping of the flat partition,
  a ``torch.optim.AdamW`` param group). ZeRO-1 pads the stage's flat parameter buffer to a multiple of
  2·dp elements (``nccl_start_alignment_factor`` × dp in stage_1_and_2.py) and splits it into dp equal partitions;
  the last partition's padding stays in the saved storages (the fp32 partition is saved as a slice of it);
- sizes: the payload is the bytes of every tensor storage, exact; the file size is what ``torch.save`` itself
  writes for that state dict, run on FakeTensors under ``torch.serialization.skip_data`` (no tensor byte is
  allocated or written: a sparse file whose length is the real file's). The tests compare every name and size with
  real runs; the stated tolerance is ``SIZE_TOLERANCE_BYTES`` per file (integers in the pickled metadata, such as
  step counts, change the pickle by a byte or two, which the zip's 64-byte alignment mostly absorbs).

The prediction is for DeepSpeed's default engine (``torch``). ``zero_to_fp32.py`` and ``zero_to_torch.py``, which
DeepSpeed's global rank 0 copies into the checkpoint folder's root at every save, are listed apart (they are not
written through the checkpoint engine, so a run's ``checkpoint.durable`` events do not count them either).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import sys
import tempfile
import types
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from restartbench.config import RunConfig, build_parser
from restartbench.layout import Layout, validate_layout
from restartbench.presets import PRESETS, ModelPreset

#: How restartbench.model.build_pipeline_module splits the layers over pipeline stages.
PARTITION_METHOD = "type:DecoderLayerPipe"
#: Largest difference between a predicted and a written file size that the tests accept, bytes.
SIZE_TOLERANCE_BYTES = 64
#: Engines whose files this module predicts.
PREDICTED_ENGINES = ("torch",)
#: Layouts of docs/plan.md (those that do not fit a preset are left out, with the reason).
DOC_LAYOUTS = ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp2", "tp2pp4dp1", "tp8pp4dp2", "tp8pp8dp1")
KINDS = ("layer", "model", "optimizer")


@dataclass(frozen=True)
class PlannedFile:
    path: str
    """Relative to the checkpoint folder, as the run folder records it: ``<tag>/<name>``."""
    rank: int
    """Global rank that writes it."""
    kind: str
    payload_bytes: int
    """Bytes of the tensor storages in it: exact."""
    bytes: int
    """File size as torch.save writes it."""


@dataclass
class CheckpointPlan:
    preset: str
    layout: str
    dtype: str
    engine: str
    tag: str
    world_size: int
    files: list[PlannedFile]
    root_files: dict[str, int] = field(default_factory=dict)
    """Files DeepSpeed's rank 0 copies into the checkpoint folder's root (name -> bytes), outside the engine."""
    scale: float = 1.0
    """Width factor of an emulated, scaled-down model (1.0: the preset as it is)."""

    @property
    def checkpoint_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)

    def rank_files(self, rank: int) -> list[PlannedFile]:
        return [f for f in self.files if f.rank == rank]

    def per_rank_bytes(self) -> dict[int, int]:
        totals = {rank: 0 for rank in range(self.world_size)}
        for f in self.files:
            totals[f.rank] += f.bytes
        return totals

    def by_kind(self) -> dict[str, dict[str, int]]:
        return {kind: {"files": sum(1 for f in self.files if f.kind == kind),
                       "bytes": sum(f.bytes for f in self.files if f.kind == kind)} for kind in KINDS}

    def totals(self) -> dict[str, Any]:
        per_rank = self.per_rank_bytes()
        busiest = max(per_rank, key=per_rank.get)
        return {"checkpoint_bytes": self.checkpoint_bytes, "payload_bytes": self.payload_bytes,
                "overhead_bytes": self.checkpoint_bytes - self.payload_bytes, "files": len(self.files),
                "per_rank_max_bytes": per_rank[busiest], "per_rank_max_rank": busiest,
                "per_rank_min_bytes": min(per_rank.values()), "by_kind": self.by_kind(),
                "root_files": self.root_files}

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "layout": self.layout, "dtype": self.dtype, "engine": self.engine,
                "tag": self.tag, "world_size": self.world_size, "scale": self.scale, "totals": self.totals(),
                "files": [asdict(f) for f in self.files]}


# --- the model, DeepSpeed's way ------------------------------------------------------------


def scaled_preset(preset: ModelPreset, scale: float, tp: int) -> ModelPreset:
    """The preset with hidden, ffn and vocabulary widths multiplied by ``scale`` (layers and heads kept), each
    rounded to what the model and a tensor-parallel size ``tp`` accept: hidden a multiple of 2·heads (even head
    dimension), ffn and vocabulary multiples of tp. ``scale`` 1 returns the preset unchanged."""
    if scale == 1.0:
        return preset
    if not 0 < scale <= 1:
        raise ValueError(f"the emulation scale must be in (0, 1], got {scale}")

    def width(value: int, multiple: int) -> int:
        return max(multiple, round(value * scale / multiple) * multiple)

    return replace(preset, name=f"{preset.name}@{scale:g}", hidden=width(preset.hidden, 2 * preset.heads),
                   ffn_hidden=width(preset.ffn_hidden, tp), vocab_size=width(preset.vocab_size, tp))


@lru_cache(maxsize=8)
def _layers(preset: ModelPreset, tp: int) -> tuple[tuple[str, OrderedDict], ...]:
    """(layer class name, fp32 state dict on meta, as DeepSpeed clones it for torch.save) for every pipeline layer.

    One layer of each class is built (on the meta device, tensor rank 0: every tp rank's shards have the same
    shapes); the layers of a class differ only in the seed of their weights, so they share its state dict."""
    import torch
    from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

    from restartbench.model import TensorParallel, layer_specs

    meta = torch.device("meta")
    built: dict[type, OrderedDict] = {}
    with meta:
        specs = layer_specs(preset, TensorParallel(tp, 0), seed=0)
        for spec in specs:
            if spec.typename not in built:
                built[spec.typename] = clone_tensors_for_torch_save(spec.build().state_dict(), device=meta)
    return tuple((spec.typename.__name__, built[spec.typename]) for spec in specs)


_ENGINE = ("deepspeed.runtime.engine", "DeepSpeedEngine")
_PIPE_MODULE = ("deepspeed.runtime.pipe.module", "PipelineModule")


class _Borrowed:
    """A method of a DeepSpeed class, used on a stand-in object; DeepSpeed is imported when it is first called."""

    def __init__(self, owner: tuple[str, str], name: str):
        self.owner, self.name = owner, name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        import importlib

        module, cls = self.owner
        function = getattr(getattr(importlib.import_module(module), cls), self.name)
        return function if obj is None else types.MethodType(function, obj)


class _PartitionedModule:
    """Stands in for a PipelineModule so that DeepSpeed's own ``_partition_layers`` runs without processes."""

    _partition_layers = _Borrowed(_PIPE_MODULE, "_partition_layers")
    _find_layer_type = _Borrowed(_PIPE_MODULE, "_find_layer_type")

    def __init__(self, specs: list[Any], topology: Any, rank: int):
        self._layer_specs, self._topo, self.global_rank = specs, topology, rank
        self.num_stages = topology.get_dim("pipe")
        self.loss_fn = None

    def _set_bounds(self, start: int, stop: int) -> None:
        self._local_start, self._local_stop = start, stop


def _stage_parts(preset: ModelPreset, layout: Layout) -> list[int]:
    """DeepSpeed's ``parts``: stage s holds pipeline layers parts[s] .. parts[s+1]-1."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from restartbench.model import TensorParallel, layer_specs

    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    specs = layer_specs(preset, TensorParallel(layout.tp, 0), seed=0)  # what PipelineModule is given (not built)
    module = _PartitionedModule(specs, topology, layout.world_size - 1)
    with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints the partition from rank 0
        module._partition_layers(PARTITION_METHOD)
    return module.parts


class _EngineNames:
    """DeepSpeed's own file-name methods, on a rank's coordinates instead of a live engine."""

    _get_zero_ckpt_prefix = _Borrowed(_ENGINE, "_get_zero_ckpt_prefix")
    _get_rank_zero_ckpt_name = _Borrowed(_ENGINE, "_get_rank_zero_ckpt_name")
    _get_ckpt_name = _Borrowed(_ENGINE, "_get_ckpt_name")

    def __init__(self, checkpoint_mp_rank: int):
        self.checkpoint_mp_rank = checkpoint_mp_rank

    def zero_optimization_partition_weights(self) -> bool:
        return False  # ZeRO stage 1


class _LayerNames:
    """DeepSpeed's ``PipelineModule.ckpt_layer_path`` on a rank's coordinates."""

    ckpt_layer_path = _Borrowed(_PIPE_MODULE, "ckpt_layer_path")

    def __init__(self, topology: Any, rank: int, local_start: int):
        self._grid = types.SimpleNamespace(_topo=topology)
        self.global_rank, self._local_start = rank, local_start


class _Grid:
    """The parallel sizes DeepSpeed's ``_checkpoint_parallel_metadata`` asks a PipelineParallelGrid for."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def get_pipe_parallel_world_size(self) -> int:
        return self.layout.pp

    def get_slice_parallel_world_size(self) -> int:
        return self.layout.tp


def _checkpoint_mp_rank(topology: Any, rank: int) -> int:
    """``PipelineParallelGrid.ds_model_rank``: the rank's index among the ranks of its data-parallel replica."""
    replica = sorted(topology.get_axis_list(axis="data", idx=topology.get_coord(rank).data))
    return replica.index(rank) if len(replica) > 1 else 0


# --- what each rank writes -------------------------------------------------------------------


@dataclass
class ShardFile:
    """One file a rank writes: its name, kind and content (tensors on the meta device, shaped and typed)."""

    path: str
    rank: int
    kind: str
    state: Any


@dataclass
class ShardSetup:
    """Everything a rank's files depend on besides its coordinates."""

    preset: ModelPreset
    layout: Layout
    dtype: str
    ds_config: dict[str, Any]
    step: int
    tag: str


def shard_files(setup: ShardSetup) -> list[ShardFile]:
    """Every file of one checkpoint, rank by rank, in the order DeepSpeed writes them."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layout = setup.layout
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    parts = _stage_parts(setup.preset, layout)
    layers = _layers(setup.preset, layout.tp)
    files = []
    for rank in range(layout.world_size):
        coord = topology.get_coord(rank)
        start, stop = parts[coord.pipe], parts[coord.pipe + 1]
        stage = [(start + i, layers[start + i][1]) for i in range(stop - start)]
        files.extend(_rank_files(setup, topology, rank, stage))
    return files


def _rank_files(setup: ShardSetup, topology: Any, rank: int, stage: list[tuple[int, OrderedDict]]
                ) -> Iterator[ShardFile]:
    import torch

    coord = topology.get_coord(rank)
    dtype = torch.bfloat16 if setup.dtype == "bf16" else torch.float32
    weights = [(index, OrderedDict((name, t.to(dtype)) for name, t in state.items())) for index, state in stage]
    names = _EngineNames(_checkpoint_mp_rank(topology, rank))
    if coord.data == 0:  # PipelineModule.save_state_dict and save_non_zero_checkpoint: data-parallel rank 0 only
        layer_names = _LayerNames(topology, rank, stage[0][0])
        for local, (_, state) in enumerate(weights):
            yield ShardFile(_relative(layer_names.ckpt_layer_path(setup.tag, local)), rank, "layer", state)
        yield ShardFile(_relative(names._get_ckpt_name("", setup.tag)), rank, "model",
                        _model_states(setup, weights))
    dp_rank = coord.data
    yield ShardFile(_relative(names._get_rank_zero_ckpt_name("", setup.tag, names.checkpoint_mp_rank, dp_rank,
                                                             setup.dtype == "bf16")),
                    rank, "optimizer", _optimizer_states(setup, weights, dp_rank))


def _relative(path: str) -> str:
    return os.path.normpath(path)


def _stage_params(weights: list[tuple[int, OrderedDict]]) -> OrderedDict:
    """The stage module's parameters by DeepSpeed name (``<layer index>.<name>``), in module order."""
    return OrderedDict((f"{index}.{name}", tensor) for index, state in weights for name, tensor in state.items())


def _model_states(setup: ShardSetup, weights: list[tuple[int, OrderedDict]]) -> dict[str, Any]:
    """``mp_rank_XX_model_states.pt``: DeepSpeedEngine._common_checkpoint_state of a PipelineEngine under ZeRO-1."""
    from deepspeed.git_version_info import version
    from deepspeed.runtime.engine import _checkpoint_parallel_metadata

    params = _stage_params(weights)
    micro, accum = setup.ds_config["train_micro_batch_size_per_gpu"], setup.ds_config["gradient_accumulation_steps"]
    return dict(module=None, buffer_names=[], optimizer=None,
                param_shapes=[OrderedDict((name, t.shape) for name, t in params.items())],
                frozen_param_shapes=None, shared_params={}, frozen_param_fragments=None,
                lr_scheduler={"last_batch_iteration": setup.step - 1},  # WarmupLR.state_dict()
                data_sampler=None, random_ltd=None, skipped_steps=0, global_steps=setup.step,
                global_samples=setup.step * micro * accum * setup.layout.dp,
                dp_world_size=setup.layout.dp, mp_world_size=setup.layout.pp * setup.layout.tp,
                **_checkpoint_parallel_metadata(_Grid(setup.layout)), ds_config=setup.ds_config, ds_version=version)


def zero_partition(numel: int, dp: int, dp_rank: int) -> tuple[int, int, int]:
    """(partition start, partition size, padding in this partition) of ZeRO-1's flat buffer of ``numel`` elements
    (DeepSpeedZeroOptimizer.__init__ and get_data_parallel_partitions, stage_1_and_2.py)."""
    alignment = 2 * dp  # nccl_start_alignment_factor x data-parallel size
    padded = math.ceil(numel / alignment) * alignment
    size = padded // dp
    start = dp_rank * size
    padding = size if numel <= start else max(0, start + size - numel)
    return start, size, padding


def _optimizer_states(setup: ShardSetup, weights: list[tuple[int, OrderedDict]], dp_rank: int) -> dict[str, Any]:
    """``[bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt``: DeepSpeedZeroOptimizer.state_dict() under ZeRO-1."""
    import torch
    from deepspeed.git_version_info import version
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.mixed_precision_linkage import _init_lp_to_hp_mapping
    from deepspeed.utils.tensor_fragment import get_hp_fragment_mapping

    params = _stage_params(weights)
    dtype = next(iter(params.values())).dtype
    numel = sum(t.numel() for t in params.values())
    start, size, padding = zero_partition(numel, setup.layout.dp, dp_rank)
    meta = torch.device("meta")
    fp32 = torch.empty(size, dtype=torch.float32, device=meta, requires_grad=True)
    lp = {name: torch.nn.Parameter(torch.empty(t.shape, dtype=t.dtype, device=meta)) for name, t in params.items()}
    names = {id(p): name for name, p in lp.items()}
    in_partition = _init_lp_to_hp_mapping(list(lp.values()), start, size, dp_group=None)
    mapping = OrderedDict(
        (names[id(p)], get_hp_fragment_mapping(p, offset, fp32, None, None, False, 0, start, size)
         .get_hp_fragment_address()) for p, offset in in_partition)
    options = {k: v for k, v in setup.ds_config["optimizer"]["params"].items() if k not in ("torch_adam", "adam_w_mode")}
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.empty(0, device=meta))], **options)
    base = adam.state_dict()
    base["state"] = {0: {"step": torch.empty((), dtype=torch.float32, device=meta),
                         "exp_avg": torch.empty(size, dtype=torch.float32, device=meta),
                         "exp_avg_sq": torch.empty(size, dtype=torch.float32, device=meta)}}
    optimizer_state = {
        "loss_scaler": CreateLossScaler(dtype, static_loss_scale=1.0, dynamic_scaling=False, dynamic_loss_args=None),
        "dynamic_loss_scale": False, "overflow": False, "clip_grad": setup.ds_config.get("gradient_clipping", 0.0),
        "base_optimizer_state": base,
        "single_partition_of_fp32_groups": [fp32[:size - padding]],  # a slice: the padding stays in the storage
        "zero_stage": ZeroStageEnum.optimizer_states, "group_paddings": [padding],
        "param_alignment_paddings": [[0] * len(lp)], "partition_count": [setup.layout.dp], "ds_version": version,
        "param_slice_mappings": [mapping],
    }
    return dict(optimizer_state_dict=optimizer_state, ds_config=setup.ds_config, ds_version=version)


# --- from meta tensors to real or fake ones, and their sizes ---------------------------------


def materialize(state: Any, make: Callable[[int, Any], Any]) -> Any:
    """``state`` with every meta tensor replaced by one of the same shape, stride, offset and dtype, backed by a
    storage from ``make(numel, dtype)``; tensors that share a meta storage share the new one, as in the real run."""
    import torch

    storages: dict[int, Any] = {}

    def convert(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            key = item.untyped_storage()._cdata
            base = storages.get(key)
            if base is None:
                base = storages[key] = make(item.untyped_storage().nbytes() // item.element_size(), item.dtype)
            tensor = base.as_strided(item.shape, item.stride(), item.storage_offset())
            return tensor.requires_grad_() if item.requires_grad and not tensor.requires_grad else tensor
        if type(item) is list:
            return [convert(v) for v in item]
        if type(item) is tuple:  # not torch.Size nor named tuples: they hold no tensors and pickle as themselves
            return tuple(convert(v) for v in item)
        if isinstance(item, dict):
            converted = type(item)((k, convert(v)) for k, v in item.items())
            if getattr(item, "__dict__", None):  # e.g. an OrderedDict's _metadata
                converted.__dict__.update(item.__dict__)
            return converted
        return item

    return convert(state)


def payload_bytes(state: Any) -> int:
    """Bytes of the distinct tensor storages in ``state`` (what torch.save writes as tensor data)."""
    import torch

    seen: dict[int, int] = {}

    def walk(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
        elif isinstance(item, (list, tuple)):
            for v in item:
                walk(v)
        elif isinstance(item, dict):
            for v in item.values():
                walk(v)

    walk(state)
    return sum(seen.values())


def signature(state: Any) -> tuple:
    """Everything in ``state`` that shapes its pickle and its zip records: container types and keys, leaf values,
    and for tensors dtype, shape, stride, offset, requires_grad and which storage (by order of appearance) they use."""
    import torch

    storages: dict[int, int] = {}

    def walk(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            index = storages.setdefault(storage._cdata, len(storages))
            return ("tensor", index, storage.nbytes(), str(item.dtype), tuple(item.shape), item.stride(),
                    item.storage_offset(), item.requires_grad)
        if isinstance(item, dict):
            extra = tuple(sorted((k, repr(v)) for k, v in getattr(item, "__dict__", {}).items()))
            return (type(item).__qualname__, extra, tuple((repr(k), walk(v)) for k, v in item.items()))
        if type(item) in (list, tuple):
            return (type(item).__name__, tuple(walk(v) for v in item))
        return (type(item).__qualname__, repr(item))

    return walk(state)


class _CpuLocationPickler(pickle._Pickler):
    """Pickles a FakeTensor's storage reference byte for byte as torch.save pickles a real CPU storage's.

    torch names a fake storage's location with a fresh ``str(device)`` each time, which pickle cannot memoize;
    for a real CPU storage it returns the same ``"cpu"`` object, written once and then referenced."""

    _CPU = "cpu"

    def save_pers(self, pid: Any) -> None:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[3] == "cpu":
            pid = (*pid[:3], self._CPU, pid[4])
        super().save_pers(pid)


_PICKLE = types.ModuleType("restartbench_plan_pickle")
_PICKLE.Pickler = _CpuLocationPickler


def saved_size(state: Any, name: str, scratch: str) -> int:
    """The size of the file ``torch.save(state, <scratch>/<name>)`` would write, without writing tensor data:
    ``state`` (meta tensors) is saved as FakeTensors under ``skip_data`` into a sparse file, then removed."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = materialize(state, lambda numel, dtype: torch.empty(numel, dtype=dtype))
    path = os.path.join(scratch, os.path.basename(name))
    try:
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            torch.save(fake, path, pickle_module=_PICKLE)
        return os.path.getsize(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


# --- the plan -------------------------------------------------------------------------------


def setup_for(cfg: RunConfig, step: int | None = None, scale: float = 1.0) -> ShardSetup:
    """The checkpoint of run configuration ``cfg`` after iteration ``step`` (default: its first save)."""
    from restartbench.runtime import preset_for
    from restartbench.study import render_ds_config

    base = preset_for(cfg)
    ranks = cfg.layout.nnodes * cfg.layout.nproc_per_node if cfg.layout.nproc_per_node else None
    layout = validate_layout(cfg.layout.layout, base, ranks)
    step = step or min(cfg.train.save_interval, cfg.train.iters)
    grad_accum = cfg.train.grad_accum or layout.pp
    return ShardSetup(preset=scaled_preset(base, scale, layout.tp), layout=layout, dtype=cfg.model.dtype,
                      ds_config=render_ds_config(cfg, grad_accum, layout.dp), step=step, tag=f"step{step}")


def predict(cfg: RunConfig, step: int | None = None, scale: float = 1.0) -> CheckpointPlan:
    """Every file of one checkpoint of ``cfg`` with its writing rank, kind, payload and file size."""
    if cfg.engine.engine not in PREDICTED_ENGINES:
        raise ValueError(f"the checkpoint plan predicts DeepSpeed's default engine ({', '.join(PREDICTED_ENGINES)}); "
                         f"engine {cfg.engine.engine!r} writes other files. Use --engine torch")
    setup = setup_for(cfg, step, scale)
    sizes: dict[tuple, int] = {}  # files alike but for their names' digits are serialized once
    with tempfile.TemporaryDirectory(prefix="restartbench-plan-") as scratch:
        files = []
        for f in shard_files(setup):
            key = (len(os.path.basename(f.path)), signature(f.state))
            if key not in sizes:
                sizes[key] = saved_size(f.state, f.path, scratch)
            files.append(PlannedFile(f.path, f.rank, f.kind, payload_bytes(f.state), sizes[key]))
    return CheckpointPlan(preset=cfg.model.preset, layout=setup.layout.name, dtype=setup.dtype,
                          engine=cfg.engine.engine, tag=setup.tag, world_size=setup.layout.world_size, files=files,
                          root_files=recovery_scripts(), scale=scale)


class _RecoveryScripts:
    """DeepSpeed's own ``_copy_recovery_script``, which global rank 0 runs at every save."""

    copy = _Borrowed(_ENGINE, "_copy_recovery_script")
    _change_recovery_script_permissions = _Borrowed(_ENGINE, "_change_recovery_script_permissions")


def copy_recovery_scripts(folder: str) -> None:
    """Copy the scripts into ``folder`` exactly as DeepSpeed's save_checkpoint does into the checkpoint folder."""
    _RecoveryScripts().copy(folder)


@lru_cache(maxsize=1)
def recovery_scripts() -> dict[str, int]:
    """Name -> size of each script DeepSpeed copies (found by letting DeepSpeed copy them into a scratch folder)."""
    with tempfile.TemporaryDirectory(prefix="restartbench-plan-") as scratch:
        copy_recovery_scripts(scratch)
        return {entry.name: entry.stat().st_size for entry in sorted(os.scandir(scratch), key=lambda e: e.name)}


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Bytes of one checkpoint of ``cfg`` (every rank's files), predicted for DeepSpeed's format whatever the engine:
    the reference the disk check and the analysis use. An emulated run (``--emulate``) is predicted at its scale.

    Only what shapes the files is kept (preset, dtype, layout and ranks, batch sizes, emulation scale), so that runs
    differing in anything else share one prediction; the rest changes a pickled integer or float, a few bytes."""
    import json

    key = {"model": {"preset": cfg.model.preset, "dtype": cfg.model.dtype},
           "layout": {"layout": cfg.layout.layout, "nproc_per_node": cfg.layout.nproc_per_node,
                      "nnodes": cfg.layout.nnodes},
           "train": {"micro_batch": cfg.train.micro_batch, "grad_accum": cfg.train.grad_accum}}
    scale = cfg.emulation.emulate_scale if cfg.emulation.emulate else 1.0
    return _cached_bytes(json.dumps(key, sort_keys=True), scale)


@lru_cache(maxsize=256)
def _cached_bytes(key: str, scale: float) -> int:
    import json

    return predict(RunConfig.from_dict(json.loads(key)), scale=scale).checkpoint_bytes


# --- output ---------------------------------------------------------------------------------


def _size(n: float) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def render_markdown(plan: CheckpointPlan, heading: str = "###") -> str:
    """Totals, counts per kind, and the files of every rank: ranks whose files have the same kinds and sizes are one
    row group (their names differ only in their own numbers), and consecutive files alike are one line."""
    t = plan.totals()
    lines = [f"{heading} {plan.preset} {plan.layout} ({plan.dtype}, engine {plan.engine}, tag {plan.tag})", "",
             f"- checkpoint: **{t['checkpoint_bytes']:,} B** ({_size(t['checkpoint_bytes'])}) in {t['files']} files; "
             f"tensor payload {t['payload_bytes']:,} B, serialization overhead {t['overhead_bytes']:,} B",
             f"- per rank: max {t['per_rank_max_bytes']:,} B ({_size(t['per_rank_max_bytes'])}, rank "
             f"{t['per_rank_max_rank']}), min {t['per_rank_min_bytes']:,} B ({_size(t['per_rank_min_bytes'])})",
             "- per kind: " + "; ".join(f"{kind} {v['files']} files, {_size(v['bytes'])}"
                                        for kind, v in t["by_kind"].items()),
             "- also at the checkpoint folder's root (rank 0 at every save, not through the engine): "
             + ", ".join(f"`{n}` {b:,} B" for n, b in plan.root_files.items()), "",
             "| ranks | files of the first rank (the others: same sizes, their own numbers) | kind | payload B each "
             "| file B each |", "|---|---|---|---:|---:|"]
    for ranks, files in _rank_groups(plan):
        for first, last, count, kind, payload, size in _runs(files):
            name = f"`{first}`" if count == 1 else f"`{first}` … `{Path(last).name}` ({count} files)"
            lines.append(f"| {ranks} | {name} | {kind} | {payload:,} | {size:,} |")
            ranks = ""
    return "\n".join(lines) + "\n"


def _rank_groups(plan: CheckpointPlan) -> list[tuple[str, list[PlannedFile]]]:
    groups: dict[tuple, list[int]] = {}
    for rank in range(plan.world_size):
        groups.setdefault(tuple((f.kind, f.payload_bytes, f.bytes) for f in plan.rank_files(rank)), []).append(rank)
    return [(_ranges(ranks), plan.rank_files(ranks[0])) for ranks in groups.values()]


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0–2, 5'."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def _runs(files: list[PlannedFile]) -> Iterator[tuple[str, str, int, str, int, int]]:
    """(first path, last path, count, kind, payload, bytes) of each run of consecutive files alike."""
    i = 0
    while i < len(files):
        j = i
        while j + 1 < len(files) and (files[j + 1].kind, files[j + 1].payload_bytes, files[j + 1].bytes) == \
                (files[i].kind, files[i].payload_bytes, files[i].bytes):
            j += 1
        yield files[i].path, files[j].path, j - i + 1, files[i].kind, files[i].payload_bytes, files[i].bytes
        i = j + 1


def render_text(plan: CheckpointPlan) -> str:
    t = plan.totals()
    lines = [f"{plan.preset} {plan.layout}, {plan.dtype}, engine {plan.engine}: checkpoint {plan.tag}, "
             f"{plan.world_size} ranks", ""]
    for rank in range(plan.world_size):
        files = plan.rank_files(rank)
        lines.append(f"rank {rank}: {len(files)} files, {sum(f.bytes for f in files):,} B")
        lines += [f"  {f.path:<60} {f.kind:<9} payload {f.payload_bytes:>16,}  file {f.bytes:>16,}" for f in files]
    lines += ["", "per kind: " + "; ".join(f"{kind}: {v['files']} files, {v['bytes']:,} B"
                                          for kind, v in t["by_kind"].items()),
              f"checkpoint: {t['checkpoint_bytes']:,} B ({_size(t['checkpoint_bytes'])}) in {t['files']} files; "
              f"payload {t['payload_bytes']:,} B; overhead {t['overhead_bytes']:,} B",
              f"per rank: max {t['per_rank_max_bytes']:,} B (rank {t['per_rank_max_rank']}), "
              f"min {t['per_rank_min_bytes']:,} B",
              "root of the checkpoint folder (rank 0, every save, not through the engine): "
              + ", ".join(f"{n} {b:,} B" for n, b in plan.root_files.items())]
    return "\n".join(lines) + "\n"


def render_all(dtype: str = "bf16", layouts: tuple[str, ...] = DOC_LAYOUTS) -> str:
    """docs/plan.md: every preset x ``layouts``."""
    from restartbench.layout import LayoutError

    command = f"python -m restartbench.plan --all-presets --layouts {','.join(layouts)} --dtype {dtype} > docs/plan.md"
    out = ["# Checkpoint plans", "",
           f"Generated by `{command}` (do not edit by hand). For each preset and "
           f"layout, the files one checkpoint of DeepSpeed's default engine writes ({dtype}, ZeRO-1, tag of the first "
           "save), predicted without running anything: see `restartbench/plan.py` for how each figure is obtained.",
           f"File sizes are torch.save's own, within {SIZE_TOLERANCE_BYTES} B per file of a real run "
           "(`tests/test_predict.py`).", "",
           "| preset | layout | ranks | files | checkpoint | payload | per-rank max | layer | model | optimizer |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    plans, skipped = [], []
    for preset in PRESETS.values():
        for name in layouts:
            cfg = RunConfig()
            cfg.model.preset, cfg.model.dtype, cfg.layout.layout = preset.name, dtype, name
            try:
                plan = predict(cfg)
            except LayoutError as error:
                skipped.append(f"- {preset.name} {name}: {str(error).splitlines()[-1].strip(' -')}")
                continue
            plans.append(plan)
            t = plan.totals()
            kinds = t["by_kind"]
            out.append(f"| {plan.preset} | {plan.layout} | {plan.world_size} | {t['files']} | "
                       f"{_size(t['checkpoint_bytes'])} | {_size(t['payload_bytes'])} | "
                       f"{_size(t['per_rank_max_bytes'])} | " + " | ".join(_size(kinds[k]["bytes"]) for k in KINDS)
                       + " |")
    out += ["", "Layouts that do not fit their preset:", "", *skipped, "", "## Files per rank", ""]
    out += [render_markdown(plan) for plan in plans]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(prog="python -m restartbench.plan")
    parser.description = ("Print the files one checkpoint of a preset and layout writes, rank by rank, with their "
                          "sizes, without running anything.")
    parser.add_argument("--step", type=int, default=None, help="Iteration of the checkpoint (default: --save-interval).")
    parser.add_argument("--json", action="store_true", help="Print the plan as JSON.")
    parser.add_argument("--all-presets", action="store_true",
                        help="Markdown for every preset x --layouts (docs/plan.md); preset and layout are ignored.")
    parser.add_argument("--layouts", default=",".join(DOC_LAYOUTS),
                        help="Comma-separated layouts for --all-presets (default: %(default)s).")
    args = vars(parser.parse_args(argv))
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to the stdout of its import: keep stdout the plan's
        import deepspeed  # noqa: F401
    layouts = tuple(name for name in args.pop("layouts").split(",") if name)
    if args.pop("all_presets"):
        print(render_all(args["model.dtype"], layouts), end="")
        return 0
    step, as_json = args.pop("step"), args.pop("json")
    nested: dict[str, dict[str, Any]] = {}
    for dest, value in args.items():
        section, name = dest.split(".")
        nested.setdefault(section, {})[name] = value
    try:
        plan = predict(RunConfig.from_dict(nested), step=step)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if as_json:
        import json

        print(json.dumps(plan.to_dict(), indent=1))
    else:
        print(render_text(plan), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank's training state at a checkpoint, as DeepSpeed builds it, on meta tensors: what every engine's files
are predicted from (``restartbench.plan``) and what an emulated rank saves (``restartbench.emulate``).

Nothing here is copied from DeepSpeed by hand:

- parameter shapes come from the model itself: ``restartbench.model.layer_specs`` built on torch's meta device;
- the layers of each pipeline stage come from DeepSpeed's ``PipelineModule._partition_layers`` with the model's
  partition method, the rank coordinates from DeepSpeed's ``PipeModelDataParallelTopology``;
- each rank's training state (``TrainingState``) is made of DeepSpeed's and torch's own objects, on meta tensors:
  a ``torch.optim.AdamW`` over the rank's fp32 ZeRO-1 partition with Adam's state, the run's lr scheduler (DeepSpeed's
  class, stepped to the checkpoint's iteration), ``CreateLossScaler``, DeepSpeed's fragment mapping of the flat
  partition. ZeRO-1 pads the stage's flat parameter buffer to a multiple of 2·dp elements
  (``nccl_start_alignment_factor`` × dp in stage_1_and_2.py) and splits it into dp equal partitions;
- DeepSpeed's default engine's files (``shard_files``): the state dicts DeepSpeed 0.19.8 saves
  (``PipelineModule.save_state_dict``, ``DeepSpeedEngine._common_checkpoint_state`` and the model's
  ``universal_checkpoint_info`` (``restartbench.model``), ``DeepSpeedZeroOptimizer.state_dict``: the last
  partition's padding stays in the saved storages, the fp32 partition being saved as a slice of it), named by
  DeepSpeed's ``ckpt_layer_path``, ``_get_ckpt_name`` and ``_get_rank_zero_ckpt_name``; data-parallel rank 0 of
  each (stage, tensor rank) writes the layer files and the model file, every rank its optimizer file;
- ``zero_to_fp32.py`` and ``zero_to_torch.py``, which DeepSpeed's global rank 0 copies into the checkpoint folder's
  root at every save (``recovery_scripts``).

torch and DeepSpeed are imported inside the functions: importing this module is cheap (the launcher and
``--dry-run`` read the predictions without them).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import tempfile
import types
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from restartbench.layout import Layout
from restartbench.presets import ModelPreset

#: How restartbench.model.build_pipeline_module splits the layers over pipeline stages.
PARTITION_METHOD = "type:DecoderLayerPipe"


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
    device: str = "cpu"
    """Where the training state lives (cpu, cuda): the lazy format records it, TorchSnapshot batches by it."""
    folder: str = ""
    """The checkpoint folder (absolute; ``checkpoint_folder``): DCP pickles its path into ``.metadata``."""
    nnodes: int = 1
    """Nodes of the run (torchrun numbers ranks node by node): FastPersist assigns its writers per machine."""
    ranks: frozenset[int] | None = None
    """The ranks whose files are planned (None: every rank), for an engine whose ranks plan their files alone (not
    a collective's global plan): the what-if plans two replicas of each stage at 16,384 GPUs."""


def meta_tensor(shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype, device="meta")


def cpu_resident(name: str) -> bool:
    """Whether the tensor of this name (any separator) stays on the CPU when the state lives on a GPU: Adam's step
    counters, which torch.optim keeps on the CPU (non-capturable, non-fused Adam). The plan's meta tensors carry no
    device of the run, so the formats that record devices are told by name."""
    return re.split(r"[./]", name)[-1] == "step"


def _ranks(setup: ShardSetup) -> Iterator[tuple[int, Any, list[tuple[int, OrderedDict]]]]:
    """(rank, DeepSpeed topology coordinates, its stage's layers as (pipeline index, fp32 state dict on meta)) for
    every rank (``setup.ranks`` only, where it names some), in rank order."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layout = setup.layout
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    parts = _stage_parts(setup.preset, layout)
    layers = _layers(setup.preset, layout.tp)
    for rank in range(layout.world_size) if setup.ranks is None else sorted(setup.ranks):
        coord = topology.get_coord(rank)
        start, stop = parts[coord.pipe], parts[coord.pipe + 1]
        yield rank, coord, [(start + i, layers[start + i][1]) for i in range(stop - start)]


def shard_files(setup: ShardSetup, model_writers: set[int] | None = None) -> list[ShardFile]:
    """Every file of one checkpoint of DeepSpeed's engines, rank by rank, in the order DeepSpeed writes them.
    ``model_writers``: the ranks whose checkpoint engine is a data-parallel writer (they write the model file;
    DeepSpeed's default engine: data-parallel rank 0 of each replica group)."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layout = setup.layout
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    return [f for rank, coord, stage in _ranks(setup)
            for f in _rank_files(setup, topology, rank, stage,
                                 coord.data == 0 if model_writers is None else rank in model_writers)]


def model_dtype(setup: ShardSetup) -> Any:
    import torch

    return torch.bfloat16 if setup.dtype == "bf16" else torch.float32


def _rank_files(setup: ShardSetup, topology: Any, rank: int, stage: list[tuple[int, OrderedDict]],
                writes_model: bool) -> Iterator[ShardFile]:
    coord = topology.get_coord(rank)
    dtype = model_dtype(setup)
    weights = [(index, OrderedDict((name, t.to(dtype)) for name, t in state.items())) for index, state in stage]
    state = TrainingState(setup, _stage_params(weights), coord.data)
    names = _EngineNames(_checkpoint_mp_rank(topology, rank))
    if coord.data == 0:  # PipelineModule.save_state_dict: data-parallel rank 0 only
        layer_names = _LayerNames(topology, rank, stage[0][0])
        for local, (_, layer) in enumerate(weights):
            yield ShardFile(_relative(layer_names.ckpt_layer_path(setup.tag, local)), rank, "layer", layer)
    if writes_model:  # DeepSpeedEngine.save_non_zero_checkpoint
        yield ShardFile(_relative(names._get_ckpt_name("", setup.tag)), rank, "model", _model_states(setup, state))
    yield ShardFile(_relative(names._get_rank_zero_ckpt_name("", setup.tag, names.checkpoint_mp_rank, coord.data,
                                                             setup.dtype == "bf16")),
                    rank, "optimizer", _optimizer_states(setup, state))


def _relative(path: str) -> str:
    return os.path.normpath(path)


def _stage_params(weights: list[tuple[int, OrderedDict]]) -> OrderedDict:
    """The stage module's parameters by DeepSpeed name (``<layer index>.<name>``), in module order."""
    return OrderedDict((f"{index}.{name}", tensor) for index, state in weights for name, tensor in state.items())


def _model_states(setup: ShardSetup, state: TrainingState) -> dict[str, Any]:
    """``mp_rank_XX_model_states.pt``: DeepSpeedEngine._common_checkpoint_state of a PipelineEngine under ZeRO-1, then
    the module's ``universal_checkpoint_info``, which ``DeepSpeedEngine._save_checkpoint`` adds after it."""
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO
    from deepspeed.git_version_info import version
    from deepspeed.runtime.engine import _checkpoint_parallel_metadata

    from restartbench.model import universal_checkpoint_info

    return dict(module=None, buffer_names=[], optimizer=None,
                param_shapes=[OrderedDict((name, t.shape) for name, t in state.module.state_dict().items())],
                frozen_param_shapes=None, shared_params={}, frozen_param_fragments=None,
                lr_scheduler=state.lr_scheduler.state_dict(), data_sampler=None, random_ltd=None,
                skipped_steps=state.skipped_steps, global_steps=state.global_steps,
                global_samples=state.global_samples,
                dp_world_size=setup.layout.dp, mp_world_size=setup.layout.pp * setup.layout.tp,
                **_checkpoint_parallel_metadata(_Grid(setup.layout)), ds_config=setup.ds_config, ds_version=version,
                **{UNIVERSAL_CHECKPOINT_INFO: universal_checkpoint_info(setup.preset)})


def _optimizer_states(setup: ShardSetup, state: TrainingState) -> dict[str, Any]:
    """``[bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt``: DeepSpeedZeroOptimizer.state_dict() under ZeRO-1."""
    from deepspeed.git_version_info import version

    return dict(optimizer_state_dict=state.optimizer.state_dict(), ds_config=setup.ds_config, ds_version=version)


def zero_partition(numel: int, dp: int, dp_rank: int) -> tuple[int, int, int]:
    """(partition start, partition size, padding in this partition) of ZeRO-1's flat buffer of ``numel`` elements
    (DeepSpeedZeroOptimizer.__init__ and get_data_parallel_partitions, stage_1_and_2.py)."""
    alignment = 2 * dp  # nccl_start_alignment_factor x data-parallel size
    padded = math.ceil(numel / alignment) * alignment
    size = padded // dp
    start = dp_rank * size
    padding = size if numel <= start else max(0, start + size - numel)
    return start, size, padding


# --- one rank's training state, as a checkpoint reads it ---------------------------------------


class _Module:
    """The stage's module: its ``state_dict()`` (parameters by DeepSpeed name; the model has no buffers)."""

    def __init__(self, params: OrderedDict):
        self._params = params

    def state_dict(self) -> OrderedDict:
        return OrderedDict(self._params)

    def named_buffers(self) -> Iterator[tuple[str, Any]]:
        return iter(())


def _adamw(setup: ShardSetup, param: Any) -> tuple[Any, Any]:
    """(torch.optim.AdamW over ``param`` as DeepSpeed builds it from the config (``torch_adam``) with Adam's state
    after a step, the run's lr scheduler, DeepSpeed's own class, set to iteration ``setup.step``)."""
    import torch
    from deepspeed.runtime import lr_schedules

    params = setup.ds_config["optimizer"]["params"]
    options = {k: v for k, v in params.items() if k not in ("torch_adam", "adam_w_mode")}
    adam = torch.optim.AdamW([param], **options)
    moment = tuple(param.shape)
    adam.state[param] = {"step": meta_tensor((), torch.float32), "exp_avg": meta_tensor(moment, torch.float32),
                         "exp_avg_sq": meta_tensor(moment, torch.float32)}
    schedule = setup.ds_config.get("scheduler")
    scheduler = getattr(lr_schedules, schedule["type"])(adam, **schedule["params"]) if schedule else None
    if scheduler is not None and setup.step:
        scheduler.step(setup.step - 1)  # where setup.step calls of step() leave it, set at once (any iteration count)
    return adam, scheduler


class ZeroOptimizer:
    """One rank's DeepSpeedZeroOptimizer (ZeRO-1, one parameter group) as far as a checkpoint reads it: the fp32
    partition, the torch optimizer stepping it, the loss scaler and overflow flag; ``state_dict()`` is what
    DeepSpeedZeroOptimizer.state_dict() returns, made of DeepSpeed's and torch's own objects."""

    def __init__(self, setup: ShardSetup, params: OrderedDict, dp_rank: int):
        import torch
        from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

        self.setup, self.params = setup, params
        numel = sum(t.numel() for t in params.values())
        self.start, self.size, self.padding = zero_partition(numel, setup.layout.dp, dp_rank)
        fp32 = meta_tensor((self.size,), torch.float32).requires_grad_()
        self.single_partition_of_fp32_groups = [fp32]
        self.optimizer, self.scheduler = _adamw(setup, fp32)
        self.loss_scaler = CreateLossScaler(model_dtype(setup), static_loss_scale=1.0, dynamic_scaling=False,
                                            dynamic_loss_args=None)
        self.overflow = False

    def state_dict(self) -> dict[str, Any]:
        import torch
        from deepspeed.git_version_info import version
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.mixed_precision_linkage import _init_lp_to_hp_mapping
        from deepspeed.utils.tensor_fragment import get_hp_fragment_mapping

        fp32 = self.single_partition_of_fp32_groups[0]
        lp = {name: torch.nn.Parameter(meta_tensor(tuple(t.shape), t.dtype)) for name, t in self.params.items()}
        names = {id(p): name for name, p in lp.items()}
        in_partition = _init_lp_to_hp_mapping(list(lp.values()), self.start, self.size, dp_group=None)
        mapping = OrderedDict(
            (names[id(p)], get_hp_fragment_mapping(p, offset, fp32, None, None, False, 0, self.start, self.size)
             .get_hp_fragment_address()) for p, offset in in_partition)
        return {
            "loss_scaler": self.loss_scaler, "dynamic_loss_scale": False, "overflow": self.overflow,
            "clip_grad": self.setup.ds_config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT),
            "base_optimizer_state": self.optimizer.state_dict(),
            "single_partition_of_fp32_groups": [fp32[:self.size - self.padding]],  # a slice: the padding stays in
            "zero_stage": ZeroStageEnum.optimizer_states, "group_paddings": [self.padding],  # the storage
            "param_alignment_paddings": [[0] * len(lp)], "partition_count": [self.setup.layout.dp],
            "ds_version": version, "param_slice_mappings": [mapping],
        }


class TrainingState:
    """One rank's DeepSpeed engine at a save, as much as a checkpoint reads of it: the stage's module, the ZeRO
    optimizer, the lr scheduler and the step counters. DeepSpeed's own save builds its files from it
    (``_model_states``, ``_optimizer_states``); restartbench's harness-level engines read it through their own
    capture functions (the lazy engine's ``capture``, ``harness_state.capture``), as they read a live engine."""

    def __init__(self, setup: ShardSetup, params: OrderedDict, dp_rank: int):
        micro, accum = setup.ds_config["train_micro_batch_size_per_gpu"], setup.ds_config["gradient_accumulation_steps"]
        self.module = _Module(params)
        self.optimizer = ZeroOptimizer(setup, params, dp_rank)
        self.lr_scheduler = self.optimizer.scheduler
        self.global_steps, self.skipped_steps = setup.step, 0
        self.global_samples = setup.step * micro * accum * setup.layout.dp


def two_replicas(layout: Layout) -> frozenset[int]:
    """Data-parallel ranks 0 and 1 of each pipeline stage and tensor rank (DeepSpeed's axes: pipe, data, model): what
    is planned of a layout where the other replicas are as rank 1 (a per-rank engine's files in the what-if, DCP's
    plans in its coordinator's measurement)."""
    return frozenset((pipe * layout.dp + data) * layout.tp + model
                     for pipe in range(layout.pp) for model in range(layout.tp) for data in (0, 1))


def training_states(setup: ShardSetup, ranks: set[int] | None = None) -> Iterator[tuple[int, Any, TrainingState]]:
    """(rank, coordinates, training state on meta tensors) of every rank, or of ``ranks`` only."""
    dtype = model_dtype(setup)
    for rank, coord, stage in _ranks(setup):
        if ranks is not None and rank not in ranks:
            continue
        params = OrderedDict((name, meta_tensor(tuple(t.shape), dtype)) for name, t in _stage_params(stage).items())
        yield rank, coord, TrainingState(setup, params, coord.data)


# --- DeepSpeed's recovery scripts ---------------------------------------------------------------


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

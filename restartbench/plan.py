"""The checkpoint plan: every file each rank writes for a preset, layout and engine, predicted without running.

    python -m restartbench.plan 70B tp8pp4dp2 --engine torch        # files per rank, counts per kind, totals
    python -m restartbench.plan 70B tp8pp4dp2 --engine dcp --json   # the same, as JSON
    python -m restartbench.plan --all-presets --layouts tp1pp1,tp8pp8 > docs/plan.md   # presets x layouts, engines

Options are the run options of ``config-n-run.py`` (``--dtype``, ``--micro-batch``, ``--engine``, ...), plus
``--step`` (the checkpoint's iteration, default ``--save-interval``). Nothing here is copied from DeepSpeed by hand:

- parameter shapes come from the model itself: ``restartbench.model.layer_specs`` built on torch's meta device;
- the layers of each pipeline stage come from DeepSpeed's ``PipelineModule._partition_layers`` with the model's
  partition method, the rank coordinates from DeepSpeed's ``PipeModelDataParallelTopology``;
- each rank's training state (``TrainingState``) is made of DeepSpeed's and torch's own objects, on meta tensors:
  a ``torch.optim.AdamW`` over the rank's fp32 ZeRO-1 partition with Adam's state, the run's lr scheduler (DeepSpeed's
  class, stepped to the checkpoint's iteration), ``CreateLossScaler``, DeepSpeed's fragment mapping of the flat
  partition. ZeRO-1 pads the stage's flat parameter buffer to a multiple of 2·dp elements
  (``nccl_start_alignment_factor`` × dp in stage_1_and_2.py) and splits it into dp equal partitions;
- every engine's files come from that state through the engine's own code (``PREDICTORS``, one function each):

  - torch: the state dicts DeepSpeed 0.19.8 saves (``PipelineModule.save_state_dict``,
    ``DeepSpeedEngine._common_checkpoint_state``, ``DeepSpeedZeroOptimizer.state_dict``: the last partition's
    padding stays in the saved storages, the fp32 partition being saved as a slice of it), named by DeepSpeed's
    ``ckpt_layer_path``, ``_get_ckpt_name`` and ``_get_rank_zero_ckpt_name``; data-parallel rank 0 of each (stage,
    tensor rank) writes the layer files and the model file, every rank its optimizer file;
  - fastpersist: the same state dicts, written by the ranks DeepSpeed's ``DataParallelWriterFactory`` makes
    writers, into its FastFileWriter, and renamed as the harness renames them;
  - lazy: ``lazy_engine``'s own capture, file plan and header encoding;
  - dcp, dcp-async: ``dcp_engine``'s flat state, planned by DCP's own planners, laid out as FileSystemWriter does;
  - torchsnapshot: ``harness_state``'s capture, planned by TorchSnapshot's own functions under the study's patch;
  - none writes nothing; decoupled and datastates are not predicted (``NOT_PREDICTED`` says why);
- sizes: the payload is the bytes of every tensor storage, exact; a torch.save'd file's size is what ``torch.save``
  itself writes, on CPU tensors whose storages map a sparse file, under ``torch.serialization.skip_data`` (no
  tensor byte is allocated, read or written: a sparse file whose length is the real file's). The tests compare
  every name and size with real runs; each engine's stated tolerance per file is a named constant below
  (``SIZE_TOLERANCE_BYTES``, ``LAZY_TOLERANCE_BYTES``, ...), with its reason.

``zero_to_fp32.py`` and ``zero_to_torch.py``, which DeepSpeed's global rank 0 copies into the checkpoint folder's
root at every save, are listed apart (they are not written through the checkpoint engine, so a run's
``checkpoint.durable`` events do not count them either).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import re
import sys
import tempfile
import types
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from restartbench.config import RunConfig, build_parser
from restartbench.events import number_ranges
from restartbench.layout import Layout, validate_layout
from restartbench.presets import PRESETS, ModelPreset, get_preset

#: How restartbench.model.build_pipeline_module splits the layers over pipeline stages.
PARTITION_METHOD = "type:DecoderLayerPipe"
SIZE_TOLERANCE_BYTES = 64
"""torch (DeepSpeed's default engine): largest difference between a predicted and a written file size, bytes, needed
on a GPU run only. On a CPU run every file is predicted byte for byte: the plan's torch.save'd pickle (the zip's
``data.pkl``) is the run's own, and tests/test_predict.py holds stored and fresh CPU runs to 0. Each file is
torch.save's zip, which starts every record on a 64-byte boundary, so a pickle a few bytes longer moves the file by 0
or 64 B. On a GPU, DeepSpeed's optimizer file holds the fp32 partition and Adam's moments on the device, and torch.save
pickles each storage's location, ``cuda:<index>`` instead of ``cpu``; the plan saves CPU tensors, so such a file can
be 64 B longer than predicted (small tp1pp1dp2 bf16's is, with ``cuda:0``; tiny's are not). Layer files are
cloned to the CPU before they are saved and model files hold no tensor: exact on any device. Not yet checked against
a GPU run.

Every engine's tolerance assumes the run's optimizer applied every step. DeepSpeed skips a step whose gradient norm is
not finite (always checked in fp32, in bf16 only with ``check_grad_overflow``), and then its ``skipped_steps`` and the
lr scheduler's iteration differ from the plan's: a pickled integer takes 1, 2 or 4 bytes below 256, 65,536 and 2**31,
so a torch.save'd file can move by 64 B; the lazy header and TorchSnapshot's manifest hold these values as text."""
FASTPERSIST_TOLERANCE_BYTES = SIZE_TOLERANCE_BYTES
"""fastpersist: the same torch.save zips as torch (written into DeepSpeed's FastFileWriter, which adds no padding:
its aligned O_DIRECT writes end with a buffered write of the unaligned tail), so the same tolerance: exact on a CPU
run, 64 B for the optimizer files' device locations on a GPU run."""
LAZY_TOLERANCE_BYTES = 0
"""lazy: exact. The file is restartbench's own format: its header is computed by the engine's own functions from
the same values (the device each tensor lives on included), and the data region's size depends only on tensor
shapes."""
DCP_TOLERANCE_BYTES = 0
"""dcp, dcp-async: exact. Each ``.distcp`` entry is a torch.save zip of a CPU copy (FileSystemWriter moves every
tensor to the CPU before saving it, so the device changes nothing), and the plan's entries are the run's own pickles.
``.metadata`` pickles the checkpoint folder's path (DCP's checkpoint_id): the run's own folder is exact; before the
run (plan.json's estimate) the run folder's time stamp is a placeholder of the same length, a few bytes off only when
the folder gets a ``-N`` suffix (two runs in the same second). For an object-store prefix the writer is
s3torchconnector's or fsspec's, whose checkpoint_id is not checked against real runs."""
TORCHSNAPSHOT_TOLERANCE_BYTES = 0
"""torchsnapshot: exact. Tensors are written raw, small values are inlined in the manifest, and the manifest's JSON
is built by TorchSnapshot's own code from the same values; only the batch files' names are random (uuid4: the plan
writes ``<uuid4>``), not their length."""
#: Layouts of docs/plan.md (those that do not fit a preset are left out, with the reason).
DOC_LAYOUTS = ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp2", "tp2pp4dp1", "tp8pp4dp2", "tp8pp8dp1")
#: Kinds of files, in the order counts are listed: DeepSpeed's layer, model and optimizer files (the lazy format has
#: model and optimizer files too); a rank's data file (DCP, TorchSnapshot), pickled objects, and metadata.
KINDS = ("layer", "model", "optimizer", "data", "object", "metadata")


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
    tolerance_bytes: int = SIZE_TOLERANCE_BYTES
    """Largest difference per file between a predicted and a written size (``EnginePredictor.tolerance_bytes``)."""
    note: str = ""

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
        """Files and bytes of each kind this plan has, in ``KINDS`` order."""
        return {kind: {"files": sum(1 for f in self.files if f.kind == kind),
                       "bytes": sum(f.bytes for f in self.files if f.kind == kind)}
                for kind in KINDS if any(f.kind == kind for f in self.files)}

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
                "tag": self.tag, "world_size": self.world_size, "scale": self.scale,
                "tolerance_bytes": self.tolerance_bytes, "note": self.note, "totals": self.totals(),
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
    device: str = "cpu"
    """Where the training state lives (cpu, cuda): the lazy format records it, TorchSnapshot batches by it."""
    folder: str = ""
    """The checkpoint folder (absolute; ``checkpoint_folder``): DCP pickles its path into ``.metadata``."""
    nnodes: int = 1
    """Nodes of the run (torchrun numbers ranks node by node): FastPersist assigns its writers per machine."""


def _meta(shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype, device="meta")


def _cpu_resident(name: str) -> bool:
    """Whether the tensor of this name (any separator) stays on the CPU when the state lives on a GPU: Adam's step
    counters, which torch.optim keeps on the CPU (non-capturable, non-fused Adam). The plan's meta tensors carry no
    device of the run, so the formats that record devices are told by name."""
    return re.split(r"[./]", name)[-1] == "step"


def _ranks(setup: ShardSetup) -> Iterator[tuple[int, Any, list[tuple[int, OrderedDict]]]]:
    """(rank, DeepSpeed topology coordinates, its stage's layers as (pipeline index, fp32 state dict on meta)) for
    every rank, in rank order."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layout = setup.layout
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    parts = _stage_parts(setup.preset, layout)
    layers = _layers(setup.preset, layout.tp)
    for rank in range(layout.world_size):
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


def _model_dtype(setup: ShardSetup) -> Any:
    import torch

    return torch.bfloat16 if setup.dtype == "bf16" else torch.float32


def _rank_files(setup: ShardSetup, topology: Any, rank: int, stage: list[tuple[int, OrderedDict]],
                writes_model: bool) -> Iterator[ShardFile]:
    coord = topology.get_coord(rank)
    dtype = _model_dtype(setup)
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


def _model_states(setup: ShardSetup, state: "TrainingState") -> dict[str, Any]:
    """``mp_rank_XX_model_states.pt``: DeepSpeedEngine._common_checkpoint_state of a PipelineEngine under ZeRO-1."""
    from deepspeed.git_version_info import version
    from deepspeed.runtime.engine import _checkpoint_parallel_metadata

    return dict(module=None, buffer_names=[], optimizer=None,
                param_shapes=[OrderedDict((name, t.shape) for name, t in state.module.state_dict().items())],
                frozen_param_shapes=None, shared_params={}, frozen_param_fragments=None,
                lr_scheduler=state.lr_scheduler.state_dict(), data_sampler=None, random_ltd=None,
                skipped_steps=state.skipped_steps, global_steps=state.global_steps,
                global_samples=state.global_samples,
                dp_world_size=setup.layout.dp, mp_world_size=setup.layout.pp * setup.layout.tp,
                **_checkpoint_parallel_metadata(_Grid(setup.layout)), ds_config=setup.ds_config, ds_version=version)


def _optimizer_states(setup: ShardSetup, state: "TrainingState") -> dict[str, Any]:
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
    after a step, the run's lr scheduler, DeepSpeed's own class, stepped once per iteration up to ``setup.step``)."""
    import torch
    from deepspeed.runtime import lr_schedules

    options = {k: v for k, v in setup.ds_config["optimizer"]["params"].items() if k not in ("torch_adam", "adam_w_mode")}
    adam = torch.optim.AdamW([param], **options)
    adam.state[param] = {"step": _meta((), torch.float32), "exp_avg": _meta(tuple(param.shape), torch.float32),
                         "exp_avg_sq": _meta(tuple(param.shape), torch.float32)}
    schedule = setup.ds_config.get("scheduler")
    scheduler = getattr(lr_schedules, schedule["type"])(adam, **schedule["params"]) if schedule else None
    for _ in range(setup.step if scheduler else 0):
        scheduler.step()
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
        fp32 = _meta((self.size,), torch.float32).requires_grad_()
        self.single_partition_of_fp32_groups = [fp32]
        self.optimizer, self.scheduler = _adamw(setup, fp32)
        self.loss_scaler = CreateLossScaler(_model_dtype(setup), static_loss_scale=1.0, dynamic_scaling=False,
                                            dynamic_loss_args=None)
        self.overflow = False

    def state_dict(self) -> dict[str, Any]:
        import torch
        from deepspeed.git_version_info import version
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.mixed_precision_linkage import _init_lp_to_hp_mapping
        from deepspeed.utils.tensor_fragment import get_hp_fragment_mapping

        fp32 = self.single_partition_of_fp32_groups[0]
        lp = {name: torch.nn.Parameter(_meta(tuple(t.shape), t.dtype)) for name, t in self.params.items()}
        names = {id(p): name for name, p in lp.items()}
        in_partition = _init_lp_to_hp_mapping(list(lp.values()), self.start, self.size, dp_group=None)
        mapping = OrderedDict(
            (names[id(p)], get_hp_fragment_mapping(p, offset, fp32, None, None, False, 0, self.start, self.size)
             .get_hp_fragment_address()) for p, offset in in_partition)
        return {
            "loss_scaler": self.loss_scaler, "dynamic_loss_scale": False, "overflow": self.overflow,
            "clip_grad": self.setup.ds_config.get("gradient_clipping", 0.0),
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
    capture functions (``lazy_engine.capture``, ``harness_state.capture``), as they read a live engine."""

    def __init__(self, setup: ShardSetup, params: OrderedDict, dp_rank: int):
        micro, accum = setup.ds_config["train_micro_batch_size_per_gpu"], setup.ds_config["gradient_accumulation_steps"]
        self.module = _Module(params)
        self.optimizer = ZeroOptimizer(setup, params, dp_rank)
        self.lr_scheduler = self.optimizer.scheduler
        self.global_steps, self.skipped_steps = setup.step, 0
        self.global_samples = setup.step * micro * accum * setup.layout.dp


def training_states(setup: ShardSetup, ranks: set[int] | None = None) -> Iterator[tuple[int, Any, TrainingState]]:
    """(rank, coordinates, training state on meta tensors) of every rank, or of ``ranks`` only."""
    dtype = _model_dtype(setup)
    for rank, coord, stage in _ranks(setup):
        if ranks is not None and rank not in ranks:
            continue
        params = OrderedDict((name, _meta(tuple(t.shape), dtype)) for name, t in _stage_params(stage).items())
        yield rank, coord, TrainingState(setup, params, coord.data)


# --- from meta tensors to real ones, and their sizes -------------------------------------------


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
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in _tensors(state)}.values())


def signature(state: Any) -> tuple:
    """Everything in ``state`` that shapes its pickle and its zip records: container types and keys, leaf values,
    and for tensors dtype, shape, stride, offset, requires_grad and which storage (by order of appearance) they use."""
    import torch

    storages: dict[int, int] = {}

    def walk(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            untyped = item.untyped_storage()
            index = storages.setdefault(untyped._cdata, len(storages))  # one id per storage, as torch.save's
            return ("tensor", index, untyped.nbytes(), str(item.dtype), tuple(item.shape), item.stride(),
                    item.storage_offset(), item.requires_grad)
        if isinstance(item, dict):
            extra = tuple(sorted((k, repr(v)) for k, v in getattr(item, "__dict__", {}).items()))
            return (type(item).__qualname__, extra, tuple((repr(k), walk(v)) for k, v in item.items()))
        if type(item) in (list, tuple):
            return (type(item).__name__, tuple(walk(v) for v in item))
        return (type(item).__qualname__, repr(item))

    return walk(state)


def saved_size(state: Any, name: str, scratch: str, stream: bool = False) -> int:
    """The size of the file ``torch.save(state, <scratch>/<name>)`` would write (``stream``: ``torch.save`` into that
    file opened, as a writer object is given it), without a tensor byte: ``state`` (meta tensors) is saved as CPU
    tensors whose storages map a sparse scratch file (``_mapped``), under ``skip_data``, which writes no storage
    byte but leaves the room they take (a sparse file whose length is the real file's); the file is then removed."""
    import torch

    path = os.path.join(scratch, os.path.basename(name))
    try:
        with _mapped(state, scratch) as cpu, torch.serialization.skip_data():
            if stream:
                with open(path, "wb") as handle:
                    torch.save(cpu, handle)
            else:
                torch.save(cpu, path)
        return os.path.getsize(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


@contextlib.contextmanager
def _mapped(state: Any, scratch: str) -> Iterator[Any]:
    """``state`` with its meta tensors as CPU tensors of the same shapes, strides, offsets and dtypes whose storages
    are shared mappings of one sparse file: no memory is taken and nothing is read unless the data is touched (it is
    not: ``saved_size`` saves under ``skip_data``). Real CPU tensors, so torch.save pickles them exactly as a run's."""
    import torch

    backing = os.path.join(scratch, ".storage")
    need = max([0] + [t.untyped_storage().nbytes() for t in _tensors(state)])
    with open(backing, "ab") as handle:
        handle.truncate(max(need, os.path.getsize(backing)))

    def make(numel: int, dtype: Any) -> Any:
        nbytes = numel * dtype.itemsize
        if not nbytes:
            return torch.empty(0, dtype=dtype)
        storage = torch.UntypedStorage.from_file(backing, True, nbytes)
        return torch.tensor([], dtype=dtype).set_(storage, 0, (numel,), (1,))

    yield materialize(state, make)


def _tensors(state: Any) -> Iterator[Any]:
    import torch

    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)


# --- the plan -------------------------------------------------------------------------------


def setup_for(cfg: RunConfig, step: int | None = None, scale: float = 1.0) -> ShardSetup:
    """The checkpoint of run configuration ``cfg`` after iteration ``step`` (default: its first save)."""
    from restartbench.launchers import choose_device
    from restartbench.render import render_ds_config
    from restartbench.runtime import preset_for

    base = preset_for(cfg)
    ranks = cfg.layout.nnodes * cfg.layout.nproc_per_node if cfg.layout.nproc_per_node else None
    layout = validate_layout(cfg.layout.layout, base, ranks)
    step = step or min(cfg.train.save_interval, cfg.train.iters)
    grad_accum = cfg.train.grad_accum or layout.pp
    return ShardSetup(preset=scaled_preset(base, scale, layout.tp), layout=layout, dtype=cfg.model.dtype,
                      ds_config=render_ds_config(cfg, grad_accum, layout.dp), step=step, tag=f"step{step}",
                      device=choose_device(cfg.launch.device, base.param_count()), folder=checkpoint_folder(cfg, base.name, layout.name),
                      nnodes=cfg.layout.nnodes)


def checkpoint_folder(cfg: RunConfig, preset: str, layout: str) -> str:
    """Where a run of ``cfg`` puts its checkpoints, as ``study.plan_run`` resolves it: ``--checkpoint-dir``, else
    ``<run folder>/checkpoints``; a run folder not made yet is ``<logs>/<preset>/<layout>/<engine>/<time>`` with
    ``rundir.PLACEHOLDER_STAMP`` for the time (a path of the same length, unless the run needs a ``-N`` suffix)."""
    from restartbench import rundir, storage

    if cfg.storage.checkpoint_dir:
        where = cfg.storage.checkpoint_dir
        return where if storage.is_remote(where) else str(Path(where).resolve())
    run_dir = Path(cfg.paths.run_dir or rundir.run_folder(cfg.paths.logs, preset, layout, cfg.engine.engine))
    return str((run_dir / rundir.CHECKPOINTS).resolve())


# --- the predictors, one per engine ----------------------------------------------------------


def _deepspeed_files(setup: ShardSetup, scratch: str, stream: bool = False,
                     model_writers: set[int] | None = None) -> list[PlannedFile]:
    """DeepSpeed's files (``shard_files``), each sized by torch.save itself; ``stream``: saved into a file object
    (as FastPersist's writer is), not to a path (torch names the zip's root folder after a path's file name)."""
    sizes: dict[tuple, int] = {}  # files alike but for their names' digits are serialized once
    files = []
    for f in shard_files(setup, model_writers):
        key = (0 if stream else len(os.path.basename(f.path)), signature(f.state))
        if key not in sizes:
            sizes[key] = saved_size(f.state, f.path, scratch, stream)
        files.append(PlannedFile(f.path, f.rank, f.kind, payload_bytes(f.state), sizes[key]))
    return files


def _fastpersist_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """DeepSpeed's FastPersist writer: the state dicts of DeepSpeed's default engine, torch.save'd into DeepSpeed's
    FastFileWriter (a file object, so the zip's root folder is named ``archive``, not after the file; it adds no
    padding). Only ranks with a data-parallel writer (``_fastpersist_writers``) write, and each of them writes the
    model file too; FastPersist suffixes every file ``-<writer>.<writers>``, and the harness then gives each file
    DeepSpeed's name back, except the copies of a name a lower writer holds (``restore_deepspeed_name``): those keep
    their suffix."""
    writers = _fastpersist_writers(setup)
    files = [f for f in _deepspeed_files(setup, scratch, stream=True, model_writers=set(writers))
             if f.rank in writers]
    named: set[str] = set()
    for i in sorted(range(len(files)), key=lambda i: writers[files[i].rank][0]):  # the lowest writer keeps the name
        if files[i].path in named:
            index, count = writers[files[i].rank]
            files[i] = replace(files[i], path=f"{files[i].path}-{index}.{count}")
        named.add(files[i].path)
    return files


def _fastpersist_writers(setup: ShardSetup) -> dict[int, tuple[int, int]]:
    """Rank -> (writer index, writers) for the ranks FastPersist gives a writer: DeepSpeed's own
    DataParallelWriterFactory on each rank's parallel info (``create_data_parallel_writer_config`` without
    processes), with the run's writer block, and each rank's machine as launch.sh exports it (``CROSS_RANK``: the
    rank's node, ``CROSS_SIZE``: the nodes)."""
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_writer_config
    from deepspeed.runtime.model_checkpointing.constants import CHECKPOINT_DATA_PARALLEL, CHECKPOINT_IO_MULTIPLIER
    from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory import DataParallelWriterFactory
    from deepspeed.runtime.model_checkpointing.utils import SOCKETS_PER_MACHINE, MPUInfo, UniversalParallelInfo
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from deepspeed.runtime.zero.config import ZeroStageEnum

    layout, machines = setup.layout, setup.nnodes
    per_machine = layout.world_size // machines
    config = get_checkpoint_writer_config(setup.ds_config["checkpoint"])
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    writers = {}
    for rank in range(layout.world_size):
        coord = topology.get_coord(rank)
        mpu = MPUInfo(pp_world_size=layout.pp, pp_rank=coord.pipe, tp_world_size=layout.tp, tp_rank=coord.model,
                      dp_world_size=layout.dp, dp_rank=coord.data,
                      dp_peer_ranks=topology.filter_match(pipe=coord.pipe, model=coord.model))
        info = UniversalParallelInfo(global_world_size=layout.world_size, global_rank=rank,
                                     local_rank=rank % per_machine, mpu_info=mpu, ep_info=None,
                                     pure_dp=layout.dp == layout.world_size,
                                     num_machines=machines, machine_rank=rank // per_machine,
                                     num_sockets=machines * SOCKETS_PER_MACHINE)
        with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints each rank's assignment
            writer = DataParallelWriterFactory(info, config[CHECKPOINT_DATA_PARALLEL]).create_config(
                ZeroStageEnum.optimizer_states, has_moe_layers=False)
        if writer is not None:
            writers[rank] = (writer.rank, writer.world_size * config[CHECKPOINT_IO_MULTIPLIER])
    return writers


def _lazy_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """restartbench's lazy format: the file plans and headers ``lazy_engine`` computes itself (``capture``,
    ``make_plan``, ``encode_header``) from each rank's state; a file is its header's pages plus its data region."""
    from restartbench.engines import lazy_engine as lazy

    files = []
    for rank, coord, state in training_states(setup):
        layout, captured = lazy_capture(setup, rank, coord, state)
        for f in lazy.make_plan(captured.groups).files:
            _, data_offset = lazy.encode_header(f, lazy.file_meta(layout, setup.tag),
                                                captured.values if f.kind == "optim" else {})
            files.append(PlannedFile(f"{setup.tag}/{f.name}", rank, "model" if f.kind == "model" else "optimizer",
                                     sum(e.spec.nbytes for e in f.entries), data_offset + f.data_bytes))
    return files


def lazy_capture(setup: ShardSetup, rank: int, coord: Any, state: TrainingState) -> tuple[Any, Any]:
    """(the lazy engine's ``RankLayout`` of ``rank``, its ``capture`` of the rank's state), each tensor spec on the
    device the run's state lives on; the tensors are the state's own (meta tensors for a ``training_states`` one)."""
    from restartbench.engines import lazy_engine as lazy

    layout = lazy.RankLayout(coord.pipe, coord.model, coord.data, setup.layout.dp,
                             dp_src=rank - coord.data * setup.layout.tp, dp_group=None)
    captured = lazy.capture(state, layout)
    return layout, replace(captured, groups=_lazy_on_device(captured.groups, setup.device))


def _lazy_on_device(groups: list[tuple[str, str, list[tuple[Any, bool]]]], device: str) -> list[Any]:
    """The lazy engine's file groups with each tensor on the device the run's state lives on (the header records
    it; the plan's tensors are meta tensors)."""
    return [(name, kind, [(replace(spec, device="cpu" if _cpu_resident(spec.name) else device), sync)
                          for spec, sync in specs]) for name, kind, specs in groups]


def _dcp_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """PyTorch DCP as ``dcp_engine`` calls it, step by step as ``dcp.save`` does: each rank's planner
    (``dcp_engine.save_planner``) plans its flat harness state, the coordinator's planner makes the global plan (DCP's
    deduplication puts each module tensor shared by data-parallel replicas in one rank's file), and
    FileSystemWriter's layout follows: one ``__<rank>_0.distcp`` per rank holding its byte entries then its tensors,
    each entry a torch.save into the file; rank 0 pickles the Metadata, offsets and the folder's path included."""
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, FileSystemWriter

    from restartbench.engines import dcp_engine, harness_state

    writer = FileSystemWriter(os.path.join(setup.folder, setup.tag))  # never writes: gives .metadata its path and id
    planners = []
    for rank, coord, state in training_states(setup):
        planner = dcp_engine.save_planner()
        planner.set_up_planner(state_dict=dcp_engine.flat_state(harness_state.capture(state), coord.pipe,
                                                                 coord.model, coord.data),
                               storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        planners.append(planner)
    local = [_sent(planner.create_local_plan()) for planner in planners]  # gathered on the coordinator
    plans, metadata = planners[0].create_global_plan(local)
    plans = [planner.finish_plan(_sent(plan)) for planner, plan in zip(planners, writer.prepare_global_plan(plans))]
    files, results = [], []
    for rank, (planner, plan) in enumerate(zip(planners, plans)):
        file, written = _dcp_rank_file(setup, planner, plan, scratch)
        files.append(replace(file, rank=rank))
        results.extend(_sent(written))  # gathered on the coordinator
    metadata.version = CURRENT_DCP_VERSION  # what FileSystemWriter.finish sets before pickling it
    metadata.storage_data = {result.index: result.storage_data for result in results}
    metadata.storage_meta = writer.storage_meta()
    return files + [PlannedFile(f"{setup.tag}/{dcp_engine.METADATA}", 0, "metadata", 0,
                                len(pickle.dumps(metadata)))]


def _sent(obj: Any) -> Any:
    """``obj`` as another rank receives it from torch.distributed's object collectives (pickled and unpickled):
    objects that were one before are then distinct, and pickle writes each again in ``.metadata``."""
    return pickle.loads(pickle.dumps(obj))


def _dcp_rank_file(setup: ShardSetup, planner: Any, plan: Any, scratch: str) -> tuple[PlannedFile, list[Any]]:
    """One rank's ``.distcp`` file and DCP's WriteResults for it (FileSystemWriter.write_data, one thread)."""
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
    ordered = ([item for item in plan.items if item.type == WriteItemType.BYTE_IO]
               + [item for item in plan.items if item.type != WriteItemType.BYTE_IO])
    offset, payload, results = 0, 0, []
    for item in ordered:
        if item.type == WriteItemType.BYTE_IO:
            length = planner.resolve_data(item).getbuffer().nbytes  # the object, torch.save'd by the planner
        else:
            data = item.tensor_data
            length = _tensor_saved_size(data.properties.dtype, tuple(data.size), scratch)
            payload += math.prod(data.size) * data.properties.dtype.itemsize
        results.append(WriteResult(index=item.index, size_in_bytes=length,
                                   storage_data=_StorageInfo(name, offset, length)))
        offset += length
    return PlannedFile(f"{setup.tag}/{name}", -1, "data", payload, offset), results


_TENSOR_SIZES: dict[tuple[Any, tuple[int, ...]], int] = {}


def _tensor_saved_size(dtype: Any, shape: tuple[int, ...], scratch: str) -> int:
    """Bytes of torch.save of one contiguous CPU tensor into a file object (how DCP writes each tensor entry);
    measured once per dtype and shape."""
    import torch

    if (dtype, shape) not in _TENSOR_SIZES:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        _TENSOR_SIZES[dtype, shape] = saved_size(meta, "tensor", scratch, stream=True)
    return _TENSOR_SIZES[dtype, shape]


def _torchsnapshot_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """TorchSnapshot 0.1.0 with the study's patch: each rank's harness state is a snapshot of its own, in
    ``<tag>/rank<NNNNN>/``: what TorchSnapshot's ``take`` would write is planned with TorchSnapshot's own functions
    (``_snapshot_requests``); tensor data is written raw (one file per batch of small tensors, per large tensor or per
    512 MiB chunk), other objects torch.save'd one per file, and ``.snapshot_metadata`` is the manifest's JSON."""
    from restartbench.engines import harness_state
    from restartbench.engines.torchsnapshot_engine import rank_folder

    files = []
    for rank, _, state in training_states(setup):
        requests, metadata = _snapshot_requests(harness_state.capture(state), setup.device)
        folder = rank_folder("", setup.tag, rank)
        for request in requests:
            size, payload, kind = _snapshot_request_bytes(request)
            files.append(PlannedFile(os.path.join(folder, random_names_as_placeholders(request.path)), rank, kind,
                                     payload, size))
        files.append(PlannedFile(os.path.join(folder, SNAPSHOT_METADATA), rank, "metadata", 0,
                                 len(metadata.to_yaml().encode("utf-8"))))
    return files


SNAPSHOT_METADATA = ".snapshot_metadata"
#: A random part of a file name (TorchSnapshot names each batch of small tensors ``batched/<uuid4>``).
RANDOM_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def random_names_as_placeholders(path: str) -> str:
    """``path`` with each random uuid4 in it written ``<uuid4>`` (the same length on disk, another name each save)."""
    return RANDOM_NAME.sub("<uuid4>", path)


def _snapshot_requests(state_dict: dict[str, Any], device: str) -> tuple[list[Any], Any]:
    """The write requests and the metadata of ``Snapshot.take`` of one rank's ``state_dict`` under the study's patch
    (a world of one, nothing replicated): the steps of TorchSnapshot's ``Snapshot._take_impl``, with its own
    functions, short of staging and writing the data. TorchSnapshot batches CPU and GPU tensors apart: on a GPU
    run the CPU-resident ones (``_cpu_resident``) are batched on their own, first, as its CPU slabs are."""
    from restartbench.engines.torchsnapshot_engine import APP_KEY, patched_torchsnapshot

    patched_torchsnapshot()
    from torchsnapshot import snapshot
    from torchsnapshot.batcher import batch_write_requests
    from torchsnapshot.flatten import flatten
    from torchsnapshot.io_preparer import prepare_write
    from torchsnapshot.knobs import is_batching_disabled
    from torchsnapshot.manifest import PrimitiveEntry, SnapshotMetadata
    from torchsnapshot.partitioner import partition_write_reqs
    from torchsnapshot.version import __version__

    pg = snapshot.PGWrapper(pg=None)  # the patch's rank-local wrapper
    manifest, flattened = flatten(state_dict, prefix=APP_KEY)
    primitives, entries, requests = {}, {}, {}
    for path, obj in flattened.items():
        entry, wrs = prepare_write(obj=obj, logical_path=path, rank=pg.get_rank(), replicated=False)
        if isinstance(entry, PrimitiveEntry):
            primitives[path] = entry
        else:
            entries[path], requests[path] = entry, wrs
    entries, requests = partition_write_reqs(entries=entries, write_reqs=requests, pg=pg)
    write_reqs = [wr for wrs in requests.values() for wr in wrs]
    if not is_batching_disabled():
        on_cpu = [wr for wr in write_reqs if device == "cpu" or _cpu_resident(wr.path)]
        on_gpu = [wr for wr in write_reqs if not (device == "cpu" or _cpu_resident(wr.path))]
        write_reqs = [wr for group in (on_cpu, on_gpu) if group
                      for wr in batch_write_requests(entries=list(entries.values()), write_reqs=group)[1]]
    manifest.update(dict(**primitives, **entries))
    manifest = snapshot.Snapshot._gather_manifest(manifest=manifest, pg=pg)
    return write_reqs, SnapshotMetadata(version=__version__, world_size=pg.get_world_size(), manifest=manifest)


def _snapshot_request_bytes(request: Any) -> tuple[int, int, str]:
    """(file bytes, tensor bytes, kind) of one TorchSnapshot write request: tensors are written raw (buffer
    protocol), a batch as the sum of its tensors; any other object is torch.save'd, done here for real (they are
    small plain values: optimizer hyperparameters such as ``betas``)."""
    import asyncio

    from torchsnapshot.batcher import BatchedBufferStager
    from torchsnapshot.io_preparer import ObjectBufferStager, TensorBufferStager
    from torchsnapshot.serialization import Serializer

    stager = request.buffer_stager
    if isinstance(stager, BatchedBufferStager):
        return stager.slab_sz_bytes, stager.slab_sz_bytes, "data"
    if isinstance(stager, TensorBufferStager):
        if stager.entry.serializer != Serializer.BUFFER_PROTOCOL.value:
            raise NotImplementedError(f"TorchSnapshot would torch.save {request.path} "
                                      f"({stager.tensor.dtype}); the plan predicts raw tensor writes only")
        size = stager.tensor.nelement() * stager.tensor.element_size()
        return size, size, "data"
    if isinstance(stager, ObjectBufferStager):
        return len(asyncio.run(stager.stage_buffer())), 0, "object"
    raise NotImplementedError(f"TorchSnapshot write request {request.path} of an unknown kind "
                              f"({type(stager).__name__}): the plan does not predict it")


@dataclass(frozen=True)
class EnginePredictor:
    """How the files of one engine are predicted."""

    files: Callable[[ShardSetup, str], list[PlannedFile]]
    """(setup, scratch folder) -> every file of one checkpoint."""
    tolerance_bytes: int
    """Largest difference per file between a predicted and a written size (the constant's docstring says why)."""
    root_files: Callable[[], dict[str, int]] = dict
    """Files written at the checkpoint folder's root at each save, outside the engine (name -> bytes)."""
    needs_folder: bool = False
    """The files' sizes depend on the checkpoint folder's path."""
    note: str = ""


PREDICTORS: dict[str, EnginePredictor] = {
    "none": EnginePredictor(lambda setup, scratch: [], 0, note="engine none writes no checkpoint files"),
    "torch": EnginePredictor(_deepspeed_files, SIZE_TOLERANCE_BYTES, lambda: recovery_scripts()),
    "fastpersist": EnginePredictor(lambda setup, scratch: _fastpersist_files(setup, scratch),
                                   FASTPERSIST_TOLERANCE_BYTES, lambda: recovery_scripts()),
    "lazy": EnginePredictor(_lazy_files, LAZY_TOLERANCE_BYTES),
    "dcp": EnginePredictor(_dcp_files, DCP_TOLERANCE_BYTES, needs_folder=True),
    "dcp-async": EnginePredictor(_dcp_files, DCP_TOLERANCE_BYTES, needs_folder=True),
    "torchsnapshot": EnginePredictor(_torchsnapshot_files, TORCHSNAPSHOT_TOLERANCE_BYTES),
}
"""The engines whose files are predicted (``predict``), by name."""

NOT_PREDICTED: dict[str, str] = {
    "decoupled": "DeepSpeed's decoupled writer fails as shipped with ZeRO-1 in a PipelineEngine (its writer processes "
                 "refuse the non-leaf fp32 partitions: 'Cowardly refusing to serialize non-leaf tensor'), so no "
                 "checkpoint of it exists to hold a prediction to; were it fixed, it would write DeepSpeed's files "
                 "(see --engine torch)",
    "datastates": "DeepSpeed's DataStates-LLM engine needs the datastates package, which is not on PyPI and is not "
                  "installed here (built from https://github.com/DataStates/datastates-llm with CMake, nanobind and "
                  "CUDA); its files are not predicted",
}
"""Engines without a prediction, and why."""


class NotPredictedError(ValueError):
    """The engine's files are not predicted (``NOT_PREDICTED`` says why)."""


def predictor(engine: str) -> EnginePredictor:
    if engine in NOT_PREDICTED:
        raise NotPredictedError(f"engine {engine!r}: {NOT_PREDICTED[engine]}")
    try:
        return PREDICTORS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; the plan predicts {', '.join(PREDICTORS)}") from None


def predict(cfg: RunConfig, step: int | None = None, scale: float = 1.0) -> CheckpointPlan:
    """Every file of one checkpoint of ``cfg`` (its engine's files) with its writing rank, kind, payload and size."""
    engine = predictor(cfg.engine.engine)
    setup = setup_for(cfg, step, scale)
    with tempfile.TemporaryDirectory(prefix="restartbench-plan-") as scratch, _deepspeed_quiet():
        files = engine.files(setup, scratch)
    return CheckpointPlan(preset=cfg.model.preset, layout=setup.layout.name, dtype=setup.dtype,
                          engine=cfg.engine.engine, tag=setup.tag, world_size=setup.layout.world_size, files=files,
                          root_files=engine.root_files(), scale=scale, tolerance_bytes=engine.tolerance_bytes,
                          note=engine.note)


@contextlib.contextmanager
def _deepspeed_quiet() -> Iterator[None]:
    """DeepSpeed's logger warns when its scheduler is built before training starts (what the plan does): hush it."""
    import logging

    from deepspeed.utils import logger  # imported first: DeepSpeed's import sets its level

    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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
    """Bytes of one checkpoint of ``cfg`` (every rank's files) as its engine writes them: the reference the disk
    check and the analysis use. An engine without a prediction (``NOT_PREDICTED``) is counted as DeepSpeed's default
    engine (whose files it would write through DeepSpeed's save); an emulated run (``--emulate``) at its scale.

    Only what shapes the files is kept (model, layout and ranks, training settings, engine and its options, device,
    and for engines that record it the checkpoint folder), so that runs differing in anything else share one
    prediction, in this process and, through ``PLAN_CACHE``, in later ones."""
    engine = "torch" if cfg.engine.engine in NOT_PREDICTED else cfg.engine.engine
    config: dict[str, Any] = {
        "model": {"preset": cfg.model.preset, "dtype": cfg.model.dtype}, "layout": asdict(cfg.layout),
        "engine": {**asdict(cfg.engine), "engine": engine}, "launch": {"device": cfg.launch.device},
        "train": {name: getattr(cfg.train, name) for name in ("iters", "save_interval", "micro_batch", "grad_accum",
                                                              "lr")}}
    folder = None
    if PREDICTORS.get(engine, PREDICTORS["torch"]).needs_folder:
        config |= {"paths": asdict(cfg.paths), "storage": {"checkpoint_dir": cfg.storage.checkpoint_dir}}
        preset = get_preset(cfg.model.preset)
        ranks = cfg.layout.nnodes * cfg.layout.nproc_per_node if cfg.layout.nproc_per_node else None
        folder = checkpoint_folder(cfg, preset.name, validate_layout(cfg.layout.layout, preset, ranks).name)
    scale = cfg.emulation.emulate_scale if cfg.emulation.emulate else 1.0
    return _cached_bytes(json.dumps({"config": config, "folder": folder, "scale": scale}, sort_keys=True))


PLAN_CACHE = "RESTARTBENCH_PLAN_CACHE"
"""Environment variable: the folder where ``checkpoint_bytes`` keeps its results between processes (default
``$XDG_CACHE_HOME/restartbench/plan``, else ``~/.cache/restartbench/plan``), or ``off``. A result is found again
only for the same configuration, the same versions of torch, DeepSpeed and TorchSnapshot, and the same code
(``_code_digest``): it is the prediction itself, read back instead of computed (computing one imports torch and
DeepSpeed, seconds)."""


@lru_cache(maxsize=256)
def _cached_bytes(key: str) -> int:
    import hashlib

    where = os.environ.get(PLAN_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "restartbench", "plan")
    path = Path(where, hashlib.sha256(f"{_code_digest()}\n{key}".encode()).hexdigest() + ".json")
    if where != "off":
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads(path.read_text())["checkpoint_bytes"])
    recorded = json.loads(key)
    value = predict(RunConfig.from_dict(recorded["config"]), scale=recorded["scale"]).checkpoint_bytes
    if where != "off":
        with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"key": recorded, "checkpoint_bytes": value}))
            os.replace(partial, path)
    return value


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """What a prediction depends on besides its configuration: the versions of torch, DeepSpeed and TorchSnapshot,
    and every source file of this checkout the prediction may read (restartbench, templates, third_party)."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256()
    for package in ("torch", "deepspeed", "torchsnapshot"):
        with contextlib.suppress(PackageNotFoundError):
            digest.update(f"{package}=={version(package)}\n".encode())
    root = Path(__file__).resolve().parent.parent
    for path in sorted([*root.glob("restartbench/**/*.py"), *root.glob("templates/*"),
                        *root.glob("third_party/**/*.py")]):
        digest.update(f"{path.relative_to(root)}\n".encode() + path.read_bytes())
    return digest.hexdigest()


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
             f"- {_tolerance(plan)}"]
    if plan.root_files:
        lines.append("- also at the checkpoint folder's root (rank 0 at every save, not through the engine): "
                     + ", ".join(f"`{n}` {b:,} B" for n, b in plan.root_files.items()))
    lines += ["", "| ranks | files of the first rank (the others: same sizes, their own numbers) | kind "
              "| payload B each | file B each |", "|---|---|---|---:|---:|"]
    for ranks, files in _rank_groups(plan):
        for first, last, count, kind, payload, size in _runs(files):
            name = f"`{first}`" if count == 1 else f"`{first}` … `{Path(last).name}` ({count} files)"
            lines.append(f"| {ranks} | {name} | {kind} | {payload:,} | {size:,} |")
            ranks = ""
    return "\n".join(lines) + "\n"


def _tolerance(plan: CheckpointPlan) -> str:
    if plan.tolerance_bytes == 0:
        return "file sizes: exact (held to real runs byte for byte)"
    return f"file sizes: within {plan.tolerance_bytes} B each of a real run's"


def _rank_groups(plan: CheckpointPlan) -> list[tuple[str, list[PlannedFile]]]:
    groups: dict[tuple, list[int]] = {}
    for rank in range(plan.world_size):
        groups.setdefault(tuple((f.kind, f.payload_bytes, f.bytes) for f in plan.rank_files(rank)), []).append(rank)
    return [(number_ranges(ranks), plan.rank_files(ranks[0])) for ranks in groups.values()]


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
             f"{plan.world_size} ranks", *([plan.note] if plan.note else []), ""]
    for rank in range(plan.world_size if plan.files else 0):
        files = plan.rank_files(rank)
        lines.append(f"rank {rank}: {len(files)} files, {sum(f.bytes for f in files):,} B")
        lines += [f"  {f.path:<60} {f.kind:<9} payload {f.payload_bytes:>16,}  file {f.bytes:>16,}" for f in files]
    kinds = "; ".join(f"{kind}: {v['files']} files, {v['bytes']:,} B" for kind, v in t["by_kind"].items())
    lines += [""] * bool(plan.files) + [
              f"per kind: {kinds or 'no files'}",
              f"checkpoint: {t['checkpoint_bytes']:,} B ({_size(t['checkpoint_bytes'])}) in {t['files']} files; "
              f"payload {t['payload_bytes']:,} B; overhead {t['overhead_bytes']:,} B",
              f"per rank: max {t['per_rank_max_bytes']:,} B (rank {t['per_rank_max_rank']}), "
              f"min {t['per_rank_min_bytes']:,} B", _tolerance(plan)]
    if plan.root_files:
        lines.append("root of the checkpoint folder (rank 0, every save, not through the engine): "
                     + ", ".join(f"{n} {b:,} B" for n, b in plan.root_files.items()))
    return "\n".join(lines) + "\n"


def render_not_predicted(cfg: RunConfig) -> str:
    return f"{cfg.model.preset} {cfg.layout.layout}, engine {cfg.engine.engine}: not predicted: " \
           f"{NOT_PREDICTED[cfg.engine.engine]}\n"


#: docs/plan.md's comparison of engines: one preset and layout.
ENGINE_DOC_CASE = ("70B", "tp8pp4dp2")


def render_all(dtype: str = "bf16", layouts: tuple[str, ...] = DOC_LAYOUTS) -> str:
    """docs/plan.md: DeepSpeed's default engine for every preset x ``layouts``, then every engine for
    ``ENGINE_DOC_CASE``."""
    from restartbench.layout import LayoutError

    command = f"python -m restartbench.plan --all-presets --layouts {','.join(layouts)} --dtype {dtype} > docs/plan.md"
    out = ["# Checkpoint plans", "",
           f"Generated by `{command}` (do not edit by hand). For each preset and "
           f"layout, the files one checkpoint of DeepSpeed's default engine writes ({dtype}, ZeRO-1, tag of the first "
           "save), predicted without running anything: see `restartbench/plan.py` for how each figure is obtained; "
           f"the last section compares the engines on {' '.join(ENGINE_DOC_CASE)}.",
           f"File sizes are torch.save's own, within {SIZE_TOLERANCE_BYTES} B per file of a real run "
           "(`tests/test_predict.py`).", "",
           "| preset | layout | ranks | files | checkpoint | payload | per-rank max | layer | model | optimizer |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    plans, skipped = [], []
    for preset in PRESETS.values():
        for name in layouts:
            try:
                plan = predict(_doc_config(preset.name, name, dtype, "torch"))
            except LayoutError as error:
                skipped.append(f"- {preset.name} {name}: {str(error).splitlines()[-1].strip(' -')}")
                continue
            plans.append(plan)
            t = plan.totals()
            kinds = t["by_kind"]
            out.append(f"| {plan.preset} | {plan.layout} | {plan.world_size} | {t['files']} | "
                       f"{_size(t['checkpoint_bytes'])} | {_size(t['payload_bytes'])} | "
                       f"{_size(t['per_rank_max_bytes'])} | "
                       + " | ".join(_size(kinds[k]["bytes"]) for k in ("layer", "model", "optimizer")) + " |")
    out += ["", "Layouts that do not fit their preset:", "", *skipped, "", "## Files per rank", ""]
    out += [render_markdown(plan) for plan in plans]
    return "\n".join(out) + "\n" + render_engines(*ENGINE_DOC_CASE, dtype)


#: The checkpoint folder of docs/plan.md's plans (DCP pickles its path into ``.metadata``): the same wherever the
#: document is generated.
DOC_CHECKPOINT_DIR = "/checkpoints"


def _doc_config(preset: str, layout: str, dtype: str, engine: str) -> RunConfig:
    cfg = RunConfig()
    cfg.model.preset, cfg.model.dtype, cfg.layout.layout, cfg.engine.engine = preset, dtype, layout, engine
    cfg.storage.checkpoint_dir = DOC_CHECKPOINT_DIR
    return cfg


def render_engines(preset: str, layout: str, dtype: str) -> str:
    """docs/plan.md's last section: one checkpoint of ``preset`` and ``layout`` as each engine writes it."""
    out = [f"## Engines: {preset} {layout}", "",
           f"One checkpoint of {preset} {layout} ({dtype}, tag of the first save) as each engine writes it "
           f"(`python -m restartbench.plan {preset} {layout} --engine NAME --checkpoint-dir {DOC_CHECKPOINT_DIR}`: "
           "DCP pickles the checkpoint folder's path into `.metadata`).", "",
           "| engine | files | checkpoint | payload | per-rank max | files per kind | file sizes |",
           "|---|---:|---:|---:|---:|---|---|"]
    sections = []
    for engine in PREDICTORS:
        plan = predict(_doc_config(preset, layout, dtype, engine))
        t = plan.totals()
        kinds = ", ".join(f"{kind} {v['files']}" for kind, v in t["by_kind"].items()) or "-"
        exact = "exact" if plan.tolerance_bytes == 0 else f"± {plan.tolerance_bytes} B"
        out.append(f"| {engine} | {t['files']} | {_size(t['checkpoint_bytes'])} | {_size(t['payload_bytes'])} | "
                   f"{_size(t['per_rank_max_bytes'])} | {kinds} | {exact} |")
        if plan.files and engine != "torch":  # torch's files are listed above
            sections.append(render_markdown(plan))
    out += ["", "Not predicted:", "", *(f"- {engine}: {why}" for engine, why in NOT_PREDICTED.items()), "", *sections]
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
    cfg = RunConfig.from_dict(nested)
    try:
        plan = predict(cfg, step=step)
    except NotPredictedError:  # the plan's answer, not a mistake: said on stdout
        print(json.dumps({"engine": cfg.engine.engine, "predicted": False, "reason": NOT_PREDICTED[cfg.engine.engine]})
              if as_json else render_not_predicted(cfg), end="\n" if as_json else "")
        return 0
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=1) if as_json else render_text(plan), end="\n" if as_json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Digests of the consolidated training state: every parameter at full shape, by its global name (issue 19).

A per-rank digest (``restartbench.verify``) proves a restore onto the layout that saved: each rank holds again what it
held. A restore onto another layout (other tp, pp or dp) gives every rank other slices, so its proof must be on the
state the layout cuts up: each parameter's fp32 master weights and Adam moments, gathered to the model's full shape,
named as ``restartbench.model.parameter_splits`` names them (``<pipeline layer index>.<name>``, the PipelineModule's
names, which are global across stages), and the step counters and scheduler state. That digest is the same for every
layout that holds the same model.

How a parameter is gathered (``consolidated_digest``, a collective every rank calls):

- over data-parallel ranks: ZeRO-1 gives each one a fragment of the stage's flat fp32 buffer (and of the Adam moments
  kept over it). DeepSpeed's fragment map (``param._hp_mapping``, what ``deepspeed.utils.safe_get_full_fp32_param``
  reads) places this rank's fragment in a zero buffer of the parameter's size, and the buffers are summed onto
  data-parallel rank 0 *as bytes*, so every value arrives bit for bit: a float sum would turn a
  fragment's -0.0 into +0.0. DeepSpeed's own ``safe_get_full_fp32_param`` (a float all-reduce) is not used for that
  reason, and ``safe_get_full_optimizer_state`` cannot be: it reads fragments of the moments that DeepSpeed 0.19.8
  links only at the optimizer's first step, and unlinks at a checkpoint load (``_link_all_hp_params``) without
  linking them again, so it raises before the first step and after a restore, the two moments a proof needs.
- over tensor-parallel ranks: a parameter with a ``tp_dim`` (``TensorParallel.parameter``) is gathered onto tp rank 0
  and concatenated along that dimension, in tp-rank order; a replicated one (the RMSNorm weights) is hashed on every
  tp rank, and copies that differ are reported (``INCONSISTENT``), never one of them chosen.
- over pipeline stages: each stage hashes its own layers; the ranks' entries are exchanged (``all_gather_object``)
  and merged, so every rank returns the whole digest.

Entries: ``params.<name>.fp32``, ``params.<name>.exp_avg``, ``params.<name>.exp_avg_sq`` (``verify.tensor_hash`` of
the full fp32 tensor), ``optimizer.group<i>.step`` and the group's plain hyperparameters (``optimizer.group<i>.lr``,
...), ``global_steps``, ``global_samples`` and ``lr_scheduler.<key>`` (the scheduler's state_dict as
``verify.digest`` records it). A counter every rank holds is merged the same way: equal on every rank, or
``INCONSISTENT``. Before the optimizer's first step Adam has no moments yet: they are digested as zeros (what its
first step starts from), and the group's step as ``None``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from restartbench import rundir
from restartbench.model import TP_DIM
from restartbench.verify import compare as compare_digests
from restartbench.verify import digest, digest_path, tensor_hash
from restartbench.zero import fp32_partitions, zero_optimizer

KINDS = ("fp32", "exp_avg", "exp_avg_sq")
"""What is digested of every parameter: the fp32 master weights and Adam's two moments, each at full shape."""
PARAMS = "params"
INCONSISTENT = "inconsistent across ranks"
"""The start of an entry whose copies on several ranks differ (a replicated parameter, a step counter)."""
CONSOLIDATED_FILE = "consolidated.json"


def param_key(name: str, kind: str) -> str:
    """The digest entry of one parameter's state of one kind: ``params.1.q.exp_avg``."""
    return f"{PARAMS}.{name}.{kind}"


# -- the optimizer's pieces ------------------------------------------------------------------


def _source(zero: Any, flat: torch.Tensor, kind: str) -> torch.Tensor | None:
    """The flat partition's tensor of ``kind``: the fp32 masters themselves, or Adam's moment over them (None before
    the optimizer's first step)."""
    return flat if kind == "fp32" else zero.optimizer.state.get(flat, {}).get(kind)


# -- gathering one parameter ------------------------------------------------------------------


def _sum_bits_onto(buffer: torch.Tensor, group: Any, dst: int) -> None:
    """Sum ``buffer`` over ``group`` onto global rank ``dst`` byte by byte (uint8, which gloo and NCCL both sum):
    where one rank holds a value and the others zeros, the sum is that value's bytes exactly (a float sum would lose
    a -0.0)."""
    if dist.get_world_size(group) > 1:
        dist.reduce(buffer.view(torch.uint8), dst=dst, group=group)


def _full_over_dp(param: torch.nn.Parameter, kind: str, zero: Any, flats: list[torch.Tensor]) -> torch.Tensor:
    """This tp rank's shard of ``param``'s state ``kind`` at its whole shape (fp32), complete on the data-parallel
    group's first rank; the other ranks return their partial buffer."""
    mapping = getattr(param, "_hp_mapping", False)
    if mapping is False or not hasattr(param, "_dp_group"):
        raise TypeError(f"parameter of shape {tuple(param.shape)} has no ZeRO fragment map (_hp_mapping): the "
                        "consolidated digest needs DeepSpeed's ZeRO stage 1/2 optimizer")
    buffer = torch.zeros(param.numel(), dtype=flats[0].dtype, device=param.device)
    if mapping is not None:  # this data-parallel rank holds a fragment of the parameter
        source = _source(zero, flats[mapping.param_group_index], kind)
        if source is not None:
            hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
            buffer.narrow(0, lp.start, lp.numel).copy_(source.narrow(0, hp.start, hp.numel))
    _sum_bits_onto(buffer, param._dp_group, dist.get_global_rank(param._dp_group, 0))
    return buffer.view(param.shape)


def _full_over_tp(shard: torch.Tensor, dim: int, grid: Any, owner: bool) -> torch.Tensor | None:
    """The tp ranks' shards (each complete on its data-parallel rank 0, the ranks calling this) gathered onto tp rank 0
    (``owner``) and concatenated along ``dim`` in tp-rank order; None on the other tp ranks."""
    group = grid.get_slice_parallel_group()
    size = grid.get_slice_parallel_world_size()
    if size == 1:
        return shard
    parts = [torch.empty_like(shard) for _ in range(size)] if owner else None
    dist.gather(shard.contiguous(), parts, dst=dist.get_global_rank(group, 0), group=group)
    return torch.cat(parts, dim=dim) if owner else None


def _param_entries(ds_engine: Any) -> Iterator[tuple[str, str]]:
    """(key, hash) of every parameter state this rank hashes: a tensor-parallel parameter on tp rank 0 of data-
    parallel rank 0, a replicated one on every tp rank of data-parallel rank 0. A collective over the stage."""
    zero = zero_optimizer(ds_engine)
    flats = fp32_partitions(zero)
    grid = ds_engine.grid
    dp_rank = grid.get_data_parallel_rank()
    dp_first, tp_first = dp_rank == 0, grid.get_slice_parallel_rank() == 0
    for name, param in ds_engine.module.named_parameters():
        if hasattr(param, "_dp_group") and dist.get_rank(group=param._dp_group) != dp_rank:
            # the fragments are summed onto the ZeRO group's first rank, and the tp groups gather from the grid's
            raise RuntimeError(f"{name}: ZeRO's data-parallel group does not number the ranks as the grid does")
        dim = getattr(param, TP_DIM, None)
        for kind in KINDS:
            shard = _full_over_dp(param, kind, zero, flats)
            if dim is None:
                if dp_first:
                    yield param_key(name, kind), tensor_hash(shard)
            elif dp_first:  # only data-parallel rank 0 holds the whole shard; its tp group gathers them
                full = _full_over_tp(shard, dim, grid, owner=tp_first)
                if tp_first:
                    yield param_key(name, kind), tensor_hash(full)


def _counter_entries(ds_engine: Any) -> dict[str, str]:
    """Step counters and scheduler state, as every rank holds them."""
    zero = zero_optimizer(ds_engine)
    entries = {"global_steps": repr(ds_engine.global_steps), "global_samples": repr(ds_engine.global_samples)}
    for index, (group, flat) in enumerate(zip(zero.optimizer.param_groups, fp32_partitions(zero))):
        step = zero.optimizer.state.get(flat, {}).get("step")
        entries[f"optimizer.group{index}.step"] = repr(float(step) if isinstance(step, torch.Tensor) else step)
        hyper = {key: value for key, value in group.items() if key != "params"}
        entries.update(digest(hyper, f"optimizer.group{index}"))
    if ds_engine.lr_scheduler is not None:
        entries.update(digest(ds_engine.lr_scheduler.state_dict(), "lr_scheduler"))
    return entries


def _merge(parts: list[dict[str, str]]) -> dict[str, str]:
    """One entry per key from every rank's entries: the value where the ranks holding the key agree, else a line
    naming each value and the ranks that hold it."""
    held: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank, part in enumerate(parts):
        for key, value in part.items():
            held[key][value].append(rank)
    merged = {}
    for key in sorted(held):
        values = held[key]
        if len(values) == 1:
            merged[key] = next(iter(values))
        else:
            merged[key] = f"{INCONSISTENT}: " + "; ".join(f"{value} on ranks {ranks}"
                                                          for value, ranks in values.items())
    return merged


def consolidated_digest(ds_engine: Any) -> dict[str, str]:
    """The digest of the engine's training state at full shape, independent of the parallel layout; a collective:
    every rank of the job calls it, and every rank returns the whole digest (see the module's docstring)."""
    entries = dict(_param_entries(ds_engine))
    entries.update(_counter_entries(ds_engine))
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, entries)
    return _merge(parts)


# -- records in the run folder -------------------------------------------------------------------------------------


def consolidated_path(run_dir: Path, name: str) -> Path:
    """``digests/<name>/consolidated.json``, beside the per-rank digests of the same tag (``verify.digest_path``)."""
    return digest_path(run_dir, name, 0).with_name(CONSOLIDATED_FILE)


def write_consolidated(run_dir: Path, name: str, value: dict[str, str]) -> Path:
    """Record a consolidated digest (one writer, rank 0: every rank holds the same); atomic."""
    path = consolidated_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(path, dict(sorted(value.items())))
    return path


def read_consolidated(run_dir: Path, name: str) -> dict[str, str]:
    path = consolidated_path(run_dir, name)
    if not path.exists():
        raise FileNotFoundError(f"no consolidated digest {name!r} recorded ({path}); was phase 1 run with --verify?")
    return rundir.read_json(path)


def compare(saved: dict[str, str], restored: dict[str, str], limit: int = 10) -> list[str]:
    """``verify.compare`` of two consolidated digests, each line saying it is about the consolidated state."""
    return [f"consolidated state: {line}" for line in compare_digests(saved, restored, limit)]

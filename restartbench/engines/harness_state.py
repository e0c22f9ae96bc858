"""The training state that engines outside DeepSpeed (DCP, TorchSnapshot) capture and restore themselves.

These engines never call ``save_checkpoint``: they take from the DeepSpeed engine what its own
checkpoint holds for ZeRO stage 1 and give it back in place. One rank's state is one nested
structure of tensors and plain values::

    module        the module's state_dict: this rank's pipeline stage and tensor-parallel shard
    optimizer
      fp32_partitions   ZeRO's fp32 master weights, this data-parallel rank's partition per group
      base              the wrapped torch optimizer's state_dict (Adam moments, step, param groups, lr)
      loss_scaler       the loss scaler's numeric attributes (its scale, for fp16)
      overflow          ZeRO's overflow flag of the last step
    lr_scheduler  the scheduler's state_dict (None without a scheduler)
    counters      global_steps, global_samples, skipped_steps (what DeepSpeed's load restores)

``capture`` returns the live tensors, detached, not copies: a synchronous engine writes them
before training continues; an asynchronous one must stage a copy first (DCP's ``async_save``
does). ``restore`` copies into the tensors DeepSpeed already holds (the module parameters are
views into ZeRO's flat buffers, the fp32 partitions are the torch optimizer's parameters), so
nothing DeepSpeed refers to is replaced.

The lazy engine (``restartbench.engines.lazy.capture``) takes the parts every engine here reads alike from this
module, ``module_tensors`` and ``counters``, and keeps its own optimizer and scheduler capture, which its file
format and restore depend on: it saves DeepSpeed's whole optimizer ``state_dict`` (its plain entries, such as
``partition_count`` and ``zero_stage``, compared or set back one by one on restore; its tensors read in place),
where ``capture`` here takes the fp32 partitions, the torch optimizer's ``state_dict`` (given back through
``load_state_dict``) and the loss scaler's numbers; and a missing scheduler is ``{}`` in its files, ``None`` here.

``split``/``join`` turn the nested state into a skeleton of plain values plus a flat
{key: tensor} map and back, for engines that want tensors as top-level entries.
The file helpers at the end are what these engines share for ``written()`` and ``read()``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from restartbench.engines.base import FileRecord
from restartbench.zero import fp32_partitions, zero_optimizer

COUNTERS = ("global_steps", "global_samples", "skipped_steps")
"""The DeepSpeed engine's step counters: what its own ``load_checkpoint`` sets back."""
TENSOR_SLOT = "__tensor__"
"""Key of the one-entry dict that stands for a tensor in a skeleton."""


# -- capture and restore ---------------------------------------------------------------------


def capture(ds_engine: Any) -> dict[str, Any]:
    """This rank's training state: live tensors, detached (no copy), and plain values."""
    zero = zero_optimizer(ds_engine)
    scheduler = ds_engine.lr_scheduler
    return {
        "module": module_tensors(ds_engine),
        "optimizer": {
            "fp32_partitions": [t.detach() for t in fp32_partitions(zero)],
            "base": zero.optimizer.state_dict(),
            "loss_scaler": _numeric_attributes(getattr(zero, "loss_scaler", None)),
            "overflow": bool(getattr(zero, "overflow", False)),
        },
        "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
        "counters": counters(ds_engine),
    }


def module_tensors(ds_engine: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The module's state_dict as its live tensors, detached (no copy), each name after ``prefix``."""
    return {f"{prefix}{name}": t.detach() for name, t in ds_engine.module.state_dict().items()}


def counters(ds_engine: Any, missing_ok: bool = False) -> dict[str, Any]:
    """The step counters: all of them (AttributeError for one missing: ``restore`` sets all three back), or with
    ``missing_ok`` those the engine has (the lazy engine records what it found, and its restore sets back exactly
    what it recorded)."""
    return {name: getattr(ds_engine, name) for name in COUNTERS if not missing_ok or hasattr(ds_engine, name)}


@torch.no_grad()
def restore(ds_engine: Any, state: dict[str, Any]) -> None:
    """Put ``state`` (as ``capture`` made it) back into the engine, copying into the tensors it holds."""
    copy_tensors(dict(ds_engine.module.state_dict()), state["module"], "module")
    zero = zero_optimizer(ds_engine)
    live = fp32_partitions(zero)
    saved = state["optimizer"]["fp32_partitions"]
    copy_tensors({str(i): t for i, t in enumerate(live)}, {str(i): t for i, t in enumerate(saved)},
                 "optimizer fp32 partition")
    zero.optimizer.load_state_dict(state["optimizer"]["base"])
    for name, value in state["optimizer"]["loss_scaler"].items():
        setattr(zero.loss_scaler, name, value)
    if hasattr(zero, "overflow"):
        zero.overflow = state["optimizer"]["overflow"]
    if ds_engine.lr_scheduler is not None:
        ds_engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    for name in COUNTERS:
        setattr(ds_engine, name, state["counters"][name])


def copy_tensors(live: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], what: str) -> None:
    """Copy each saved tensor into the live one of the same name; names, shapes and dtypes must match.

    A saved tensor that already is the live one (an engine that read straight into it) is left alone."""
    if live.keys() != saved.keys():
        missing, extra = sorted(live.keys() - saved.keys()), sorted(saved.keys() - live.keys())
        raise ValueError(f"{what}: the checkpoint does not match this model: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}; restore with the preset and layout it was saved with")
    for name, target in live.items():
        source = saved[name]
        if source.shape != target.shape or source.dtype != target.dtype:
            raise ValueError(f"{what} {name}: checkpoint has {source.dtype}{tuple(source.shape)}, the model "
                             f"{target.dtype}{tuple(target.shape)}; restore with the preset, layout and dtype it was "
                             "saved with")
        if not _same_view(source, target):
            target.copy_(source)


def coordinates(ds_engine: Any) -> tuple[int, int, int]:
    """(pipeline stage, tensor-parallel rank, data-parallel rank) of this rank."""
    grid = ds_engine.grid
    return grid.get_pipe_parallel_rank(), grid.get_slice_parallel_rank(), grid.get_data_parallel_rank()


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape


def _numeric_attributes(obj: Any) -> dict[str, int | float | bool]:
    if obj is None:
        return {}
    return {name: value for name, value in vars(obj).items() if type(value) in (int, float, bool)}


# -- skeleton + flat tensors -------------------------------------------------------------------


def split(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(skeleton, tensors): the skeleton is ``state`` with each tensor replaced by ``{TENSOR_SLOT: key}``,
    the key being its path ('optimizer/base/state/0/exp_avg'); ``join`` reverses it."""
    tensors: dict[str, torch.Tensor] = {}

    def visit(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            if path in tensors:
                raise ValueError(f"two tensors map to the key {path!r}: dict keys must stay distinct as strings")
            tensors[path] = obj
            return {TENSOR_SLOT: path}
        if isinstance(obj, dict):
            return type(obj)((key, visit(value, f"{path}/{key}" if path else str(key))) for key, value in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(visit(value, f"{path}/{i}" if path else str(i)) for i, value in enumerate(obj))
        return obj

    return visit(state, ""), tensors


def join(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The nested state ``split`` took apart, with the given tensors in their slots."""
    if isinstance(skeleton, dict):
        if skeleton.keys() == {TENSOR_SLOT}:
            key = skeleton[TENSOR_SLOT]
            if key not in tensors:
                raise KeyError(f"tensor {key!r} of the checkpoint's skeleton was not loaded")
            return tensors[key]
        return type(skeleton)((key, join(value, tensors)) for key, value in skeleton.items())
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(join(value, tensors) for value in skeleton)
    return skeleton


# -- files written and read -----------------------------------------------------------------------


def files_under(folder: str) -> list[str]:
    """Every regular file below ``folder`` (recursively), sorted."""
    return sorted(os.path.join(root, name) for root, _dirs, names in os.walk(folder) for name in names)


def records(sizes: dict[str, int], seconds: float) -> list[FileRecord]:
    """File records for files an engine wrote or read in one call of ``seconds``.

    Such an engine does not time files one by one, so each file gets the call's time in
    proportion to its bytes: sums over files are the engine's time, as for DeepSpeed's engines."""
    total = sum(sizes.values())

    def share(size: int) -> float:
        return seconds * size / total if total else seconds / len(sizes)

    return [FileRecord(path, size, share(size)) for path, size in sorted(sizes.items())]

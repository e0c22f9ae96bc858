"""The lazy engine's restore: the header checks, the plain state set back on the live objects, where each saved
tensor goes, and the parallel reads into those tensors.

Optimizer tensors are read into the tensors the optimizer holds, or into tensors created where torch.optim would
create them in a fresh process. Reads are ``os.preadv`` scatter reads, straight into CPU tensors and through the
host buffer for device tensors; with ``--lazy-direct-io``, O_DIRECT reads of each whole data region into the host
buffer, each tensor copied out as soon as its bytes are in (``read_into_direct``). With ``dp_read_once`` the
module file is read by data-parallel rank 0 only and broadcast to its replicas (``broadcast_tensors``). After a
prefetch (``prefetch.py``: the same region reads, ``read_regions``, before the load) the tensors are copied out of
the host buffer (``copy_out``).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from restartbench.engines.base import FileRecord
from restartbench.engines.lazy.copies import PAGE, HostBuffer, byte_view, pieces
from restartbench.engines.lazy.flush import open_direct
from restartbench.engines.lazy.format import (
    ENTRY_ALIGN,
    FILE_ALIGN,
    LazyFormatError,
    LazyRestoreError,
    ObjectState,
    Opaque,
    TensorRef,
    TensorSpec,
    align_up,
    child_path,
    decode_value,
    fits,
    read_header,
    torch_dtype,
)

# -- the files' headers -------------------------------------------------------------------------------------


def checked_header(path: Path, tag: str) -> tuple[dict[str, Any], int]:
    """The header of a file the restore needs, named in words when the checkpoint lacks it."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {tag} has no {path.name} ({path}): was it written by --engine lazy "
                                "with the same parallel layout?")
    return read_header(path)


def check_same_names(path: Path, saved: list[dict[str, Any]], live: dict[str, torch.Tensor]) -> None:
    """The module file holds exactly the tensors of the model built here."""
    names = {t["name"] for t in saved}
    missing, extra = sorted(set(live) - names), sorted(names - set(live))
    if missing or extra:
        raise LazyRestoreError(f"{path}: module state differs from the model built here: not in the file "
                               f"{missing[:5]}, not in the model {extra[:5]} (a different preset or layout?)")


# -- restore of plain state, and where each tensor goes -------------------------------------------------------


def restore_plain_and_targets(ds_engine: Any, values: dict[str, Any], tensors: list[dict[str, Any]]
                              ) -> dict[str, torch.Tensor]:
    """Set the plain optimizer, scheduler and counter state saved in ``values`` on the live objects, and
    return the live tensor each saved optimizer tensor is to be read into (created where a fresh optimizer
    has no state yet, as torch.optim would create it)."""
    specs = {t["name"]: TensorSpec(t["name"], t["dtype"], tuple(t["shape"]), t["device"]) for t in tensors}
    targets: dict[str, torch.Tensor] = {}
    if ds_engine.optimizer is not None:
        _restore_optimizer(ds_engine.optimizer, values["optimizer"], specs, targets)
    if ds_engine.lr_scheduler is not None:
        ds_engine.lr_scheduler.load_state_dict(decode_value(values["lr_scheduler"]))
    for key, value in values["engine"].items():
        setattr(ds_engine, key, value)
    missing = sorted(set(specs) - set(targets))
    if missing:
        raise LazyRestoreError(f"saved optimizer tensors with no place in this optimizer: {missing[:5]}")
    return targets


def _restore_optimizer(optimizer: Any, saved: dict[str, Any], specs: dict[str, TensorSpec],
                       targets: dict[str, torch.Tensor]) -> None:
    """A DeepSpeed ZeRO/BF16 optimizer wraps a torch optimizer whose state_dict is its ``base_optimizer_state``;
    a bare torch optimizer is its own."""
    saved = decode_value(saved)
    wrapped = "base_optimizer_state" in saved
    inner = optimizer.optimizer if wrapped else optimizer
    base = saved["base_optimizer_state"] if wrapped else saved
    if not isinstance(base, dict) or "param_groups" not in base:
        raise LazyRestoreError("the saved optimizer state is not a torch optimizer state_dict (DeepSpeed's "
                               "elastic_checkpoint layout?); the lazy engine restores only rigid ZeRO checkpoints")
    _restore_torch_optimizer(inner, base, specs, targets)
    if wrapped:
        live = optimizer.state_dict()
        for key, value in saved.items():
            if key != "base_optimizer_state":
                _restore_entry(optimizer, key, value, live.get(key, _MISSING), f"optimizer.{key}", specs, targets)


def _restore_torch_optimizer(inner: torch.optim.Optimizer, saved: dict[str, Any],
                             specs: dict[str, TensorSpec], targets: dict[str, torch.Tensor]) -> None:
    """Hyperparameters of each group (lr included: the scheduler set it) and each parameter's state, in place."""
    params = _restore_param_groups(inner, saved)
    for index, state in saved["state"].items():
        live = inner.state[params[index]]
        for key, value in state.items():
            if isinstance(value, TensorRef):
                live[key] = _target(live.get(key), specs[value.name], params[index])
                targets[value.name] = live[key]
            else:
                live[key] = value


def _target(live: Any, spec: TensorSpec, param: torch.Tensor) -> torch.Tensor:
    """The live tensor if it fits the saved one, else a new one where torch.optim keeps it (the parameter's
    device, or the CPU for state saved from the CPU such as Adam's step)."""
    if fits(live, spec):
        return live
    device = param.device if spec.device != "cpu" else torch.device("cpu")
    return torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device)


def _restore_param_groups(inner: torch.optim.Optimizer, saved: dict[str, Any]) -> list[torch.Tensor]:
    """Each group's hyperparameters (lr included: the scheduler set it), in place; the optimizer's parameters in
    state_dict order."""
    if len(saved["param_groups"]) != len(inner.param_groups):
        raise LazyRestoreError(f"{len(saved['param_groups'])} optimizer parameter groups saved, "
                               f"{len(inner.param_groups)} here")
    for group, saved_group in zip(inner.param_groups, saved["param_groups"]):
        if len(saved_group["params"]) != len(group["params"]):
            raise LazyRestoreError(f"a parameter group of {len(saved_group['params'])} parameters was saved, "
                                   f"this optimizer's has {len(group['params'])} (a different layout?)")
        group.update({k: v for k, v in saved_group.items() if k != "params"})
    return [p for group in inner.param_groups for p in group["params"]]


LAYOUT_KEYS = ("single_partition_of_fp32_groups", "group_paddings", "param_alignment_paddings", "partition_count",
               "param_slice_mappings")
"""Entries of a DeepSpeed ZeRO optimizer's state_dict that follow from the parallel layout (the fp32 partition, its
padding, the data-parallel size, each parameter's fragment of the partition): a load in another layout keeps the
live ones and fills the partition element by element (restartbench.engines.lazy.reshard)."""


def restore_plain(ds_engine: Any, values: dict[str, Any]) -> None:
    """The plain state of an optimizer file, set on a live engine of another parallel layout: each parameter
    group's hyperparameters, the wrapped torch optimizer's plain per-parameter state, DeepSpeed's flags and loss
    scaler (compared or set as a same-layout restore does), the scheduler and the step counters. Tensors and
    ``LAYOUT_KEYS`` are left to the reshard; a saved tensor anywhere else has no rule and is refused."""
    optimizer = ds_engine.optimizer
    if optimizer is not None:
        saved = decode_value(values["optimizer"])
        if "base_optimizer_state" not in saved or not hasattr(optimizer, "optimizer"):
            raise LazyRestoreError("a load in another layout restores DeepSpeed ZeRO optimizer states only (the "
                                   "saved or the live optimizer is not one)")
        inner = optimizer.optimizer
        params = _restore_param_groups(inner, saved["base_optimizer_state"])
        for index, state in saved["base_optimizer_state"]["state"].items():
            live = inner.state[params[index]]
            live.update({key: value for key, value in state.items() if not isinstance(value, TensorRef)})
        current = optimizer.state_dict()
        for key, value in saved.items():
            if key != "base_optimizer_state" and key not in LAYOUT_KEYS:
                _restore_entry(optimizer, key, value, current.get(key, _MISSING), f"optimizer.{key}", {}, {})
    if ds_engine.lr_scheduler is not None:
        ds_engine.lr_scheduler.load_state_dict(decode_value(values["lr_scheduler"]))
    for key, value in values["engine"].items():
        setattr(ds_engine, key, value)


_MISSING = object()


def _restore_entry(owner: Any, key: str, saved: Any, live: Any, name: str,
                   specs: dict[str, TensorSpec], targets: dict[str, torch.Tensor]) -> None:
    """A top-level entry of a DeepSpeed optimizer's state_dict: tensors (views of the live ones) are read into,
    plain values set as attributes, objects (the loss scaler) updated attribute by attribute, the rest compared."""
    for sub_name, sub_saved, sub_live in _leaves(name, saved, live):
        if isinstance(sub_saved, TensorRef):
            if sub_saved.name not in specs:
                raise LazyRestoreError(f"{sub_name}: a saved tensor this restore has no place for")
            spec = specs[sub_saved.name]
            if not fits(sub_live, spec):
                raise LazyRestoreError(f"{sub_name}: saved {spec}, this optimizer holds {_describe(sub_live)}")
            targets[spec.name] = sub_live
        elif isinstance(sub_saved, ObjectState):
            for attr, value in sub_saved.attrs.items():
                setattr(sub_live, attr, value)
        elif isinstance(sub_saved, Opaque):
            if repr(sub_live) != sub_saved.repr:
                raise LazyRestoreError(f"{sub_name}: saved {sub_saved.repr}, here {sub_live!r} (a different layout?)")
        elif _plain_differs(sub_saved, sub_live):
            if sub_name != name or not hasattr(owner, key):
                raise LazyRestoreError(f"{sub_name}: saved {sub_saved!r}, here {_describe(sub_live)} "
                                       "(a different parallel layout or configuration?)")
            setattr(owner, key, sub_saved)


def _leaves(name: str, saved: Any, live: Any) -> Iterator[tuple[str, Any, Any]]:
    """(path, saved leaf, live leaf at the same path) through the containers decode_value returns."""
    if isinstance(saved, dict):
        for key, value in saved.items():
            inner = live.get(key, _MISSING) if isinstance(live, dict) else _MISSING
            yield from _leaves(child_path(name, key), value, inner)
    elif isinstance(saved, (list, tuple)):
        for index, value in enumerate(saved):
            inner = live[index] if isinstance(live, (list, tuple)) and index < len(live) else _MISSING
            yield from _leaves(f"{name}[{index}]", value, inner)
    else:
        yield name, saved, live


def _plain_differs(saved: Any, live: Any) -> bool:
    return type(saved) is not type(live) or repr(saved) != repr(live)


def _describe(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return repr(value)


# -- parallel reads -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where one saved tensor goes: its bytes at ``offset`` in the file, into ``target`` (through the staging
    buffer at ``staged`` when the target is not in host memory)."""
    offset: int
    nbytes: int
    target: torch.Tensor
    staged: int | None

    def host_bytes(self, buffer: torch.Tensor | None) -> torch.Tensor:
        return byte_view(self.target) if self.staged is None else buffer[self.staged:self.staged + self.nbytes]


def read_into(jobs: list[tuple[Path, int, dict[str, Any], dict[str, torch.Tensor]]], io_threads: int, chunk: int,
              staging: HostBuffer) -> list[FileRecord]:
    """Read every file's tensors into their targets with parallel scatter reads (``os.preadv``), each of about
    ``chunk`` bytes: straight into CPU tensors; device tensors are read into a host staging buffer and copied to
    the device by the same reader thread right after its read, so copies overlap the other threads' reads.
    The staging buffer is the engine's host buffer: pinned where ``prepare`` pinned it for the saves, else pageable
    (pinning it only for one load would cost more than the copies gain). A pinned buffer too small for the load (a
    data-parallel replica reads the module file it did not save) grows pinned: a pageable one in its place would
    make the load's copies pageable and the next save pin again, inside its stall."""
    files, staged_bytes = [], 0
    for path, data_offset, header, targets in jobs:
        places = []
        for entry, target in _checked_targets(path, header, targets):
            staged = None if target.device.type == "cpu" else staged_bytes
            places.append(Place(data_offset + entry["offset"], entry["nbytes"], target, staged))
            staged_bytes += 0 if staged is None else align_up(entry["nbytes"], ENTRY_ALIGN)
        files.append((path, places))
    buffer = staging.get(staged_bytes, pinned=staging.pinned) if staged_bytes else None
    with ThreadPoolExecutor(io_threads, thread_name_prefix="lazy-read") as pool:
        records = [_read_file(path, places, buffer, chunk, pool) for path, places in files]
    if staged_bytes:
        torch.cuda.synchronize()
    return records


def _checked_targets(path: Path, header: dict[str, Any], targets: dict[str, torch.Tensor]
                     ) -> Iterator[tuple[dict[str, Any], torch.Tensor]]:
    """Each saved tensor's header entry and the live tensor it is read into, refused where the two differ."""
    for entry in header["tensors"]:
        target = targets[entry["name"]]
        spec = TensorSpec(entry["name"], entry["dtype"], tuple(entry["shape"]), entry["device"])
        if not fits(target, spec) or not target.is_contiguous():
            raise LazyRestoreError(f"{path}: {spec.name} saved as {spec}, the live tensor is {_describe(target)}")
        yield entry, target


Region = tuple[Path, int, int, int, list[Place]]
"""One file's data region to read into the host buffer: the file, the region's offset in it, its bytes, where it
starts in the buffer, and the tensors it fills (``Place.offset`` in the region, ``Place.staged`` in the buffer)."""


def read_into_direct(jobs: list[tuple[Path, int, dict[str, Any], dict[str, torch.Tensor]]], io_threads: int,
                     chunk: int, staging: HostBuffer) -> list[FileRecord]:
    """``read_into`` with O_DIRECT (``--lazy-direct-io``): each file's whole data region is read past the page cache
    into the host buffer, laid out there as in the file, in ``chunk``-sized pieces with ``io_threads`` reads in
    flight; each tensor is copied from the buffer into its target (a device or a CPU tensor) by the reader thread
    that completes the last piece covering it, so the copies overlap the other reads. O_DIRECT needs the region
    (FILE_ALIGN-aligned and padded by the format), the pieces (whole MiB) and the buffer (page-aligned: pinned, or
    the engine's mapping under this option) aligned; the alignment padding between tensors is read too. A pinned
    buffer too small for the load (a data-parallel replica that saved only its partition reads the module file
    too) is replaced by a pinned one, page-aligned as the reads need: on CUDA, where O_DIRECT is the default, the
    engine's pageable buffers are not."""
    bases, total = region_bases([header for _, _, header, _ in jobs])
    regions = []
    for (path, data_offset, header, targets), base in zip(jobs, bases, strict=True):
        places = [Place(entry["offset"], entry["nbytes"], target, base + entry["offset"])
                  for entry, target in _checked_targets(path, header, targets)]
        regions.append(region_of(path, data_offset, header, base, places, direct=True))
    buffer = staging.get(total, pinned=staging.pinned)
    records = read_regions(regions, buffer, chunk, io_threads, direct=True)
    if any(place.target.device.type != "cpu" for *_, places in regions for place in places):
        torch.cuda.synchronize()
    return records


def region_bases(headers: list[dict[str, Any]]) -> tuple[list[int], int]:
    """Where each file's data region starts in the host buffer, the regions laid out one after the other in the
    files' order, and the bytes they take together."""
    ends = list(itertools.accumulate(header["data_bytes"] for header in headers))
    return [0, *ends[:-1]], ends[-1] if ends else 0


def region_of(path: Path, data_offset: int, header: dict[str, Any], base: int, places: list[Place],
              direct: bool) -> Region:
    """``path``'s data region at ``base`` in the buffer, refused for O_DIRECT (``direct``) when not aligned."""
    if direct and (data_offset % FILE_ALIGN or header["data_bytes"] % FILE_ALIGN):
        raise LazyFormatError(f"{path}: data region at {data_offset}, {header['data_bytes']} bytes: not "
                              f"{FILE_ALIGN}-aligned, so it cannot be read with O_DIRECT")
    return path, data_offset, header["data_bytes"], base, places


def read_regions(regions: list[Region], buffer: torch.Tensor, chunk: int, io_threads: int,
                 direct: bool) -> list[FileRecord]:
    """Read each region into ``buffer`` in ``chunk``-sized pieces, ``io_threads`` in flight, with O_DIRECT
    (``direct``: the buffer must be page-aligned) or through the page cache; each tensor of a region's places is
    copied out once its last piece is in."""
    if direct and buffer.data_ptr() % PAGE:
        raise LazyRestoreError("the host buffer is not page-aligned, as O_DIRECT reads need (an engine made "
                               "without --lazy-direct-io?)")
    with ThreadPoolExecutor(io_threads, thread_name_prefix="lazy-read") as pool:
        return [_read_region(region, buffer, chunk, pool, direct) for region in regions]


def copy_out(jobs: list[tuple[Path, int, dict[str, Any], dict[str, torch.Tensor]]], bases: list[int],
             buffer: torch.Tensor) -> None:
    """Copy each file's tensors into their targets from its data region, read into ``buffer`` at its base
    (``bases``, one per job) before the load: a device target from pinned memory without blocking, waited for at
    the end."""
    device = False
    for (path, _, header, targets), base in zip(jobs, bases, strict=True):
        for entry, target in _checked_targets(path, header, targets):
            byte_view(target).copy_(buffer[base + entry["offset"]:base + entry["offset"] + entry["nbytes"]],
                                    non_blocking=target.device.type != "cpu")
            device = device or target.device.type != "cpu"
    if device:
        torch.cuda.synchronize()


def _read_region(region: Region, buffer: torch.Tensor, chunk: int, pool: ThreadPoolExecutor,
                 direct: bool) -> FileRecord:
    """One file's data region, its pieces read in parallel; a tensor is copied out once its last piece is in
    (``Place.offset`` is in the region here, ``Place.staged`` in the buffer)."""
    path, data_offset, data_bytes, base, places = region
    start = time.perf_counter()
    spans = list(pieces(data_bytes, chunk)) if data_bytes else []
    covering: dict[int, list[Place]] = {}  # piece -> the tensors it holds bytes of
    waiting: dict[int, int] = {}  # id(tensor's place) -> pieces of it not read yet
    for place in (place for place in places if place.nbytes):
        indices = range(place.offset // chunk, (place.offset + place.nbytes - 1) // chunk + 1)
        waiting[id(place)] = len(indices)
        for index in indices:
            covering.setdefault(index, []).append(place)
    lock = threading.Lock()

    def read_piece(index: int) -> int:
        lo, hi = spans[index]
        preadv_all(fd, [memoryview(buffer[base + lo:base + hi].numpy())], data_offset + lo)
        with lock:
            ready = [place for place in covering.get(index, []) if _count_down(waiting, place)]
        for place in ready:
            byte_view(place.target).copy_(place.host_bytes(buffer))
        return hi - lo

    fd = open_direct(path, os.O_RDONLY) if direct else os.open(path, os.O_RDONLY)
    return _run_reads(path, fd, start, pool, [functools.partial(read_piece, index) for index in range(len(spans))])


def _count_down(waiting: dict[int, int], place: Place) -> bool:
    """One more piece of ``place`` is in the buffer: whether it was the last (under the caller's lock)."""
    waiting[id(place)] -= 1
    return waiting[id(place)] == 0


def _read_file(path: Path, places: list[Place], buffer: torch.Tensor | None, chunk: int,
               pool: ThreadPoolExecutor) -> FileRecord:
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    return _run_reads(path, fd, start, pool,
                      [functools.partial(_read_batch, fd, batch, buffer) for batch in _batches(places, chunk)])


def _run_reads(path: Path, fd: int, start: float, pool: ThreadPoolExecutor, reads: list[Callable[[], int]]
               ) -> FileRecord:
    """Run a file's ``reads`` (each returns the bytes it read) on ``pool``, then close ``fd`` once none is left
    running, whatever happened; the file's record, timed from ``start``."""
    futures = []
    try:
        futures = [pool.submit(read) for read in reads]
        total = sum(future.result() for future in futures)
    finally:
        for future in futures:  # none may be left reading from a closed descriptor
            future.exception()
        os.close(fd)
    return FileRecord(str(path), total, time.perf_counter() - start)


def _batches(places: list[Place], chunk: int) -> Iterator[list[Place]]:
    """Consecutive tensors grouped into reads of about ``chunk`` bytes."""
    batch: list[Place] = []
    for place in sorted(places, key=lambda p: p.offset):
        if batch and place.offset - batch[0].offset >= chunk:
            yield batch
            batch = []
        batch.append(place)
    if batch:
        yield batch


def _read_batch(fd: int, batch: list[Place], buffer: torch.Tensor | None) -> int:
    """One scatter read for the batch (alignment padding between tensors goes to scratch), then the device copies."""
    views, cursor = [], batch[0].offset
    for place in batch:
        if place.offset > cursor:
            views.append(memoryview(bytearray(place.offset - cursor)))
        views.append(memoryview(place.host_bytes(buffer).numpy()))
        cursor = place.offset + place.nbytes
    got = preadv_all(fd, views, batch[0].offset)
    for place in batch:
        if place.staged is not None:
            byte_view(place.target).copy_(place.host_bytes(buffer))
    return got


def preadv_all(fd: int, views: list[memoryview], offset: int) -> int:
    """Read exactly the views' total length at ``offset``; a short file is an error naming the shortfall."""
    want = sum(v.nbytes for v in views)
    views = [v.cast("B") for v in views if v.nbytes]
    while views:
        got = os.preadv(fd, views, offset)
        if got == 0:
            raise LazyFormatError(f"file ends {sum(v.nbytes for v in views)} bytes early (truncated)")
        offset += got
        views = _drop_prefix(views, got)
    return want


def _drop_prefix(views: list[memoryview], count: int) -> list[memoryview]:
    while count and views:
        if views[0].nbytes <= count:
            count -= views[0].nbytes
            views = views[1:]
        else:
            views = [views[0][count:]] + views[1:]
            count = 0
    return views


def broadcast_tensors(tensors: list[torch.Tensor], src: int, group: Any, bucket_bytes: int) -> None:
    """Broadcast from data-parallel rank 0 to its replicas, in place, coalesced per dtype into ~bucket_bytes buckets."""
    import torch.distributed as dist

    by_dtype: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group_tensors in by_dtype.values():
        bucket, size = [], 0
        for tensor in group_tensors + [None]:
            if tensor is not None:
                bucket.append(tensor)
                size += tensor.numel() * tensor.element_size()
            if bucket and (tensor is None or size >= bucket_bytes):
                flat = torch.cat([t.reshape(-1) for t in bucket])
                dist.broadcast(flat, src=src, group=group)
                if dist.get_rank() != src:
                    _scatter_back(flat, bucket)
                bucket, size = [], 0


def _scatter_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        tensor.detach().copy_(flat[offset:offset + tensor.numel()].view(tensor.shape))
        offset += tensor.numel()

"""restartbench's own checkpoint engine (``--engine lazy``): a lazy, asynchronous checkpoint whose
stall is little more than the copy out of device memory.

How a save goes (learned from DataStates-LLM, ByteCheckpoint and PyTorch DCP's async_save;
none of their code is used):

1. ``save`` collects references to the tensors this rank holds (module parameters and buffers,
   the ZeRO optimizer's fp32 partition and moments) and snapshots the small plain values
   (step counters, learning rate, scheduler state). It looks the **save plan** up by the
   tensors' names, dtypes and shapes: offsets in the host buffer and in the files are computed
   once and reused while they do not change.
2. It starts the copies into one **host buffer allocated once**, at engine set-up (``prepare``: out
   of any save's stall) and reused by every save (pinned on CUDA, a plain
   preallocated buffer on CPU): on CUDA they are queued on a side stream
   after an event on the compute stream; on CPU a background thread copies. Module buffers
   (which a forward pass may change) are copied before ``save`` returns; everything else is
   only modified by the optimizer step, so ``save`` returns at once and the copies overlap the
   next iteration's forward and backward.
3. The optimizer step is guarded: ``ds_engine.optimizer.step`` is wrapped, on this instance
   only, so that the step first waits for the copies still in flight. The time waited there is
   the rest of the stall: ``stall_extra_s``, ``copy_waits`` and the ``on_copy_wait`` callback
   report it (``save``'s own duration is what the harness records as the stall).
4. A writer thread streams the buffer to the files while copies are still arriving: it writes
   each chunk (``lazy_chunk_mb``, aligned) as soon as the copies covering it are done, with
   ``lazy_io_threads`` writes in flight, then fsyncs every file and the folder.
   ``wait_until_durable`` returns when that is done.

Files (format: docs/lazy-format.md): data-parallel rank 0 of each (pipeline stage, tensor
slice) writes ``model_ppPP_tpTT.lazy``, the module state its replicas share (deduplicated
across data-parallel replicas, as ZeRO-1 replicates it); every rank writes
``optim_ppPP_tpTT_dpDDD.lazy``, its own optimizer partition and plain state.

Restore reads with threads (``os.preadv`` scatter reads, straight into the tensors DeepSpeed
holds on CPU, through the pinned buffer on CUDA) and restores in place; optimizer moments that
do not exist yet in a fresh process are created where the optimizer would create them. With
``dp_read_once`` only data-parallel rank 0 reads the module file and broadcasts it to its replicas.

The training-state capture here mirrors restartbench/engines/harness_state.py's purpose
(written separately for the DCP/torchsnapshot adapters); the two should be merged.
"""

from __future__ import annotations

import enum
import errno
import json
import math
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from restartbench.config import EngineConfig
from restartbench.durability import fsync_dir
from restartbench.engines.base import CheckpointEngine, FileRecord
from restartbench.faults import save_fault

MAGIC = b"RBLAZY01"
PREAMBLE = struct.Struct("<8sQQ")
"""magic, header JSON length, data offset (all little-endian)."""
FILE_ALIGN = 4096
"""The data region starts on, and is padded to, a multiple of this (page and O_DIRECT friendly)."""
ENTRY_ALIGN = 64
"""Each tensor starts on a multiple of this inside the data region."""
FORMAT_VERSION = 1


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


# -- plan (pure) ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    """torch dtype without the ``torch.`` prefix: float32, bfloat16, ..."""
    shape: tuple[int, ...]
    device: str
    """Device type the tensor lives on (cpu, cuda): where a restore creates it if it does not exist."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _dtype(self.dtype).itemsize


@dataclass(frozen=True)
class EntryPlan:
    spec: TensorSpec
    offset: int
    """Offset in the file's data region."""
    buffer_offset: int
    """Offset in the host buffer."""
    sync: bool = False
    """Copied before ``save`` returns (state that a forward pass may modify, e.g. module buffers)."""


@dataclass(frozen=True)
class FilePlan:
    name: str
    kind: str
    """model or optim."""
    entries: tuple[EntryPlan, ...]
    data_bytes: int
    """Size of the data region, padded to FILE_ALIGN."""
    buffer_offset: int


@dataclass(frozen=True)
class SavePlan:
    files: tuple[FilePlan, ...]
    buffer_bytes: int
    signature: tuple

    def entries(self) -> Iterator[tuple[FilePlan, EntryPlan]]:
        for file in self.files:
            for entry in file.entries:
                yield file, entry

    def gaps(self) -> Iterator[tuple[int, int]]:
        """Buffer ranges no tensor covers (alignment padding), zeroed once per plan so that files are deterministic."""
        cursor = 0
        for _, entry in sorted(self.entries(), key=lambda item: item[1].buffer_offset):
            if entry.buffer_offset > cursor:
                yield cursor, entry.buffer_offset
            cursor = entry.buffer_offset + entry.spec.nbytes
        if cursor < self.buffer_bytes:
            yield cursor, self.buffer_bytes

    @property
    def sync_bytes(self) -> int:
        """Buffer prefix that ``save`` copies before returning (sync entries come first)."""
        return max((e.buffer_offset + e.spec.nbytes for _, e in self.entries() if e.sync), default=0)


def plan_signature(groups: list[tuple[str, str, list[tuple[TensorSpec, bool]]]]) -> tuple:
    return tuple((name, kind, tuple(specs)) for name, kind, specs in groups)


def make_plan(groups: list[tuple[str, str, list[tuple[TensorSpec, bool]]]]) -> SavePlan:
    """Lay out (file name, kind, [(spec, sync)]) groups: each file's data region is a contiguous,
    FILE_ALIGN-aligned range of the host buffer, with the same relative offsets as in the file,
    so that one buffer range is one file range. Sync entries go first in buffer order."""
    ordered = sorted(range(len(groups)), key=lambda i: not any(sync for _, sync in groups[i][2]))
    files, cursor = [], 0
    for index in ordered:
        name, kind, specs = groups[index]
        entries, offset = [], 0
        for spec, sync in sorted(specs, key=lambda item: not item[1]):
            entries.append(EntryPlan(spec, offset, cursor + offset, sync))
            offset = align_up(offset + spec.nbytes, ENTRY_ALIGN)
        data_bytes = align_up(offset, FILE_ALIGN)
        files.append(FilePlan(name, kind, tuple(entries), data_bytes, cursor))
        cursor += data_bytes
    return SavePlan(tuple(files), cursor, plan_signature(groups))


# -- file format (pure) -----------------------------------------------------------------------------


def encode_header(file: FilePlan, meta: dict[str, Any], values: Any) -> tuple[bytes, int]:
    """The bytes before the data region (preamble, header JSON, zero padding) and the data offset."""
    header = {
        "format": "restartbench-lazy", "version": FORMAT_VERSION, "kind": file.kind, **meta,
        "alignment": {"file": FILE_ALIGN, "entry": ENTRY_ALIGN}, "data_bytes": file.data_bytes,
        "tensors": [{"name": e.spec.name, "dtype": e.spec.dtype, "shape": list(e.spec.shape), "device": e.spec.device,
                     "offset": e.offset, "nbytes": e.spec.nbytes} for e in file.entries],
        "values": values,
    }
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    data_offset = align_up(PREAMBLE.size + len(text), FILE_ALIGN)
    head = PREAMBLE.pack(MAGIC, len(text), data_offset) + text
    return head + bytes(data_offset - len(head)), data_offset


def decode_header(raw: bytes, source: str = "<bytes>") -> tuple[dict[str, Any], int]:
    """(header, data offset) from the first bytes of a file (at least PREAMBLE.size + header length)."""
    if len(raw) < PREAMBLE.size:
        raise LazyFormatError(f"{source}: {len(raw)} bytes, too short for a restartbench-lazy file")
    magic, length, data_offset = PREAMBLE.unpack_from(raw)
    if magic != MAGIC:
        raise LazyFormatError(f"{source}: not a restartbench-lazy file (magic {magic!r}, expected {MAGIC!r})")
    if len(raw) < PREAMBLE.size + length:
        raise LazyFormatError(f"{source}: header cut short ({len(raw)} bytes, header needs {PREAMBLE.size + length})")
    header = json.loads(raw[PREAMBLE.size:PREAMBLE.size + length])
    if header.get("version") != FORMAT_VERSION:
        raise LazyFormatError(f"{source}: format version {header.get('version')}, this reader knows {FORMAT_VERSION}")
    return header, data_offset


def read_header(path: str | Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as handle:
        raw = handle.read(PREAMBLE.size)
        if len(raw) == PREAMBLE.size and raw[:8] == MAGIC:
            raw += handle.read(PREAMBLE.unpack(raw)[1])
        header, data_offset = decode_header(raw, str(path))
    size = os.path.getsize(path)
    if size < data_offset + header["data_bytes"]:
        raise LazyFormatError(f"{path}: {size} bytes, the header says {data_offset + header['data_bytes']} "
                              "(truncated: an interrupted save?)")
    return header, data_offset


class LazyFormatError(ValueError):
    pass


class LazyRestoreError(RuntimeError):
    pass


# -- plain values (pure): JSON with tags for what JSON cannot say -----------------------------------

_PLAIN = (bool, int, float, str, type(None))


def encode_value(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able, self-describing copy of ``obj``; tensors are replaced by a reference and
    collected in ``tensors`` under their path (the path as restartbench.verify.digest writes it)."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return {"t": "tensor", "name": path}
    if type(obj) in _PLAIN:
        return {"t": "float", "v": repr(obj)} if type(obj) is float and not math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {"t": "dict", "v": [[encode_value(k, "", {}), encode_value(v, _child(path, k), tensors)]
                                  for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"t": "list" if isinstance(obj, list) else "tuple",
                "v": [encode_value(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]}
    return _encode_object(obj)


def _encode_object(obj: Any) -> dict[str, Any]:
    """An object (DeepSpeed's LossScaler, fragment_address, an enum): its plain attributes, so that a
    restore can set them on the live object; anything else is opaque and only compared by repr."""
    cls = f"{type(obj).__module__}.{type(obj).__qualname__}"
    attrs = getattr(obj, "__dict__", None)
    if isinstance(obj, enum.Enum) or not attrs or not all(type(v) in _PLAIN for v in attrs.values()):
        return {"t": "opaque", "class": cls, "repr": repr(obj)}
    return {"t": "object", "class": cls, "attrs": {k: encode_value(v, "", {}) for k, v in attrs.items()}}


@dataclass(frozen=True)
class TensorRef:
    """A saved tensor, by name (its data is in the file's data region)."""
    name: str


@dataclass(frozen=True)
class ObjectState:
    """An object saved as its plain attributes."""
    cls: str
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Opaque:
    """An object saved only as its repr (enums and the like: derived from the configuration, compared on restore)."""
    cls: str
    repr: str


def decode_value(node: Any) -> Any:
    """Inverse of encode_value: plain values and containers as they were; tensors, objects and opaque values as
    TensorRef, ObjectState and Opaque."""
    if not isinstance(node, dict):
        return node
    kind = node["t"]
    if kind == "float":
        return float(node["v"])
    if kind == "dict":
        return {decode_value(k): decode_value(v) for k, v in node["v"]}
    if kind in ("list", "tuple"):
        items = [decode_value(v) for v in node["v"]]
        return items if kind == "list" else tuple(items)
    if kind == "tensor":
        return TensorRef(node["name"])
    if kind == "object":
        return ObjectState(node["class"], {k: decode_value(v) for k, v in node["attrs"].items()})
    if kind == "opaque":
        return Opaque(node["class"], node["repr"])
    raise LazyFormatError(f"unknown value tag {kind!r} in a restartbench-lazy header")


def _child(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise LazyFormatError(f"unknown dtype {name!r} in a restartbench-lazy header")
    return value


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tensor.device.type)


def fits(tensor: Any, spec: TensorSpec) -> bool:
    """``tensor`` can take the saved bytes of ``spec`` (same dtype and shape, wherever it lives)."""
    return (isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == spec.shape
            and str(tensor.dtype).removeprefix("torch.") == spec.dtype)


# -- what a rank holds --------------------------------------------------------------------------------


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
        module = {f"module.{k}": v.detach() for k, v in ds_engine.module.state_dict().items()}
        buffers = {f"module.{name}" for name, _ in ds_engine.module.named_buffers()}
        groups.append((layout.model_file, "model", [(tensor_spec(k, v), k in buffers) for k, v in module.items()]))
        tensors.update(module)
    optim_tensors: dict[str, torch.Tensor] = {}
    values = {
        "optimizer": encode_value(_optimizer_state(ds_engine), "optimizer", optim_tensors),
        "lr_scheduler": encode_value(ds_engine.lr_scheduler.state_dict() if ds_engine.lr_scheduler else {},
                                     "lr_scheduler", optim_tensors),
        "engine": {key: getattr(ds_engine, key) for key in ENGINE_COUNTERS if hasattr(ds_engine, key)},
    }
    if any(name.startswith("lr_scheduler") for name in optim_tensors):
        raise LazyRestoreError("the lr scheduler's state holds tensors; the lazy engine saves only plain "
                               "scheduler state")
    optim_tensors = {k: v.detach() for k, v in optim_tensors.items()}
    groups.append((layout.optim_file, "optim", [(tensor_spec(k, v), False) for k, v in optim_tensors.items()]))
    tensors.update(optim_tensors)
    return Capture(groups, tensors, values)


ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps")


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


# -- host buffer and copies ---------------------------------------------------------------------------


class HostBuffer:
    """One host buffer per rank, allocated on first use and reused while large enough
    (pinned when the state is on CUDA: pinning is slow, so it is done once)."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.pinned = False
        self.allocations = 0

    def get(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """At least ``nbytes``, uninitialised (its pages are touched by the copies, not here); a pinned buffer
        also serves a request for pageable memory."""
        if self.tensor is None or self.tensor.numel() < nbytes or (pinned and not self.pinned):
            self.tensor = None  # free the old one first
            self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)
            self.pinned = pinned
            self.allocations += 1
        return self.tensor


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat uint8 tensor sharing its memory."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def typed_slice(buffer: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
    return buffer[offset:offset + spec.nbytes].view(_dtype(spec.dtype)).view(spec.shape)


class CopyProgress:
    """Copies of the live tensors into the host buffer, in buffer order; ``wait(offset)`` returns once
    every byte below ``offset`` is in the buffer. CPU: a background thread; CUDA: a side stream with an
    event every chunk."""

    def __init__(self, plan: SavePlan, tensors: dict[str, torch.Tensor], buffer: torch.Tensor, chunk: int,
                 stream: Any = None):
        self.error: BaseException | None = None
        self._jobs = [(e.buffer_offset, typed_slice(buffer, e.buffer_offset, e.spec), tensors[e.spec.name])
                      for _, e in plan.entries()]
        self._jobs.sort(key=lambda job: job[0])
        self._end = plan.buffer_bytes
        self._sync_end = plan.sync_bytes
        self._chunk = chunk
        if stream is not None:
            self._marks = self._enqueue_cuda(stream)
        else:
            self._done = 0
            self._cond = threading.Condition()
            threading.Thread(target=self._copy_cpu, name="lazy-copy", daemon=True).start()

    def _enqueue_cuda(self, stream: Any) -> list[tuple[int, Any]]:
        """Queue every copy on the side stream after the compute stream's work so far; an event marks each chunk."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(stream.device))
        stream.wait_event(ready)
        marks, since = [], 0
        with torch.cuda.stream(stream):
            for offset, dst, src in self._jobs:
                if src.is_cuda:
                    src.record_stream(stream)  # the allocator must not hand its memory out before the copy ran
                dst.copy_(src, non_blocking=True)
                end = offset + dst.numel() * dst.element_size()
                since += dst.numel() * dst.element_size()
                if since >= self._chunk or end == self._sync_end:
                    marks.append((end, _recorded_event(stream)))
                    since = 0
            marks.append((self._end, _recorded_event(stream)))
        return marks

    def _copy_cpu(self) -> None:
        try:
            for offset, dst, src in self._jobs:
                for start, stop in _pieces(dst.numel(), max(1, self._chunk // max(1, dst.element_size()))):
                    if src.is_contiguous():
                        dst.view(-1)[start:stop].copy_(src.reshape(-1)[start:stop])
                    else:
                        dst.copy_(src)
                        stop = dst.numel()
                    self._advance(offset + stop * dst.element_size())
                    if stop == dst.numel():
                        break
            self._advance(self._end)
        except BaseException as error:  # noqa: BLE001 - reported to whoever waits
            with self._cond:
                self.error = error
                self._cond.notify_all()

    def _advance(self, offset: int) -> None:
        with self._cond:
            self._done = max(self._done, offset)
            self._cond.notify_all()

    def wait(self, offset: int | None = None) -> None:
        offset = self._end if offset is None else offset
        if hasattr(self, "_marks"):
            next(event for end, event in self._marks if end >= offset).synchronize()
            return
        with self._cond:
            self._cond.wait_for(lambda: self._done >= offset or self.error is not None)
            if self.error is not None:
                raise LazyRestoreError(f"copy into the host buffer failed: {self.error}") from self.error

    def done(self) -> bool:
        if hasattr(self, "_marks"):
            return self._marks[-1][1].query()
        with self._cond:
            return self._done >= self._end or self.error is not None


def _recorded_event(stream: Any) -> Any:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _pieces(total: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, max(total, 1), step):
        yield start, min(total, start + step)


# -- the streaming flush --------------------------------------------------------------------------------


class Flush:
    """Background writer: header first, then each data chunk once its copies are done, ``io_threads``
    writes in flight; fsync of every file and of the folders; ``durable_at`` when all is on disk."""

    def __init__(self, plan: SavePlan, heads: dict[str, tuple[bytes, int]], buffer: torch.Tensor,
                 progress: CopyProgress, folder: Path, chunk: int, io_threads: int, fault: str | None):
        self.plan, self.heads, self.progress, self.folder = plan, heads, progress, folder
        self.chunk, self.io_threads, self.fault = chunk, io_threads, fault
        self.memory = buffer.numpy()
        self.records: list[FileRecord] = []
        self.error: BaseException | None = None
        self.durable_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="lazy-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with ThreadPoolExecutor(self.io_threads, thread_name_prefix="lazy-write") as pool:
                for file in self.plan.files:
                    self.records.append(self._write_file(file, pool))
            fsync_dir(self.folder)
            fsync_dir(self.folder.parent)
            self.durable_at = time.perf_counter()
        except BaseException as error:  # noqa: BLE001 - reported by wait_until_durable
            self.error = error

    def _write_file(self, file: FilePlan, pool: ThreadPoolExecutor) -> FileRecord:
        start = time.perf_counter()
        path = self.folder / file.name
        head, data_offset = self.heads[file.name]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pending = []
        try:
            _pwrite_all(fd, memoryview(head), 0)
            if self.fault:
                self._die_or_fail(fd, file, data_offset, path)
            for lo, hi in _pieces(file.data_bytes, self.chunk):
                self.progress.wait(file.buffer_offset + hi)
                view = memoryview(self.memory[file.buffer_offset + lo:file.buffer_offset + hi])
                pending.append(pool.submit(_pwrite_all, fd, view, data_offset + lo))
            for write in pending:
                write.result()
            os.fsync(fd)
        finally:
            for write in pending:  # whatever happened, no write may be left running on a closed descriptor
                write.exception()
            os.close(fd)
        return FileRecord(str(path), data_offset + file.data_bytes, time.perf_counter() - start)

    def _die_or_fail(self, fd: int, file: FilePlan, data_offset: int, path: Path) -> None:
        """Fault injection (restartbench.faults): half of the first file is written, then the rank dies
        or the disk is full."""
        half = file.data_bytes // 2
        self.progress.wait(file.buffer_offset + half)
        _pwrite_all(fd, memoryview(self.memory[file.buffer_offset:file.buffer_offset + half]), data_offset)
        os.fsync(fd)
        if self.fault == "kill-in-save":
            os.kill(os.getpid(), signal.SIGKILL)
        self.fault = None
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def join(self) -> None:
        self._thread.join()


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


# -- the engine ---------------------------------------------------------------------------------------------


class LazyEngine(CheckpointEngine):
    """``--engine lazy``: see the module docstring."""

    asynchronous = True

    def __init__(self, options: EngineConfig):
        self.options = options
        self.chunk = max(1, options.lazy_chunk_mb) * 2**20
        self.io_threads = max(1, options.lazy_io_threads)
        self.buffer = HostBuffer()
        self.plan: SavePlan | None = None
        self.plans_made = 0
        self._padded_for: SavePlan | None = None
        self._stream = None
        self._copies: CopyProgress | None = None
        self._copies_tag: str | None = None
        self._flush: Flush | None = None
        self._read: list[FileRecord] = []
        self.copy_waits: list[dict[str, Any]] = []
        """Every wait at the optimizer step for copies still in flight: tag, seconds; each is also reported to
        ``on_copy_wait`` (from the training thread)."""

    # -- save ----------------------------------------------------------------------

    def prepare(self, ds_engine: Any) -> dict[str, Any]:
        """At engine set-up, out of the first save's stall: the host buffer (pinned when the state is on CUDA:
        about 0.5 s per GiB) and the side stream. The buffer is sized for the state as the first save will find
        it: the optimizer's moments do not exist before its first step (``state_to_come``)."""
        state = capture(ds_engine, rank_layout(ds_engine))
        cuda = any(t.is_cuda for t in state.tensors.values())
        *others, (name, kind, specs) = state.groups  # the optimizer file's group comes last
        sizing = make_plan([*others, (name, kind, specs + state_to_come(ds_engine.optimizer))])
        self.buffer.get(sizing.buffer_bytes, pinned=cuda)
        if cuda:
            self._side_stream(state)
        return {"host_buffer_bytes": sizing.buffer_bytes, "host_buffer_pinned": cuda}

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        """Returns once the copies are queued (and module buffers copied): the stall."""
        self._finish_previous()
        layout = rank_layout(ds_engine)
        state = capture(ds_engine, layout)
        self._install_step_guard(ds_engine)
        self.save_captured(state, layout, save_dir, tag)

    def save_captured(self, state: Capture, layout: RankLayout, save_dir: str, tag: str) -> None:
        """``save`` of a state already captured, without a DeepSpeed engine (restartbench.emulate): plan, host
        buffer, headers, copies and streamed flush as ``save`` does them. Nothing guards an optimizer step here:
        the caller calls ``wait_for_copies`` before it changes the captured tensors."""
        self._finish_previous()
        plan = self._plan_for(state)
        cuda = any(t.is_cuda for t in state.tensors.values())
        buffer = self._buffer_for(plan, pinned=cuda)
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        meta = file_meta(layout, tag)
        heads = {f.name: encode_header(f, meta, state.values if f.kind == "optim" else {}) for f in plan.files}
        self._copies = CopyProgress(plan, state.tensors, buffer, self.chunk,
                                    self._side_stream(state) if cuda else None)
        self._copies_tag = tag
        if plan.sync_bytes:
            self._copies.wait(plan.sync_bytes)
        self._flush = Flush(plan, heads, buffer, self._copies, folder, self.chunk, self.io_threads,
                            save_fault(_global_rank(), tag))

    def _plan_for(self, state: Capture) -> SavePlan:
        if self.plan is None or self.plan.signature != plan_signature(state.groups):
            self.plan = make_plan(state.groups)
            self.plans_made += 1
            self._padded_for = None
        return self.plan

    def _buffer_for(self, plan: SavePlan, pinned: bool) -> torch.Tensor:
        allocations = self.buffer.allocations
        buffer = self.buffer.get(plan.buffer_bytes, pinned)
        if self._padded_for is not plan or self.buffer.allocations != allocations:
            for lo, hi in plan.gaps():
                buffer[lo:hi].zero_()
            self._padded_for = plan
        return buffer

    def _side_stream(self, state: Capture) -> Any:
        device = next(t.device for t in state.tensors.values() if t.is_cuda)
        if self._stream is None or self._stream.device != device:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def _install_step_guard(self, ds_engine: Any) -> None:
        """Wrap this engine's optimizer step (instance attribute, once) so that it first waits for the copies of the
        last save: the step is the first thing after a save that modifies what is being copied."""
        optimizer = ds_engine.optimizer
        if optimizer is None or getattr(optimizer.step, "_lazy_guard", None) is self:
            return
        original = optimizer.step

        def guarded_step(*args: Any, **kwargs: Any) -> Any:
            self.wait_for_copies()
            return original(*args, **kwargs)

        guarded_step._lazy_guard = self  # type: ignore[attr-defined]
        optimizer.step = guarded_step

    def wait_for_copies(self) -> None:
        """At the first optimizer step after a save: wait for its copies, and record how long (0 when already done).
        The guarded step calls it; restartbench.emulate calls it where the next step would come."""
        copies, tag = self._copies, self._copies_tag
        if copies is None:
            return
        self._copies = None
        start = time.perf_counter()
        try:
            copies.wait()
        except LazyRestoreError:
            pass  # the writer reports it at wait_until_durable; the step may go on
        waited = time.perf_counter() - start
        self.copy_waits.append({"tag": tag, "seconds": waited})
        if self.on_copy_wait is not None:
            self.on_copy_wait(tag, waited)

    @property
    def stall_extra_s(self) -> float:
        """Time the last save's copies held up the optimizer step (0 when they were done before it)."""
        last = self._copies_tag
        return sum(w["seconds"] for w in self.copy_waits if w["tag"] == last)

    def _finish_previous(self) -> None:
        """The buffer is reused: a new save must not overwrite it while the last flush still reads it."""
        if self._flush is not None and self._flush.durable_at is None and self._flush.error is None:
            self.wait_until_durable()

    def wait_until_durable(self) -> float:
        flush = self._flush
        if flush is None:
            raise LazyRestoreError("wait_until_durable called before any save")
        flush.join()
        if flush.error is not None:
            raise flush.error
        return flush.durable_at

    def written(self) -> list[FileRecord]:
        return list(self._flush.records) if self._flush else []

    def read(self) -> list[FileRecord]:
        return list(self._read)

    # -- load ---------------------------------------------------------------------------

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        module = {f"module.{k}": v for k, v in ds_engine.module.state_dict().items()}
        self.load_into(rank_layout(ds_engine), load_dir, tag, module,
                       lambda header: restore_plain_and_targets(ds_engine, header["values"], header["tensors"]))
        if hasattr(ds_engine.optimizer, "_link_all_hp_params"):
            ds_engine.optimizer._link_all_hp_params()

    def load_into(self, layout: RankLayout, load_dir: str, tag: str, module: dict[str, torch.Tensor],
                  optim_targets: Callable[[dict[str, Any]], dict[str, torch.Tensor]]) -> None:
        """``load`` without a DeepSpeed engine (restartbench.emulate drives it too): read the module file into
        ``module`` (saved name -> tensor) and the optimizer file into the tensors ``optim_targets(its header)``
        returns (``load`` restores the header's plain values there first)."""
        folder = Path(load_dir) / tag
        self._read = []
        optim_path = folder / layout.optim_file
        header, data_offset = _checked_header(optim_path, tag)
        jobs = [(optim_path, data_offset, header, optim_targets(header))]
        reads_module = not self.options.dp_read_once or layout.dp == 0
        if reads_module:
            model_path = folder / layout.model_file
            model_header, model_offset = _checked_header(model_path, tag)
            _check_same_names(model_path, model_header["tensors"], module)
            jobs.append((model_path, model_offset, model_header, module))
        self._read = read_into(jobs, self.io_threads, self.chunk, self.buffer)
        if self.options.dp_read_once and layout.dp_size > 1:
            broadcast_tensors(list(module.values()), layout.dp_src, layout.dp_group, self.chunk)


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _checked_header(path: Path, tag: str) -> tuple[dict[str, Any], int]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {tag} has no {path.name} ({path}): was it written by --engine lazy "
                                "with the same parallel layout?")
    return read_header(path)


def _check_same_names(path: Path, saved: list[dict[str, Any]], live: dict[str, torch.Tensor]) -> None:
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
    if len(saved["param_groups"]) != len(inner.param_groups):
        raise LazyRestoreError(f"{len(saved['param_groups'])} optimizer parameter groups saved, "
                               f"{len(inner.param_groups)} here")
    params = [p for group in inner.param_groups for p in group["params"]]
    for group, saved_group in zip(inner.param_groups, saved["param_groups"]):
        if len(saved_group["params"]) != len(group["params"]):
            raise LazyRestoreError(f"a parameter group of {len(saved_group['params'])} parameters was saved, "
                                   f"this optimizer's has {len(group['params'])} (a different layout?)")
        group.update({k: v for k, v in saved_group.items() if k != "params"})
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
    return torch.empty(spec.shape, dtype=_dtype(spec.dtype), device=device)


_MISSING = object()


def _restore_entry(owner: Any, key: str, saved: Any, live: Any, name: str,
                   specs: dict[str, TensorSpec], targets: dict[str, torch.Tensor]) -> None:
    """A top-level entry of a DeepSpeed optimizer's state_dict: tensors (views of the live ones) are read into,
    plain values set as attributes, objects (the loss scaler) updated attribute by attribute, the rest compared."""
    for sub_name, sub_saved, sub_live in _leaves(name, saved, live):
        if isinstance(sub_saved, TensorRef):
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
            yield from _leaves(_child(name, key), value, inner)
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


def read_into(jobs: list[tuple[Path, int, dict[str, Any], dict[str, torch.Tensor]]], io_threads: int, chunk: int,
              staging: HostBuffer) -> list[FileRecord]:
    """Read every file's tensors into their targets with parallel scatter reads (``os.preadv``), each of about
    ``chunk`` bytes: straight into CPU tensors; device tensors are read into a host staging buffer and copied to
    the device by the same reader thread right after its read, so copies overlap the other threads' reads.
    The staging buffer is the engine's host buffer: pinned where ``prepare`` pinned it for the saves, else pageable
    (pinning it only for one load would cost more than the copies gain)."""
    files, staged_bytes = [], 0
    for path, data_offset, header, targets in jobs:
        places = []
        for entry in header["tensors"]:
            target = targets[entry["name"]]
            spec = TensorSpec(entry["name"], entry["dtype"], tuple(entry["shape"]), entry["device"])
            if not fits(target, spec) or not target.is_contiguous():
                raise LazyRestoreError(f"{path}: {spec.name} saved as {spec}, the live tensor is {_describe(target)}")
            staged = None if target.device.type == "cpu" else staged_bytes
            places.append(Place(data_offset + entry["offset"], entry["nbytes"], target, staged))
            staged_bytes += 0 if staged is None else align_up(entry["nbytes"], ENTRY_ALIGN)
        files.append((path, places))
    buffer = staging.get(staged_bytes, pinned=False) if staged_bytes else None
    with ThreadPoolExecutor(io_threads, thread_name_prefix="lazy-read") as pool:
        records = [_read_file(path, places, buffer, chunk, pool) for path, places in files]
    if staged_bytes:
        torch.cuda.synchronize()
    return records


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


def _read_file(path: Path, places: list[Place], buffer: torch.Tensor | None, chunk: int,
               pool: ThreadPoolExecutor) -> FileRecord:
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    reads = []
    try:
        reads = [pool.submit(_read_batch, fd, batch, buffer) for batch in _batches(places, chunk)]
        total = sum(read.result() for read in reads)
    finally:
        for read in reads:  # none may be left reading from a closed descriptor
            read.exception()
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
    got = _preadv_all(fd, views, batch[0].offset)
    for place in batch:
        if place.staged is not None:
            byte_view(place.target).copy_(place.host_bytes(buffer))
    return got


def _preadv_all(fd: int, views: list[memoryview], offset: int) -> int:
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

"""The lazy engine's save plan and file format: pure functions, shared by the engine, its prediction
(restartbench.engines.lazy.predict) and its emulation. The format in words: docs/lazy-format.md.

A save plan lays out, once for a given set of tensors, where each tensor goes in the host buffer and in its file:
each file's data region is one contiguous range of the buffer, so a buffer range is a file range. A file is a
preamble (magic, header length, data offset), a JSON header (the tensors' names, dtypes, shapes and offsets, and the
plain values), padding to FILE_ALIGN, then the data region. Plain values are JSON with tags for what JSON cannot
say (tuples, non-finite floats, non-string keys, tensors by reference, objects by their attributes).
"""

from __future__ import annotations

import enum
import json
import math
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MAGIC = b"RBLAZY01"
PREAMBLE = struct.Struct("<8sQQ")
"""magic, header JSON length, data offset (all little-endian)."""
FILE_ALIGN = 4096
"""The data region starts on, and is padded to, a multiple of this (page and O_DIRECT friendly)."""
ENTRY_ALIGN = 64
"""Each tensor starts on a multiple of this inside the data region."""
FORMAT_VERSION = 2
"""Version 2 adds what a load in another parallel layout needs (``layout``, ``params``, ``zero``: docs/lazy-format.md);
version 1 files still load in the layout they were written in."""
READABLE_VERSIONS = (1, 2)


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class LazyFormatError(ValueError):
    """A file that is not, or no longer, a readable restartbench-lazy file."""


class LazyRestoreError(RuntimeError):
    """A save or restore the lazy engine cannot do (a layout, optimizer or state it does not handle)."""


# -- plan -------------------------------------------------------------------------------------------------


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
        return math.prod(self.shape) * torch_dtype(self.dtype).itemsize


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a header names (float32, bfloat16, ...)."""
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


# -- file format ------------------------------------------------------------------------------------------


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
    if header.get("version") not in READABLE_VERSIONS:
        raise LazyFormatError(f"{source}: format version {header.get('version')}, this reader knows "
                              f"{', '.join(map(str, READABLE_VERSIONS))}")
    return header, data_offset


def read_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """(header, data offset) of a file, refused when the file is shorter than its header says."""
    header, data_offset, _ = read_header_counted(path)
    return header, data_offset


def read_header_counted(path: str | Path) -> tuple[dict[str, Any], int, int]:
    """``read_header`` and the bytes it read (preamble and header JSON)."""
    with open(path, "rb") as handle:
        raw = handle.read(PREAMBLE.size)
        if len(raw) == PREAMBLE.size and raw[:8] == MAGIC:
            raw += handle.read(PREAMBLE.unpack(raw)[1])
        header, data_offset = decode_header(raw, str(path))
    size = os.path.getsize(path)
    if size < data_offset + header["data_bytes"]:
        raise LazyFormatError(f"{path}: {size} bytes, the header says {data_offset + header['data_bytes']} "
                              "(truncated: an interrupted save?)")
    return header, data_offset, len(raw)


# -- plain values: JSON with tags for what JSON cannot say -----------------------------------------------

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
        return {"t": "dict", "v": [[encode_value(k, "", {}), encode_value(v, child_path(path, k), tensors)]
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


def child_path(path: str, key: Any) -> str:
    """The dotted name of ``key`` under ``path``: how encode_value names the tensors it collects."""
    return f"{path}.{key}" if path else str(key)

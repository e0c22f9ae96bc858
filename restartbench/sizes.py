"""What a predictor gives (``PlannedFile``, ``EnginePredictor``), and the sizes of files from meta tensors.

Sizes: the payload is the bytes of every tensor storage, exact; a torch.save'd file's size is what ``torch.save``
itself writes, on CPU tensors whose storages map a sparse file, under ``torch.serialization.skip_data`` (no tensor
byte is allocated, read or written: a sparse file whose length is the real file's).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from restartbench.shards import ShardSetup

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
    held_to: str = "real runs"
    """What the sizes are held to by the tests: real runs of the engine, unless none can run here yet."""


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

"""PyTorch Distributed Checkpoint (DCP): ``save`` and ``async_save`` of the DeepSpeed engine's state.

DCP saves a flat {key: tensor or object} dict, every rank at once, each rank writing
``__<rank>_0.distcp`` and rank 0 the ``.metadata`` that maps keys to file offsets. The state
is the harness state (``harness_state``: module, ZeRO-1 fp32 partition and Adam moments,
scheduler, counters), its tensors as top-level entries and its plain values as one object
per rank. Keys carry the rank's place in the 3D layout:

- ``pp<P>-tp<T>/module/<name>``: the module is the same on every data-parallel rank of a
  stage and shard, so DCP's planner keeps one copy of each tensor (written by one of those
  ranks), as DeepSpeed's own checkpoint does;
- ``pp<P>-tp<T>-dp<D>/...``: the optimizer partition and everything else, distinct per rank.

The checkpoint lives in ``<save_dir>/<tag>/`` and is restored with the same layout. The folder is
either local (DCP's ``FileSystemWriter``/``Reader``; durable once fsync'd) or an object-store prefix
(s3torchconnector's ``S3StorageWriter``/``S3StorageReader``, seeds 000 and 001, or torch's
``FsspecWriter``/``FsspecReader`` on s3fs or gcsfs; durable once the uploads have completed, which
DCP's write waits for): ``for_store`` picks the writer of the store's client.
DCP is imported with this module (when the engine is created at start-up, seconds on a busy
CPU), not in the first save, whose stall would otherwise include it.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from restartbench.config import EngineConfig
from restartbench.engines import harness_state
from restartbench.engines.base import CheckpointEngine, FileRecord, durable_now

METADATA = ".metadata"
SKELETON = "skeleton"


def namespaces(pp: int, tp: int, dp: int) -> tuple[str, str]:
    """(module namespace shared by the data-parallel replicas, this rank's own namespace)."""
    return f"pp{pp}-tp{tp}", f"pp{pp}-tp{tp}-dp{dp}"


def flat_state(state: dict[str, Any], pp: int, tp: int, dp: int) -> dict[str, Any]:
    """The harness state as DCP's flat dict: namespaced tensors plus this rank's skeleton object."""
    shared, own = namespaces(pp, tp, dp)
    skeleton, tensors = harness_state.split(state)
    flat: dict[str, Any] = {f"{shared if key.startswith('module/') else own}/{key}": t for key, t in tensors.items()}
    flat[f"{own}/{SKELETON}"] = skeleton
    return flat


def is_mine(key: str, pp: int, tp: int, dp: int) -> bool:
    shared, own = namespaces(pp, tp, dp)
    return key.startswith(f"{shared}/module/") or key.startswith(f"{own}/")


def unflatten(flat: dict[str, Any], pp: int, tp: int, dp: int) -> dict[str, Any]:
    """Reverse of ``flat_state`` for this rank's keys."""
    _, own = namespaces(pp, tp, dp)
    tensors = {key.split("/", 1)[1]: value for key, value in flat.items() if key != f"{own}/{SKELETON}"}
    return harness_state.join(flat[f"{own}/{SKELETON}"], tensors)


def save_planner() -> DefaultSavePlanner:
    """Unflattened, the skeleton stays one object (not an entry per leaf) and keeps its keys as they are
    (DCP's flattening turns the optimizer's integer keys into strings)."""
    return DefaultSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


def rank_save_planner(state: Any, coord: Any, storage_meta: Any, is_coordinator: bool) -> DefaultSavePlanner:
    """``save_planner`` set up on one rank's training state (on meta tensors, ``restartbench.shards``) as its flat
    dict at its DeepSpeed coordinates, as ``dcp.save`` sets it up on each rank: what the plan and the coordinator's
    measurement plan each rank with."""
    planner = save_planner()
    planner.set_up_planner(state_dict=flat_state(harness_state.capture(state), coord.pipe, coord.model, coord.data),
                           storage_meta=storage_meta, is_coordinator=is_coordinator)
    return planner


def load_planner() -> DefaultLoadPlanner:
    """Unflattened, the planner loads objects into (a shallow copy of) the template itself, which
    ``dcp.load`` copies back: the skeleton lands in the template."""
    return DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


def load_template(metadata: Any, live: dict[str, Any], pp: int, tp: int, dp: int) -> dict[str, Any]:
    """What DCP loads into: this rank's keys of the checkpoint, each the tensor of ``live`` (a
    ``flat_state``) where it has one of the same shape and dtype (read in place), else a new
    tensor; None for objects."""
    template: dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        if not is_mine(key, pp, tp, dp):
            continue
        if not isinstance(md, TensorStorageMetadata):
            template[key] = None
            continue
        current = live.get(key)
        fits = isinstance(current, torch.Tensor) and current.shape == md.size and current.dtype == md.properties.dtype
        template[key] = current if fits else torch.empty(md.size, dtype=md.properties.dtype)
    if not template:
        raise FileNotFoundError(f"the DCP checkpoint has no entries for pipeline stage {pp}, tensor rank {tp}, "
                                f"data-parallel rank {dp}: was it saved with another layout?")
    return template


def files_of_rank(names: list[str], pg_rank: int) -> list[str]:
    """The files of a DCP checkpoint folder that ``pg_rank`` wrote: its ``__<rank>_<n>.distcp`` files,
    and ``.metadata`` for the coordinator (rank 0). Each file belongs to exactly one rank."""
    mine = [n for n in names if n.startswith(f"__{pg_rank}_") and n.endswith(".distcp")]
    return sorted(mine + ([METADATA] if pg_rank == 0 and METADATA in names else []))


class LocalFolder:
    """DCP's own file-system writer and reader; a file is durable once it and its folder are fsync'd."""

    def writer(self, folder: str) -> Any:
        return dcp.FileSystemWriter(folder, sync_files=True)

    def reader(self, folder: str) -> Any:
        return dcp.FileSystemReader(folder)

    def sizes(self, folder: str) -> dict[str, int]:
        """Name -> bytes of every file in the checkpoint folder."""
        return {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}

    def durable(self, records: list[FileRecord], write_done: float) -> float:
        return durable_now(records)


class ObjectPrefix:
    """A DCP checkpoint folder that is an object-store prefix: an object is durable once its upload has
    completed, which happens inside DCP's write; sizes come from the store's listing."""

    def __init__(self, store: Any):
        self.store = store

    def sizes(self, folder: str) -> dict[str, int]:
        tag = self.store.relative(folder)
        return {posixpath.relpath(key, tag): size for key, size in self.store.files(tag).items()}

    def durable(self, records: list[FileRecord], write_done: float) -> float:
        return write_done


class S3ConnectorPrefix(ObjectPrefix):
    """s3torchconnector's DCP writer and reader (seeds 000 and 001), through the run's client: their own
    constructors take no endpoint, so their file system is given the store's (endpoint, region, addressing)."""

    def _file_system(self, reader_constructor: Any = None) -> Any:
        from s3torchconnector.dcp import S3FileSystem

        return S3FileSystem(self.store.settings.region, s3_client=self.store.client,
                            reader_constructor=reader_constructor)

    def writer(self, folder: str) -> Any:
        from s3torchconnector.dcp import S3StorageWriter

        writer = S3StorageWriter(self.store.settings.region, folder)
        writer.fs = self._file_system()
        return writer

    def reader(self, folder: str) -> Any:
        from s3torchconnector import S3ReaderConstructor
        from s3torchconnector.dcp import S3StorageReader

        constructor = S3ReaderConstructor.dcp_optimized()
        reader = S3StorageReader(self.store.settings.region, folder, reader_constructor=constructor)
        reader.fs = self._file_system(constructor)
        return reader


class FsspecPrefix(ObjectPrefix):
    """torch's own fsspec writer and reader for DCP, on the store's fsspec file system (s3fs, or gcsfs's core
    one). Files are not fsync'd (an object has no file descriptor; it is durable once uploaded)."""

    def writer(self, folder: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(folder, sync_files=False, **self.store.settings.fsspec_options())
        writer.fs.fs = self.store.fs
        return writer

    def reader(self, folder: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = FsspecReader(folder, **self.store.settings.fsspec_options())
        reader.fs.fs = self.store.fs
        return reader


#: The store's class -> how DCP reaches it.
OBJECT_PREFIXES = {"S3Store": S3ConnectorPrefix, "FsspecStore": FsspecPrefix}


class DCPEngine(CheckpointEngine):
    """``torch.distributed.checkpoint.save``: returns once every rank's files are written (and fsync'd by DCP)."""

    def __init__(self, options: EngineConfig):
        self.options = options
        self.target: LocalFolder | ObjectPrefix = LocalFolder()
        self._folder: str | None = None
        self._pg_rank = 0
        self._save_start = 0.0
        self._write_done = 0.0
        self._read: list[FileRecord] = []

    def for_store(self, store: Any) -> DCPEngine:
        """For an object store: this engine with the DCP writer and reader of the store's client."""
        self.target = OBJECT_PREFIXES[type(store).__name__](store)
        return self

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        group = self._begin_save(save_dir, tag)
        flat = flat_state(harness_state.capture(ds_engine), *harness_state.coordinates(ds_engine))
        self._start_save(flat, self.target.writer(self._folder), save_planner(), group)

    def save_flat(self, flat: dict[str, Any], save_dir: str, tag: str) -> None:
        """``save`` of a state already in ``flat_state``'s form, without a DeepSpeed engine (restartbench.emulate)."""
        group = self._begin_save(save_dir, tag)
        self._start_save(flat, self.target.writer(self._folder), save_planner(), group)

    def _begin_save(self, save_dir: str, tag: str) -> Any:
        """Where the save goes and on which process group; its start time. Returns the group."""
        self._folder = os.path.join(save_dir, tag)
        group = self._process_group()
        self._pg_rank = dist.get_rank(group)
        self._save_start = time.perf_counter()
        return group

    def _process_group(self) -> Any:
        return None  # the default group: the save runs on the training thread

    def _start_save(self, flat: dict, writer: Any, planner: Any, group: Any) -> None:
        dcp.save(flat, storage_writer=writer, planner=planner, process_group=group)
        self._write_done = time.perf_counter()

    def wait_until_durable(self) -> float:
        return self.target.durable(self.written(), self._write_done)

    def pinned_host_bytes(self) -> int:
        """0: DCP pins nothing here. ``save`` writes from the live tensors; ``async_save`` stages through its writer,
        which every target here builds as a ``FileSystemWriter`` (DCP's own, ``FsspecWriter``, s3torchconnector's
        ``S3StorageWriter``): a ``BlockingAsyncStager`` without ``cache_staged_state_dict``, whose staging copies the
        state into new pageable CPU tensors at every save (``_create_cpu_state_dict`` without ``pin_memory``)."""
        return 0

    def written(self) -> list[FileRecord]:
        if self._folder is None:
            return []
        sizes = self.target.sizes(self._folder)
        mine = {os.path.join(self._folder, n): sizes[n] for n in files_of_rank(list(sizes), self._pg_rank)}
        return harness_state.records(mine, self._write_done - self._save_start)

    def read(self) -> list[FileRecord]:
        return list(self._read)

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        coords = harness_state.coordinates(ds_engine)
        template = self._load(lambda: flat_state(harness_state.capture(ds_engine), *coords), coords, load_dir, tag)
        harness_state.restore(ds_engine, unflatten(template, *coords))

    def load_flat(self, live: dict[str, Any], coords: tuple[int, int, int], load_dir: str, tag: str
                  ) -> dict[str, Any]:
        """``load`` without a DeepSpeed engine (restartbench.emulate): this rank's entries, read into the tensors of
        ``live`` (a ``flat_state``) where they fit, returned as a flat state."""
        return self._load(lambda: live, coords, load_dir, tag)

    def _load(self, live: Callable[[], dict[str, Any]], coords: tuple[int, int, int], load_dir: str, tag: str
              ) -> dict[str, Any]:
        """``dcp.load`` of this rank's entries into the tensors of ``live()`` where they fit (taken once the metadata
        is read, so that a real run's load time includes capturing its live state); records what was read."""
        folder = os.path.join(load_dir, tag)
        start = time.perf_counter()
        reader = self.target.reader(folder)
        metadata = reader.read_metadata()
        template = load_template(metadata, live(), *coords)
        dcp.load(template, storage_reader=reader, planner=load_planner())
        seconds = time.perf_counter() - start
        self._read = harness_state.records(self._bytes_read(folder, metadata, template), seconds)
        return template

    def _bytes_read(self, folder: str, metadata: Any, template: dict[str, Any]) -> dict[str, int]:
        """Bytes this rank read from each file: its entries' extents, plus the whole ``.metadata``."""
        sizes = {os.path.join(folder, METADATA): self.target.sizes(folder)[METADATA]}
        for index, info in metadata.storage_data.items():
            if index.fqn in template:
                path = os.path.join(folder, info.relative_path)
                sizes[path] = sizes.get(path, 0) + info.length
        return sizes


class AsyncDCPEngine(DCPEngine):
    """``torch.distributed.checkpoint.async_save``: the state is staged to a CPU copy before ``save``
    returns (so training cannot change what is written), then planned and written by a background
    thread on a process group of its own, so its collectives never interleave with training's.

    That group (gloo: async_save needs a CPU backend, also beside NCCL) is created with the engine,
    on every rank at start-up as a real job would, so the first save's stall does not include it."""

    asynchronous = True

    def __init__(self, options: EngineConfig):
        super().__init__(options)
        self._group = dist.new_group(backend="gloo")
        self._future: Any = None
        self._done_at: float | None = None

    def _process_group(self) -> Any:
        return self._group

    def _start_save(self, flat: dict, writer: Any, planner: Any, group: Any) -> None:
        self._done_at = None
        self._future = dcp.async_save(flat, storage_writer=writer, planner=planner, process_group=group)
        self._future.add_done_callback(self._mark_written)

    def _mark_written(self, _future: Any) -> None:
        self._done_at = time.perf_counter()

    def background_done(self) -> bool:
        return self._future is None or self._future.done()

    def wait_until_durable(self) -> float:
        """Wait for the background write (raising its error, if any), then make this rank's files durable
        (fsync them in a folder; in S3 the completed uploads already are)."""
        if self._future is not None:
            future, self._future = self._future, None
            future.result()
            # result() may return before the done callback has run: then the write ended just now.
            self._write_done = self._done_at or time.perf_counter()
        return super().wait_until_durable()

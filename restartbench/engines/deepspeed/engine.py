"""DeepSpeed's own checkpoint engines, driven through ``save_checkpoint``/``load_checkpoint``.

DeepSpeed routes every file of a checkpoint through ``ds_engine.checkpoint_engine.save``
and ``.load``. Wrapping that object (``RecordingCheckpointEngine``) tells us exactly which
files this rank wrote or read, how big they are and how long each took, without touching
DeepSpeed's code paths or naming rules. With an object-store target (s3://, gs://), DeepSpeed's default
engine streams every file through the store's client (``ObjectStoreTorchEngine``, ``restartbench.storage``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import posixpath
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from restartbench.config import EngineConfig
from restartbench.engines.base import CheckpointEngine, FileRecord, durable_now, guard_optimizer_step
from restartbench.engines.deepspeed.datastates_adapter import ADAPTER_NOTE
from restartbench.storage import ObjectStore


class RecordingCheckpointEngine:
    """Delegates to DeepSpeed's checkpoint engine and records each file saved or loaded. A DeepSpeed checkpoint
    engine (one call per file), not a ``CheckpointEngine``."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.saved: list[FileRecord] = []
        self.loaded: list[FileRecord] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        start = time.perf_counter()
        self.inner.save(state_dict, path)
        self.saved.append(FileRecord(path, _size_or_zero(path), time.perf_counter() - start))

    def load(self, path: str, map_location: Any = None) -> Any:
        start = time.perf_counter()
        state = self.inner.load(path, map_location=map_location)
        self.loaded.append(FileRecord(path, _size_or_zero(path), time.perf_counter() - start))
        return state


def _size_or_zero(path: str) -> int:
    """Size on disk now; 0 where an asynchronous engine has not created the file yet."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


class DeepSpeedEngine(CheckpointEngine):
    """Base for engines that are DeepSpeed checkpoint engines selected by the ``checkpoint`` JSON block."""

    def __init__(self, options: EngineConfig):
        self.options = options
        self._recorder: RecordingCheckpointEngine | None = None

    def _recording(self, ds_engine: Any) -> RecordingCheckpointEngine:
        if self._recorder is None or ds_engine.checkpoint_engine is not self._recorder:
            self._recorder = RecordingCheckpointEngine(ds_engine.checkpoint_engine)
            ds_engine.checkpoint_engine = self._recorder
        return self._recorder

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        recorder = self._recording(ds_engine)
        recorder.saved.clear()
        # The harness, not DeepSpeed, writes `latest`: only after every rank is durable.
        ds_engine.save_checkpoint(save_dir, tag=tag, save_latest=False)

    def wait_until_durable(self) -> float:
        return durable_now(self.written())

    def written(self) -> list[FileRecord]:
        """Files this rank wrote in the last save, sizes read now (after durability they are final)."""
        records = self._recorder.saved if self._recorder else []
        return [FileRecord(r.path, _size_or_zero(r.path), r.seconds) for r in records]

    def read(self) -> list[FileRecord]:
        return list(self._recorder.loaded) if self._recorder else []

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        self._recording(ds_engine).loaded.clear()
        path, _client_state = ds_engine.load_checkpoint(
            load_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:  # DeepSpeed only warns when it finds nothing to load
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag!r} under {load_dir}")


class TorchEngine(DeepSpeedEngine):
    """DeepSpeed's default TorchCheckpointEngine: torch.save per file, synchronous, no fsync of its own."""

    def for_store(self, store: Any) -> Any:
        """For an object store: the same engine with every file streamed through the store's client."""
        return ObjectStoreTorchEngine(self.options, store)


_WRITER_SUFFIX = re.compile(r"-(\d+)\.(\d+)")


def restore_deepspeed_name(plain: str, actual: str) -> str:
    """Rename FastPersist's ``<plain>-<writer>.<writers>`` to DeepSpeed's ``plain``; return where the file is now.

    Under the ``replica`` writer layout every data-parallel replica writes a full copy of the replicated
    model-states file: writer 0's copy takes the plain name and the others stay as FastPersist named them
    (the load never reads them). Ranks need not talk to each other: every file exists once DeepSpeed's
    save returns (it ends in a barrier), and a lower writer's copy is checked for under its suffixed name
    first, then under the plain name (``os.replace`` is atomic, so one of the two is always seen).
    Two ranks that wrote the same path (one writer index for several ranks) raise: that file's content
    cannot be trusted.
    """
    match = _WRITER_SUFFIX.fullmatch(actual[len(plain):]) if actual.startswith(plain) else None
    if match is None:
        return actual
    writer, writers = int(match[1]), int(match[2])
    if any(os.path.exists(f"{plain}-{lower}.{writers}") for lower in range(writer)):
        return actual
    clash = RuntimeError(f"FastPersist wrote {actual} from more than one rank at once, so its content cannot be "
                         "trusted: its writer.data_parallel layout gave those ranks the same writer index; "
                         "use --writer-data-parallel replica")
    if os.path.exists(plain):
        if writer == 0:
            raise clash
        return actual
    try:
        os.replace(actual, plain)
    except FileNotFoundError:
        raise clash from None
    return plain


def use_deepspeed_utils_op() -> str | None:
    """Let FastPersist's file writer load DeepSpeed's ``utils`` op on a CPU-only machine; the note to record.

    ``FastFileWriter.__init__`` loads the op (for ``cast_to_byte_tensor``) through the accelerator's
    table of op builders, and the CPU accelerator lists none for it: it answers with a builder whose
    ``load`` raises "This op had not been implemented on CPU backend". The op is plain C++
    (``csrc/utils``) and DeepSpeed ships its accelerator-independent builder
    (``deepspeed.ops.op_builder.utils.UtilsBuilder``), so the writer module is pointed at that builder:
    DeepSpeed's own op, JIT-built once into ``TORCH_EXTENSIONS_DIR``. Its only user,
    ``save_torch_storage_object_list``, is never called by stock ``torch.save``, which writes through
    ``write()``. Where the accelerator has the op (a GPU) nothing is changed and None is returned.
    The op is loaded here, at engine set-up, so that no save's stall includes a build.
    """
    from deepspeed.io import fast_file_writer
    from deepspeed.ops.op_builder import utils as generic_builders

    try:
        fast_file_writer.UtilsBuilder().load()
        return None
    except ValueError as not_on_this_accelerator:  # NotImplementedBuilder.load
        original = f"{fast_file_writer.UtilsBuilder.__name__}: {not_on_this_accelerator}"
    fast_file_writer.UtilsBuilder = generic_builders.UtilsBuilder
    fast_file_writer.UtilsBuilder().load(verbose=False)
    return ("deepspeed.io.fast_file_writer.UtilsBuilder pointed at DeepSpeed's accelerator-independent "
            f"deepspeed.ops.op_builder.utils.UtilsBuilder (this accelerator's builder is {original}); "
            "the op is only loaded by the writer, stock torch.save never calls it")


def allow_deepspeed_classes_in_load() -> str:
    """FastPersist's and the decoupled engine's ``load`` call ``torch.load`` without ``weights_only=False``
    (DeepSpeed's torch engine passes it), and torch >= 2.6 then refuses the DeepSpeed classes the ZeRO files
    hold ("Unsupported global: ... LossScaler"). Allow exactly those classes
    (``torch.serialization.add_safe_globals``), at engine set-up in both phases; the note to record with
    each save, whose checkpoint loads only so."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    classes = [LossScaler, ZeroStageEnum, fragment_address]
    torch.serialization.add_safe_globals(classes)
    return ("torch.serialization.add_safe_globals(" + ", ".join(c.__name__ for c in classes) + "): DeepSpeed's "
            "writer engines load with torch.load's weights_only default, which refuses DeepSpeed's own classes")


class FastPersistEngine(DeepSpeedEngine):
    """DeepSpeed's FastPersist writer (``checkpoint.writer.type = fast``), as shipped, with stated workarounds.

    FastPersist writes each file as ``<name>-<writer>.<writers>`` (e.g. ``...optim_states.pt-0.2``) and
    DeepSpeed's own ``load_checkpoint`` then cannot find ``<name>``. After the save the harness renames the
    files back to DeepSpeed's names (bytes untouched; see ``restore_deepspeed_name``) and records each rename, and
    the time it took, as a ``checkpoint.workaround`` event; the rename is inside the save span (the stall),
    so the stall is an upper bound by that much. On a CPU-only machine the writer also needs DeepSpeed's
    ``utils`` op (``use_deepspeed_utils_op``) and its native pinning backend (``DS_PIN_MEMORY_BACKEND=native``,
    set by the registry's launch environment on CPU only); on every machine its ``load`` needs DeepSpeed's classes
    allowed (``allow_deepspeed_classes_in_load``). Both notes are recorded with every save.
    """

    def __init__(self, options: EngineConfig):
        super().__init__(options)
        self._setup_notes = [note for note in (use_deepspeed_utils_op(), allow_deepspeed_classes_in_load()) if note]
        self._written_as: dict[str, str] = {}
        """DeepSpeed's path -> the path FastPersist wrote it to, for the last save."""
        self._now_at: dict[str, str] = {}
        """DeepSpeed's path -> where that file of the last save is now."""
        self._problems: list[str] = []
        """What went wrong in the last save's renames."""

    def _watch_writer(self, ds_engine: Any) -> None:
        """Record the path of each file FastPersist's writer factory opens (what it really names it)."""
        factory = getattr(self._recording(ds_engine).inner, "_writer", None)
        if factory is None:
            raise RuntimeError("DeepSpeed's checkpoint engine has no FastPersist writer on this rank: the run's "
                               "DeepSpeed config lacks checkpoint.writer.type=fast, or this rank got no writer")
        if getattr(factory, "_restartbench_watched", False):
            return
        create_writer = factory.create_writer

        def watched(file_path: str, optimize_dp_state: bool) -> Any:
            writer = create_writer(file_path, optimize_dp_state)
            self._written_as[file_path] = writer.file_path()
            return writer

        factory.create_writer = watched
        factory._restartbench_watched = True

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        self._watch_writer(ds_engine)
        self._written_as.clear()
        super().save(ds_engine, save_dir, tag)
        start = time.perf_counter()
        self._now_at, self._problems = {}, []
        for plain, actual in self._written_as.items():
            try:
                self._now_at[plain] = restore_deepspeed_name(plain, actual)
            except (RuntimeError, OSError) as problem:
                self._now_at[plain] = actual
                self._problems.append(f"{type(problem).__name__}: {problem}")
        seconds = time.perf_counter() - start
        self.workarounds = self._setup_notes + [
            f"renamed {os.path.basename(self._written_as[plain])} -> {os.path.basename(plain)} (FastPersist's writer "
            f"suffix; DeepSpeed's load expects the plain name; this rank's renames took {seconds:.4f} s, inside the "
            "save span)" for plain, now in self._now_at.items() if now == plain != self._written_as[plain]]

    def wait_until_durable(self) -> float:
        """Raises what went wrong in the renames: not in ``save``, because DeepSpeed's save ends in a barrier, and
        a rank failing alone after it would break the harness's matching of collectives for a failed save."""
        if self._problems:
            raise RuntimeError("renaming FastPersist's files back to DeepSpeed's names failed: "
                               + "; ".join(self._problems))
        return super().wait_until_durable()

    def written(self) -> list[FileRecord]:
        records = self._recorder.saved if self._recorder else []
        paths = [self._now_at.get(r.path, r.path) for r in records]
        return [FileRecord(path, _size_or_zero(path), r.seconds) for path, r in zip(paths, records)]


class DecoupledEngine(DeepSpeedEngine):
    """DeepSpeed's decoupled writer (``checkpoint.writer.decoupled = true``), as shipped.

    ``save`` hands each file's state to a background writer process and returns; DeepSpeed commits the
    checkpoint (waits for its writer) in ``engine.step()``, which a PipelineEngine never calls, so the
    harness calls DeepSpeed's own ``_commit_decoupled_checkpoint()`` when it waits for durability (before
    the next save or at the end of training, as for every asynchronous engine). The writer process is not
    a daemon: DeepSpeed's ``cleanup()`` (what ``engine.destroy()`` calls) is registered to run at exit,
    before multiprocessing would wait for that process forever.
    """

    asynchronous = True

    def __init__(self, options: EngineConfig):
        super().__init__(options)
        self._ds_engine: Any = None
        self._setup_notes = [allow_deepspeed_classes_in_load()]

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        if self._ds_engine is None:
            import atexit

            atexit.register(ds_engine.checkpoint_engine.cleanup)
        self._ds_engine = ds_engine
        self.workarounds = self._setup_notes + [
            "the harness calls DeepSpeed's engine._commit_decoupled_checkpoint() when it waits for durability: "
            "a PipelineEngine never calls step(), where DeepSpeed commits"]
        super().save(ds_engine, save_dir, tag)

    def wait_until_durable(self) -> float:
        self._ds_engine._commit_decoupled_checkpoint()
        return super().wait_until_durable()


class DataStatesEngine(DeepSpeedEngine):
    """DeepSpeed's DataStates-LLM engine (``datastates_ckpt`` block), through the study's adapter, with stated
    workarounds.

    DeepSpeed 0.19.8 imports ``datastates.CheckpointEngine``, which the public source lacks:
    ``scripts/build-datastates.sh`` builds the vendored source (``third_party/datastates-llm``) and installs
    ``datastates_adapter.CheckpointEngine`` as that name (``datastates_adapter.ADAPTER_NOTE``, recorded with every
    save). CUDA only.

    ``save`` is DeepSpeed's ``save_checkpoint``: DataStates queues each file's work and returns (the stall). DeepSpeed
    does not clone the tensors for it (``preserves_storage_sharing`` is False), so its copies read the live state, and
    the next optimizer step must wait for them. DeepSpeed's own wait for that, ``_commit_decoupled_checkpoint()`` at
    the top of ``engine.step()``, never commits for DataStates: its engine keeps the commit info as ``commit_info``
    but has no ``get_commit_info`` (the base's returns None, ``checkpoint_engine.py`` line 56), and a PipelineEngine
    never calls ``step()``. So the harness calls DeepSpeed's ``DataStatesCheckpointEngine.commit(commit_info)`` (the
    adapter's ``wait(persist=True)``) before the first optimizer step after a save, as the lazy engine's step is
    guarded, and reports that wait as ``copy_wait``; and again, if still pending, when it waits for durability. No call
    of the source waits for its file writes: there the harness asks the adapter's ``wait_for_writes`` (DataStates'
    host tier writes in order, so a last small write marks the end of the checkpoint's), then fsyncs the files. A
    save that fails waits for what DataStates already queued before the harness removes the folder: its host tier
    would otherwise write into files being removed, and end the process.
    """

    asynchronous = True
    STEP_GUARD_NOTE = ("the harness calls DeepSpeed's DataStatesCheckpointEngine.commit(commit_info) before the first "
                       "optimizer step after the save (timed as copy_wait) and when it waits for durability: "
                       "DeepSpeed's own call, _commit_decoupled_checkpoint() in engine.step(), never commits for "
                       "DataStates (its engine has no get_commit_info) and a PipelineEngine never calls step()")

    def __init__(self, options: EngineConfig):
        super().__init__(options)
        self._ds_engine: Any = None
        self._pending_tag: str | None = None

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        self._ds_engine = ds_engine
        guard_optimizer_step(ds_engine, self, self._commit_before_step)
        self.workarounds = [ADAPTER_NOTE, self.STEP_GUARD_NOTE]
        try:
            super().save(ds_engine, save_dir, tag)
        except BaseException:
            self._settle_after_failure()
            raise
        self._pending_tag = tag

    def _settle_after_failure(self) -> None:
        """Wait for what DataStates queued of a save that failed, at most 10 minutes; what this wait raises is
        dropped (the error the harness records is the save's)."""
        with contextlib.suppress(Exception):
            self._adapter().wait_for_writes(timeout_s=600.0)

    def _adapter(self) -> Any:
        """The ``datastates.CheckpointEngine`` DeepSpeed made (``datastates_adapter.CheckpointEngine``)."""
        return self._recording(self._ds_engine).inner.ckpt_engine

    def _commit_before_step(self) -> None:
        """The guarded step's call: commit the pending save, reported as the step's copy wait."""
        tag = self._pending_tag
        if tag is not None:
            at, start = time.time(), time.perf_counter()
            self._commit()
            if self.on_copy_wait is not None:
                self.on_copy_wait(tag, time.perf_counter() - start, at)

    def _commit(self) -> None:
        """DeepSpeed's commit of the pending save (the adapter's wait(persist=True)), once."""
        self._pending_tag = None
        inner = self._recording(self._ds_engine).inner
        if inner.commit_info is not None:
            inner.commit(inner.commit_info)

    def wait_until_durable(self) -> float:
        if self._ds_engine is not None:
            self._commit()
            self._adapter().wait_for_writes()
        return super().wait_until_durable()

    def close(self) -> None:
        """The phase's end: the adapter waits for the writes and stops DataStates' thread pool. Its workers are not
        daemons, so they would make the process end through the interpreter's teardown, where DataStates' destructor
        deletes its tiers under their detached threads."""
        if self._ds_engine is not None:
            self._adapter().close()

    def pinned_host_bytes(self) -> int | None:
        """The host cache DataStates pins (cudaMallocHost) when DeepSpeed creates its engine: --host-cache-gb, in the
        bytes DataStates computes (GB * 2**30)."""
        return int(self.options.host_cache_gb * (1 << 30))


# --- DeepSpeed's default engine with its files in an object store ------------------------------------


class ObjectFileEngine:
    """A DeepSpeed checkpoint engine (one call per file, not a ``CheckpointEngine``) that streams each file to the
    object store (``torch.save`` into the store client's writer: a multipart upload for objects larger than one
    part) and loads with ``torch.load`` from its reader. DeepSpeed's paths ``s3://bucket/prefix/tag/name`` (or
    gs://) are the object URLs. Everything but save, load and makedirs is DeepSpeed's own torch engine's
    (``inner``)."""

    def __init__(self, inner: Any, store: ObjectStore):
        self.inner, self.store = inner, store
        self.saved: list[FileRecord] = []
        self.loaded: list[FileRecord] = []
        self.sizes: dict[str, int] = {}
        """Object URL -> bytes, from the listing taken before a load."""
        self.durable_at = time.perf_counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """An object store has no folders: a key prefix exists once an object is written under it."""

    def save(self, state_dict: Any, path: str) -> None:
        import torch

        start = time.perf_counter()
        try:
            with self.store.writer(path) as writer:
                torch.save(state_dict, writer, _use_new_zipfile_serialization=self.inner.zipfile_serialization)
                size = writer.tell()
        except self.store.client_errors as error:  # the client's error, said in words, with the object
            raise self.store.error(error, f"uploading {path}") from None
        # leaving the block completed the upload: the object is durable and visible from here on
        self.durable_at = time.perf_counter()
        self.saved.append(FileRecord(path, size, self.durable_at - start))

    def load(self, path: str, map_location: Any = None) -> Any:
        import torch

        start = time.perf_counter()
        try:
            with self.store.reader(path) as reader:
                state = torch.load(reader, map_location=map_location, weights_only=False)
        except self.store.client_errors as error:
            raise self.store.error(error, f"downloading {path}") from None
        self.loaded.append(FileRecord(path, self.sizes.get(path, 0), time.perf_counter() - start))
        return state


class ObjectStoreTorchEngine(TorchEngine):
    """DeepSpeed's default engine (``torch``) with its files in an object store, through DeepSpeed's own save and load.

    Two places where DeepSpeed 0.19.8 reaches the local file system directly, not through its checkpoint
    engine, are answered for the object store (each stated in ``workarounds`` or here):

    - at save, global rank 0 copies ``zero_to_fp32.py`` and ``zero_to_torch.py`` into the tag folder with
      ``shutil.copyfile``: here they are uploaded instead (same bytes; like DeepSpeed's copy they are not
      checkpoint-engine files, so they are not in the manifest);
    - at load, DeepSpeed finds the model files with ``glob.glob`` and checks names with ``os.path.exists``:
      for object URLs only, and only during the load, both are answered from one listing of the tag's
      objects, taken before the load (and counted in it). Local paths go to the real functions.

    A file is durable when its upload has completed (inside ``save``), so there is no fsync to wait for.
    """

    def __init__(self, options: Any, store: ObjectStore):
        super().__init__(options)
        self.store = store
        self._files: ObjectFileEngine | None = None

    def _object_files(self, ds_engine: Any) -> ObjectFileEngine:
        if self._files is None or ds_engine.checkpoint_engine is not self._files:
            self._files = ObjectFileEngine(ds_engine.checkpoint_engine, self.store)
            ds_engine.checkpoint_engine = self._files
            ds_engine._copy_recovery_script = self._upload_recovery_scripts
        return self._files

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        files = self._object_files(ds_engine)
        files.saved.clear()
        self.workarounds = []
        ds_engine.save_checkpoint(save_dir, tag=tag, save_latest=False)

    def _upload_recovery_scripts(self, save_path: str) -> None:
        import deepspeed

        utils = Path(deepspeed.__file__).parent / "utils"
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            self.store.write_durably(self.store.relative(f"{save_path.rstrip('/')}/{script}"),
                                     (utils / script).read_text())
        self.workarounds.append("uploaded DeepSpeed's zero_to_fp32.py and zero_to_torch.py to the checkpoint prefix, "
                                "where DeepSpeed puts them in a folder (it copies them with shutil.copyfile, which "
                                "writes local files only)")

    def wait_until_durable(self) -> float:
        return self._files.durable_at if self._files else time.perf_counter()

    def written(self) -> list[FileRecord]:
        return list(self._files.saved) if self._files else []

    def read(self) -> list[FileRecord]:
        return list(self._files.loaded) if self._files else []

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        files = self._object_files(ds_engine)
        files.loaded.clear()
        files.sizes = {self.store.url_of(k): size for k, size in self.store.files(tag).items()}
        with object_paths_from_listing(files.sizes, self.store.where.scheme):
            path, _client_state = ds_engine.load_checkpoint(
                load_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag!r} under {load_dir}")


@contextlib.contextmanager
def object_paths_from_listing(objects: dict[str, int], scheme: str) -> Iterator[None]:
    """While active, ``glob.glob`` and ``os.path.exists`` answer paths starting with ``scheme`` (s3://, gs://) from
    ``objects`` (URL -> bytes); every other path goes to the real functions."""
    real_glob, real_exists = glob.glob, os.path.exists

    def object_glob(pattern: Any, *args: Any, **kwargs: Any) -> list[str]:
        if not str(pattern).startswith(scheme):
            return real_glob(pattern, *args, **kwargs)
        folder = posixpath.dirname(pattern)
        return sorted(u for u in objects if posixpath.dirname(u) == folder and fnmatch.fnmatchcase(u, pattern))

    def object_exists(path: Any) -> bool:
        if not isinstance(path, str) or not path.startswith(scheme):
            return real_exists(path)
        return path in objects or any(u.startswith(path.rstrip("/") + "/") for u in objects)

    glob.glob, os.path.exists = object_glob, object_exists
    try:
        yield
    finally:
        glob.glob, os.path.exists = real_glob, real_exists

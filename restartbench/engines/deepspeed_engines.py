"""DeepSpeed's own checkpoint engines, driven through ``save_checkpoint``/``load_checkpoint``.

DeepSpeed routes every file of a checkpoint through ``ds_engine.checkpoint_engine.save``
and ``.load``. Wrapping that object (``RecordingCheckpointEngine``) tells us exactly which
files this rank wrote or read, how big they are and how long each took, without touching
DeepSpeed's code paths or naming rules.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from restartbench.config import EngineConfig
from restartbench.engines import durable_now


@dataclass
class FileRecord:
    path: str
    bytes: int
    seconds: float
    """Time inside the engine's save (serialize + write) or load (read + deserialize) of this file."""


class RecordingCheckpointEngine:
    """Delegates to DeepSpeed's checkpoint engine and records each file saved or loaded."""

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


class DeepSpeedEngine:
    """Base for engines that are DeepSpeed checkpoint engines selected by the ``checkpoint`` JSON block."""

    asynchronous = False
    saves_state = True

    def __init__(self, options: EngineConfig):
        self.options = options
        self._recorder: RecordingCheckpointEngine | None = None
        self.workarounds: list[str] = []
        """What the harness changed after the engine's last save, to be recorded with it (empty: nothing)."""

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


_WRITER_SUFFIX = re.compile(r"-\d+\.\d+$")


def drop_writer_suffixes(paths: list[str]) -> list[str]:
    """Rename ``<path>-<writer>.<writers>`` to ``<path>`` where only the suffixed file exists; one line per rename."""
    renamed = []
    for path in paths:
        if os.path.exists(path):
            continue
        folder, name = os.path.split(path)
        suffixed = [f for f in os.listdir(folder or ".") if f.startswith(name) and _WRITER_SUFFIX.fullmatch(f[len(name):])]
        if len(suffixed) == 1:
            os.replace(os.path.join(folder, suffixed[0]), path)
            renamed.append(f"renamed {suffixed[0]} -> {name} (FastPersist's writer suffix; DeepSpeed's load expects "
                           "the plain name)")
    return renamed


def records_as_dicts(records: list[FileRecord], root: str) -> list[dict[str, Any]]:
    """File records with paths relative to the checkpoint root (as the run folder stores them)."""
    return [{**asdict(r), "path": os.path.relpath(r.path, root)} for r in records]


class FastPersistEngine(DeepSpeedEngine):
    """DeepSpeed's FastPersist writer (``checkpoint.writer.type = fast``), as shipped, with one stated workaround.

    FastPersist names each file ``<name>-<writer>.<writers>`` (e.g. ``...optim_states.pt-0.1``) and
    DeepSpeed's own ``load_checkpoint`` then fails to find ``<name>``. After the save the harness renames
    the files back to DeepSpeed's names — bytes untouched — and records each rename as a
    ``checkpoint.workaround`` event, so every run says it happened.
    """

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        super().save(ds_engine, save_dir, tag)
        self.workarounds = drop_writer_suffixes([r.path for r in self._recorder.saved])


class DecoupledEngine(DeepSpeedEngine):
    """DeepSpeed's decoupled writer (background writer processes), as shipped."""

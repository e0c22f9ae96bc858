"""TorchSnapshot 0.1.0 with the study's patch (``third_party/torchsnapshot/``): one snapshot per rank.

The patch makes TorchSnapshot rank-local (no replication assumption, no collectives), so each
rank takes its whole harness state (``harness_state``: module, ZeRO-1 fp32 partition and Adam
moments, scheduler, counters) as its own snapshot in ``<save_dir>/<tag>/rank<NNNNN>/``. The
module of a pipeline stage and tensor shard is therefore written by each of its data-parallel
replicas (DeepSpeed and DCP write it once). ``save`` ends in a barrier, as DeepSpeed's
``save_checkpoint`` does, so it returns once every rank has written. TorchSnapshot is imported
and patched when the engine is created (at start-up), not in the first save.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.distributed as dist

from restartbench.config import EngineConfig
from restartbench.engines import harness_state
from restartbench.engines.base import CheckpointEngine, FileRecord, durable_now

PATCH = Path(__file__).resolve().parents[3] / "third_party" / "torchsnapshot" / "rank_local.py"
PATCH_MODULE = "restartbench_torchsnapshot_rank_local"
APP_KEY = "harness"


def patched_torchsnapshot() -> ModuleType:
    """``torchsnapshot``, with the study's patch applied (once per process)."""
    if PATCH_MODULE not in sys.modules:
        if not PATCH.is_file():
            raise FileNotFoundError(f"the study's TorchSnapshot patch {PATCH} is missing; "
                                    "run from a checkout of the restartbench repository")
        spec = importlib.util.spec_from_file_location(PATCH_MODULE, PATCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[PATCH_MODULE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[PATCH_MODULE]
            raise
    import torchsnapshot

    return torchsnapshot


def rank_folder(save_dir: str, tag: str, rank: int) -> str:
    return os.path.join(save_dir, tag, f"rank{rank:05d}")


class HarnessStateful:
    """The DeepSpeed engine's harness state as a TorchSnapshot ``Stateful``.

    On restore TorchSnapshot reads into the tensors ``state_dict`` returns (the live ones) where it
    can, then calls ``load_state_dict``; the time spent there is the copy into the engine."""

    def __init__(self, ds_engine: Any):
        self.ds_engine = ds_engine
        self.restore_seconds = 0.0

    def state_dict(self) -> dict[str, Any]:
        return harness_state.capture(self.ds_engine)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        start = time.perf_counter()
        harness_state.restore(self.ds_engine, state)
        self.restore_seconds = time.perf_counter() - start


class TorchSnapshotEngine(CheckpointEngine):
    """``--engine torchsnapshot``: see the module docstring."""

    def __init__(self, options: EngineConfig):
        self.options = options
        self._snapshot = patched_torchsnapshot().Snapshot
        self._folder: str | None = None
        self._write_seconds = 0.0
        self._read: list[FileRecord] = []

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        self._folder = rank_folder(save_dir, tag, dist.get_rank())
        start = time.perf_counter()
        self._snapshot.take(path=self._folder, app_state={APP_KEY: HarnessStateful(ds_engine)})
        self._write_seconds = time.perf_counter() - start
        dist.barrier()

    def wait_until_durable(self) -> float:
        return durable_now(self.written())

    def written(self) -> list[FileRecord]:
        if self._folder is None:
            return []
        return harness_state.records(_sizes(self._folder), self._write_seconds)

    def read(self) -> list[FileRecord]:
        return list(self._read)

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        folder = rank_folder(load_dir, tag, dist.get_rank())
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"no TorchSnapshot of rank {dist.get_rank()} in {folder}: "
                                    "was the checkpoint saved with another number of ranks?")
        stateful = HarnessStateful(ds_engine)
        start = time.perf_counter()
        self._snapshot(path=folder).restore(app_state={APP_KEY: stateful})
        seconds = time.perf_counter() - start - stateful.restore_seconds
        self._read = harness_state.records(_sizes(folder), seconds)


def _sizes(folder: str) -> dict[str, int]:
    return {path: os.path.getsize(path) for path in harness_state.files_under(folder)}

"""The toy engine: the whole contract of ``restartbench/engines/base.py`` in a few lines. Each rank saves the state
DeepSpeed's own checkpoint holds for ZeRO-1 (``harness_state.capture``: module, fp32 partition, Adam's moments,
scheduler, counters) with torch.save, and a restore copies it back in place (``harness_state.restore``)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from restartbench.config import EngineConfig
from restartbench.engines import harness_state
from restartbench.engines.base import CheckpointEngine, FileRecord, durable_now


class ToyEngine(CheckpointEngine):
    def __init__(self, options: EngineConfig):
        self.options = options
        self._written: list[FileRecord] = []
        self._read: list[FileRecord] = []

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        path = rank_file(save_dir, tag, self.options.toy_file_prefix)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        start = time.perf_counter()
        torch.save(harness_state.capture(ds_engine), path)
        self._written = [FileRecord(path, os.path.getsize(path), time.perf_counter() - start)]

    def wait_until_durable(self) -> float:
        return durable_now(self._written)

    def written(self) -> list[FileRecord]:
        return self._written

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        path = rank_file(load_dir, tag, self.options.toy_file_prefix)
        start = time.perf_counter()
        harness_state.restore(ds_engine, torch.load(path, weights_only=False))
        self._read = [FileRecord(path, os.path.getsize(path), time.perf_counter() - start)]

    def read(self) -> list[FileRecord]:
        return self._read


def rank_file(folder: str, tag: str, prefix: str) -> str:
    return os.path.join(folder, tag, f"{prefix}-rank{dist.get_rank():05d}.pt")

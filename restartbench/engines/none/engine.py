"""The ``none`` engine: no checkpoint at all.

Phase 1 gives the iteration time without any checkpoint cost; phase 2 is a relaunch that
restores nothing, so its start-up parts are the floor any restart pays before loading.
"""

from __future__ import annotations

import time
from typing import Any

from restartbench.config import EngineConfig
from restartbench.engines.base import CheckpointEngine, FileRecord
from restartbench.shards import ShardSetup
from restartbench.sizes import EnginePredictor, PlannedFile


class NoCheckpoint(CheckpointEngine):
    def __init__(self, options: EngineConfig):
        self.options = options

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        raise RuntimeError("engine 'none' saves nothing; the harness must not call save")

    def wait_until_durable(self) -> float:
        return time.perf_counter()

    def written(self) -> list[FileRecord]:
        return []

    def read(self) -> list[FileRecord]:
        return []

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        raise RuntimeError("engine 'none' restores nothing; the harness must not call load")

    def for_store(self, store: Any) -> NoCheckpoint:
        """Itself: it writes nothing, so any location will do."""
        return self


def no_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    return []


PREDICTOR = EnginePredictor(no_files, 0, note="engine none writes no checkpoint files")

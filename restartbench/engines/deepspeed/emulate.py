"""DeepSpeed's default engine under ``--emulate``: every file of the rank torch.save'd, then fsync'd."""

from __future__ import annotations

import os
import time
from typing import Any

from restartbench.emulator import Emulator, differences, state_of
from restartbench.engines.base import FileRecord, durable_now
from restartbench.shards import copy_recovery_scripts, shard_files


class TorchFiles(Emulator):
    how = ("DeepSpeed's default engine: every file of the rank (DeepSpeed's names and state dicts) torch.save'd, "
           "then fsync'd; rank 0 copies DeepSpeed's recovery scripts; restored with torch.load")

    def __init__(self, ranks: Any):
        super().__init__(ranks)
        self._files: dict[int, dict[int, list[Any]]] = {}
        self._written: list[Any] = []

    def files(self, step: int) -> dict[int, list[Any]]:
        """rank -> the ShardFiles it writes at ``step`` (every rank of the layout)."""
        if step not in self._files:
            files: dict[int, list[Any]] = {rank: [] for rank in range(self.ranks.plan.world_size)}
            for shard in shard_files(self.ranks.setup(step)):
                files[shard.rank].append(shard)
            self._files = {step: files}
        return self._files[step]

    def stage(self, rank: int, step: int) -> Any:
        return [(shard, state_of(shard, self.ranks.cfg.train.seed)) for shard in self.files(step)[rank]]

    def save(self, rank: int, staged: Any, tag: str) -> None:
        """torch.save of each file; global rank 0 also copies DeepSpeed's recovery scripts into the checkpoint
        folder's root, as save_checkpoint does."""
        import torch

        self._written = []
        os.makedirs(os.path.join(self.ranks.ckpt_dir, tag), exist_ok=True)
        for shard, state in staged:
            path = os.path.join(self.ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            torch.save(state, path)
            self._written.append(FileRecord(path, os.path.getsize(path), time.perf_counter() - start))
        if rank == 0:
            copy_recovery_scripts(self.ranks.ckpt_dir)

    def wait_until_durable(self, rank: int) -> float:
        return durable_now(self._written)

    def written(self, rank: int) -> list[Any]:
        return self._written

    def hold(self, rank: int, step: int) -> Any:
        """The files the rank needs: its stage's layer and model files (written by data-parallel rank 0 of the same
        stage and tensor rank) and its own optimizer file."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        layout, files = self.ranks.plan.layout, self.files(step)
        topology = PipeModelDataParallelTopology(num_pp=layout["pp"], num_mp=layout["tp"], num_dp=layout["dp"])
        coord = topology.get_coord(rank)
        writer = topology.get_rank(pipe=coord.pipe, data=0, model=coord.model)
        return ([f for f in files[writer] if f.kind != "optimizer"]
                + [f for f in files[rank] if f.kind == "optimizer"])

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        """torch.load of each file (read + deserialize), as DeepSpeed's TorchCheckpointEngine.load does."""
        import torch

        records, loaded = [], []
        for shard in held:
            path = os.path.join(self.ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            loaded.append(torch.load(path, map_location="cpu", weights_only=False))
            records.append(FileRecord(path, os.path.getsize(path), time.perf_counter() - start))
        return records, loaded

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        return [problem for shard, got in zip(held, restored)
                for problem in differences(state_of(shard, self.ranks.cfg.train.seed), got, shard.path)]

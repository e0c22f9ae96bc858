"""PyTorch DCP under ``--emulate``: the rank's flat harness state saved collectively through the engine."""

from __future__ import annotations

from typing import Any

from restartbench.config import RunConfig
from restartbench.emulator import Emulator, differences, random_tensor
from restartbench.engines import create_engine


class DCPFlat(Emulator):
    """PyTorch DCP (``dcp``, ``dcp-async``): the rank's harness state in dcp_engine's flat form, saved collectively."""

    how = ("PyTorch DCP: the rank's harness state (module, ZeRO-1 fp32 partition and Adam moments, scheduler, "
           "counters; random data) in dcp_engine's flat form, saved by every process at once through the engine's "
           "dcp.save or async_save (DCPEngine.save_flat) and loaded back with dcp.load (DCPEngine.load_flat) into "
           "tensors allocated before the load")

    def __init__(self, ranks: Any):
        super().__init__(ranks)
        self.engine = create_engine(ranks.cfg.engine)  # dcp-async: its own gloo group, on every process at once

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        k = cfg.emulation.ranks_per_process
        if k != 1:
            return (f"--engine {cfg.engine.engine} under --emulate needs --ranks-per-process 1 (got {k}): DCP's save "
                    "is collective (every rank of the process group takes part at once), so a process can emulate "
                    "one rank only")
        return None

    def _flat(self, rank: int, step: int) -> tuple[tuple[int, int, int], dict[str, Any]]:
        """(coordinates, the rank's flat state on meta tensors)."""
        from restartbench.engines import harness_state
        from restartbench.engines.dcp import engine as dcp_engine

        coord, state = self.ranks.state(rank, step)
        coords = (coord.pipe, coord.model, coord.data)
        return coords, dcp_engine.flat_state(harness_state.capture(state), *coords)

    def stage(self, rank: int, step: int) -> Any:
        """Random data keyed by DCP's key: a module entry's key is the same on every data-parallel replica (DCP
        writes it once and every replica reads it)."""
        import torch

        _, flat = self._flat(rank, step)
        return {key: random_tensor(value.shape, value.dtype, self.ranks.cfg.train.seed, step, key)
                if isinstance(value, torch.Tensor) else value for key, value in flat.items()}

    def save(self, rank: int, staged: Any, tag: str) -> None:
        self.engine.save_flat(staged, self.ranks.ckpt_dir, tag)

    def wait_until_durable(self, rank: int) -> float:
        return self.engine.wait_until_durable()

    def written(self, rank: int) -> list[Any]:
        return self.engine.written()

    def hold(self, rank: int, step: int) -> Any:
        import torch

        coords, flat = self._flat(rank, step)
        return coords, {key: torch.empty(value.shape, dtype=value.dtype) for key, value in flat.items()
                        if isinstance(value, torch.Tensor)}

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        coords, live = held
        restored = self.engine.load_flat(live, coords, self.ranks.ckpt_dir, tag)
        return self.engine.read(), restored

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        want = self.stage(rank, step)
        if want.keys() != restored.keys():
            return [f"rank {rank}: DCP restored entries {sorted(restored)[:5]}..., saved {sorted(want)[:5]}..."]
        return differences(want, restored, f"rank {rank} (DCP)")

"""How an emulated rank goes through an engine (``--emulate``): the ``Emulator`` base class each engine's
``emulate.py`` subclasses, and the random data it saves and compares after the restore.

The ranks an emulator serves are ``restartbench.emulate.EmulatedRanks`` (the program every emulating process runs):
``ranks.setup(step)``, ``ranks.state(rank, step)``, ``ranks.cfg``, ``ranks.plan``, ``ranks.ckpt_dir``,
``ranks.logs``. torch is imported inside the functions: the launcher reads an emulator's ``refusal`` and ``how``
without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from restartbench.config import RunConfig
from restartbench.data import stable_seed
from restartbench.sizes import materialize


class Emulator:
    """One process's emulated ranks going through one engine. ``stage`` builds what training leaves in memory and
    ``hold`` what a fresh process holds before its load (both outside the timed spans); ``save`` is the stall,
    ``next_step`` what the next optimizer step waits for, ``load`` the restore."""

    how = ""
    """What of the engine runs, for metadata.json."""

    def __init__(self, ranks: Any):
        self.ranks = ranks

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        """Why this engine cannot emulate ``cfg`` (None: it can)."""
        return None

    def stage(self, rank: int, step: int) -> Any:
        raise NotImplementedError

    def save(self, rank: int, staged: Any, tag: str) -> None:
        raise NotImplementedError

    def next_step(self, rank: int, tag: str) -> None:
        """Nothing to wait for: the engine's save returned with the state taken."""

    def wait_until_durable(self, rank: int) -> float:
        raise NotImplementedError

    def written(self, rank: int) -> list[Any]:
        raise NotImplementedError

    def hold(self, rank: int, step: int) -> Any:
        raise NotImplementedError

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        """(FileRecords of what was read, what was restored)."""
        raise NotImplementedError

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        raise NotImplementedError


def random_tensor(shape: Any, dtype: Any, *key: Any) -> Any:
    """A tensor of random data, the same for the same key in every process (saved, then compared after the
    restore; a tensor that data-parallel replicas share has a key without the data-parallel rank)."""
    import torch

    generator = torch.Generator().manual_seed(stable_seed("emulate", *key))
    return torch.empty(tuple(shape), dtype=dtype).uniform_(-1.0, 1.0, generator=generator)


def differences(want: Any, got: Any, where: str) -> list[str]:
    """Where ``got`` (restored) differs from ``want`` (saved): tensors by value, dtype and shape, the rest by repr."""
    import torch

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return a.dtype == b.dtype and torch.equal(a, b)
        return a == b

    return [f"{where}: {name} differs after the restore" for name, (a, b) in _pairs(want, got) if not same(a, b)]


def _pairs(want: Any, got: Any, name: str = "") -> Iterator[tuple[str, tuple[Any, Any]]]:
    import torch

    if isinstance(want, dict) and isinstance(got, dict) and want.keys() == got.keys():
        for key in want:
            yield from _pairs(want[key], got[key], f"{name}.{key}" if name else str(key))
    elif isinstance(want, (list, tuple)) and not isinstance(want, torch.Size) and type(want) is type(got) \
            and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            yield from _pairs(a, b, f"{name}[{i}]")
    elif isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor) or type(want) is not type(got):
        yield name or "state", (want, got)
    else:
        yield name or "state", (repr(want), repr(got))


def state_of(shard: Any, seed: int) -> Any:
    """The shard's state dict with random data, the same for the same file and seed (saved, then compared)."""
    import torch

    generator = torch.Generator().manual_seed(stable_seed("emulate", seed, shard.path))

    def random(numel: int, dtype: Any) -> Any:
        return torch.empty(numel, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)

    return materialize(shard.state, random)

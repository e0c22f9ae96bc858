"""What ``deepspeed.initialize`` spends its time on: DeepSpeed's own set-up stages, and the collectives it waits in.

``deepspeed.initialize`` is the largest restart part of a small model (8.8-14.6 s of a 17-25 s tiny restart on a
2-core machine), and one number says nothing of why. ``timed_stages()`` wraps, for the duration of its ``with``
block only, the functions that make up the engine's construction and the ``torch.distributed`` calls that wait for
other ranks, and restores every original as it leaves (also when the block raises).

What is timed, each as its **own** time (a stage's time less that of the timed stages and collectives it called, so
that the figures add up and none is counted twice):

- ``parts`` (work, in seconds): ``ds_config`` (``DeepSpeedConfig.__init__``: parsing and checking the JSON),
  ``engine_init`` (the rest of ``DeepSpeedEngine.__init__``: sanity checks, hooks, timers), ``distributed_model``
  (``_configure_distributed_model``: the module to its device, data-parallel groups), ``broadcast_model``
  (``_broadcast_model``, without its broadcasts), ``configure_optimizer`` (``_configure_optimizer``: choosing and
  wrapping the optimizer), ``basic_optimizer`` (``_configure_basic_optimizer``: the torch or DeepSpeed Adam;
  torch.optim's first optimizer in a process imports ``torch._dynamo``: 2.4 s of constructing a torch AdamW in a
  fresh process on the 2-core CPU machine),
  ``optimizer_sanity_check`` (``_do_optimizer_sanity_check``; in DeepSpeed 0.19.8 it imports the ZeRO Muon optimizer,
  whose ``torch.compile`` decorators import ``torch._inductor``: about 1 s of imports inside the call, seen on the
  tiny model),
  ``zero_optimizer`` (``_configure_zero_optimizer``: ZeRO's flat buffers and partitions), ``bf16_optimizer`` and
  ``fp16_optimizer`` (their wrappers), ``lr_scheduler`` (``_configure_lr_scheduler``), ``checkpointing``
  (``_configure_checkpointing``: DeepSpeed's checkpoint engine), ``pipeline_init`` (the rest of
  ``PipelineEngine.__init__``: buffers, parameter counts), ``pipe_p2p_groups`` (``p2p.init_process_groups``, without
  the groups it creates). A stage that did not run this time is absent.
- ``collectives`` ({name: {"calls", "s"}}) and their sum ``collective_wait_s``: the time inside
  ``torch.distributed``'s blocking collectives (barrier, broadcast, all_reduce, all_gather, reduce, gather, scatter,
  reduce_scatter, all_to_all, send, recv, their object and coalesced forms) and in ``new_group``. A collective returns
  when the slowest rank of its group has joined, so its time is mostly waiting for slower ranks (on the tiny model
  the transfers themselves are bytes); ``new_group`` waits likewise in its rendezvous with the group's other ranks.
- ``other_s``: the rest of the timed block (``deepspeed.initialize`` outside the engine's construction, and the
  engine's work in functions not listed above), so that ``parts + collective_wait_s + other_s = timed_s``.

What is not timed: calls made with ``async_op=True`` (and ``isend``/``irecv``) are counted with their launch only,
their wait falls where it is waited for (DeepSpeed's initialize makes none on the study's configurations); calls
from other threads than the one that entered the block; collectives torch makes inside its own functions (a
``new_group``'s internal barrier is part of ``new_group``'s time). Wrapping costs two clock readings per call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

STAGES = {
    "DeepSpeedConfig.__init__": "ds_config",
    "DeepSpeedEngine.__init__": "engine_init",
    "DeepSpeedEngine._configure_distributed_model": "distributed_model",
    "DeepSpeedEngine._broadcast_model": "broadcast_model",
    "DeepSpeedEngine._configure_optimizer": "configure_optimizer",
    "DeepSpeedEngine._configure_basic_optimizer": "basic_optimizer",
    "DeepSpeedEngine._do_optimizer_sanity_check": "optimizer_sanity_check",
    "DeepSpeedEngine._configure_zero_optimizer": "zero_optimizer",
    "DeepSpeedEngine._configure_bf16_optimizer": "bf16_optimizer",
    "DeepSpeedEngine._configure_fp16_optimizer": "fp16_optimizer",
    "DeepSpeedEngine._configure_lr_scheduler": "lr_scheduler",
    "DeepSpeedEngine._configure_checkpointing": "checkpointing",
    "PipelineEngine.__init__": "pipeline_init",
    "p2p.init_process_groups": "pipe_p2p_groups",
}
"""``owner.attribute`` -> the part its own time is recorded under."""

COLLECTIVES = ("barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "all_reduce",
               "all_reduce_coalesced", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "gather", "gather_object", "scatter", "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "send", "recv", "new_group")
"""``torch.distributed`` functions whose time is a wait (see the module docstring)."""


@dataclass
class _Frame:
    start: float
    inner: float = 0.0
    """Time spent in timed calls made from this one (subtracted from its own time)."""


@dataclass
class StageTimes:
    """Own times of the stages and collectives called inside one ``timed_stages`` block."""

    parts: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    untimed: list[str] = field(default_factory=list)
    """Stages this DeepSpeed does not have (renamed or removed): nothing was wrapped for them."""
    timed_s: float = 0.0
    _stack: list[_Frame] = field(default_factory=list)

    def enter(self) -> None:
        self._stack.append(_Frame(time.perf_counter()))

    def leave(self) -> float:
        """Close the innermost call; return its own time and count its whole time in its caller's inner time."""
        frame = self._stack.pop()
        elapsed = time.perf_counter() - frame.start
        if self._stack:
            self._stack[-1].inner += elapsed
        return elapsed - frame.inner

    def add_part(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def add_collective(self, name: str, seconds: float) -> None:
        entry = self.collectives.setdefault(name, {"calls": 0, "s": 0.0})
        entry["calls"] += 1
        entry["s"] += seconds

    def fields(self) -> dict[str, Any]:
        """The ``startup.ds_initialize`` span's fields: parts, collective_wait_s, collectives, other_s, timed_s."""
        wait = sum(entry["s"] for entry in self.collectives.values())
        other = max(0.0, self.timed_s - sum(self.parts.values()) - wait)
        return {"parts": {name: round(s, 6) for name, s in self.parts.items()},
                "collective_wait_s": round(wait, 6),
                "collectives": {name: {"calls": entry["calls"], "s": round(entry["s"], 6)}
                                for name, entry in self.collectives.items()},
                "other_s": round(other, 6), "timed_s": round(self.timed_s, 6),
                **({"untimed": self.untimed} if self.untimed else {})}


def owners() -> dict[str, Any]:
    """The classes and modules whose attributes are wrapped, by the name ``STAGES`` and ``COLLECTIVES`` use."""
    import torch.distributed
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.pipe import p2p
    from deepspeed.runtime.pipe.engine import PipelineEngine

    return {"DeepSpeedConfig": DeepSpeedConfig, "DeepSpeedEngine": DeepSpeedEngine, "PipelineEngine": PipelineEngine,
            "p2p": p2p, "torch.distributed": torch.distributed}


def targets() -> list[tuple[Any, str, str, bool]]:
    """(owner, attribute, recorded name, is a collective) of every function ``timed_stages`` wraps."""
    found = owners()
    stages = [(found[owner], attribute, part, False)
              for owner, attribute, part in ((*key.split("."), part) for key, part in STAGES.items())]
    return stages + [(found["torch.distributed"], name, name, True) for name in COLLECTIVES]


@contextmanager
def timed_stages() -> Iterator[StageTimes]:
    """Time DeepSpeed's set-up stages and the collectives called on this thread while the block runs (the module
    docstring says what); every wrapped attribute is set back to its original when the block ends."""
    times = StageTimes()
    thread = threading.get_ident()
    originals: list[tuple[Any, str, Any]] = []
    try:
        for owner, attribute, name, collective in targets():
            original = vars(owner).get(attribute)
            if original is None:
                times.untimed.append(f"{getattr(owner, '__name__', owner)}.{attribute}")
                continue
            originals.append((owner, attribute, original))
            setattr(owner, attribute, _wrapped(original, times, name, collective, thread))
        start = time.perf_counter()
        try:
            yield times
        finally:
            times.timed_s = time.perf_counter() - start
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


def _wrapped(original: Callable[..., Any], times: StageTimes, name: str, collective: bool,
             thread: int) -> Callable[..., Any]:
    record = times.add_collective if collective else times.add_part

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != thread:
            return original(*args, **kwargs)
        times.enter()
        try:
            return original(*args, **kwargs)
        finally:
            record(name, times.leave())

    return timed

"""Fault injection for the fault tests: ``RESTARTBENCH_FAULT=kind:key=value:...`` in a rank's environment.

Kinds (each applies only to the rank given by ``rank=``, default every rank):

- ``kill-in-save:tag=step4`` — during that checkpoint, the first file this rank writes is
  truncated half-way and the process SIGKILLs itself: a rank dying mid-write;
- ``enospc-in-save:tag=step4`` — that checkpoint's first write on this rank fails with
  ``OSError(ENOSPC)`` after writing part of the file: a full disk;
- ``flip-in-save:tag=step4`` — while that checkpoint is saved, one bit of the first tensor of this rank's
  module is flipped, and flipped back when the save returns (synchronous engines): the files and their
  manifest agree, but they hold a state other than the one the rank trained on and recorded in its digest,
  so the restore cannot be proved exact;
- ``hang-before-save:tag=step4`` — the rank sleeps before that checkpoint starts while the others go on
  into the save's collectives: a stalled rank;
- ``hang-before-iteration:step=3`` — the rank sleeps before that training iteration while the others go on
  into its collectives, on the groups DeepSpeed creates (data-, pipeline-, tensor-parallel);
- ``segfault-in-save:tag=step4`` — the rank reads address 0 once that checkpoint's save has begun, and dies of
  SIGSEGV as a fault in an engine's compiled code would kill it (no Python error to record);
- ``kill-in-load`` — the rank SIGKILLs itself when the restore starts reading;
- ``hang-before-init`` — the rank sleeps instead of joining distributed init.

Nothing here runs unless the variable is set. A fault that strikes is recorded first, as a ``fault.injected``
event in the rank's events (``fault``, and ``tag`` where given), just before it acts (the save faults when
they are armed, before the save begins), so a test can time what follows from it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from restartbench.events import Event, EventLog

VARIABLE = "RESTARTBENCH_FAULT"


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, str] = field(default_factory=dict)

    def applies(self, kind: str, rank: int, **match: str) -> bool:
        if self.kind != kind or int(self.params.get("rank", rank)) != rank:
            return False
        return all(self.params.get(key, value) == value for key, value in match.items())


def active_fault() -> Fault | None:
    text = os.environ.get(VARIABLE)
    if not text:
        return None
    kind, *pairs = text.split(":")
    return Fault(kind, dict(pair.split("=", 1) for pair in pairs))


def _strikes(log: EventLog, kind: str, **match: str) -> bool:
    """Whether fault ``kind`` hits this rank here; if it does, it is recorded before it acts."""
    fault = active_fault()
    if not (fault and fault.applies(kind, log.rank, **match)):
        return False
    log.emit(Event.FAULT_INJECTED, fault=kind, **match)
    return True


def hang_before_init(log: EventLog) -> None:
    if _strikes(log, "hang-before-init"):
        time.sleep(10**6)


def hang_before_save(log: EventLog, tag: str) -> None:
    if _strikes(log, "hang-before-save", tag=tag):
        time.sleep(10**6)


def hang_before_iteration(log: EventLog, step: int) -> None:
    if _strikes(log, "hang-before-iteration", step=str(step)):
        time.sleep(10**6)


@contextmanager
def bit_flipped_while_saving(log: EventLog, tag: str, ds_engine: Any) -> Iterator[None]:
    """``flip-in-save``: the lowest bit of the first element of this rank's first module tensor flipped for the
    duration of the save of ``tag``."""
    if not _strikes(log, "flip-in-save", tag=tag):
        yield
        return
    import torch

    first = next(iter(ds_engine.module.state_dict().values()))
    raw = first.detach().view(-1)[:1].view(torch.int16 if first.element_size() == 2 else torch.int32)
    raw ^= 1
    try:
        yield
    finally:
        raw ^= 1


def segfault_in_save(log: EventLog, tag: str) -> None:
    if _strikes(log, "segfault-in-save", tag=tag):
        ctypes.string_at(0)


def kill_in_load(log: EventLog) -> None:
    if _strikes(log, "kill-in-load"):
        os.kill(os.getpid(), signal.SIGKILL)


def save_fault(rank: int, tag: str) -> str | None:
    """The save fault (``kill-in-save`` or ``enospc-in-save``) this rank must suffer in checkpoint ``tag``, if any.
    Engines that never call torch.save apply it in their own writer (half a file written, then die or fail)."""
    fault = active_fault()
    return next((kind for kind in ("kill-in-save", "enospc-in-save")
                 if fault and fault.applies(kind, rank, tag=tag)), None)


def arm_save_fault(log: EventLog, tag: str) -> None:
    """Make this rank's next torch.save of checkpoint ``tag`` die or fail half-way, if a fault asks for it."""
    kind = save_fault(log.rank, tag)
    if kind:
        log.emit(Event.FAULT_INJECTED, fault=kind, tag=tag)
        _patch_torch_save_once(kind)


def _patch_torch_save_once(kind: str) -> None:
    import torch

    original = torch.save

    def failing_save(obj, f, *args, **kwargs):
        torch.save = original
        original(obj, f, *args, **kwargs)
        size = os.path.getsize(f)
        with open(f, "r+b") as handle:
            handle.truncate(size // 2)
        if kind == "kill-in-save":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))

    torch.save = failing_save

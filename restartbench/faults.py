"""Fault injection for the fault tests: ``RESTARTBENCH_FAULT=kind:key=value:...`` in a rank's environment.

Kinds (each applies only to the rank given by ``rank=``, default every rank):

- ``kill-in-save:tag=step4`` — during that checkpoint, the first file this rank writes is
  truncated half-way and the process SIGKILLs itself: a rank dying mid-write;
- ``enospc-in-save:tag=step4`` — that checkpoint's first write on this rank fails with
  ``OSError(ENOSPC)`` after writing part of the file: a full disk;
- ``kill-in-load`` — the rank SIGKILLs itself when the restore starts reading;
- ``hang-before-init`` — the rank sleeps instead of joining distributed init.

Nothing here runs unless the variable is set; the run records the fault in its events.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field

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


def hang_before_init(rank: int) -> None:
    fault = active_fault()
    if fault and fault.applies("hang-before-init", rank):
        time.sleep(10**6)


def kill_in_load(rank: int) -> None:
    fault = active_fault()
    if fault and fault.applies("kill-in-load", rank):
        os.kill(os.getpid(), signal.SIGKILL)


def save_fault(rank: int, tag: str) -> str | None:
    """The save fault (``kill-in-save`` or ``enospc-in-save``) this rank must suffer in checkpoint ``tag``, if any.
    Engines that never call torch.save apply it in their own writer (half a file written, then die or fail)."""
    fault = active_fault()
    return next((kind for kind in ("kill-in-save", "enospc-in-save")
                 if fault and fault.applies(kind, rank, tag=tag)), None)


def arm_save_fault(rank: int, tag: str) -> None:
    """Make this rank's next torch.save of checkpoint ``tag`` die or fail half-way, if a fault asks for it."""
    kind = save_fault(rank, tag)
    if kind:
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

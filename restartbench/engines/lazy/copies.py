"""The lazy engine's host buffer and the copies into it.

The buffer is allocated once per rank and reused by every save (pinned when the state is on CUDA). The copies run
in buffer order, overlapped with training: on CUDA they are queued on a side stream after an event on the compute
stream; on CPU a background thread copies. ``CopyProgress.wait(offset)`` is how the flush, and the optimizer step,
wait for the bytes they need.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from restartbench.engines.lazy.format import LazyRestoreError, SavePlan, TensorSpec, torch_dtype


class HostBuffer:
    """One host buffer per rank, allocated on first use and reused while large enough
    (pinned when the state is on CUDA: pinning is slow, so it is done once)."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.pinned = False
        self.allocations = 0

    def get(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """At least ``nbytes``, uninitialised (its pages are touched by the copies, not here); a pinned buffer
        also serves a request for pageable memory."""
        if self.tensor is None or self.tensor.numel() < nbytes or (pinned and not self.pinned):
            self.tensor = None  # free the old one first
            self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)
            self.pinned = pinned
            self.allocations += 1
        return self.tensor

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host bytes this buffer holds (0 while it is pageable or not allocated)."""
        return self.tensor.numel() if self.pinned and self.tensor is not None else 0


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat uint8 tensor sharing its memory."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def typed_slice(buffer: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
    return buffer[offset:offset + spec.nbytes].view(torch_dtype(spec.dtype)).view(spec.shape)


class CopyProgress:
    """Copies of the live tensors into the host buffer, in buffer order; ``wait(offset)`` returns once
    every byte below ``offset`` is in the buffer. CPU: a background thread; CUDA: a side stream with an
    event every chunk."""

    def __init__(self, plan: SavePlan, tensors: dict[str, torch.Tensor], buffer: torch.Tensor, chunk: int,
                 stream: Any = None):
        self.error: BaseException | None = None
        self._jobs = [(e.buffer_offset, typed_slice(buffer, e.buffer_offset, e.spec), tensors[e.spec.name])
                      for _, e in plan.entries()]
        self._jobs.sort(key=lambda job: job[0])
        self._end = plan.buffer_bytes
        self._sync_end = plan.sync_bytes
        self._chunk = chunk
        if stream is not None:
            self._marks = self._enqueue_cuda(stream)
        else:
            self._done = 0
            self._cond = threading.Condition()
            threading.Thread(target=self._copy_cpu, name="lazy-copy", daemon=True).start()

    def _enqueue_cuda(self, stream: Any) -> list[tuple[int, Any]]:
        """Queue every copy on the side stream after the compute stream's work so far; an event marks each chunk."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(stream.device))
        stream.wait_event(ready)
        marks, since = [], 0
        with torch.cuda.stream(stream):
            for offset, dst, src in self._jobs:
                if src.is_cuda:
                    src.record_stream(stream)  # the allocator must not hand its memory out before the copy ran
                dst.copy_(src, non_blocking=True)
                end = offset + dst.numel() * dst.element_size()
                since += dst.numel() * dst.element_size()
                if since >= self._chunk or end == self._sync_end:
                    marks.append((end, _recorded_event(stream)))
                    since = 0
            marks.append((self._end, _recorded_event(stream)))
        return marks

    def _copy_cpu(self) -> None:
        try:
            for offset, dst, src in self._jobs:
                for start, stop in pieces(dst.numel(), max(1, self._chunk // max(1, dst.element_size()))):
                    if src.is_contiguous():
                        dst.view(-1)[start:stop].copy_(src.reshape(-1)[start:stop])
                    else:
                        dst.copy_(src)
                        stop = dst.numel()
                    self._advance(offset + stop * dst.element_size())
                    if stop == dst.numel():
                        break
            self._advance(self._end)
        except BaseException as error:  # noqa: BLE001 - reported to whoever waits
            with self._cond:
                self.error = error
                self._cond.notify_all()

    def _advance(self, offset: int) -> None:
        with self._cond:
            self._done = max(self._done, offset)
            self._cond.notify_all()

    def wait(self, offset: int | None = None) -> None:
        offset = self._end if offset is None else offset
        if hasattr(self, "_marks"):
            next(event for end, event in self._marks if end >= offset).synchronize()
            return
        with self._cond:
            self._cond.wait_for(lambda: self._done >= offset or self.error is not None)
            if self.error is not None:
                raise LazyRestoreError(f"copy into the host buffer failed: {self.error}") from self.error

    def done(self) -> bool:
        if hasattr(self, "_marks"):
            return self._marks[-1][1].query()
        with self._cond:
            return self._done >= self._end or self.error is not None


def _recorded_event(stream: Any) -> Any:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def pieces(total: int, step: int) -> Iterator[tuple[int, int]]:
    """(start, stop) ranges of ``step`` covering ``total`` (one empty range for 0)."""
    for start in range(0, max(total, 1), step):
        yield start, min(total, start + step)

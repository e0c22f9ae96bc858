"""What every span of a real rank records of memory: host RSS always, and on CUDA the device's allocated peak.

``RankWatch`` is the ``events.SpanWatch`` a rank program gives its ``EventLog``: the host figures come from
``restartbench.memwatch.MemoryWatch`` (``peak_rss_bytes``, ``rss_resolution_s``); once ``watch_cuda`` is called
(after the imports span, on a CUDA run) every span also records ``cuda_max_allocated_bytes``, torch's
``max_memory_allocated`` of the rank's device with its peak reset at the span's start. On CPU it adds nothing.

This module imports only the standard library at load time (the rank programs import it before the imports span);
torch is imported by ``watch_cuda``. CUDA is never initialised by the watch itself: a span that begins before the
rank's first CUDA call resets nothing (nothing is allocated yet), and one that ends before it records 0.
"""

from __future__ import annotations

from typing import Any

from restartbench.memwatch import MemoryWatch


class RankWatch:
    """Host RSS peaks (``MemoryWatch``) and, after ``watch_cuda``, the CUDA allocator's peak per span. Spans may
    nest: resetting the device's peak for an inner span first folds the peak so far into the enclosing ones."""

    def __init__(self, host: MemoryWatch):
        self.host = host
        self._cuda: Any = None
        self._device: Any = None
        self._open: list[int] = []
        """Per open span, innermost last: the device peak seen before the last reset."""

    def watch_cuda(self, device_index: int) -> None:
        """Record the CUDA allocator's peak of device ``device_index`` from the next span on."""
        import torch

        self._cuda, self._device = torch.cuda, torch.device("cuda", device_index)

    def span_begin(self) -> None:
        self.host.span_begin()
        if self._cuda is not None:
            self._fold(self._cuda_peak())
            if self._cuda.is_initialized():
                self._cuda.reset_peak_memory_stats(self._device)
            self._open.append(0)

    def span_fields(self, start: float) -> dict[str, Any]:
        fields = self.host.span_fields(start)
        if self._cuda is not None and self._open:
            now = self._cuda_peak()
            fields["cuda_max_allocated_bytes"] = max(self._open.pop(), now)
            self._fold(now)
        return fields

    def timeline(self, start: float) -> list[list[float]]:
        return self.host.timeline(start)

    def _cuda_peak(self) -> int:
        return self._cuda.max_memory_allocated(self._device) if self._cuda.is_initialized() else 0

    def _fold(self, peak: int) -> None:
        """The device peak so far belongs to every open span too."""
        self._open[:] = [max(seen, peak) for seen in self._open]

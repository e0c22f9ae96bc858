"""A rank's memory over time and its peak in each timed part: resume is where training runs out of memory.

A daemon thread samples the process's resident set size (``/proc/self/statm``, the kernel's own count of resident
pages) every ``SAMPLE_INTERVAL_S`` (100 Hz); a span's peak is the largest sample taken while it ran, and one taken
as it ends, so a part shorter than the interval still has its end measured. A peak between two samples that is gone
by the next one is missed: the resolution is stated with every figure (``resolution_s``). Stdlib only: the rank
programs import it before torch, whose import time is measured.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

SAMPLE_INTERVAL_S = 0.01
"""100 Hz: the issue asks for 50 Hz or more; reading statm costs microseconds."""
MAX_SAMPLES = 360_000
"""An hour of samples at 100 Hz; older ones are dropped (a phase's spans are long over by then)."""
TIMELINE_POINTS = 400
"""Samples kept in a ``rank.memory`` event: the timeline the report draws, thinned evenly."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


_STATM = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
"""Opened once: a file opened and closed 100 times a second by the sampler would show, now and then, as one more
open file in the rank's resources (the soak test's handle count)."""


def rss_bytes() -> int:
    """This process's resident set size now."""
    return int(os.pread(_STATM, 64, 0).split()[1]) * _PAGE


class MemoryWatch:
    """Samples this process's RSS from a daemon thread until ``stop``; answers the peak since a wall-clock time."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self._samples: deque[tuple[float, int]] = deque(maxlen=MAX_SAMPLES)
        self._lock = threading.Lock()
        """Held to append and to walk the samples (a deque may not change while it is iterated)."""
        self._starts: list[int] = []
        """The RSS at the start of each open span, innermost last (spans nest)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="restartbench-memwatch", daemon=True)

    def start(self) -> MemoryWatch:
        self._samples.append((time.time(), rss_bytes()))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = (time.time(), rss_bytes())
            with self._lock:
                self._samples.append(sample)

    def peak_since(self, start: float) -> int:
        """The largest RSS sampled at or after wall-clock ``start``, and now. Walks back from the newest sample only
        as far as ``start``: a span's end costs its own samples, not the hour the buffer holds."""
        peak = rss_bytes()
        with self._lock:
            for when, rss in reversed(self._samples):
                if when < start:
                    break
                peak = max(peak, rss)
        return peak

    def span_begin(self) -> None:
        """A span starts: its RSS now, its start figure (the peak needs no reset: the samples carry their times)."""
        self._starts.append(rss_bytes())

    def span_fields(self, start: float) -> dict[str, Any]:
        """What a span that began at wall-clock ``start`` records of memory (``EventLog`` adds it to every span): its
        peak, the resolution, and the RSS it started from (``start_rss_bytes``: peak - start is what the part added)."""
        fields = {"peak_rss_bytes": self.peak_since(start), "rss_resolution_s": self.interval_s}
        if self._starts:
            fields["start_rss_bytes"] = self._starts.pop()
            fields["peak_rss_bytes"] = max(fields["peak_rss_bytes"], fields["start_rss_bytes"])
        return fields

    def timeline(self, start: float) -> list[list[float]]:
        """[[seconds since ``start``, RSS bytes], ...] from ``start`` on, thinned to ``TIMELINE_POINTS``."""
        with self._lock:
            samples = [(when, rss) for when, rss in self._samples if when >= start]
        step = max(1, -(-len(samples) // TIMELINE_POINTS))  # ceiling: at most TIMELINE_POINTS
        return [[round(when - start, 4), rss] for when, rss in samples[::step]]

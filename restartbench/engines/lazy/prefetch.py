"""The lazy engine's early read on a relaunch (``--lazy-prefetch``, ``EngineInfo.prefetcher``).

A restart's parts run one after another: the model is built, DeepSpeed initializes, the engine sets up, and only then
does the load read the checkpoint. None of the start-up needs the checkpoint's bytes, and none of the read needs the
model: the read needs only the rank's file names, which its place in the layout gives before the model exists
(``restartbench.model.rank_coordinates``). So, once the harness has chosen the checkpoint and evicted it from the
page cache, ``Prefetch`` reads this rank's files into the engine's host buffer on a thread of its own (allocated,
and pinned on CUDA, there too), and the load then waits for what is left of that and copies each tensor out
(``LazyEngine.load_into``). A restart then takes about the longer of the start-up and the read, not their sum.

Nothing is hidden by it: the load's record says the read was prefetched and holds the read's own time
(``load_fields``), the analysis takes the read throughput from that time, and a prefetch that was not used, or
failed, is recorded with the reason and the load reads as without it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch

from restartbench.engines.base import FileRecord, RankPlace
from restartbench.engines.lazy.capture import model_file_name, optim_file_name
from restartbench.engines.lazy.copies import HostBuffer
from restartbench.engines.lazy.options import direct_io
from restartbench.engines.lazy.restore import checked_header, read_regions, region_bases, region_of


class Prefetch:
    """This rank's files of ``<folder>/<tag>`` (``names``) read into ``buffer`` in the background: their data
    regions one after the other, as ``read_into_direct`` lays them out. ``wait`` returns once they are all in."""

    def __init__(self, folder: Path, tag: str, names: list[str], buffer: HostBuffer, *, pinned: bool,
                 device: str, io_threads: int, chunk: int, direct: bool):
        self.folder, self.tag, self.names, self.buffer = folder, tag, names, buffer
        self.pinned, self.device, self.direct = pinned, device, direct
        self.io_threads, self.chunk = io_threads, chunk
        self.heads: list[tuple[dict[str, Any], int]] = []
        """Each file's header and its data region's offset, in ``names``' order."""
        self.bases: list[int] = []
        """Where each file's data region starts in the buffer."""
        self.records: list[FileRecord] = []
        self.error: BaseException | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.setup_s: float | None = None
        """The buffer's allocation (fault-in, and pinning on CUDA)."""
        self.read_s: float | None = None
        """The reads alone: first piece asked to last piece in."""
        self._thread = threading.Thread(target=self._run, name="lazy-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.device.startswith("cuda"):
                torch.cuda.set_device(torch.device(self.device))  # a thread's current device is its own
            paths = [self.folder / self.tag / name for name in self.names]
            self.heads = [checked_header(path, self.tag) for path in paths]
            self.bases, total = region_bases([header for header, _ in self.heads])
            regions = [region_of(path, data_offset, header, base, [], self.direct)
                       for path, (header, data_offset), base in zip(paths, self.heads, self.bases, strict=True)]
            start = time.perf_counter()
            buffer = self.buffer.get(total, pinned=self.pinned)
            self.setup_s = time.perf_counter() - start
            self.records = read_regions(regions, buffer, self.chunk, self.io_threads, self.direct)
            self.read_s = time.perf_counter() - start - self.setup_s
        except BaseException as error:  # noqa: BLE001 - reported by wait and in the load's record
            self.error = error
        finally:
            self.ended_at = time.time()

    def wait(self) -> float:
        """Block until the reads have ended; the seconds waited. Does not raise: ``error`` says what failed."""
        start = time.perf_counter()
        self._thread.join()
        return time.perf_counter() - start

    def done(self) -> bool:
        return not self._thread.is_alive()

    def serves(self, folder: Path, jobs: list[tuple[Path, int, dict[str, Any], Any]]) -> bool:
        """Whether this prefetch read, without error, the files a load of ``folder`` (the checkpoint's own folder)
        reads (``jobs``: each file, its data region's offset and its header, as the load found them)."""
        return (self.error is None and folder == self.folder / self.tag
                and [path.name for path, *_ in jobs] == self.names
                and [(header, offset) for _, offset, header, _ in jobs] == self.heads)

    def fields(self) -> dict[str, Any]:
        """What was started, for the ``restore.prefetch`` record."""
        return {"files": list(self.names), "direct_io": self.direct, "pinned": self.pinned}

    def outcome(self, used: bool, waited_s: float) -> dict[str, Any]:
        """What the load adds to its record (``LazyEngine.load_fields``)."""
        fields = {"prefetched": used, "prefetch_wait_s": waited_s, "prefetch_setup_s": self.setup_s,
                  "prefetch_read_s": self.read_s, "prefetch_started": self.started_at,
                  "prefetch_ended": self.ended_at, "prefetch_bytes": sum(r.bytes for r in self.records)}
        if self.error is not None:
            fields["prefetch_error"] = f"{type(self.error).__name__}: {self.error}"
        return fields


class LazyPrefetcher:
    """The lazy engine's ``restartbench.engines.base.Prefetcher``."""

    def enabled(self, options: Any) -> bool:
        return bool(options.lazy_prefetch)

    def start(self, options: Any, folder: str, tag: str, place: RankPlace) -> Prefetch:
        """Read the files a load of ``tag`` in this layout reads on this rank: its optimizer file, and its module
        file unless a replica reads it (``dp_read_once``: data-parallel rank 0 reads it and broadcasts)."""
        names = [optim_file_name(place.pp, place.tp, place.dp)]
        if not options.dp_read_once or place.dp == 0:
            names.append(model_file_name(place.pp, place.tp))
        return Prefetch(Path(folder), tag, names, HostBuffer(page_aligned=direct_io(options, "cpu")),
                        pinned=place.device.startswith("cuda"), device=place.device,
                        io_threads=max(1, options.lazy_io_threads), chunk=max(1, options.lazy_chunk_mb) * 2**20,
                        direct=direct_io(options, place.device))


PREFETCHER = LazyPrefetcher()

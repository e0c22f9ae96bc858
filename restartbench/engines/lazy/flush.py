"""The lazy engine's streamed flush: a writer thread writes each file's header, then each chunk of its data
region as soon as the copies covering it are in the host buffer, ``io_threads`` writes in flight; then it fsyncs
every file and the folders. Fault injection (restartbench.faults) strikes in the middle of the first file.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from restartbench.durability import fsync_dir
from restartbench.engines.base import FileRecord
from restartbench.engines.lazy.copies import CopyProgress, pieces
from restartbench.engines.lazy.format import FilePlan, SavePlan


class Flush:
    """Background writer: header first, then each data chunk once its copies are done, ``io_threads``
    writes in flight; fsync of every file and of the folders; ``durable_at`` when all is on disk."""

    def __init__(self, plan: SavePlan, heads: dict[str, tuple[bytes, int]], buffer: torch.Tensor,
                 progress: CopyProgress, folder: Path, chunk: int, io_threads: int, fault: str | None,
                 direct: bool = False):
        self.plan, self.heads, self.progress, self.folder = plan, heads, progress, folder
        self.chunk, self.io_threads, self.fault, self.direct = chunk, io_threads, fault, direct
        self.memory = buffer.numpy()
        self.records: list[FileRecord] = []
        self.error: BaseException | None = None
        self.durable_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="lazy-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with ThreadPoolExecutor(self.io_threads, thread_name_prefix="lazy-write") as pool:
                for file in self.plan.files:
                    self.records.append(self._write_file(file, pool))
            fsync_dir(self.folder)
            fsync_dir(self.folder.parent)
            self.durable_at = time.perf_counter()
        except BaseException as error:  # noqa: BLE001 - reported by wait_until_durable
            self.error = error

    def _write_file(self, file: FilePlan, pool: ThreadPoolExecutor) -> FileRecord:
        start = time.perf_counter()
        path = self.folder / file.name
        head, data_offset = self.heads[file.name]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        data_fd, pending = fd, []
        try:
            _pwrite_all(fd, memoryview(head), 0)
            if self.fault:
                self._die_or_fail(fd, file, data_offset, path)
            data_fd = open_direct(path) if self.direct else fd
            for lo, hi in pieces(file.data_bytes, self.chunk):
                self.progress.wait(file.buffer_offset + hi)
                view = memoryview(self.memory[file.buffer_offset + lo:file.buffer_offset + hi])
                pending.append(pool.submit(_pwrite_all, data_fd, view, data_offset + lo))
            for write in pending:
                write.result()
            os.fsync(fd)
        finally:
            for write in pending:  # whatever happened, no write may be left running on a closed descriptor
                write.exception()
            if data_fd != fd:
                os.close(data_fd)
            os.close(fd)
        return FileRecord(str(path), data_offset + file.data_bytes, time.perf_counter() - start)

    def _die_or_fail(self, fd: int, file: FilePlan, data_offset: int, path: Path) -> None:
        """Fault injection (restartbench.faults): half of the first file is written, then the rank dies
        or the disk is full."""
        half = file.data_bytes // 2
        self.progress.wait(file.buffer_offset + half)
        _pwrite_all(fd, memoryview(self.memory[file.buffer_offset:file.buffer_offset + half]), data_offset)
        os.fsync(fd)
        if self.fault == "kill-in-save":
            os.kill(os.getpid(), signal.SIGKILL)
        self.fault = None
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def join(self) -> None:
        self._thread.join()

    def done(self) -> bool:
        """The writes (and the copies they wait for) have ended, well or not: ``join`` would not wait."""
        return not self._thread.is_alive()


def open_direct(path: Path, access: int = os.O_WRONLY) -> int:
    """A descriptor of ``path`` with O_DIRECT, for its data region: a second one for the writes (``access``
    O_WRONLY), each going from the host buffer to the device without a copy into the page cache; or one for the
    reads of a restore (O_RDONLY). The buffer, the offsets and the lengths are all multiples of FILE_ALIGN (4096) by
    the format, as O_DIRECT needs; the fsync after the writes still makes them durable (the device's cache, the
    file's size)."""
    try:
        return os.open(path, access | os.O_DIRECT)
    except OSError as error:
        raise OSError(error.errno, f"{path}: the file system refuses O_DIRECT ({error.strerror}): run with "
                      "--no-lazy-direct-io (on CUDA it is on by default), or put the checkpoints on a file system "
                      "that takes it (tmpfs does not)", str(path)) from None


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` at ``offset`` (``os.pwrite`` may write less than asked)."""
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written

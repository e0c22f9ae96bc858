"""The lazy engine's host buffer and the copies into it.

The buffer is allocated once per rank and reused by every save (pinned when the state is on CUDA). The copies run
in buffer order, overlapped with training: on CUDA they are queued on a side stream after an event on the compute
stream; on CPU a background thread copies. ``CopyProgress.wait(offset)`` is how the flush, and the optimizer step,
wait for the bytes they need.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from restartbench.engines.lazy.format import LazyRestoreError, SavePlan, TensorSpec, torch_dtype
from restartbench.launchers import cpu_share


class HostBuffer:
    """One host buffer per rank, allocated on first use and reused while large enough (pinned when the state is on
    CUDA: pinning is slow, so it is done once).

    A pinned buffer is pageable memory page-locked in place with ``cudaHostRegister`` (``pin_pages``), not
    ``torch.empty(..., pin_memory=True)``: that goes through torch's caching host allocator, which rounds each
    request up to a power of two (a 21 GB buffer pins 32 GiB) and, when the tensor is dropped, keeps the block in
    its cache rather than giving it back, so a buffer that grows would keep both. Here exactly the request's pages
    are pinned, ``pinned_bytes`` says how many, and ``release`` unpins them and frees the memory."""

    def __init__(self, page_aligned: bool = False) -> None:
        self.tensor: torch.Tensor | None = None
        self.pinned = False
        self.allocations = 0
        self.page_aligned = page_aligned
        """A pageable buffer is an anonymous mapping (page-aligned, as O_DIRECT needs) rather than ``torch.empty``'s
        64-byte-aligned block, faulted in when it is allocated (``fault_in``); a pinned one always is both."""
        self._pinned: PinnedPages | None = None

    def get(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """At least ``nbytes``, uninitialised; a pinned buffer also serves a request for pageable memory. A
        ``torch.empty`` buffer's pages are touched by the copies, not here (the first save's copies pay for it, in the
        background); a pinned one's are faulted in by ``fault_in`` before they are registered, and so are a
        page-aligned one's (``--lazy-direct-io``), at set-up as on CUDA: it is the restore's I/O buffer too, and an
        O_DIRECT read into pages not there yet faults them in inside the load (bench/lazy_io.py, 2-core CPU machine,
        2.2 GB: a cold restore of 4.0 s so, 0.9 s after a set-up of 3.3 s)."""
        if self.tensor is None or self.tensor.numel() < nbytes or (pinned and not self.pinned):
            self.release()  # unpin and free the old one first
            if pinned:
                self._pinned = pin_pages(max(nbytes, 1))
                self.tensor = self._pinned.tensor
            elif self.page_aligned:
                length = pinned_length(max(nbytes, 1))
                block = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                self.tensor = torch.frombuffer(block, dtype=torch.uint8, count=max(nbytes, 1))
                fault_in(self.tensor.data_ptr(), length)
            else:
                self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            self.pinned = pinned
            self.allocations += 1
        return self.tensor

    def release(self) -> None:
        """Unpin the buffer's pages (if pinned) and drop it: its memory goes back to the system."""
        if self._pinned is not None:
            self._pinned.unpin()
            self._pinned = None
        self.tensor, self.pinned = None, False

    @property
    def pinned_bytes(self) -> int:
        """Page-locked host bytes this buffer holds: the request rounded up to whole pages (0 while pageable or not
        allocated)."""
        return self._pinned.length if self._pinned is not None else 0


PAGE = os.sysconf("SC_PAGE_SIZE")


def pinned_length(nbytes: int, page: int = PAGE) -> int:
    """Bytes ``cudaHostRegister`` locks for an ``nbytes`` buffer: the request rounded up to whole pages."""
    if nbytes < 1 or page < 1:
        raise ValueError(f"pinned_length needs nbytes >= 1 and page >= 1, got nbytes={nbytes}, page={page}")
    return -(-nbytes // page) * page


class PinnedPages:
    """``nbytes`` of anonymous host memory (an ``mmap`` of ``length`` bytes, page-aligned), page-locked with
    ``cudaHostRegister`` from its first byte: the tensor's storage starts on the first locked page, so torch's own
    ``is_pinned`` (which looks at the storage's start) says so. The first H100 visit (2026-11-26) found that a
    ``torch.empty`` block pinned from its first page boundary inward was locked but not ``is_pinned``.

    Its pages are faulted in by ``fault_in`` (``fault_threads`` threads) before they are registered; ``fault_s`` and
    ``register_s`` time the two steps. ``prefault=False`` leaves the faulting to ``cudaHostRegister``, on one thread
    (``fault_threads`` 0). By default (``huge_pages``) the memory is private, advised to the kernel for transparent
    huge pages (``MADV_HUGEPAGE``: a fault zero-fills 2 MiB at once where the kernel allows it, else this is plain
    private memory) and not inherited by a forked child (``MADV_DONTFORK``, as RDMA libraries do for registered
    memory). The third H100 visit's probe (bench/results/2026-11-27-h100-gpu-probe, 4 GiB, 16 threads) pinned it at
    0.05 s/GiB, against 0.31 s/GiB for a shared mapping (Python's ``mmap.mmap(-1, ...)``, shmem pages, which the
    engine used before), and copied into either at 55 GB/s: for a 1B rank's 19.5 GiB, about 1 s of set-up instead
    of 6. ``huge_pages=False`` keeps the shared mapping (``bench/gpu_probe.py`` times both).

    The pages stay registered until ``unpin``, or until this object is collected: a registration outliving its
    mapping is not harmless. The same visit's GPU tests dropped engines without unpinning, and CUDA took a later
    mapping at the same address for memory it had already locked: ``cudaHostRegister`` of it failed (error 712,
    already registered), and in a later test the digest of a CUDA tensor, copied to the host through a fresh
    buffer, no longer matched its host copy's, as a copy into the old locked pages instead of the new ones would."""

    def __init__(self, nbytes: int, prefault: bool = True, huge_pages: bool = True):
        self.length = pinned_length(nbytes)
        """Bytes page-locked: ``nbytes`` rounded up to whole pages."""
        self._block: mmap.mmap | None = private_huge(self.length) if huge_pages else mmap.mmap(-1, self.length)
        self.tensor: torch.Tensor | None = torch.frombuffer(self._block, dtype=torch.uint8, count=nbytes)
        self.address = self.tensor.data_ptr()
        start = time.perf_counter()
        self.fault_threads = fault_in(self.address, self.length) if prefault else 0
        self.fault_s = time.perf_counter() - start
        cuda_call("cudaHostRegister", self.address, self.length, 0)  # 0: cudaHostRegisterDefault
        self.register_s = time.perf_counter() - start - self.fault_s
        # Runs once: at unpin, or when this object is collected, while it still holds the mapping (not at exit,
        # where the process's end frees both).
        self._unregister = weakref.finalize(self, cuda_call, "cudaHostUnregister", self.address)
        self._unregister.atexit = False

    def unpin(self) -> None:
        """Unlock the pages and drop this object's hold on them: the mapping is unmapped once no tensor views it."""
        self._unregister()
        self._block = self.tensor = None


def private_huge(length: int) -> mmap.mmap:
    """``length`` bytes of private anonymous memory, advised for transparent huge pages and not to be forked."""
    block = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block.madvise(mmap.MADV_HUGEPAGE)
    block.madvise(mmap.MADV_DONTFORK)
    return block


def pin_pages(nbytes: int, prefault: bool = True, huge_pages: bool = True) -> PinnedPages:
    """Allocate ``nbytes`` of host memory and page-lock exactly its pages (CUDA only). On the first H100 visit, a
    shared mapping without ``fault_in`` took about 0.39 s per GiB (21 GB: 8.2 s at set-up in training, 7.7 s in the
    restart); on the third, with it, 0.31 s per GiB, and private huge-page memory with it 0.05 s per GiB
    (``bench/gpu_probe.py``'s ``engine_pin``): the default since."""
    return PinnedPages(nbytes, prefault, huge_pages)


FAULT_THREADS = 16
"""At most this many threads fault a buffer in (the GPU machine has 16 cores)."""
FAULT_SLICE_MIN = 64 * 2**20
"""A thread faults in at least this many bytes (a small buffer is one thread's work)."""


def fault_threads() -> int:
    """Threads ``fault_in`` uses: this rank's share of the node's CPUs (``launchers.cpu_share``: the ranks on a node
    set up their engines at once), at most ``FAULT_THREADS``."""
    return min(cpu_share(), FAULT_THREADS)


def fault_in(address: int, length: int, threads: int | None = None) -> int:
    """Write zeros over the ``length`` bytes at ``address`` (a page-aligned, fresh anonymous mapping, so zero already),
    each of up to ``threads`` threads (default ``fault_threads()``) its own page-aligned slice; returns the threads
    used.

    Why: ``cudaHostRegister`` of a fresh mapping faults in, and the kernel zero-fills, every page on the one calling
    thread. Faults on different pages run in parallel, and ``ctypes.memset`` releases the GIL, so the threads fault
    the pages in together and registering then only locks pages that exist. On this study's 2-core CPU machine (busy),
    2 threads faulted a 2 GiB mapping in at best 0.83 s/GiB, 1 thread at 1.37 s/GiB; the GPU machine's 16 cores are
    not measured yet (``bench/gpu_probe.py``'s ``engine_pin``: the next visit checks it)."""
    threads = max(1, min(threads or fault_threads(), length // FAULT_SLICE_MIN))
    step = -(-length // (threads * PAGE)) * PAGE
    slices = [(address + start, min(step, length - start)) for start in range(0, length, step)]
    with ThreadPoolExecutor(len(slices), thread_name_prefix="lazy-fault-in") as pool:
        list(pool.map(lambda piece: ctypes.memset(piece[0], 0, piece[1]), slices))
    return len(slices)


def cuda_call(name: str, *args: int) -> None:
    """The CUDA runtime's ``name`` called with ``args``; LazyRestoreError where it fails. Public: tests replace it."""
    error = int(getattr(torch.cuda.cudart(), name)(*args))
    if error != 0:
        size = f" of {args[1]} bytes" if len(args) > 1 else ""
        raise LazyRestoreError(f"{name}{size} failed with CUDA error {error}: the lazy engine could not pin (or "
                               "unpin) its host buffer. Check the host's free memory and the locked-memory limit "
                               "(ulimit -l), or lower the state per rank (more ranks, or a smaller preset).")


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
        self._marks: list[tuple[int, Any]] | None = None
        """CUDA: (buffer offset, the event recorded once the bytes below it are copied), per chunk."""
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
        if self._marks is not None:
            next(event for end, event in self._marks if end >= offset).synchronize()
            return
        with self._cond:
            self._cond.wait_for(lambda: self._done >= offset or self.error is not None)
            if self.error is not None:
                raise LazyRestoreError(f"copy into the host buffer failed: {self.error}") from self.error

    @property
    def on_gpu(self) -> bool:
        """The copies run on a CUDA side stream (else a host thread copies)."""
        return self._marks is not None

    def gate(self, stream: Any) -> GpuWait:
        """Make ``stream`` (the compute stream, at the optimizer step) wait for every copy on the GPU, the host going
        on at once; the returned ``GpuWait`` times that wait on the GPU's clock."""
        return GpuWait(stream, self._marks[-1][1])

    def done(self) -> bool:
        if self._marks is not None:
            return self._marks[-1][1].query()
        with self._cond:
            return self._done >= self._end or self.error is not None


class GpuWait:
    """The compute stream's wait for the copies, timed on the GPU: a timing event at the step's entry (the GPU reaches
    it when the forward and backward queued before it are done), ``wait_event`` on the copies' last event, and a timing
    event after it. The host never blocks; ``seconds`` is read once the step's iteration has run (``done``)."""

    def __init__(self, stream: Any, copies_done: Any):
        self.at = time.time()
        """Wall time at which the host reached the step: the wait belongs to the iteration running then."""
        self._ready = _recorded_event(stream, timing=True)
        stream.wait_event(copies_done)
        self._resumed = _recorded_event(stream, timing=True)

    def done(self) -> bool:
        return self._resumed.query()

    def seconds(self) -> float:
        """Blocks until the step has passed the wait (at once after its iteration ended)."""
        self._resumed.synchronize()
        return gpu_wait_s(self._ready.elapsed_time(self._resumed))


def gpu_wait_s(elapsed_ms: float) -> float:
    """Seconds the compute stream stood still for the copies, from ``cudaEventElapsedTime`` (ms) between the event
    recorded before its wait and the one after: max(0, copies done - compute ready). Only the wait lies between the
    two events on that stream, so this is the wait itself; a negative reading (events resolve to about 0.5 us) is 0."""
    return max(0.0, elapsed_ms) / 1e3


def _recorded_event(stream: Any, timing: bool = False) -> Any:
    event = torch.cuda.Event(enable_timing=timing)
    event.record(stream)
    return event


def pieces(total: int, step: int) -> Iterator[tuple[int, int]]:
    """(start, stop) ranges of ``step`` covering ``total`` (one empty range for 0)."""
    for start in range(0, max(total, 1), step):
        yield start, min(total, start + step)

"""restartbench's own checkpoint engine (``--engine lazy``): a lazy, asynchronous checkpoint whose
stall is little more than the copy out of device memory.

How a save goes (learned from DataStates-LLM, ByteCheckpoint and PyTorch DCP's async_save;
none of their code is used):

1. ``save`` collects references to the tensors this rank holds (module parameters and buffers,
   the ZeRO optimizer's fp32 partition and moments) and snapshots the small plain values
   (step counters, learning rate, scheduler state). It looks the **save plan** up by the
   tensors' names, dtypes and shapes: offsets in the host buffer and in the files are computed
   once and reused while they do not change.
2. It starts the copies into one **host buffer allocated once**, at engine set-up (``prepare``: out
   of any save's stall) and reused by every save (pinned on CUDA, a plain
   preallocated buffer on CPU): on CUDA they are queued on a side stream
   after an event on the compute stream; on CPU a background thread copies. Module buffers
   (which a forward pass may change) are copied before ``save`` returns; everything else is
   only modified by the optimizer step, so ``save`` returns at once and the copies overlap the
   next iteration's forward and backward.
3. The optimizer step is guarded: ``ds_engine.optimizer.step`` is wrapped, on this instance
   only, so that the step first waits for the copies still in flight. The time waited there is
   the rest of the stall: ``stall_extra_s``, ``copy_waits`` and the ``on_copy_wait`` callback
   report it (``save``'s own duration is what the harness records as the stall). On CUDA the
   compute stream waits on the GPU, the host going on, and the wait is timed on the GPU's clock.
4. A writer thread streams the buffer to the files while copies are still arriving: it writes
   each chunk (``lazy_chunk_mb``, aligned) as soon as the copies covering it are done, with
   ``lazy_io_threads`` writes in flight, then fsyncs every file and the folder.
   ``wait_until_durable`` returns when that is done.

Files (format: docs/lazy-format.md): data-parallel rank 0 of each (pipeline stage, tensor
slice) writes ``model_ppPP_tpTT.lazy``, the module state its replicas share (deduplicated
across data-parallel replicas, as ZeRO-1 replicates it); every rank writes
``optim_ppPP_tpTT_dpDDD.lazy``, its own optimizer partition and plain state.

Restore reads with threads (``os.preadv`` scatter reads, straight into the tensors DeepSpeed
holds on CPU, through the pinned buffer on CUDA) and restores in place; optimizer moments that
do not exist yet in a fresh process are created where the optimizer would create them. With
``dp_read_once`` only data-parallel rank 0 reads the module file and broadcasts it to its replicas.
A checkpoint written in another parallel layout (tp, pp or dp; its file names say which) is resharded as it is
read, each rank reading only the byte ranges that hold its elements (``reshard.py``). With ``lazy_prefetch`` a
relaunch's files are read from before the model is built (``prefetch.py``), and the load copies them out.

The engine's parts, in this folder: ``format.py`` (the save plan and the file format, pure),
``capture.py`` (what a rank saves), ``copies.py`` (the host buffer and the copies into it),
``flush.py`` (the streamed writer), ``restore.py`` (header checks, plain state, parallel reads),
``reshard.py`` (the load in another layout), ``prefetch.py`` (the early read on a relaunch);
this module ties them together in ``LazyEngine``.

The capture shares its module and counter reads with the DCP and TorchSnapshot engines
(restartbench/engines/harness_state.py); the rest of it stays its own (said there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from restartbench.config import EngineConfig
from restartbench.engines.base import CheckpointEngine, FileRecord, guard_optimizer_step
from restartbench.engines.lazy.capture import Capture, RankLayout, capture, file_meta, rank_layout, state_to_come
from restartbench.engines.lazy.copies import CopyProgress, GpuWait, HostBuffer
from restartbench.engines.lazy.flush import Flush
from restartbench.engines.lazy.format import LazyRestoreError, SavePlan, encode_header, make_plan, plan_signature
from restartbench.engines.lazy.options import direct_io
from restartbench.engines.lazy.prefetch import Prefetch
from restartbench.engines.lazy.reshard import layout_name, load_resharded, saved_sizes
from restartbench.engines.lazy.restore import (
    broadcast_tensors,
    check_same_names,
    checked_header,
    copy_out,
    read_into,
    read_into_direct,
    restore_plain_and_targets,
)
from restartbench.faults import save_fault


class LazyEngine(CheckpointEngine):
    """``--engine lazy``: see the module docstring."""

    asynchronous = True

    def __init__(self, options: EngineConfig):
        self.options = options
        self.chunk = max(1, options.lazy_chunk_mb) * 2**20
        self.io_threads = max(1, options.lazy_io_threads)
        self.buffer = HostBuffer(page_aligned=direct_io(options, "cpu"))  # a pageable buffer: the CPU's
        self.plan: SavePlan | None = None
        self.plans_made = 0
        self._padded_for: SavePlan | None = None
        self._stream = None
        self._copies: CopyProgress | None = None
        self._copies_tag: str | None = None
        self._flush: Flush | None = None
        self._read: list[FileRecord] = []
        self._prefetch: Prefetch | None = None
        """The relaunch's prefetch (``prepare``), until the load has taken it."""
        self._wanted: tuple[int, bool] = (0, False)
        """The host buffer's bytes and pinning, as ``prepare`` sized it for the saves."""
        self._load_fields: dict[str, Any] = {}
        self.copy_waits: list[dict[str, Any]] = []
        """Every wait at the optimizer step for copies still in flight: tag, seconds; each is also reported to
        ``on_copy_wait`` (from the training thread) with the wall time the step began waiting."""
        self.gpu_waits: list[tuple[str | None, GpuWait]] = []
        """CUDA: the compute stream's waits not read yet (the GPU may not have passed them). Public: tests put
        GPU-less stand-ins here."""

    # -- save ----------------------------------------------------------------------

    def prepare(self, ds_engine: Any, prefetched: Prefetch | None = None) -> dict[str, Any]:
        """At engine set-up, out of the first save's stall: the host buffer (pinned when the state is on CUDA) and
        the side stream; what it returns is recorded with the set-up, O_DIRECT or not (``direct_io``) among it. The
        buffer is sized for the state as the first save will find it: the optimizer's moments do not exist before
        its first step (``state_to_come``). A relaunch's prefetch (``--lazy-prefetch``) is setting the buffer up on
        its own thread: it becomes the engine's, and is grown to that size, if it must be, after the load has copied
        the prefetched bytes out."""
        state = capture(ds_engine, rank_layout(ds_engine))
        cuda = any(t.is_cuda for t in state.tensors.values())
        *others, (name, kind, specs) = state.groups  # the optimizer file's group comes last
        sizing = make_plan([*others, (name, kind, specs + state_to_come(ds_engine.optimizer))])
        self._wanted = (sizing.buffer_bytes, cuda)
        if prefetched is None:
            self.buffer.get(sizing.buffer_bytes, pinned=cuda)
        else:
            self._prefetch, self.buffer = prefetched, prefetched.buffer
        if cuda:
            self._side_stream(state)
        return {"host_buffer_bytes": sizing.buffer_bytes, "host_buffer_pinned": cuda,
                "host_buffer_by_prefetch": prefetched is not None,
                "direct_io": self._direct_io(cuda)}

    def pinned_host_bytes(self) -> int | None:
        """The host buffer's bytes when it is pinned (on CUDA), else 0: the lazy engine pins nothing else. None while
        a prefetch is still setting the buffer up: it cannot be said yet."""
        if self._prefetch is not None and not self._prefetch.done():
            return None
        return self.buffer.pinned_bytes

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        """Returns once the copies are queued (and module buffers copied): the stall."""
        self._finish_previous()
        layout = rank_layout(ds_engine)
        state = capture(ds_engine, layout)
        guard_optimizer_step(ds_engine, self, self.wait_for_copies)
        self.save_captured(state, layout, save_dir, tag)

    def save_captured(self, state: Capture, layout: RankLayout, save_dir: str, tag: str) -> None:
        """``save`` of a state already captured, without a DeepSpeed engine (restartbench.emulate): plan, host
        buffer, headers, copies and streamed flush as ``save`` does them. Nothing guards an optimizer step here:
        the caller calls ``wait_for_copies`` before it changes the captured tensors."""
        self._finish_previous()
        plan = self._plan_for(state)
        cuda = any(t.is_cuda for t in state.tensors.values())
        buffer = self._buffer_for(plan, pinned=cuda)
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        heads = {f.name: encode_header(f, file_meta(layout, tag, state, f.kind),
                                       state.values if f.kind == "optim" else {}) for f in plan.files}
        self._copies = CopyProgress(plan, state.tensors, buffer, self.chunk,
                                    self._side_stream(state) if cuda else None)
        self._copies_tag = tag
        if plan.sync_bytes:
            self._copies.wait(plan.sync_bytes)
        self._flush = Flush(plan, heads, buffer, self._copies, folder, self.chunk, self.io_threads,
                            save_fault(_global_rank(), tag), direct=self._direct_io(cuda))

    def _direct_io(self, cuda: bool) -> bool:
        """O_DIRECT or not for a state on CUDA (``cuda``) or on the CPU (``lazy.options.direct_io``)."""
        return direct_io(self.options, "cuda" if cuda else "cpu")

    def _plan_for(self, state: Capture) -> SavePlan:
        if self.plan is None or self.plan.signature != plan_signature(state.groups):
            self.plan = make_plan(state.groups)
            self.plans_made += 1
            self._padded_for = None
        return self.plan

    def _buffer_for(self, plan: SavePlan, pinned: bool) -> torch.Tensor:
        allocations = self.buffer.allocations
        buffer = self.buffer.get(plan.buffer_bytes, pinned)
        if self._padded_for is not plan or self.buffer.allocations != allocations:
            for lo, hi in plan.gaps():
                buffer[lo:hi].zero_()
            self._padded_for = plan
        return buffer

    def _side_stream(self, state: Capture) -> Any:
        device = next(t.device for t in state.tensors.values() if t.is_cuda)
        if self._stream is None or self._stream.device != device:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def wait_for_copies(self) -> None:
        """At the first optimizer step after a save: wait for its copies, and record how long (0 when already done).
        The guarded step calls it; restartbench.emulate calls it where the next step would come.

        On CUDA the host does not wait: the compute stream waits for the copies' last event on the GPU, timed there
        (``GpuWait``): the forward and backward before the step are only queued when the host gets here, so a host
        wait would count the copies against kernel launches rather than against the GPU's work. That wait is read
        and reported once the GPU has passed it (``_report_gpu_waits``). On CPU the host thread waits for the copy
        thread, as the step's own work would."""
        copies, tag = self._copies, self._copies_tag
        if copies is None:
            return
        self._copies = None
        if copies.on_gpu:
            self.gpu_waits.append((tag, copies.gate(torch.cuda.current_stream(self._stream.device))))
            return
        at, start = time.time(), time.perf_counter()
        try:
            copies.wait()
        except LazyRestoreError:
            pass  # the writer reports it at wait_until_durable; the step may go on
        self._report_wait(tag, time.perf_counter() - start, at)

    def _report_gpu_waits(self, block: bool) -> None:
        """Report the GPU waits the GPU has passed (``block``: all of them, waiting for the GPU if it has not)."""
        pending = []
        for tag, wait in self.gpu_waits:
            if block or wait.done():
                self._report_wait(tag, wait.seconds(), wait.at)
            else:
                pending.append((tag, wait))
        self.gpu_waits = pending

    def _report_wait(self, tag: str | None, seconds: float, at: float) -> None:
        self.copy_waits.append({"tag": tag, "seconds": seconds})
        if self.on_copy_wait is not None:
            self.on_copy_wait(tag, seconds, at)

    @property
    def stall_extra_s(self) -> float:
        """Time the last save's copies held up the optimizer step (0 when they were done before it)."""
        self._report_gpu_waits(block=True)
        last = self._copies_tag
        return sum(w["seconds"] for w in self.copy_waits if w["tag"] == last)

    def _finish_previous(self) -> None:
        """The buffer is reused: a new save must not overwrite it while the last flush still reads it."""
        if self._flush is not None and self._flush.durable_at is None and self._flush.error is None:
            self.wait_until_durable()

    def wait_until_durable(self) -> float:
        self._report_gpu_waits(block=True)
        flush = self._flush
        if flush is None:
            raise LazyRestoreError("wait_until_durable called before any save")
        flush.join()
        if flush.error is not None:
            raise flush.error
        return flush.durable_at

    def background_done(self) -> bool:
        self._report_gpu_waits(block=False)
        return self._flush is None or self._flush.done()

    def written(self) -> list[FileRecord]:
        return list(self._flush.records) if self._flush else []

    def read(self) -> list[FileRecord]:
        return list(self._read)

    # -- load ---------------------------------------------------------------------------

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        """Restore ``<load_dir>/<tag>``: in the layout that wrote it, each rank reads its own files whole; in another
        layout (tp, pp or dp differ, as the file names say) each rank reads the byte ranges it needs
        (``restartbench.engines.lazy.reshard``)."""
        layout = rank_layout(ds_engine)
        folder = Path(load_dir) / tag
        saved = saved_sizes(folder)
        if saved is not None and saved[0] != layout.sizes:
            sizes, missing = saved
            if missing:
                raise LazyRestoreError(f"checkpoint {tag}: its file names say layout {layout_name(sizes)}, but "
                                       f"{len(missing)} of its files are missing: {missing[:4]}")
            self._read = []
            self._read = load_resharded(ds_engine, layout, folder, sizes, io_threads=self.io_threads, chunk=self.chunk,
                                        dp_read_once=self.options.dp_read_once)
        else:
            module = {f"module.{k}": v for k, v in ds_engine.module.state_dict().items()}
            self.load_into(layout, load_dir, tag, module,
                           lambda header: restore_plain_and_targets(ds_engine, header["values"], header["tensors"]))
        if not isinstance(ds_engine.optimizer, torch.optim.Optimizer):  # a ZeRO optimizer, not a bare torch one
            ds_engine.optimizer._link_all_hp_params()  # as DeepSpeed's own load does: the fp32 views of safe_get_*

    def _take_prefetch(self, prefetch: Prefetch, folder: Path, jobs: list[tuple[Path, int, dict[str, Any], Any]]
                       ) -> list[FileRecord] | None:
        """The load from what the prefetch read: wait for its reads, then copy each tensor out of the buffer; the
        files it read. None where it failed or read other files: that is recorded (``load_fields``), and the load
        reads them itself, as without it (into the same buffer: its thread has ended)."""
        waited = prefetch.wait()
        used = prefetch.serves(folder, jobs)
        self._load_fields = prefetch.outcome(used, waited)
        if not used:
            self._load_fields["prefetch_unused"] = self._load_fields.get(
                "prefetch_error", f"it read {prefetch.names} of {prefetch.folder / prefetch.tag}, the load needs "
                f"{[path.name for path, *_ in jobs]} of {folder}")
            return None
        copy_out(jobs, prefetch.bases, self.buffer.tensor)
        self._padded_for = None  # the buffer now holds the files' bytes in their order: the next save pads again
        return prefetch.records

    def _read_files(self, jobs: list[tuple[Path, int, dict[str, Any], dict[str, torch.Tensor]]]
                    ) -> list[FileRecord]:
        """Read the files into their tensors: O_DIRECT through the host buffer, or buffered scatter reads."""
        if not self._direct_io(any(t.is_cuda for *_, targets in jobs for t in targets.values())):
            return read_into(jobs, self.io_threads, self.chunk, self.buffer)
        self._padded_for = None  # the buffer now holds the files' bytes in their order: the next save pads again
        return read_into_direct(jobs, self.io_threads, self.chunk, self.buffer)

    def load_fields(self) -> dict[str, Any]:
        return dict(self._load_fields)

    def load_into(self, layout: RankLayout, load_dir: str, tag: str, module: dict[str, torch.Tensor],
                  optim_targets: Callable[[dict[str, Any]], dict[str, torch.Tensor]]) -> None:
        """``load`` without a DeepSpeed engine (restartbench.emulate drives it too): read the module file into
        ``module`` (saved name -> tensor) and the optimizer file into the tensors ``optim_targets(its header)``
        returns (``load`` restores the header's plain values there first); from the prefetch's buffer where one
        read them (``_take_prefetch``)."""
        folder = Path(load_dir) / tag
        self._read, self._load_fields = [], {}
        optim_path = folder / layout.optim_file
        header, data_offset = checked_header(optim_path, tag)
        saved = header.get("layout")
        if saved is not None and (saved["tp"], saved["pp"], saved["dp"]) != layout.sizes:
            written = layout_name((saved["tp"], saved["pp"], saved["dp"]))
            raise LazyRestoreError(f"{optim_path}: written in layout {written}, this rank is of "
                                   f"{layout_name(layout.sizes)}")
        jobs = [(optim_path, data_offset, header, optim_targets(header))]
        reads_module = not self.options.dp_read_once or layout.dp == 0
        if reads_module:
            model_path = folder / layout.model_file
            model_header, model_offset = checked_header(model_path, tag)
            check_same_names(model_path, model_header["tensors"], module)
            jobs.append((model_path, model_offset, model_header, module))
        prefetch, self._prefetch = self._prefetch, None
        taken = self._take_prefetch(prefetch, folder, jobs) if prefetch is not None else None
        self._read = taken if taken is not None else self._read_files(jobs)
        if prefetch is not None:
            self.buffer.get(*self._wanted)  # a no-op where the prefetch's buffer is large enough for the saves
        if self.options.dp_read_once and layout.dp_size > 1:
            broadcast_tensors(list(module.values()), layout.dp_src, layout.dp_group, self.chunk)


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

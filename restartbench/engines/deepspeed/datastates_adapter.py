"""``datastates.CheckpointEngine`` for DeepSpeed 0.19.8, on top of DataStates-LLM's public source: the study's adapter.

DataStates-LLM's code is not changed: it is vendored as upstream wrote it (``third_party/datastates-llm``, commit
3296031, see its ``VENDORED.md``), built by ``scripts/build-datastates.sh``, which also writes the
``datastates/__init__.py`` that imports ``CheckpointEngine`` from here. Every save records what this adapter does as a
``checkpoint.workaround`` event (``ADAPTER_NOTE``, through ``DataStatesEngine.workarounds``).

What DeepSpeed calls (``deepspeed/runtime/checkpoint_engine/datastates_checkpoint_engine.py`` in 0.19.8):

- line 21: ``from datastates import CheckpointEngine``; line 22: ``CheckpointEngine(deepspeed_config, rank)``, with
  DeepSpeed's ``DeepSpeedConfig`` and the global rank (``utils.py`` line 32);
- line 36: ``save(state_dict, path)``; line 39: ``load(path, map_location)``;
- lines 45 and 52: ``wait(persist=True)`` (in ``commit`` and ``cleanup``); line 53: ``del`` of the object.

What the public source exposes (paths under ``third_party/datastates-llm``):

- no ``datastates/__init__.py`` and no ``CheckpointEngine``. The class DeepSpeed means is
  ``datastates.llm.Checkpointing(runtime_config={}, rank=0)`` (``datastates/llm/checkpointing.py`` lines 19-20). It
  takes DeepSpeed's config as it is: ``parse_config`` (``datastates/llm/helper.py`` line 26) recognises a
  ``DeepSpeedConfig`` by its class name and ``parse_ds_config`` (``datastates/llm/deepspeed/helper.py`` line 3) reads
  ``config.datastates_config.config``, the ``datastates_ckpt`` block (``{"host_cache_size": GB}``);
- ``save(state_dict, path)`` (checkpointing.py line 108) and ``load(path, map_location=None)`` (line 119): as DeepSpeed
  calls them;
- ``wait(self)`` (line 175): no ``persist``, so DeepSpeed's ``wait(persist=True)`` raises TypeError;
- ``save`` queues the file's work on a thread pool (line 112) and returns ``True``, dropping the Future. ``wait``
  waits for the C++ engine's device-to-host copies only (``datastates/ckpt/src/engine.cpp`` lines 51-57: the GPU
  tier's queue), not for jobs still on the pool: a ``wait`` right after a ``save`` can return before the job has handed
  any tensor to the C++ engine (line 93). A job that fails logs the error and calls ``sys.exit(-1)`` (line 106) inside
  the pool's thread, where the dropped Future keeps the SystemExit and nobody sees it;
- nothing waits for the files' writes: the host tier writes each tensor to its file from its own thread
  (``tiers/host_tier.cpp`` lines 35-61) and its queue is waited on only in its destructor;
- ``save_background`` hands the file's tensors to the compiled engine (line 93) before it opens the file with ``'wb'``
  (line 95), which truncates it, to write the header and the pickle. Nothing holds the tensors back meanwhile: each
  ``ckpt_tensor`` (``datastates/ckpt/ckpt_engine.py`` line 27; ``py_datastates_llm.cpp`` line 22 releases the GIL)
  pushes a CUDA tensor onto the GPU tier's queue and a CPU tensor straight onto the host tier's (``engine.cpp`` lines
  23-30); the GPU tier's thread, running since the engine was made, copies it at once on a non-blocking stream and
  pushes it on (``tiers/gpu_tier.cpp`` lines 9, 13, 40-52); the host tier's thread creates the file if it is missing
  and writes the tensor at its offset, opened without truncation (``tiers/host_tier.cpp`` lines 38-54). A tensor
  written before the ``'wb'`` is lost: the truncation drops it and the pickle written past it leaves zeros in its place;
- a host cache smaller than a tensor, or DataStates' default of 0 GB, ends the whole process in C++
  (``pool/mem_pool.cpp`` line 55: ``FATAL`` is ``std::abort``);
- ``setup.py``'s ``find_packages(include=['datastates', 'datastates.*'])`` finds no package (``datastates/`` has no
  ``__init__.py``, so the whole tree is skipped), so ``pip install`` installs the compiled extension alone;
  ``scripts/build-datastates.sh`` copies the Python modules beside it, unchanged.

What this adapter does, and nothing more:

1. ``CheckpointEngine(deepspeed_config, rank)`` makes ``datastates.llm.Checkpointing(deepspeed_config, rank)``, after
   refusing a ``host_cache_size`` that is missing or not above 0 with an error that says so (instead of the abort).
2. ``save`` refuses a state holding a tensor larger than the host cache (the same abort, said in words), then calls
   ``Checkpointing.save`` as it is. The Checkpointing's thread pool is wrapped (``FutureKeeper``) so that the Future of
   the job ``save`` queues is kept; the job runs DataStates' code unchanged.
3. ``wait(persist=True)`` waits for those jobs (a job that failed raises ``RuntimeError`` naming its file), then calls
   ``Checkpointing.wait()``. ``persist`` is accepted and cannot be honoured there: when ``wait`` returns, every
   tensor has been copied to the host cache (training may change it), but its file may still be being written.
   DeepSpeed calls it before the next optimizer step too, where waiting for the files would add their writes to the
   stall.
4. ``wait_for_writes()`` is the wait for the files, which the harness calls once it waits for durability: DataStates'
   host tier writes what it is handed in order, on one thread (``tiers/host_tier.cpp`` lines 35-58: seek, write,
   flush and close, then the next), and the GPU tier hands it each tensor before ``Checkpointing.wait()`` returns
   (``tiers/gpu_tier.cpp`` lines 52-54). So after ``wait``, one more small CPU tensor handed to the compiled engine
   with the source's own call (``ckpt_tensor``, to a file of its own beside the checkpoint's folder) is written last:
   once that file holds its bytes, every file of the checkpoint has been written. The file is removed.
5. ``save`` hands DataStates a copy of each CPU tensor of the state (new containers around them; DeepSpeed's state
   is not changed). DataStates writes a CPU tensor from its memory as it is when the host tier reaches it, with no
   copy (``engine.cpp`` lines 27-29), while DeepSpeed's optimizer state holds live tensors (Adam's ``step``, a CPU
   scalar, is incremented in place by the next optimizer step): without the copy the file can hold the next step's
   value. Device tensors go to DataStates unchanged (their copies to the host cache are what the guarded step waits
   for).
6. ``load`` is ``Checkpointing.load``, unchanged.
7. Each ``save_background`` hands its tensors to the compiled engine once it has returned, after its ``'wb'`` open,
   header and pickle (``HandOverAfterOpen``): its ``async_save`` call, the one before the open, is kept and made
   when the job's ``save_background`` has returned (the file written and closed). The same list, the same call of
   DataStates' ``CkptEngine.async_save``, the same bytes at the same offsets; the copies start after the file's
   header and pickle are written instead of before, and a job that fails hands nothing over.
8. What a job hands over is kept (``HandOverAfterOpen.handed``) until ``wait_for_writes`` has seen every write done.
   The compiled engine keeps a tensor's address, not the tensor (``engine.cpp`` lines 25 and 29: a ``mem_region_t``
   of ``t.data_ptr()``), and the host tier writes a CPU tensor from that address when it reaches it
   (``tiers/host_tier.cpp`` line 52), maybe after the job has returned and dropped its state: the adapter's copies
   (item 5) have no other owner, and a freed small block is overwritten at once (the allocator's free-list pointer).
   A CUDA tensor ``save_background`` made ``contiguous()`` (checkpointing.py line 57) is kept too; DeepSpeed's own
   tensors are alive anyway. The cost: the copies of the CPU tensors live until the checkpoint's durability wait.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

ADAPTER_NOTE = (
    "datastates.CheckpointEngine, which DeepSpeed 0.19.8 imports, is restartbench's adapter "
    "(restartbench/engines/deepspeed/datastates_adapter.py; datastates/__init__.py written by "
    "scripts/build-datastates.sh) over the public datastates-llm source at 3296031, which has "
    "datastates.llm.Checkpointing(runtime_config, rank) and no CheckpointEngine: DeepSpeed's config, rank, save and "
    "load go to Checkpointing unchanged; wait(persist=True), which Checkpointing.wait() does not accept, waits for the "
    "file jobs Checkpointing.save queued on its thread pool (their Futures kept by a wrapper of that pool), then "
    "Checkpointing.wait() (the device-to-host copies); no call of the source waits for the files' writes, so when "
    "the harness waits for durability the adapter hands the compiled engine one more small CPU tensor, to a file "
    "of its own, and waits until it is written (the host tier writes in order, on one thread), then removes it; "
    "save hands DataStates a copy of each CPU tensor (Adam's step among them), which it would otherwise write from "
    "live memory after the next optimizer step changed it; save_background's tensors are handed to the compiled "
    "engine after its open(path, 'wb') (checkpointing.py line 95), not before it (line 93), where the host tier "
    "could write one before the truncation dropped it; what a job handed to the compiled engine, which keeps a "
    "tensor's address only, is kept alive until the wait for the writes has seen them done (the copies of the CPU "
    "tensors have no other owner). Its Python modules are copied beside the compiled "
    "extension, which its setup.py installs alone")


class DataStatesConfigError(ValueError):
    """The ``datastates_ckpt`` block cannot work with DataStates-LLM."""


def host_cache_bytes(deepspeed_config: Any) -> int:
    """Bytes of the pinned host cache that DataStates will allocate for ``deepspeed_config``'s ``datastates_ckpt``
    block, as ``Checkpointing`` computes them (GB * 2**30, checkpointing.py line 27). Refuses what would end the
    process in DataStates' C++ pool, or what DataStates would misread."""
    block = getattr(getattr(deepspeed_config, "datastates_config", None), "config", None)
    if not isinstance(block, Mapping):
        raise DataStatesConfigError(
            "DeepSpeed's config has no datastates_ckpt block (got "
            f"{type(block).__name__}): give it one, such as \"datastates_ckpt\": {{\"host_cache_size\": 4}} "
            "(GB of pinned host memory per rank); restartbench writes it from --host-cache-gb")
    size = block.get("host_cache_size")
    if isinstance(size, bool) or not isinstance(size, int | float) or not size > 0:
        raise DataStatesConfigError(
            f"datastates_ckpt.host_cache_size is {size!r}: it must be a number of GB above 0 (DataStates' default, "
            "0, makes its C++ pool abort the process at the first tensor); restartbench writes it from "
            "--host-cache-gb")
    return int(size * (1 << 30))


def largest_tensor(state: Any) -> tuple[str, int]:
    """The key (DataStates' ``a|b|0`` form) and bytes of the largest tensor in ``state``, walking dicts and lists as
    ``Checkpointing.save_background`` does (checkpointing.py lines 46-76; tuples are kept whole there, so they are
    not walked here either). ``("", 0)`` without tensors."""
    best = ("", 0)
    pending: list[tuple[str, Any]] = [("", state)]
    while pending:
        key, data = pending.pop()
        if torch.is_tensor(data):
            size = data.numel() * data.element_size()
            if size > best[1]:
                best = (key, size)
        elif isinstance(data, list):
            pending += [(f"{key}|{i}" if key else f"{i}", item) for i, item in enumerate(data)]
        elif isinstance(data, dict):
            pending += [(f"{key}|{k}" if key else f"{k}", item) for k, item in data.items()]
    return best


def check_fits(state: Any, cache_bytes: int, path: str) -> None:
    """Refuse, in words, a state whose largest tensor cannot fit DataStates' host cache (its C++ pool would abort the
    process: mem_pool.cpp line 55)."""
    key, size = largest_tensor(state)
    if size > cache_bytes:
        raise DataStatesConfigError(
            f"{path}: tensor {key!r} is {size} bytes, more than DataStates' pinned host cache of {cache_bytes} bytes "
            f"({cache_bytes / 2**30:.2f} GB), and DataStates aborts the process on it; give a host cache of at least "
            f"{size / 2**30:.2f} GB (--host-cache-gb)")


def with_cpu_copies(data: Any) -> Any:
    """``data`` with every CPU tensor copied, walked as ``Checkpointing.save_background`` walks it (dicts and lists;
    tuples kept whole); new containers where anything below them was copied, ``data`` itself left unchanged."""
    if torch.is_tensor(data):
        return data.clone() if data.device.type == "cpu" else data
    if isinstance(data, list):
        return [with_cpu_copies(item) for item in data]
    if isinstance(data, dict):
        kind = OrderedDict if isinstance(data, OrderedDict) else dict
        return kind((key, with_cpu_copies(value)) for key, value in data.items())
    return data


def wait_for_file(path: str, size: int, timeout_s: float, poll_s: float = 0.002) -> None:
    """Return once ``path`` holds ``size`` bytes; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (os.path.exists(path) and os.path.getsize(path) >= size):
        if time.monotonic() > deadline:
            raise TimeoutError(f"DataStates' host tier did not write {path} ({size} bytes) within {timeout_s:.0f} s: "
                               "its writes of the checkpoint before it are not known to be done")
        time.sleep(poll_s)


#: The bytes handed to DataStates' host tier to learn that it has written everything before them.
DRAIN_BYTES = 4096


class FutureKeeper:
    """A thread pool that keeps the Future of every job submitted to it, so that its jobs can be waited for and their
    errors seen; ``around`` (optional) runs each job as ``around(fn, *args)``. Everything else (``shutdown``, which
    ``Checkpointing.__del__`` calls) is the pool's own."""

    def __init__(self, pool: concurrent.futures.Executor, around: Any = None):
        self.pool = pool
        self.around = around
        self._lock = threading.Lock()
        self._futures: list[tuple[str, concurrent.futures.Future]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future = (self.pool.submit(fn, *args, **kwargs) if self.around is None
                  else self.pool.submit(self.around, fn, *args, **kwargs))
        label = str(args[1]) if len(args) > 1 else getattr(fn, "__name__", repr(fn))  # save_background(state, path)
        with self._lock:
            self._futures.append((label, future))
        return future

    def wait_all(self) -> None:
        """Wait for every job submitted so far; raise RuntimeError naming the jobs that failed (a SystemExit, which
        DataStates' jobs raise on error, counts as a failure)."""
        with self._lock:
            futures, self._futures = self._futures, []
        failed = []
        for label, future in futures:
            try:
                future.result()
            except BaseException as error:  # noqa: BLE001 - SystemExit(-1) is how a DataStates job says it failed
                failed.append(f"{label} ({type(error).__name__}: {error})")
        if failed:
            raise RuntimeError("DataStates' background save failed for " + "; ".join(failed) + " (its own message, "
                               "'[DataStates.llm][ERROR] ...', is in the rank's stdout)")


class HandOverAfterOpen:
    """``Checkpointing.ckpt_engine`` (DataStates' ``CkptEngine``) for the adapter: ``save_background`` calls its
    ``async_save`` before it opens the file with ``'wb'`` (checkpointing.py lines 93 and 95), and the compiled
    engine's threads may write a tensor before that truncation (the module's docstring). Inside ``run``, the job's
    ``async_save`` is kept and made once ``save_background`` has returned; everything else (``ckpt_engine``, the
    compiled handle; ``wait``; ``async_save`` outside a job) is the ``CkptEngine``'s own. ``handed`` keeps each job's
    list alive (the compiled engine keeps addresses only) until ``release``."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._job = threading.local()  # the pool runs several jobs at once (parser_threads, 4 by default)
        self._lock = threading.Lock()
        self.handed: list[list] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def async_save(self, tensors: list) -> None:
        kept = getattr(self._job, "tensors", None)
        if kept is None:
            self.engine.async_save(tensors)
        else:
            kept.extend(tensors)

    def run(self, save_background: Any, state_dict: Any, path: str) -> Any:
        """``save_background(state_dict, path)``, then its tensors to the compiled engine (none if it failed)."""
        self._job.tensors = []
        try:
            result = save_background(state_dict, path)
            tensors = self._job.tensors
        finally:
            self._job.tensors = None
        with self._lock:
            self.handed.append(tensors)
        self.engine.async_save(tensors)
        return result

    def release(self, count: int) -> None:
        """Let go of the first ``count`` lists handed over (their writes are known to be done)."""
        with self._lock:
            del self.handed[:count]

    @classmethod
    def install(cls, checkpointing: Any) -> tuple[HandOverAfterOpen, FutureKeeper]:
        """Put one in ``checkpointing`` (a ``datastates.llm.Checkpointing``) as its ``ckpt_engine``, and a
        ``FutureKeeper`` as its pool, which runs the ``save_background`` jobs its ``save`` queues (line 112) through
        ``run``. Nothing of it refers back to ``checkpointing``: no reference cycle keeps DataStates' objects (whose
        ``__del__`` shuts its compiled engine down) alive past the adapter, for the garbage collector to end at some
        later time or in the interpreter's teardown."""
        handoff = cls(checkpointing.ckpt_engine)
        checkpointing.ckpt_engine = handoff
        jobs = FutureKeeper(checkpointing.executor, around=handoff.run)
        checkpointing.executor = jobs
        return handoff, jobs


class CheckpointEngine:
    """What DeepSpeed 0.19.8's ``DataStatesCheckpointEngine`` imports as ``datastates.CheckpointEngine``:
    DataStates-LLM's ``datastates.llm.Checkpointing``, met where the two differ (see the module's docstring)."""

    def __init__(self, deepspeed_config: Any, rank: int):
        # Imported here, not at the top: the compiled engine exists only where scripts/build-datastates.sh built it
        # (CUDA), while the checks above are tested on every machine.
        from datastates.llm import Checkpointing

        self.cache_bytes = host_cache_bytes(deepspeed_config)
        self.rank = int(rank)
        self.inner = Checkpointing(deepspeed_config, rank)
        self.handoff, self.jobs = HandOverAfterOpen.install(self.inner)
        self.last_path: str | None = None

    def save(self, state_dict: Any, path: str) -> Any:
        check_fits(state_dict, self.cache_bytes, path)
        self.last_path = path
        return self.inner.save(with_cpu_copies(state_dict), path)

    def load(self, path: str, map_location: Any = None) -> Any:
        return self.inner.load(path, map_location)

    def wait(self, persist: bool = True) -> None:
        """DeepSpeed's ``wait(persist=True)``: the queued file jobs, then DataStates' own wait (device-to-host copies).
        ``persist`` cannot be honoured beyond that: the public source has no call that waits for the file writes."""
        self.jobs.wait_all()
        self.inner.wait()

    def wait_for_writes(self, timeout_s: float = 3600.0) -> None:
        """Return once DataStates' host tier has written every file of the saves so far (see the module's item 4):
        ``wait``, then one small CPU tensor to a file of its own beside the last save's folder, written after all
        that came before it; the file is removed, and what the saves handed over is let go (item 8). Nothing to wait
        for before any save."""
        self.wait(persist=True)
        if self.last_path is None:
            return
        handed = len(self.handoff.handed)  # every job has returned: all it handed over is before the marker
        probe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(self.last_path))),
                             f".datastates-drain-rank{self.rank}")
        with contextlib.suppress(FileNotFoundError):
            os.remove(probe)
        marker = torch.ones(DRAIN_BYTES, dtype=torch.uint8)  # alive until written: DataStates keeps its address only
        self.inner.ckpt_engine.ckpt_engine.ckpt_tensor(0, marker, DRAIN_BYTES, 0, probe)
        wait_for_file(probe, DRAIN_BYTES, timeout_s)
        os.remove(probe)
        self.handoff.release(handed)

    def close(self) -> None:
        """Every write waited for, then the file jobs' thread pool shut down (its idle workers joined)."""
        self.wait_for_writes()
        self.jobs.shutdown(wait=True)

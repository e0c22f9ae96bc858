"""Digests of training state, to prove a restore exact.

A digest maps every tensor and number in a (nested) state dict to a short hash of
its dtype, shape and raw bytes. At save time each rank records the digest of what it
holds; after a restore it computes the digest again and every entry must match.
Objects that are neither tensors nor plain values (DeepSpeed's bookkeeping classes)
are left out, since they carry no training state of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

HASH_NAME = "sha256-chunked-v2"
"""The digest's format, hashed into every tensor's hash: a digest of another format never matches one of this."""
CHUNK_BYTES = 64 * 2**20
"""A tensor's bytes are hashed in chunks of this size (the last one shorter), each on a thread of its own, and the
tensor's hash is the hash of its header and the chunks' hashes in order. Fixed, since it is part of the hash: a
thread count or order of completion changes nothing, a chunk size would change every hash."""
PARALLEL_BYTES = 64 * 2**20
"""Above this many tensor bytes a digest hashes its chunks on several threads: hashlib (SHA-256, hardware-accelerated
where the CPU has SHA extensions) and the device-to-host copy release the GIL. One thread per tensor, as before,
left a 1B model's few 6 GB tensors (ZeRO's fp32 partition and Adam's moments) to one thread each: 0.7 GB/s."""
HASH_THREADS = min(8, os.cpu_count() or 1)
HASH_BYTES = 12
"""A tensor's hash is the first HASH_BYTES of the SHA-256 (24 hex digits, as long as the blake2b digests were)."""


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bytes as a flat uint8 view where they lie (numpy has no bfloat16): no copy for a contiguous
    tensor, one on its own device for another."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _chunks(nbytes: int) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of ``nbytes``; the last ends at ``nbytes`` whatever its size; none when empty."""
    return [(start, min(start + CHUNK_BYTES, nbytes)) for start in range(0, nbytes, CHUNK_BYTES)]


@dataclass
class DigestCost:
    """What a digest's tensors cost, recorded with the proof's spans (``proof.digest``, ``restore.verify``): the
    harness's own time, never a measured figure, but the first GPU visits spent 16 s a digest on a 1B state (21 GB,
    1.3 GB/s), a third of each engine block, and where it goes decides what to make faster."""

    tensor_bytes: int = 0
    chunks: int = 0
    threads: int = 1
    copy_s: float = 0.0
    """CUDA chunks' device-to-host copies, summed over the threads (0 for host tensors, hashed where they lie)."""
    hash_s: float = 0.0
    """SHA-256 of the chunks, summed over the threads."""

    def fields(self) -> dict[str, Any]:
        return {f"digest_{key}": value for key, value in asdict(self).items()}


class _Staging:
    """One host buffer of CHUNK_BYTES per hashing thread, reused for every CUDA chunk it copies (a fresh ``.cpu()``
    per chunk faulted in 64 MiB of new pages each time), and gone when the digest ends: it adds nothing to the
    rank's memory outside the digest."""

    def __init__(self, count: int):
        self._free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(torch.empty(CHUNK_BYTES, dtype=torch.uint8))

    def copy(self, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the buffer taken, ``part``'s bytes in it); give the buffer back with ``done``."""
        buffer = self._free.get()
        return buffer, buffer[:part.numel()].copy_(part)

    def done(self, buffer: torch.Tensor) -> None:
        self._free.put(buffer)


def _chunk_hash(raw: torch.Tensor, start: int, stop: int, staging: _Staging | None,
                cost: DigestCost, lock: threading.Lock) -> bytes:
    """SHA-256 of raw[start:stop]: a CUDA tensor's chunk is copied to the host here, into a staging buffer of the
    thread that hashes it, so copies and hashing overlap across threads and no full-size host copy is made."""
    part, buffer, began = raw[start:stop], None, time.perf_counter()
    if part.device.type != "cpu":
        assert staging is not None, "a CUDA tensor's digest needs its staging buffers"
        buffer, part = staging.copy(part)
    copied = began if buffer is None else time.perf_counter()
    digest = hashlib.sha256(memoryview(part.numpy())).digest()
    hashed = time.perf_counter()
    if buffer is not None:
        staging.done(buffer)
    with lock:
        cost.copy_s += copied - began
        cost.hash_s += hashed - copied
    return digest


def _header(tensor: torch.Tensor, count: int) -> bytes:
    return f"{HASH_NAME} {CHUNK_BYTES} {tensor.dtype}{tuple(tensor.shape)} {count}\n".encode()


def _combine(tensor: torch.Tensor, chunk_hashes: list[bytes]) -> str:
    """The tensor's hash: SHA-256 of the format, chunk size, dtype, shape and chunk count, then every chunk's
    SHA-256 in order (truncated to HASH_BYTES)."""
    whole = hashlib.sha256(_header(tensor, len(chunk_hashes)))
    for chunk in chunk_hashes:
        whole.update(chunk)
    return whole.hexdigest()[:2 * HASH_BYTES]


def hash_tensors(tensors: list[torch.Tensor], threads: int | None = None,
                 cost: DigestCost | None = None) -> list[str]:
    """Each tensor's hash, its chunks spread over ``threads`` threads (default: HASH_THREADS above PARALLEL_BYTES
    in all, else one). The result depends only on the tensors' dtypes, shapes and bytes; ``cost``, if given, gets
    what the hashing cost."""
    cost = DigestCost() if cost is None else cost
    raws = [_bytes_of(tensor) for tensor in tensors]
    work = [(index, start, stop) for index, raw in enumerate(raws) for start, stop in _chunks(raw.numel())]
    if threads is None:
        threads = HASH_THREADS if sum(raw.numel() for raw in raws) > PARALLEL_BYTES else 1
    threads = max(1, min(threads, len(work)))
    cuda = {raw.device for raw in raws if raw.device.type == "cuda"}
    for device in cuda:
        torch.cuda.synchronize(device)  # the workers' copies run on their threads' (default) streams, not this one's
    staging, lock = (_Staging(threads) if cuda else None), threading.Lock()
    cost.tensor_bytes += sum(raw.numel() for raw in raws)
    cost.chunks += len(work)
    cost.threads = threads

    def chunk_hash(item: tuple[int, int, int]) -> bytes:
        return _chunk_hash(raws[item[0]], item[1], item[2], staging, cost, lock)

    if threads > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            hashes = list(pool.map(chunk_hash, work))
    else:
        hashes = [chunk_hash(item) for item in work]
    per_tensor: list[list[bytes]] = [[] for _ in tensors]
    for (index, _, _), chunk in zip(work, hashes):
        per_tensor[index].append(chunk)
    return [_combine(tensor, chunks) for tensor, chunks in zip(tensors, per_tensor)]


def tensor_hash(tensor: torch.Tensor, threads: int | None = None) -> str:
    """The hash of the dtype, the shape and the raw bytes (``hash_tensors``): format, chunk size, dtype, shape and
    the SHA-256 of each CHUNK_BYTES chunk of the bytes in order, hashed with SHA-256."""
    return hash_tensors([tensor], threads)[0]


def digest(obj: Any, prefix: str = "", threads: int | None = None, cost: DigestCost | None = None) -> dict[str, str]:
    """Flatten a nested state into {'path.to.entry': hash-or-value}. A key that is not a string carries its type
    (``0:int``), so a restore that turns the optimizer's integer parameter ids into strings is caught. The tensors'
    chunks are hashed together on the threads (``hash_tensors``): a few huge tensors use every thread."""
    entries = flatten(obj, prefix)
    tensors = [key for key, value in entries.items() if isinstance(value, torch.Tensor)]
    hashes = dict(zip(tensors, hash_tensors([entries[key] for key in tensors], threads, cost)))
    return {key: hashes.get(key, value) for key, value in entries.items()}


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{'path.to.entry': tensor-or-repr} of a nested state, in the order of its walk; objects that are neither
    tensors nor plain values are left out."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            label = key if isinstance(key, str) else f"{key!r}:{type(key).__name__}"
            out.update(flatten(value, f"{prefix}.{label}" if prefix else label))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for index, value in enumerate(obj):
            out.update(flatten(value, f"{prefix}[{index}]"))
        return out
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return {prefix: repr(obj)}
    return {}


def training_state_digest(ds_engine: Any, cost: DigestCost | None = None) -> dict[str, str]:
    """Model, optimizer and scheduler state this rank holds, plus the step counter."""
    state = {
        "module": ds_engine.module.state_dict(),
        "optimizer": ds_engine.optimizer.state_dict() if ds_engine.optimizer is not None else {},
        "lr_scheduler": ds_engine.lr_scheduler.state_dict() if ds_engine.lr_scheduler is not None else {},
        "global_steps": ds_engine.global_steps,
    }
    return digest(state, cost=cost)


def module_digest(ds_engine: Any, cost: DigestCost | None = None) -> dict[str, str]:
    return digest({"module": ds_engine.module.state_dict()}, cost=cost)


def compare(saved: dict[str, str], restored: dict[str, str], limit: int = 10) -> list[str]:
    """Human lines for each entry missing on one side or different; empty when identical."""
    problems = [f"{key}: saved but absent after restore" for key in saved.keys() - restored.keys()]
    problems += [f"{key}: absent at save, present after restore" for key in restored.keys() - saved.keys()]
    problems += [f"{key}: differs" for key in saved.keys() & restored.keys() if saved[key] != restored[key]]
    problems.sort()
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems


def digest_path(run_dir: Path, name: str, rank: int) -> Path:
    return Path(run_dir) / "digests" / name / f"rank{rank:05d}.json"


def write_digest(run_dir: Path, name: str, rank: int, value: dict[str, str]) -> None:
    path = digest_path(run_dir, name, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=0, sort_keys=True))


def read_digest(run_dir: Path, name: str, rank: int) -> dict[str, str]:
    path = digest_path(run_dir, name, rank)
    if not path.exists():
        raise FileNotFoundError(f"no digest {name!r} recorded for rank {rank} ({path}); was phase 1 run with --verify?")
    return json.loads(path.read_text())

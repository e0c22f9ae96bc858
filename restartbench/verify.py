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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch


def tensor_hash(tensor: torch.Tensor) -> str:
    """blake2b of the dtype, the shape and the raw bytes. The bytes are viewed as uint8 where they lie (numpy has no
    bfloat16) and hashed through a memoryview of one host copy: none for a contiguous CPU tensor, one device-to-host
    copy for a GPU tensor (``.numpy().tobytes()`` made a second)."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    digest.update(memoryview(raw.cpu().numpy()))
    return digest.hexdigest()


PARALLEL_BYTES = 64 * 2**20
"""Above this many tensor bytes a digest hashes its tensors on several threads: hashlib and the device-to-host copy
release the GIL, and one thread hashing a 1B model's 18 GB of state at about 1 GB/s took some 20 s per digest."""
HASH_THREADS = min(8, os.cpu_count() or 1)


def digest(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a nested state into {'path.to.entry': hash-or-value}. A key that is not a string carries its type
    (``0:int``), so a restore that turns the optimizer's integer parameter ids into strings is caught."""
    entries = flatten(obj, prefix)
    tensors = [key for key, value in entries.items() if isinstance(value, torch.Tensor)]
    total = sum(entries[key].numel() * entries[key].element_size() for key in tensors)
    threads = HASH_THREADS if total > PARALLEL_BYTES else 1
    with ThreadPoolExecutor(max_workers=threads) as pool:
        hashes = dict(zip(tensors, pool.map(tensor_hash, (entries[key] for key in tensors))))
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


def training_state_digest(ds_engine: Any) -> dict[str, str]:
    """Model, optimizer and scheduler state this rank holds, plus the step counter."""
    state = {
        "module": ds_engine.module.state_dict(),
        "optimizer": ds_engine.optimizer.state_dict() if ds_engine.optimizer is not None else {},
        "lr_scheduler": ds_engine.lr_scheduler.state_dict() if ds_engine.lr_scheduler is not None else {},
        "global_steps": ds_engine.global_steps,
    }
    return digest(state)


def module_digest(ds_engine: Any) -> dict[str, str]:
    return digest({"module": ds_engine.module.state_dict()})


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

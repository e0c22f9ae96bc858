"""The study's patch to TorchSnapshot 0.1.0: every rank takes and restores its own snapshot.

TorchSnapshot is written for data-parallel training: ``Snapshot.take`` gathers one manifest
over the world, treats entries of ``DistributedDataParallel`` modules (or matching its
``replicated`` globs) as identical on every rank, keeps one copy and spreads their writes over
the ranks; ``restore`` hands replicated entries to every rank. Under DeepSpeed 3D parallelism
no rank's state is a replica of another's in that sense (pipeline stages, tensor shards and
ZeRO-1 optimizer partitions all differ), so the patch removes the assumption altogether:

1. ``PGWrapper`` as seen by ``torchsnapshot.snapshot`` is rank-local: rank 0 of a world of one,
   whatever process group is initialized. Each rank's take/restore issues no collective, and
   its snapshot (manifest, ``.snapshot_metadata``, data) is self-contained in its own folder.
2. ``Snapshot._infer_replicated`` infers nothing: no entry is ever marked replicated.
3. The per-rank memory budget for staging is the node's memory shared by the node's real
   ranks (``LOCAL_WORLD_SIZE``, set by torchrun), not by a world of one.
4. bfloat16 tensors are serialized byte for byte. TorchSnapshot 0.1.0 reads their bytes through
   a float32 tensor set onto the storage; under torch 2.x that tensor has ``nbytes // 4``
   elements, so the bytes past the last multiple of 4 are lost (a bf16 tensor with an odd number
   of elements loses its last one; batched writes fail on the size mismatch).

Applied once, when this module is imported, and only to the TorchSnapshot version it was
written against (any other is refused with the command that installs the right one).
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

import psutil
import torch
import torch.distributed as dist
import torchsnapshot

PATCHED_VERSION = "0.1.0"
if torchsnapshot.__version__ != PATCHED_VERSION:
    raise ImportError(f"the study's TorchSnapshot patch is written for torchsnapshot=={PATCHED_VERSION}, "
                      f"found {torchsnapshot.__version__}: pip install torchsnapshot=={PATCHED_VERSION}")

import torchsnapshot.scheduler as scheduler  # noqa: E402  (names this version has)
import torchsnapshot.serialization as serialization  # noqa: E402
import torchsnapshot.snapshot as snapshot  # noqa: E402
from torchsnapshot.pg_wrapper import PGWrapper  # noqa: E402


class RankLocalPGWrapper(PGWrapper):
    """A PGWrapper that ignores the process group: every collective is this rank's alone."""

    def __init__(self, pg: Optional[dist.ProcessGroup] = None) -> None:
        self.pg = None


def infer_no_replication(replicated: List[str], app_state: Any) -> List[str]:
    """Stands in for ``Snapshot._infer_replicated``: nothing is assumed replicated."""
    return []


def memory_budget_bytes(pg: PGWrapper) -> int:
    """TorchSnapshot's budget rule, shared by the node's real ranks (its env override still wins)."""
    if "TORCHSNAPSHOT_PER_RANK_MEMORY_BUDGET_BYTES" in os.environ:
        return scheduler.get_process_memory_budget_bytes(pg)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available = int(psutil.virtual_memory().available * scheduler._AVAILABLE_MEMORY_MULTIPLIER)
    return min(available // local_ranks, scheduler._MAX_PER_RANK_MEMORY_BUDGET_BYTES)


def bytes_as_memoryview(tensor: torch.Tensor) -> memoryview:
    """Stands in for ``serialization._tensor_as_memoryview_via_untyped_storage`` (used for bfloat16):
    every byte of the contiguous tensor, viewed as uint8."""
    if not tensor.is_contiguous():
        raise AssertionError("bytes_as_memoryview can be only used with contiguous tensors")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("b")


def apply() -> None:
    snapshot.PGWrapper = RankLocalPGWrapper
    snapshot.Snapshot._infer_replicated = staticmethod(infer_no_replication)
    snapshot.get_process_memory_budget_bytes = memory_budget_bytes
    serialization._tensor_as_memoryview_via_untyped_storage = bytes_as_memoryview


apply()

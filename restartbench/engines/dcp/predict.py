"""The files of PyTorch DCP (dcp, dcp-async), predicted: ``dcp_engine``'s flat state, planned by DCP's own planners,
laid out as FileSystemWriter does.

torch and the engine are imported inside the functions: the launcher and ``--dry-run`` read this module without torch.
"""

from __future__ import annotations

import heapq
import math
import os
import pickle
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from restartbench.shards import ShardSetup, training_states
from restartbench.sizes import EnginePredictor, PlannedFile, saved_size

DCP_TOLERANCE_BYTES = 0
"""dcp, dcp-async: exact. Each ``.distcp`` entry is a torch.save zip of a CPU copy (FileSystemWriter moves every
tensor to the CPU before saving it, so the device changes nothing), and the plan's entries are the run's own pickles.
``.metadata`` pickles the checkpoint folder's path (DCP's checkpoint_id): the run's own folder is exact; before the
run (plan.json's estimate) the run folder's time stamp and random suffix are a placeholder of the same length, so the
path is as long as the run's. For an object-store prefix the writer is
s3torchconnector's or fsspec's, whose checkpoint_id is not checked against real runs."""


def dcp_save_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """``dcp``: ``dcp_files`` as ``dcp.save`` writes them. Where CUDA is available (a run on ``cuda`` here: the run's
    device stands for its machine's), FileSystemWriter's one writing thread copies the tensors to the host with its
    overlapping loader, which takes them smallest first (torch 2.11 and 2.13: ``_OverlappingCpuLoader.start_loading``
    sorts by bytes, a stable sort); else in the plan's order. The .distcp is as long either way; the entries' offsets,
    and so the length of ``.metadata``, which pickles them, are not: the third H100 visit's dcp run (1B) wrote a
    ``.metadata`` 64 bytes shorter than the plan's order gives. ``dcp.async_save`` stages the state to the host
    first and writes it in the plan's order (its stager sets ``per_thread_copy_ahead`` to 0: no overlapping
    loader)."""
    return dcp_files(setup, scratch, smallest_first=setup.device == "cuda")


def dcp_files(setup: ShardSetup, scratch: str, smallest_first: bool = False) -> list[PlannedFile]:
    """PyTorch DCP as ``dcp_engine`` calls it, step by step as ``dcp.save`` does: each rank's planner
    (``dcp_engine.save_planner``) plans its flat harness state, the coordinator's planner makes the global plan (DCP's
    deduplication puts each module tensor shared by data-parallel replicas in one rank's file), and
    FileSystemWriter's layout follows: one ``__<rank>_0.distcp`` per rank holding its byte entries then its tensors
    (``smallest_first``: ordered by their bytes, as ``dcp_save_files`` says), each entry a torch.save into the file;
    rank 0 pickles the Metadata, offsets and the folder's path included."""
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, FileSystemWriter

    from restartbench.engines.dcp import engine as dcp_engine

    writer = FileSystemWriter(os.path.join(setup.folder, setup.tag))  # never writes: gives .metadata its path and id
    planners = [dcp_engine.rank_save_planner(state, coord, writer.storage_meta(), rank == 0)
                for rank, coord, state in training_states(setup)]
    local = [_sent(planner.create_local_plan()) for planner in planners]  # gathered on the coordinator
    plans, metadata = planners[0].create_global_plan(local)
    plans = [planner.finish_plan(_sent(plan)) for planner, plan in zip(planners, writer.prepare_global_plan(plans))]
    files, results = [], []
    for rank, (planner, plan) in enumerate(zip(planners, plans)):
        file, written = _dcp_rank_file(setup, planner, plan, scratch, smallest_first)
        files.append(replace(file, rank=rank))
        results.extend(_sent(written))  # gathered on the coordinator
    metadata.version = CURRENT_DCP_VERSION  # what FileSystemWriter.finish sets before pickling it
    metadata.storage_data = {result.index: result.storage_data for result in results}
    metadata.storage_meta = writer.storage_meta()
    return files + [PlannedFile(f"{setup.tag}/{dcp_engine.METADATA}", 0, "metadata", 0,
                                len(pickle.dumps(metadata)))]


def _sent(obj: Any) -> Any:
    """``obj`` as another rank receives it from torch.distributed's object collectives (pickled and unpickled):
    objects that were one before are then distinct, and pickle writes each again in ``.metadata``."""
    return pickle.loads(pickle.dumps(obj))


def _dcp_rank_file(setup: ShardSetup, planner: Any, plan: Any, scratch: str,
                   smallest_first: bool) -> tuple[PlannedFile, list[Any]]:
    """One rank's ``.distcp`` file and DCP's WriteResults for it (FileSystemWriter.write_data, one thread)."""
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
    tensors = [item for item in plan.items if item.type != WriteItemType.BYTE_IO]
    if smallest_first:
        tensors.sort(key=lambda item: _tensor_bytes(item.tensor_data))
    ordered = [item for item in plan.items if item.type == WriteItemType.BYTE_IO] + tensors
    offset, payload, results = 0, 0, []
    for item in ordered:
        if item.type == WriteItemType.BYTE_IO:
            length = planner.resolve_data(item).getbuffer().nbytes  # the object, torch.save'd by the planner
        else:
            data = item.tensor_data
            length = tensor_saved_size(data.properties.dtype, tuple(data.size), scratch)
            payload += _tensor_bytes(data)
        results.append(WriteResult(index=item.index, size_in_bytes=length,
                                   storage_data=_StorageInfo(name, offset, length)))
        offset += length
    return PlannedFile(f"{setup.tag}/{name}", -1, "data", payload, offset), results


def _tensor_bytes(data: Any) -> int:
    """A write item's tensor bytes (its ``tensor_data``: size and dtype), as FileSystemWriter's ``_item_size``
    counts them."""
    return math.prod(data.size) * data.properties.dtype.itemsize


TENSOR_SIZES: dict[tuple[Any, tuple[int, ...]], int] = {}
"""``tensor_saved_size``'s measurements by (dtype, shape), kept for the process. Public: tests empty it."""


def tensor_saved_size(dtype: Any, shape: tuple[int, ...], scratch: str) -> int:
    """Bytes of torch.save of one contiguous CPU tensor into a file object (how DCP writes each tensor entry);
    measured once per dtype and shape."""
    import torch

    if (dtype, shape) not in TENSOR_SIZES:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        TENSOR_SIZES[dtype, shape] = saved_size(meta, "tensor", scratch, stream=True)
    return TENSOR_SIZES[dtype, shape]


def dedup_owners(sizes: Sequence[int], ranks: Sequence[int]) -> list[int]:
    """The replica that writes each tensor of a stage module its data-parallel replicas share (``ModuleSplit``), as
    the coordinator's ``torch.distributed.checkpoint._dedup_save_plans`` chooses: each tensor, in the state's order,
    goes to the replica with the fewest bytes planned so far (an empty tensor weighs 1; the module's items come
    first in every plan, before a replica's own, so only they weigh). A tie goes to the first in the order CPython
    iterates the set of the replicas' plan indices, which DCP builds in rank order and takes ``min`` of: not the
    lowest rank ({1, 9, 17, 25} iterates 1, 25, 9, 17)."""
    plans: set[int] = set()
    for rank in ranks:  # as DCP adds each plan index: one at a time, in rank order
        plans.add(rank)
    turn = {rank: position for position, rank in enumerate(plans)}
    planned = [(0, turn[rank], replica) for replica, rank in enumerate(ranks)]  # a heap: (bytes, turn, replica)
    heapq.heapify(planned)
    owners = []
    for size in sizes:
        weight, position, replica = heapq.heappop(planned)
        owners.append(replica)
        heapq.heappush(planned, (weight + (size or 1), position, replica))
    return owners


PREDICTOR = EnginePredictor(dcp_save_files, DCP_TOLERANCE_BYTES, needs_folder=True)
ASYNC_PREDICTOR = EnginePredictor(dcp_files, DCP_TOLERANCE_BYTES, needs_folder=True)

"""The files of TorchSnapshot, predicted: ``harness_state``'s capture, planned by TorchSnapshot's own functions under
the study's patch.

TorchSnapshot and the engine are imported inside the functions: the launcher and ``--dry-run`` read this module
without torch.
"""

from __future__ import annotations

import os
import re
from typing import Any

from restartbench.shards import ShardSetup, cpu_resident, training_states
from restartbench.sizes import EnginePredictor, PlannedFile

TORCHSNAPSHOT_TOLERANCE_BYTES = 0
"""torchsnapshot: exact. Tensors are written raw, small values are inlined in the manifest, and the manifest's JSON
is built by TorchSnapshot's own code from the same values; only the batch files' names are random (uuid4: the plan
writes ``<uuid4>``), not their length."""


def torchsnapshot_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """TorchSnapshot 0.1.0 with the study's patch: each rank's harness state is a snapshot of its own, in
    ``<tag>/rank<NNNNN>/``: what TorchSnapshot's ``take`` would write is planned with TorchSnapshot's own functions
    (``snapshot_requests``); tensor data is written raw (one file per batch of small tensors, per large tensor or per
    512 MiB chunk), other objects torch.save'd one per file, and ``.snapshot_metadata`` is the manifest's JSON."""
    from restartbench.engines import harness_state
    from restartbench.engines.torchsnapshot.engine import rank_folder

    files = []
    for rank, _, state in training_states(setup):
        requests, metadata = snapshot_requests(harness_state.capture(state), setup.device)
        folder = rank_folder("", setup.tag, rank)
        for request in requests:
            size, payload, kind = snapshot_request_bytes(request)
            files.append(PlannedFile(os.path.join(folder, random_names_as_placeholders(request.path)), rank, kind,
                                     payload, size))
        files.append(PlannedFile(os.path.join(folder, SNAPSHOT_METADATA), rank, "metadata", 0,
                                 len(metadata.to_yaml().encode("utf-8"))))
    return files


SNAPSHOT_METADATA = ".snapshot_metadata"
#: A random part of a file name (TorchSnapshot names each batch of small tensors ``batched/<uuid4>``).
RANDOM_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def random_names_as_placeholders(path: str) -> str:
    """``path`` with each random uuid4 in it written ``<uuid4>`` (the same length on disk, another name each save)."""
    return RANDOM_NAME.sub("<uuid4>", path)


def snapshot_requests(state_dict: dict[str, Any], device: str) -> tuple[list[Any], Any]:
    """The write requests and the metadata of ``Snapshot.take`` of one rank's ``state_dict`` under the study's patch
    (a world of one, nothing replicated): the steps of TorchSnapshot's ``Snapshot._take_impl``, with its own
    functions, short of staging and writing the data. TorchSnapshot batches CPU and GPU tensors apart: on a GPU
    run the CPU-resident ones (``cpu_resident``) are batched on their own, first, as its CPU slabs are."""
    from restartbench.engines.torchsnapshot.engine import APP_KEY, patched_torchsnapshot

    patched_torchsnapshot()
    from torchsnapshot import snapshot
    from torchsnapshot.batcher import batch_write_requests
    from torchsnapshot.flatten import flatten
    from torchsnapshot.io_preparer import prepare_write
    from torchsnapshot.knobs import is_batching_disabled
    from torchsnapshot.manifest import PrimitiveEntry, SnapshotMetadata
    from torchsnapshot.partitioner import partition_write_reqs
    from torchsnapshot.version import __version__

    pg = snapshot.PGWrapper(pg=None)  # the patch's rank-local wrapper
    manifest, flattened = flatten(state_dict, prefix=APP_KEY)
    primitives, entries, requests = {}, {}, {}
    for path, obj in flattened.items():
        entry, wrs = prepare_write(obj=obj, logical_path=path, rank=pg.get_rank(), replicated=False)
        if isinstance(entry, PrimitiveEntry):
            primitives[path] = entry
        else:
            entries[path], requests[path] = entry, wrs
    entries, requests = partition_write_reqs(entries=entries, write_reqs=requests, pg=pg)
    write_reqs = [wr for wrs in requests.values() for wr in wrs]
    if not is_batching_disabled():
        on_cpu = [wr for wr in write_reqs if device == "cpu" or cpu_resident(wr.path)]
        on_gpu = [wr for wr in write_reqs if not (device == "cpu" or cpu_resident(wr.path))]
        write_reqs = [wr for group in (on_cpu, on_gpu) if group
                      for wr in batch_write_requests(entries=list(entries.values()), write_reqs=group)[1]]
    manifest.update(dict(**primitives, **entries))
    manifest = snapshot.Snapshot._gather_manifest(manifest=manifest, pg=pg)
    return write_reqs, SnapshotMetadata(version=__version__, world_size=pg.get_world_size(), manifest=manifest)


def snapshot_request_bytes(request: Any) -> tuple[int, int, str]:
    """(file bytes, tensor bytes, kind) of one TorchSnapshot write request: tensors are written raw (buffer
    protocol), a batch as the sum of its tensors; any other object is torch.save'd, done here for real (they are
    small plain values: optimizer hyperparameters such as ``betas``)."""
    import asyncio

    from torchsnapshot.batcher import BatchedBufferStager
    from torchsnapshot.io_preparer import ObjectBufferStager, TensorBufferStager
    from torchsnapshot.serialization import Serializer

    stager = request.buffer_stager
    if isinstance(stager, BatchedBufferStager):
        return stager.slab_sz_bytes, stager.slab_sz_bytes, "data"
    if isinstance(stager, TensorBufferStager):
        if stager.entry.serializer != Serializer.BUFFER_PROTOCOL.value:
            raise NotImplementedError(f"TorchSnapshot would torch.save {request.path} "
                                      f"({stager.tensor.dtype}); the plan predicts raw tensor writes only")
        size = stager.tensor.nelement() * stager.tensor.element_size()
        return size, size, "data"
    if isinstance(stager, ObjectBufferStager):
        return len(asyncio.run(stager.stage_buffer())), 0, "object"
    raise NotImplementedError(f"TorchSnapshot write request {request.path} of an unknown kind "
                              f"({type(stager).__name__}): the plan does not predict it")


PREDICTOR = EnginePredictor(torchsnapshot_files, TORCHSNAPSHOT_TOLERANCE_BYTES)

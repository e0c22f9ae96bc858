"""What DCP's coordinator (rank 0) does alone at each save and each load, timed on this machine's CPU.

``dcp.save`` is collective: every rank plans its items, the coordinator gathers the plans, deduplicates them (each
stage-module tensor the data-parallel replicas share is written by one of them) and builds the checkpoint's
Metadata, scatters the plans back, and once the ranks have written, gathers their write results and pickles the
Metadata into ``.metadata``. That is Python work on one process while the other ranks wait in the scatter and the
final gather, and it grows with every rank's items: at 70B tp8pp8 on 16,384 GPUs the ranks plan 1.56 million items.
The study plans without DCP's plan cache (``DefaultSavePlanner(enable_plan_caching=False)``, its default), so every
save pays it: in ``dcp``'s stall, in ``dcp-async``'s background save (its planning runs on the save's thread).

``measure`` times it on DCP's own local plans (``DefaultSavePlanner.create_local_plan`` of each rank's flat harness
state on meta tensors, as ``restartbench.engines.dcp.predict`` plans them) of data-parallel ranks 0 and 1 of every
stage and tensor rank; the other replicas' plans are rank 1's with its own namespace renamed (a replica's plan
differs from another's only there: ZeRO-1's partitions are equal), which gives DCP's own global plan of every rank's
own plans, item by item (``tests/test_dcp_coordinator.py``). Timed in the calling process, with Python's
garbage collector as it is:

- gather: unpickling every rank's plan (``gather_object`` sends each pickled);
- global plan: ``create_global_plan`` (deduplication and the Metadata);
- scatter: pickling every rank's global plan;
- finish: unpickling every rank's write results (one per item it writes), then pickling the Metadata with them.

A ``dcp.load`` is collective too: every rank reads ``.metadata`` and plans what it reads (a ReadItem per tensor it
holds), and the coordinator gathers the plans, makes the global plan (DCP's default keeps each rank's) and scatters
them back while the others wait. ``load_coordinator`` times those three steps on every rank's load plans of the
checkpoint just planned (``local_load_plans``, replicas made from rank 1's as for the save): the restart's part of it.

Not timed: the collectives' transfers (the network's), and each rank's own planning (the what-if's per-tensor term).
The what-if takes the seconds per item planned (``per_item_s``, ``load_per_item_s``) from a calibration (``PROBE``) and
multiplies them by the items every rank plans at the target's size (``restartbench.whatif.tensors.planned_items``:
a rank reads back what it holds, so a load plans as many).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from restartbench.engines import harness_state
from restartbench.engines.dcp import engine as dcp_engine
from restartbench.layout import Layout
from restartbench.shards import ShardSetup, training_states, two_replicas

PROBE = ("70B", "tp8pp8dp32", "bf16")
"""What a calibration measures: 70B tp8pp8dp32, 2,048 ranks planning 195,328 items, about 25 s on the study's 2-CPU
machine. There the seconds per item fell a little as the items grew, most of them the gather's unpickling and
Python's garbage collections: at a save 46 µs at dp 8, 43 µs at dp 32, 42 µs at dp 256 (1.56 million items), at a
load 34, 29 and 29 µs (``bench/results/2026-12-08-cpu2-dcp-coordinator.md``)."""


def local_plans(setup: ShardSetup) -> dict[tuple[int, int, int], Any]:
    """{(pipe, model, data): the rank's local SavePlan} for data-parallel ranks 0 and 1 of each stage and tp rank of
    the checkpoint ``setup`` describes (``restartbench.plan.setup_for``)."""
    writer = FileSystemWriter(f"{setup.folder}/{setup.tag}")
    return {(coord.pipe, coord.model, coord.data):
            dcp_engine.rank_save_planner(state, coord, writer.storage_meta(), rank == 0).create_local_plan()
            for rank, coord, state in training_states(setup, ranks=two_replicas(setup.layout))}


def local_load_plans(setup: ShardSetup, metadata: Any) -> dict[tuple[int, int, int], Any]:
    """{(pipe, model, data): the rank's local LoadPlan} of the checkpoint ``metadata`` indexes, for data-parallel ranks
    0 and 1 of each stage and tp rank, each loading into its own state (``dcp_engine.load_template``). Planned as the
    study's unflattened ``DefaultLoadPlanner`` plans (``create_default_local_load_plan``, strict), without its
    ``set_up_planner``, which would make each meta tensor a real one on the default device."""
    plans = {}
    for _, coord, state in training_states(setup, ranks=two_replicas(setup.layout)):
        live = dcp_engine.flat_state(harness_state.capture(state), coord.pipe, coord.model, coord.data)
        template = dcp_engine.load_template(metadata, live, coord.pipe, coord.model, coord.data)
        plans[coord.pipe, coord.model, coord.data] = create_default_local_load_plan(template, metadata, True)
    return plans


def renamed(plan: Any, pipe: int, model: int, data: int) -> Any:
    """Data-parallel rank 1's plan (a save's or a load's) as replica ``data``'s: its own namespace's items renamed."""
    _, own = dcp_engine.namespaces(pipe, model, 1)
    _, theirs = dcp_engine.namespaces(pipe, model, data)

    def index(of: Any) -> Any:
        return replace(of, fqn=theirs + of.fqn.removeprefix(own)) if of.fqn.startswith(own + "/") else of

    def item(of: Any) -> Any:
        if isinstance(of, ReadItem):
            return replace(of, dest_index=index(of.dest_index), storage_index=index(of.storage_index))
        return replace(of, index=index(of.index))

    return replace(plan, items=[item(of) for of in plan.items])


def gathered(plans: dict[tuple[int, int, int], Any], layout: Layout) -> list[bytes]:
    """Every rank's local plan pickled, in rank order, as the coordinator's gather receives them."""
    out = []
    for pipe in range(layout.pp):
        for data in range(layout.dp):
            for model in range(layout.tp):
                plan = plans[pipe, model, min(data, 1)]
                out.append(pickle.dumps(plan if data < 2 else renamed(plan, pipe, model, data)))
    return out


def written(plans: list[Any]) -> list[bytes]:
    """Each rank's WriteResults pickled, one per item it writes (FileSystemWriter's one file per rank; the lengths
    are the tensors' bytes, 1 KiB for an object: what the index pickles is their number, not their values)."""
    out = []
    for rank, plan in enumerate(plans):
        name, offset, results = f"__{rank}_0{DEFAULT_SUFFIX}", 0, []
        for item in plan.items:
            length = 1024 if item.type == WriteItemType.BYTE_IO else item.tensor_storage_size()
            results.append(WriteResult(index=item.index, size_in_bytes=length,
                                       storage_data=_StorageInfo(name, offset, length)))
            offset += length
        out.append(pickle.dumps(results))
    return out


def timed(step: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = step()
    return value, time.perf_counter() - start


def coordinator(blobs: list[bytes]) -> dict[str, Any]:
    """The coordinator's steps at a save on the gathered plans, each timed, and what they handled; ``index`` is the
    pickled ``.metadata``."""
    planner = dcp_engine.save_planner()
    planner.set_up_planner(state_dict={}, is_coordinator=True)
    local, gather_s = timed(lambda: [pickle.loads(blob) for blob in blobs])
    (plans, metadata), global_s = timed(lambda: planner.create_global_plan(local))
    scattered, scatter_s = timed(lambda: [pickle.dumps(plan) for plan in plans])
    results = written(plans)

    def finish() -> bytes:
        metadata.storage_data = {r.index: r.storage_data for blob in results for r in pickle.loads(blob)}
        return pickle.dumps(metadata)

    index, finish_s = timed(finish)
    _, read_s = timed(lambda: pickle.loads(index))
    planned = sum(len(plan.items) for plan in local)
    total = gather_s + global_s + scatter_s + finish_s
    return {"ranks": len(blobs), "local_items": planned, "written_items": sum(len(plan.items) for plan in plans),
            "index_items": len(metadata.state_dict_metadata), "gathered_bytes": sum(map(len, blobs)),
            "scattered_bytes": sum(map(len, scattered)), "metadata_bytes": len(index), "gather_s": gather_s,
            "global_plan_s": global_s, "scatter_s": scatter_s, "finish_s": finish_s, "coordinator_s": total,
            "per_item_s": total / planned, "index_read_s": read_s, "index": index}


def load_coordinator(blobs: list[bytes]) -> dict[str, Any]:
    """The coordinator's steps at a load on the gathered load plans, each timed: unpickling every rank's plan, the
    global plan (DCP's default load planner and FileSystemReader keep each rank's), pickling every rank's plan back."""
    planner = dcp_engine.load_planner()
    local, gather_s = timed(lambda: [pickle.loads(blob) for blob in blobs])
    plans, global_s = timed(lambda: planner.create_global_plan(local))
    _, scatter_s = timed(lambda: [pickle.dumps(plan) for plan in plans])
    planned = sum(len(plan.items) for plan in local)
    total = gather_s + global_s + scatter_s
    return {"load_items": planned, "load_gather_s": gather_s, "load_global_plan_s": global_s,
            "load_scatter_s": scatter_s, "load_coordinator_s": total, "load_per_item_s": total / planned}


def measure(setup: ShardSetup) -> dict[str, Any]:
    """``coordinator`` on every rank's plans of the checkpoint ``setup`` describes, then ``load_coordinator`` on
    every rank's plans to load that checkpoint back (without the pickled index)."""
    saved = coordinator(gathered(local_plans(setup), setup.layout))
    metadata = pickle.loads(saved.pop("index"))
    return {"preset": setup.preset.name, "layout": setup.layout.name, "gpus": setup.layout.world_size, **saved,
            **load_coordinator(gathered(local_load_plans(setup, metadata), setup.layout))}

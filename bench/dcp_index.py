#!/usr/bin/env python3
"""What reading DCP's ``.metadata`` costs each rank at a load, as its index grows with the data-parallel size.

    python bench/dcp_index.py [--items 1000,10000,90000] [--repeats 3]

At a load every rank of a DCP checkpoint reads and unpickles the whole ``.metadata``
(``FileSystemReader.read_metadata`` in each rank's local step of ``dcp.load``). The what-if counts its bytes in the
load's read (``whatif.tensors.index_items``: one item per stage-module tensor and per rank's optimizer tensor), not the
time to unpickle its objects, which is CPU work: this measures that time, so that docs/whatif.md can say what leaving
it out moves.

Per item count N: a real ``dcp.save`` of N one-element tensors (keys as DeepSpeed's) in this process, then
``read_metadata`` timed ``repeats`` times, the median kept: with Python's garbage collector on, as in a load, and off
(the share of the time that is collections). Each full collection visits every object the process tracks: this
process has imported torch and DeepSpeed, as a rank has (the count is recorded); a rank also holds its model, engine
and optimizer, so its collections take at least this long. The what-if's largest index is printed beside it (70B
tp8pp8 at 16,384 GPUs: dp 256). Nothing is written but the results and a scratch folder, removed.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_io import ROOT, add_output_arguments, attempt_stem, heading, positive_ints, run_meta, write_results

sys.path.insert(0, str(ROOT))

import deepspeed  # noqa: E402, F401 - its objects, which a rank holds and every full collection visits
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402

from restartbench.layout import Layout  # noqa: E402
from restartbench.whatif.predict import shapes_for  # noqa: E402
from restartbench.whatif.tensors import index_items  # noqa: E402

LARGEST = ("70B", Layout(8, 8, 256))
"""The what-if's largest sweep point of its README example (70B tp8pp8 at 16,384 GPUs)."""


def read_seconds(path: Path, repeats: int, collect: bool) -> float:
    """Median seconds of ``read_metadata`` over ``repeats``, the garbage collector on or off."""
    reader, seconds = FileSystemReader(str(path)), []
    for _ in range(repeats):
        gc.collect()
        if not collect:
            gc.disable()
        try:
            start = time.perf_counter()
            metadata = reader.read_metadata()
            seconds.append(time.perf_counter() - start)
        finally:
            gc.enable()
        del metadata
    return statistics.median(seconds)


def measure_one(items: int, scratch: Path, repeats: int) -> dict:
    state = {f"module.layers.{i // 12}.weight_{i % 12}": torch.zeros(1) for i in range(items)}
    path = scratch / str(items)
    dcp.save(state, checkpoint_id=str(path))
    del state
    gc_on, gc_off = read_seconds(path, repeats, True), read_seconds(path, repeats, False)
    nbytes = os.path.getsize(path / ".metadata")
    return {"items": items, "metadata_bytes": nbytes, "read_s": gc_on, "read_s_gc_off": gc_off,
            "us_per_item": gc_on / items * 1e6, "MBps": nbytes / gc_on / 1e6}


def largest_index() -> dict:
    preset, layout = LARGEST
    shape = shapes_for(preset, layout, ["dcp"])["dcp"]
    return {"preset": preset, "layout": layout.name, "gpus": layout.world_size,
            "items": index_items(shape.tensors, layout.dp)}


def markdown(result: dict) -> str:
    rows, largest = result["rows"], result["largest"]
    nearest = min(rows, key=lambda r: abs(r["items"] - largest["items"]))
    lines = [*heading("DCP's index read at a load", result["meta"]),
             f"`FileSystemReader.read_metadata()` of a real `dcp.save`'s `.metadata` (N one-element tensors), the "
             f"median of {result['repeats']} reads in a process that has imported torch and DeepSpeed, as a rank has "
             f"({result['tracked_objects']:,} objects tracked by the garbage collector): what every rank of a DCP load "
             "does before it reads a tensor. GC on = as a load runs; GC off = without Python's collections (their "
             "share). A rank also holds its model, engine and optimizer, which each full collection visits too: "
             "these are floors.", "",
             "| items | .metadata MB | read s (GC on) | µs per item | MB/s | read s (GC off) |",
             "|---|---|---|---|---|---|",
             *[f"| {r['items']:,} | {r['metadata_bytes'] / 1e6:.2f} | {r['read_s']:.3f} | {r['us_per_item']:.1f} | "
               f"{r['MBps']:.1f} | {r['read_s_gc_off']:.3f} |" for r in rows], "",
             f"The what-if's largest index, {largest['preset']} {largest['layout']} ({largest['gpus']:,} GPUs): "
             f"{largest['items']:,} items, about {largest['items'] * nearest['us_per_item'] / 1e6:.1f} s per rank at "
             f"the rate measured nearest it ({nearest['us_per_item']:.1f} µs per item at {nearest['items']:,}), left "
             "out of the what-if's load."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=positive_ints, default="1000,10000,90000",
                        help="index sizes, comma-separated (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    add_output_arguments(parser)
    options = parser.parse_args(argv)
    meta = run_meta("dcp-index", argv, options.machine)
    with tempfile.TemporaryDirectory(prefix="restartbench-dcp-index-") as scratch:
        rows = []
        for items in options.items:
            rows.append(measure_one(items, Path(scratch), options.repeats))
            print(f"{items} items: {rows[-1]['read_s']:.3f} s ({rows[-1]['us_per_item']:.1f} µs per item)",
                  flush=True)
    result = {"meta": meta, "repeats": options.repeats, "rows": rows, "largest": largest_index(),
              "tracked_objects": len(gc.get_objects())}
    write_results(options.out, result, markdown, attempt_stem(options.out, meta))


if __name__ == "__main__":
    main(sys.argv[1:])

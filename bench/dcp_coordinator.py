#!/usr/bin/env python3
"""What DCP's coordinator (rank 0) does alone at each save and each load, as the data-parallel size grows.

    python bench/dcp_coordinator.py [--preset 70B] [--layout tp8pp8] [--dps 8,32,256]

``restartbench.engines.dcp.coordinator`` says what is timed and how the plans are made (DCP's own, of every rank).
Per data-parallel size the coordinator's steps run twice on the same plans: with Python's garbage collector on, as
in a save, and off (the share of the time that is collections). The process has imported torch and DeepSpeed, as a
rank has; a rank also holds its model, engine and optimizer, which each full collection visits too: these are
floors. The what-if's term is the seconds per item planned; the largest dp shows whether they hold as the items
grow. Nothing is written but the results.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import resource
import sys

from results_io import ROOT, add_output_arguments, attempt_stem, heading, positive_ints, run_meta, write_results

sys.path.insert(0, str(ROOT))

import deepspeed  # noqa: E402, F401 - its objects, which a rank holds and every full collection visits

from restartbench.engines.dcp.coordinator import (  # noqa: E402
    coordinator,
    gathered,
    load_coordinator,
    local_load_plans,
    local_plans,
)
from restartbench.layout import Layout, parse_layout  # noqa: E402
from restartbench.plan import config_named, setup_for  # noqa: E402


def measure(preset: str, layout: Layout, dtype: str) -> dict:
    setup = setup_for(config_named(preset, layout.name, "dcp", dtype))
    blobs = gathered(local_plans(setup), layout)
    gc.collect()
    row = {"layout": layout.name, "gpus": layout.world_size, **coordinator(blobs),
           "tracked_objects": len(gc.get_objects())}
    loads = gathered(local_load_plans(setup, pickle.loads(row.pop("index"))), layout)
    gc.collect()
    row |= load_coordinator(loads)
    gc.collect()
    gc.disable()
    try:
        row["coordinator_s_gc_off"] = coordinator(blobs)["coordinator_s"]
        row["load_coordinator_s_gc_off"] = load_coordinator(loads)["load_coordinator_s"]
    finally:
        gc.enable()
    row["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return row


def markdown(result: dict) -> str:
    rows = result["rows"]
    lines = [*heading("DCP's coordinator at a save", result["meta"]),
             f"{result['preset']} {result['dtype']}: what rank 0 alone does in each `dcp.save` while the other ranks "
             "wait (`restartbench.engines.dcp.coordinator`), on DCP's own local plans of every rank, in a process "
             "that has imported torch and DeepSpeed. gather = unpickling every rank's plan; global plan = "
             "`create_global_plan` (deduplication and the Metadata); scatter = pickling every rank's global plan; "
             "finish = unpickling every rank's write results and pickling `.metadata`; coordinator = their sum, "
             "with Python's garbage collector on (as in a save) and off. The transfers are not timed (the "
             "network's), nor each rank's own planning (the what-if's per-tensor term). In `dcp`'s stall; in "
             "`dcp-async`'s background save. Index read = one unpickle of that `.metadata`, what each rank does "
             "first at a load.", "",
             "| layout | GPUs | items planned | index items | .metadata MB | gather s | global plan s | scatter s | "
             "finish s | coordinator s | µs per item | GC off s | index read s | peak RSS GB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
             *[f"| {r['layout']} | {r['gpus']:,} | {r['local_items']:,} | {r['index_items']:,} | "
               f"{r['metadata_bytes'] / 1e6:.1f} | {r['gather_s']:.2f} | {r['global_plan_s']:.2f} | "
               f"{r['scatter_s']:.2f} | {r['finish_s']:.2f} | {r['coordinator_s']:.2f} | "
               f"{r['per_item_s'] * 1e6:.1f} | {r['coordinator_s_gc_off']:.2f} | {r['index_read_s']:.2f} | "
               f"{r['peak_rss_gb']:.1f} |" for r in rows], "",
             "At a load of that checkpoint (`dcp.load`): the coordinator gathers every rank's load plan (a read item "
             "per tensor the rank holds), makes the global plan and scatters the plans back, while the others wait. "
             "In the restart's checkpoint load.", "",
             "| layout | GPUs | items planned | gather s | global plan s | scatter s | coordinator s | µs per item | "
             "GC off s |",
             "|---|---|---|---|---|---|---|---|---|",
             *[f"| {r['layout']} | {r['gpus']:,} | {r['load_items']:,} | {r['load_gather_s']:.2f} | "
               f"{r['load_global_plan_s']:.2f} | {r['load_scatter_s']:.2f} | {r['load_coordinator_s']:.2f} | "
               f"{r['load_per_item_s'] * 1e6:.1f} | {r['load_coordinator_s_gc_off']:.2f} |" for r in rows]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="70B")
    parser.add_argument("--layout", default="tp8pp8", help="tensor and pipeline sizes (its dp is --dps')")
    parser.add_argument("--dps", type=positive_ints, default="8,32,256",
                        help="data-parallel sizes, comma-separated (default %(default)s)")
    parser.add_argument("--dtype", default="bf16")
    add_output_arguments(parser)
    options = parser.parse_args(argv)
    base = parse_layout(options.layout)
    meta = run_meta("dcp-coordinator", argv, options.machine)
    rows = []
    for dp in options.dps:
        rows.append(measure(options.preset, Layout(base.tp, base.pp, dp), options.dtype))
        print(f"{rows[-1]['layout']}: coordinator {rows[-1]['coordinator_s']:.2f} s "
              f"({rows[-1]['local_items']:,} items planned)", flush=True)
    result = {"meta": meta, "preset": options.preset, "dtype": options.dtype, "rows": rows}
    write_results(options.out, result, markdown, attempt_stem(options.out, meta))


if __name__ == "__main__":
    main(sys.argv[1:])

"""``python -m restartbench.whatif PRESET LAYOUT --cluster FILE``: the predicted checkpoint and restart per engine.

    python -m restartbench.whatif 70B tp8pp8dp4 --cluster clusters/h100-pfs.yaml
    python -m restartbench.whatif 7B tp1pp1dp8 --cluster clusters/cpu2.yaml --engines torch,lazy --json
    python -m restartbench.whatif 13B tp2pp4dp2 --cluster clusters/h100-pfs.yaml --plot out/

Per engine: the stall, the whole cost (stall + slowdown), the durable time, every restart part and the total, the
bytes per rank and per node, the resource that bounds each part, Daly's interval and the goodput at that scale;
each figure with the range the calibration's spread gives, and "assumed" where a cited constant entered it.
Bad input (a cluster file with a missing or negative field, a layout that does not fit the preset or the cluster,
an engine the calibration never ran) is refused with the reason, and nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from restartbench import goodput
from restartbench.whatif.cluster import ClusterError, load_cluster
from restartbench.whatif.fit import FitError, read_fit
from restartbench.whatif.predict import RESTART_PARTS, WhatIfError, whatif

DEFAULT_ENGINES = "torch,lazy,dcp"
GB = 1e9


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m restartbench.whatif", description=__doc__.split("\n")[0])
    parser.add_argument("preset", help="model preset (tiny, small, 3B, 7B, 13B, 33B, 70B)")
    parser.add_argument("layout", help="parallel layout with every degree, such as tp8pp8dp4")
    parser.add_argument("--cluster", required=True, type=Path, help="cluster file (YAML; clusters/*.yaml)")
    parser.add_argument("--engines", default=DEFAULT_ENGINES, help="engines, comma-separated (default: %(default)s)")
    parser.add_argument("--failures-per-gpu-hour", type=float, default=goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                        help="failure rate for the goodput (default: Llama 3's, %(default).3g)")
    parser.add_argument("--iteration-s", type=float, default=None,
                        help="the target's iteration time in seconds (default: 6·P·tokens / (GPUs·peak·MFU) with "
                             "the cluster file's peak and MFU)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="training precision")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="draw the figures into this folder")
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = load_cluster(args.cluster)
    fit = read_fit(cluster.fit_path())
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines:
        raise WhatIfError("--engines names no engine")
    return whatif(args.preset, args.layout, engines, cluster, fit, args.failures_per_gpu_hour, args.iteration_s,
                  args.dtype)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout as it is imported: keep stdout ours
            result = run(args)
    except (ClusterError, FitError, WhatIfError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.plot:
        from restartbench.whatif.plots import draw

        result["figures"] = [str(p) for p in draw(result, args.plot)]
    print(json.dumps(result, indent=1) if args.json else render_text(result))
    return 0


# -- text ---------------------------------------------------------------------------------------------------


def _figure(p: dict[str, Any]) -> str:
    mark = " (assumed)" if p["assumed"] else ""
    return f"{p['s']:.3g} s [{p['low_s']:.3g}–{p['high_s']:.3g}]{mark}"


def render_text(result: dict[str, Any]) -> str:
    lines = [f"what-if: {result['preset']} {result['layout']} on {result['cluster']} ({result['device']}, "
             f"checkpoints to {result['storage']} storage), {result['dtype']}",
             f"iteration {result['iteration_s']:.3g} s: {result['iteration_basis']}",
             f"failures {result['failures_per_gpu_hour']:.3g} per GPU-hour; ranges: the calibration's spread", ""]
    for r in result["engines"]:
        lines += _engine_text(r)
    if result["assumed"]:
        lines += ["assumed (cited, not measured here):"]
        lines += [f"  {name}: {source}" for name, source in result["assumed"].items()]
    lines += ["", "goodput against scale (the layout's tp and pp, dp grown):"]
    lines += [f"  {row['gpus']:>6} GPUs {row['layout']:<14} {row['engine']:<10} goodput {row['goodput_pct']:.2f} % "
              f"[{row['goodput_pct_low']:.2f}–{row['goodput_pct_high']:.2f}]{' (assumed)' if row['assumed'] else ''}"
              for row in result["scale"]]
    return "\n".join(lines)


def _engine_text(r: dict[str, Any]) -> list[str]:
    c, s, g = r["checkpoint"], r["restart"], r["goodput"]
    lines = [f"engine {r['engine']}: {r['ranks']} ranks on {r['nodes']} node(s); busiest rank "
             f"{r['bytes_per_rank'] / GB:.3g} GB in {r['files_per_rank']:g} files, busiest node "
             f"{r['bytes_per_node'] / GB:.3g} GB in {r['files_per_node']:g} files"]
    for name in ("stall", "slowdown", "cost", "durable"):
        lines.append(f"  {name:<13} {_figure(c[name]):<40} bound: {c[name]['bound']}")
    for name in (*RESTART_PARTS, "total"):
        lines.append(f"  restart {name:<12} {_figure(s[name]):<36} bound: {s[name]['bound']}")
    lines.append(f"  Daly interval {g['interval_s']:.3g} s ({g['interval_iterations']:.3g} iterations), MTBF "
                 f"{g['mtbf_s']:.3g} s on {g['gpus']} GPUs, goodput {g['goodput_pct']:.2f} % "
                 f"[{g['goodput_pct_low']:.2f}–{g['goodput_pct_high']:.2f}]")
    return [*lines, ""]

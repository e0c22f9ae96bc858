"""``python -m restartbench.whatif PRESET LAYOUT --cluster FILE``: the predicted checkpoint and restart per engine.

    python -m restartbench.whatif 70B tp8pp8dp4 --cluster clusters/h100-pfs.yaml
    python -m restartbench.whatif 7B tp1pp1dp8 --cluster clusters/cpu2.yaml --engines torch,lazy --json
    python -m restartbench.whatif 13B tp2pp4dp2 --cluster clusters/h100-pfs.yaml --plot out/
    python -m restartbench.whatif --calibrate --out clusters/mine.yaml [--logs DIR] [--dry-run] [--slurm]

Per engine: the stall, the whole cost (stall + slowdown), the durable time, every restart part and the total, the
bytes per rank and per node, the resource that bounds each part, Daly's interval and the goodput at that scale;
each figure with the range the calibration's spread gives, and "assumed" where a cited constant entered it.
Bad input (a cluster file with a missing or negative field, a layout that does not fit the preset or the cluster,
an engine the calibration never ran) is refused with the reason, and nothing is written.

``--calibrate`` fits the model on the machine it runs on and writes a cluster file (restartbench.whatif.calibrate).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from restartbench import goodput
from restartbench.presets import PRESETS
from restartbench.whatif import calibrate
from restartbench.whatif.cluster import ClusterError, load_cluster
from restartbench.whatif.fit import FitError, read_fit
from restartbench.whatif.predict import RESTART_PARTS, WhatIfError, whatif

GB = 1e9


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m restartbench.whatif", description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", help=f"model preset ({', '.join(PRESETS)})")
    parser.add_argument("layout", nargs="?", help="parallel layout with every degree, such as tp8pp8dp4")
    parser.add_argument("--cluster", type=Path, help="cluster file (YAML; clusters/*.yaml)")
    parser.add_argument("--engines", default=None, help="engines, comma-separated (default: every engine the "
                        "cluster file's calibration fitted, an engine it could not fit being named with the reason "
                        f"only when asked for; with --calibrate, {','.join(calibrate.DEFAULT_ENGINES)})")
    parser.add_argument("--failures-per-gpu-hour", type=float, default=goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                        help="failure rate for the goodput (default: Llama 3's, %(default).3g)")
    parser.add_argument("--iteration-s", type=float, default=None,
                        help="the target's iteration time in seconds (default: 6·P·tokens / (GPUs·peak·MFU) with "
                             "the cluster file's peak and MFU)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="training precision")
    parser.add_argument("--prefetch", action="store_true",
                        help="restarts that read the checkpoint beside the start-up, for the engines that can "
                             "(lazy: config-n-run.py's --lazy-prefetch); the others as without")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="draw the figures into this folder")
    calibration = parser.add_argument_group("calibration (--calibrate: fit the model on this machine, write a "
                                            "cluster file; docs/calibrate.md)")
    calibration.add_argument("--calibrate", action="store_true",
                             help="run the calibration's probes and runs here, fit, write --out")
    calibration.add_argument("--out", type=Path, help="the cluster file to write (<name>.yaml; <name>-fit.json and "
                             "<name>-calibration.json beside it)")
    calibration.add_argument("--logs", type=Path, default=None,
                             help="folder of the calibration's runs and probes (default: logs/calibrate-<name>); "
                                  "complete runs there are reused")
    calibration.add_argument("--dry-run", action="store_true", help="print the steps and their expected time only")
    calibration.add_argument("--force", action="store_true", help="replace --out (and its fit) if they exist")
    calibration.add_argument("--timeout", type=int, default=900, help="seconds per run (default: %(default)s)")
    calibration.add_argument("--gpus-per-node", type=int, default=None,
                             help="the cluster file's GPUs per node (default: the GPUs torch sees; 8 on a CPU "
                                  "machine)")
    calibration.add_argument("--name", default=None, help="the cluster file's name field (default: host, CPUs, GPU)")
    calibration.add_argument("--run-device", default="auto", choices=("auto", "cpu", "cuda"),
                             help="config-n-run.py's --device for the runs (default: %(default)s)")
    calibration.add_argument("--slurm", action="store_true",
                             help="also calibrate on 2 Slurm nodes: 2-node runs (sbatch) and the shared storage "
                                  "probed from both nodes at once (srun); refused without a Slurm of 2 idle nodes")
    return parser


def engine_list(text: str) -> tuple[str, ...]:
    """``--engines``' comma-separated names."""
    return tuple(e.strip() for e in text.split(",") if e.strip())


def calibrate_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--calibrate: refuses the prediction's arguments, bad options and existing files before anything runs."""
    given = [name for name, value in (("PRESET", args.preset), ("LAYOUT", args.layout), ("--cluster", args.cluster),
                                      ("--plot", args.plot), ("--json", args.json or None)) if value]
    if given:
        parser.error(f"--calibrate writes a cluster file and predicts nothing: drop {', '.join(given)}")
    if args.out is None:
        parser.error("--calibrate needs --out FILE.yaml, the cluster file it writes")
    options = calibrate.Options(
        out=args.out.absolute(), logs=(args.logs or Path("logs") / f"calibrate-{args.out.stem}").absolute(),
        engines=engine_list(args.engines) if args.engines is not None else calibrate.DEFAULT_ENGINES,
        timeout_s=args.timeout,
        gpus_per_node=args.gpus_per_node, name=args.name, force=args.force, slurm=args.slurm,
        run_device=args.run_device)
    try:
        steps = calibrate.plan_steps(options)
        if args.dry_run:
            print("\n".join(f"{n:>2}. {s.kind:<6} {s.name}" + (f" (skipped: {s.skip})" if s.skip
                                                                else f" (about {s.expected_s:.0f} s)")
                            + (f" [{s.via}]" if s.via else "") for n, s in enumerate(steps, 1)))
            print(f"expected: about {sum(s.expected_s for s in steps) / 60:.0f} min on the study's 2-CPU machine; "
                  f"runs in {options.logs}")
            if options.slurm:
                try:
                    print(calibrate.slurm_nodes().line())
                except calibrate.CalibrationError as error:
                    print(f"not runnable here (the calibration would be refused): {error}")
            return 0
        calibrate.calibrate(options, steps)
    except calibrate.CalibrationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: nothing written; rerun the same command to go on (complete runs in {options.logs} "
              "are reused)", file=sys.stderr)
        return 130
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = load_cluster(args.cluster)
    fit = read_fit(cluster.fit_path())
    engines = list(engine_list(args.engines) if args.engines is not None else fit.real_engines())
    if not engines:
        raise WhatIfError("--engines names no engine")
    return whatif(args.preset, args.layout, engines, cluster, fit, args.failures_per_gpu_hour, args.iteration_s,
                  args.dtype, args.prefetch)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.calibrate:
        return calibrate_main(args, parser)
    calibration_only = [flag for flag, given in (("--out", args.out), ("--logs", args.logs),
                                                 ("--dry-run", args.dry_run), ("--force", args.force),
                                                 ("--slurm", args.slurm)) if given]
    if calibration_only:
        parser.error(f"{', '.join(calibration_only)} go with --calibrate")
    missing = [name for name, value in (("PRESET", args.preset), ("LAYOUT", args.layout), ("--cluster", args.cluster))
               if value is None]
    if missing:
        parser.error(f"a prediction needs {', '.join(missing)} (or --calibrate to write a cluster file)")
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
    return f"{p['s']:.3g} s [{p['low_s']:.3g}–{p['high_s']:.3g}]{_assumed(p)}"


def _assumed(figure: dict[str, Any]) -> str:
    """' (assumed: the cited constants that entered it)', or nothing."""
    return f" (assumed: {', '.join(figure['cited'])})" if figure["assumed"] else ""


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
    lines += [f"left out: {what}" for what in result["left_out"]]
    lines += ["", "goodput against scale (the layout's tp and pp, dp grown):"]
    lines += [f"  {row['gpus']:>6} GPUs {row['layout']:<14} {row['engine']:<10} goodput {row['goodput_pct']:.2f} % "
              f"[{row['goodput_pct_low']:.2f}–{row['goodput_pct_high']:.2f}]{' (assumed)' if row['assumed'] else ''}"
              for row in result["scale"]]
    return "\n".join(lines)


def _engine_text(r: dict[str, Any]) -> list[str]:
    c, s, g = r["checkpoint"], r["restart"], r["goodput"]
    lines = [f"engine {r['engine']}{' (restart prefetched)' if r.get('prefetched') else ''}: {r['ranks']} ranks "
             f"on {r['nodes']} node(s); busiest rank "
             f"{r['bytes_per_rank'] / GB:.3g} GB in {r['files_per_rank']:g} files, busiest node "
             f"{r['bytes_per_node'] / GB:.3g} GB in {r['files_per_node']:g} files"]
    for name in ("stall", "slowdown", "cost", "durable"):
        lines.append(f"  {name:<13} {_figure(c[name]):<40} bound: {c[name]['bound']}")
    for name in (*RESTART_PARTS, "total"):
        lines.append(f"  restart {name:<12} {_figure(s[name]):<36} bound: {s[name]['bound']}")
    lines.append(f"  Daly interval {g['interval_s']:.3g} s ({g['interval_iterations']:.3g} iterations), MTBF "
                 f"{g['mtbf_s']:.3g} s on {g['gpus']} GPUs, goodput {g['goodput_pct']:.2f} % "
                 f"[{g['goodput_pct_low']:.2f}–{g['goodput_pct_high']:.2f}]{_assumed(g)}")
    return [*lines, ""]

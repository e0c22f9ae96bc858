#!/usr/bin/env python3
"""How long ``./submit-job.sh PRESET LAYOUT --dry-run`` takes with an empty plan cache and with a filled one.

    python bench/dry_run.py [--preset 70B] [--layout tp8pp4dp2] [--repeats 3]

A dry run predicts the checkpoint's size (``restartbench.plan.checkpoint_bytes``: the predictor builds every
rank's state on torch's meta device) and keeps the result in the plan cache (``RESTARTBENCH_PLAN_CACHE``), so a
repeated dry run of the same configuration reads it back. Each repeat times, as wall-clock time of the whole
command, one cold run on a fresh, empty cache folder and one warm run on the folder it filled, and checks that
both print the same checkpoint size. ``scripts/setup-env.sh`` runs once before, untimed, so that no timed run
sets up the environment. Writes ``bench/results/YYYY-MM-DD-<machine>-dry-run.json`` and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from results_io import ROOT, add_output_arguments, machine_line, run_meta, write_results

PLAN_CACHE = "RESTARTBENCH_PLAN_CACHE"
SIZE_LINE = "# estimated checkpoint size:"


def timed_dry_run(command: list[str], cache: str) -> dict:
    """Wall time, exit status and printed checkpoint size of one dry run with ``cache`` as the plan cache."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, PLAN_CACHE: cache}, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    sizes = [line for line in done.stdout.splitlines() if line.startswith(SIZE_LINE)]
    return {"wall_s": wall_s, "exit": done.returncode, "load_average_after": os.getloadavg()[0],
            "checkpoint_size": sizes[0][len(SIZE_LINE):].strip() if sizes else None,
            "cache_files": len(os.listdir(cache))}


def cold_then_warm(command: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-dry-run-cache-") as cache:
        return {"cold": timed_dry_run(command, cache), "warm": timed_dry_run(command, cache)}


def spread(repeats: list[dict], kind: str) -> str:
    times = [r[kind]["wall_s"] for r in repeats]
    return f"median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f})"


def consistent(repeats: list[dict]) -> bool:
    """Every run exited 0 and printed one and the same checkpoint size."""
    runs = [r[kind] for r in repeats for kind in ("cold", "warm")]
    return all(run["exit"] == 0 for run in runs) and len({run["checkpoint_size"] for run in runs}) == 1


def markdown(result: dict) -> str:
    meta, repeats = result["meta"], result["repeats"]
    command = " ".join(result["dry_run"])
    lines = [f"# Dry run with an empty and a filled plan cache — {meta['machine']}, {meta['date']}", "",
             f"`{meta['command']}`: each of {len(repeats)} repeats runs `{command}` cold (an empty plan cache "
             "folder), then warm (the folder the cold run filled); wall-clock time of the whole command.", "",
             machine_line(meta), "",
             f"**warm: {spread(repeats, 'warm')}; cold: {spread(repeats, 'cold')}.**", "",
             "| repeat | cold s | warm s | load average after cold / warm | checkpoint size (cold / warm) | exit |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {r['cold']['wall_s']:.2f} | {r['warm']['wall_s']:.2f} | {r['cold']['load_average_after']:.1f} "
              f"/ {r['warm']['load_average_after']:.1f} | {r['cold']['checkpoint_size']} / "
              f"{r['warm']['checkpoint_size']} | {r['cold']['exit']} / {r['warm']['exit']} |"
              for i, r in enumerate(repeats, 1)]
    lines += ["", "Every run exited 0 and printed the same checkpoint size." if consistent(repeats)
              else "Not every run exited 0 with the same checkpoint size: see the table.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="70B")
    parser.add_argument("--layout", default="tp8pp4dp2")
    parser.add_argument("--repeats", type=int, default=3)
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    subprocess.run([str(ROOT / "scripts" / "setup-env.sh")], check=True)
    meta = run_meta("dry-run", argv, args.machine)
    command = ["./submit-job.sh", args.preset, args.layout, "--dry-run"]
    repeats = []
    for index in range(1, args.repeats + 1):
        repeats.append(cold_then_warm(command))
        print(f"repeat {index}: cold {repeats[-1]['cold']['wall_s']:.2f} s, warm {repeats[-1]['warm']['wall_s']:.2f} s",
              flush=True)
    write_results(args.out, {"meta": meta, "dry_run": command, "repeats": repeats}, markdown)
    return 0 if consistent(repeats) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Wall-clock time of the README's example runs: the embedded default and the demo sweep.

    python bench/commands.py [--skip-sweep]

Runs ``./submit-job.sh --logs TMP`` (the embedded default: tiny tp2pp2 on 4 CPU ranks) and
``./submit-job.sh --sweep sweeps/demo.yaml`` (its cells, with ``logs`` pointed at a temporary folder), each once,
and records each command's wall-clock time, exit status and run folders' status. ``scripts/setup-env.sh`` runs
once before, untimed. Writes ``bench/results/YYYY-MM-DD-<machine>-commands.json`` and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from results_io import ROOT, add_output_arguments, machine_line, run_meta, write_results

DEMO_SWEEP = ROOT / "sweeps" / "demo.yaml"


def run_statuses(logs: Path) -> list[str]:
    """Each run folder's status under ``logs`` (``metadata.json``)."""
    return [json.loads(meta.read_text())["status"] for meta in sorted(logs.rglob("metadata.json"))]


def timed(name: str, command: list[str], logs: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    print(f"{name}: exit {done.returncode} after {wall_s:.0f} s", flush=True)
    return {"name": name, "command": command, "wall_s": wall_s, "exit": done.returncode,
            "load_average_after": os.getloadavg()[0], "runs": run_statuses(logs),
            "tail": (done.stdout + done.stderr).strip().splitlines()[-3:]}


def default_run(scratch: Path) -> dict:
    logs = scratch / "default"
    return timed("default run", ["./submit-job.sh", "--logs", str(logs)], logs)


def demo_sweep(scratch: Path) -> dict:
    """The demo sweep's cells and options, with its logs in ``scratch``."""
    logs = scratch / "sweep"
    sweep = {**yaml.safe_load(DEMO_SWEEP.read_text()), "logs": str(logs)}
    copy = scratch / DEMO_SWEEP.name
    copy.write_text(yaml.safe_dump(sweep))
    return {**timed("demo sweep", ["./submit-job.sh", "--sweep", str(copy)], logs), "sweep": sweep}


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# The README's example runs, timed — {meta['machine']}, {meta['date']}", "", f"`{meta['command']}`",
             "", machine_line(meta), "",
             "| command | wall s | exit | runs (status) | load average after |", "|---|---|---|---|---|"]
    for m in result["measured"]:
        statuses = ", ".join(f"{m['runs'].count(s)} {s}" for s in sorted(set(m["runs"])))
        lines.append(f"| {m['name']}: `{' '.join(m['command'])}` | {m['wall_s']:.0f} | {m['exit']} | "
                     f"{len(m['runs'])} ({statuses}) | {m['load_average_after']:.1f} |")
    lines += ["", "Wall-clock time of the whole command, environment already set up; the logs went to a temporary "
              "folder (for the sweep, a copy of `sweeps/demo.yaml` whose `logs` points there).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-sweep", action="store_true", help="time the default run only")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    subprocess.run([str(ROOT / "scripts" / "setup-env.sh")], check=True)
    meta = run_meta("commands", argv, args.machine)
    steps = [default_run] if args.skip_sweep else [default_run, demo_sweep]
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as scratch:
        measured = [step(Path(scratch)) for step in steps]
    write_results(args.out, {"meta": meta, "measured": measured}, markdown)
    return 0 if all(m["exit"] == 0 for m in measured) else 1


if __name__ == "__main__":
    sys.exit(main())

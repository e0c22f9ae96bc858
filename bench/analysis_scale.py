#!/usr/bin/env python3
"""How long the analysis takes over thousands of run folders.

    python bench/analysis_scale.py [--runs 2000] [--from RUN_DIR]

Copies one real run folder (its events, metadata, config, plan and inventory; not the checkpoint
files) N times under a temporary logs root, then times ``restartbench.analysis.collect`` and the
tables ``summarize.py`` prints. Without ``--from`` it first makes one tiny run (2 CPU ranks).
The target is thousands of runs in seconds, not minutes. Writes
``bench/results/YYYY-MM-DD-<machine>-analysis-scale.json`` and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import ROOT, add_output_arguments, machine_line, run_meta, write_results

from restartbench import analysis

NOT_COPIED = ("checkpoints", "digests")
SOURCE_RUN = ["tiny", "tp1pp1dp2", "--dtype", "fp32", "--iters", "2"]


def one_real_run(logs: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), *SOURCE_RUN, "--logs", str(logs)],
                   check=True, capture_output=True)
    return next(logs.glob("*/*/*/*/metadata.json")).parent


def replicate(run: Path, logs: Path, count: int) -> None:
    for index in range(count):
        shutil.copytree(run, logs / "tiny" / f"layout{index % 10}" / "torch" / f"run{index:05d}",
                        ignore=shutil.ignore_patterns(*NOT_COPIED))


def copied_files(run: Path) -> list[str]:
    """The files of one replicated run folder, relative to it."""
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if p.is_file() and p.relative_to(run).parts[0] not in NOT_COPIED)


def timed(step, *args) -> tuple[object, float]:
    start = time.perf_counter()
    value = step(*args)
    return value, time.perf_counter() - start


def measure(logs: Path) -> dict:
    """Seconds for collect and for each summary ``summarize.py`` prints, with the table sizes."""
    collected, collect_s = timed(analysis.collect, logs)
    table, table_s = timed(collected.table)
    _, checkpoint_s = timed(analysis.checkpoint_summary, table)
    _, restart_s = timed(analysis.restart_summary, table)
    files, file_table_s = timed(collected.file_table)
    _, file_summary_s = timed(analysis.file_summary, files)
    seconds = {"collect": collect_s, "table": table_s, "checkpoint_summary": checkpoint_s,
               "restart_summary": restart_s, "file_table": file_table_s, "file_summary": file_summary_s}
    return {"runs": int(table["run_id"].nunique()), "table_rows": len(table), "file_rows": len(files),
            "seconds": seconds, "total_s": sum(seconds.values())}


def markdown(result: dict) -> str:
    meta, m = result["meta"], result["measured"]
    seconds = m["seconds"]
    steps = ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
    return "\n".join([
        f"# Analysis over many run folders — {meta['machine']}, {meta['date']}", "",
        f"`{meta['command']}`", "", machine_line(meta), "",
        f"**{m['runs']} run folders ({m['table_rows']} table rows, {m['file_rows']} file rows): "
        f"{m['total_s']:.2f} s = {m['runs'] / m['total_s']:.0f} runs/s** (collect {seconds['collect']:.2f} s).", "",
        f"Steps: {steps}.", "",
        f"Each of the {result['runs_requested']} folders is a copy of one real run ({result['source']}) holding "
        f"{len(result['copied_files'])} files: {', '.join(f'`{f}`' for f in result['copied_files'])}. The "
        f"{' and '.join(f'`{d}`' for d in NOT_COPIED)} folders are not copied: the analysis never reads them.", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--from", dest="source", type=Path, help="a finished run folder to replicate")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    meta = run_meta("analysis-scale", argv, args.machine)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        source = args.source or one_real_run(scratch / "source")
        replicate(source, scratch / "logs", args.runs)
        measured = measure(scratch / "logs")
        files = copied_files(source)
    result = {"meta": meta, "runs_requested": args.runs, "copied_files": files, "measured": measured,
              "source": str(args.source) if args.source else "made here: config-n-run.py " + " ".join(SOURCE_RUN)}
    write_results(args.out, result, markdown)
    return 0 if measured["runs"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How long the analysis takes over thousands of run folders.

    python bench/analysis_scale.py [--runs 2000] [--from RUN_DIR]

Copies one real run folder (its events, metadata, config, plan and inventory; not the checkpoint
files, nor a record the analysis kept there) N times under a temporary logs root, then reads them
``--reads`` times (default 2), each time timing ``restartbench.analysis.collect`` and every table
``summarize.py`` prints: the first read parses every folder's events (in parallel across the cores)
and keeps a record in each folder, the later ones read the records. The machine's load average is
taken before and after each read. Without ``--from`` it first makes one tiny run (2 CPU ranks).
The targets (issue 27): 10,000 folders in < 60 s at the first read, < 10 s at later ones. Writes
``bench/results/YYYY-MM-DD-<machine>-analysis-scale.json`` and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import ROOT, add_output_arguments, machine_line, run_meta, write_results

from restartbench import analysis, goodput, report

NOT_COPIED = ("checkpoints", "digests", analysis.RECORD_FILE)
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
    """Seconds for collect and for each table ``summarize.py`` prints, with the table sizes, the records the read
    found kept and the load average before and after."""
    kept = sum(1 for _ in logs.glob(f"*/*/*/*/{analysis.RECORD_FILE}"))
    load_before = os.getloadavg()
    collected, collect_s = timed(analysis.collect, logs)
    table, table_s = timed(collected.table)
    files, file_table_s = timed(collected.file_table)
    seconds = {"collect": collect_s, "table": table_s, "file_table": file_table_s}
    for name, step, arguments in SUMMARIES:
        _, seconds[name] = timed(step, files if name == "file_summary" else table, *arguments)
    return {"runs": int(table["run_id"].nunique()), "table_rows": len(table), "file_rows": len(files),
            "records_found": kept, "seconds": seconds, "total_s": sum(seconds.values()),
            "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())}


#: Every table summarize.py prints (and its findings), each made from the tidy table or the file table.
SUMMARIES = (("checkpoint_summary", analysis.checkpoint_summary, ()),
             ("restart_summary", analysis.restart_summary, ()),
             ("ds_init_summary", analysis.ds_init_summary, ()),
             ("relayout_summary", analysis.relayout_summary, ()),
             ("file_summary", analysis.file_summary, ()),
             ("goodput_table", analysis.goodput_table, (goodput.LLAMA3_FAILURES_PER_GPU_HOUR, None)),
             ("findings", report.findings, ()))


def markdown(result: dict) -> str:
    if "measured" in result:  # a result of the version before records, one read (2026-11-23)
        return one_read_markdown(result)
    meta = result["meta"]
    lines = [f"# Analysis over many run folders — {meta['machine']}, {meta['date']}", "",
             f"`{meta['command']}`", "", machine_line(meta), "",
             f"{result['cores']} cores; the first read parses the folders' events in worker processes and keeps a "
             f"record (`{analysis.RECORD_FILE}`) in each folder, later reads read the records.", ""]
    for number, m in enumerate(result["reads"], 1):
        seconds = m["seconds"]
        steps = ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items())
        load = "/".join(f"{v:.2f}" for v in m["load_average_before"])
        lines += [f"**Read {number} ({m['records_found']} records found): {m['runs']} run folders "
                  f"({m['table_rows']} table rows, {m['file_rows']} file rows) in {m['total_s']:.2f} s = "
                  f"{m['runs'] / m['total_s']:.0f} runs/s** (collect {seconds['collect']:.2f} s; load average "
                  f"{load} (1/5/15 min) before, {m['load_average_after'][0]:.2f} after).", "",
                  f"Steps: {steps}.", ""]
    lines += [f"Each of the {result['runs_requested']} folders is a copy of one real run ({result['source']}) holding "
              f"{len(result['copied_files'])} files: {', '.join(f'`{f}`' for f in result['copied_files'])}. The "
              f"{', '.join(f'`{d}`' for d in NOT_COPIED)} are not copied: the analysis never reads the first two, "
              "and a record would make the first read a later one.", ""]
    return "\n".join(lines)


def one_read_markdown(result: dict) -> str:
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
        "`checkpoints` and `digests` folders are not copied: the analysis never reads them.", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=2, help="reads of the same folders (the first keeps records)")
    parser.add_argument("--from", dest="source", type=Path, help="a finished run folder to replicate")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    meta = run_meta("analysis-scale", argv, args.machine)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        source = args.source or one_real_run(scratch / "source")
        replicate(source, scratch / "logs", args.runs)
        reads = [measure(scratch / "logs") for _ in range(args.reads)]
        files = copied_files(source)
    result = {"meta": meta, "runs_requested": args.runs, "copied_files": files, "reads": reads,
              "cores": len(os.sched_getaffinity(0)),
              "source": str(args.source) if args.source else "made here: config-n-run.py " + " ".join(SOURCE_RUN)}
    write_results(args.out, result, markdown)
    return 0 if all(m["runs"] == args.runs for m in reads) else 1


if __name__ == "__main__":
    sys.exit(main())

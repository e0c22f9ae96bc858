#!/usr/bin/env python3
"""How long the analysis takes over thousands of run folders.

    python bench/analysis_scale.py [--runs 2000] [--from RUN_DIR]

Copies one real run folder (its events, metadata, config, plan and inventory; not the checkpoint
files) N times under a temporary logs root, then times ``restartbench.analysis.collect`` and the
tables ``summarize.py`` prints. Without ``--from`` it first makes one tiny run (2 CPU ranks).
Prints runs per second; the target is thousands of runs in seconds, not minutes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from restartbench import analysis

ROOT = Path(__file__).resolve().parent.parent


def one_real_run(logs: Path) -> Path:
    subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp1pp1dp2", "--dtype", "fp32",
                    "--iters", "2", "--logs", str(logs)], check=True, capture_output=True)
    return next(logs.glob("*/*/*/*/metadata.json")).parent


def replicate(run: Path, logs: Path, count: int) -> None:
    for index in range(count):
        shutil.copytree(run, logs / "tiny" / f"layout{index % 10}" / "torch" / f"run{index:05d}",
                        ignore=shutil.ignore_patterns("checkpoints", "digests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--from", dest="source", type=Path, help="a finished run folder to replicate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        source = args.source or one_real_run(scratch / "source")
        logs = scratch / "logs"
        replicate(source, logs, args.runs)
        start = time.perf_counter()
        collected = analysis.collect(logs)
        collect_s = time.perf_counter() - start
        table = collected.table()
        analysis.checkpoint_summary(table)
        analysis.restart_summary(table)
        analysis.file_summary(collected.file_table())
        total_s = time.perf_counter() - start
    runs = table["run_id"].nunique()
    print(f"{runs} run folders ({len(table)} table rows): collect {collect_s:.2f} s, with summaries {total_s:.2f} s "
          f"= {runs / total_s:.0f} runs/s")
    return 0 if runs == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

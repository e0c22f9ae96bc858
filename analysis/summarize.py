#!/usr/bin/env python3
"""Summarize every run folder under a path: a console summary, tables (CSV, Parquet), plots (PNG, SVG), report.html.

    python analysis/summarize.py logs/ [--out logs/summary]

Figures: stall = max over ranks of the time checkpointing blocked training; durable = max over
ranks of the time from the start of the save until the rank's files were fsync'd; restart = max over
ranks of launch -> end of the first resumed iteration. Runs marked skipped (e.g. an optional engine
not installed) are listed as skipped; failed, incomplete or unreadable runs are listed with the reason.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from restartbench import analysis  # noqa: E402
from restartbench.analysis import RESTART_PART_COLUMNS, collect  # noqa: E402
from restartbench.report import findings, fmt_bytes, fmt_rate, fmt_s, fmt_share, write_outputs  # noqa: E402

TEXT_KEYS = ("preset", "layout", *analysis.SETUP_KEYS, "engine", "kind", "cache", "exact")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="folder holding run folders (searched recursively)")
    parser.add_argument("--out", type=Path, help="where tables, plots and report.html go (default: <logs>/summary)")
    parser.add_argument("--no-plots", action="store_true", help="tables and console summary only")
    args = parser.parse_args(argv)
    console = Console(width=max(120, shutil.get_terminal_size((160, 24)).columns), highlight=False)
    if not args.logs.is_dir():
        console.print(f"[red]error:[/] {args.logs} is not a folder")
        return 2
    out = args.out or args.logs / "summary"
    try:  # before reading any run: a place that cannot hold the results is said at once
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        console.print(f"[red]error:[/] the results cannot go to {out} ({error.strerror or error}); "
                      "choose a writable folder with --out")
        return 2
    start = time.perf_counter()
    collected = collect(args.logs)
    elapsed = time.perf_counter() - start
    _print_excluded(console, collected)
    for warning in collected.warnings:
        console.print(f"[yellow]warning[/] {warning}")
    table = collected.table()
    if table.empty:
        console.print(f"no complete runs under {args.logs}")
        return 1
    console.print(f"{table['run_id'].nunique()} complete run(s) read in {elapsed:.2f} s")
    console.print(_checkpoint_table(table))
    console.print(_restart_table(table))
    console.print(_file_table(collected.file_table()))
    lines = findings(table)
    if lines:
        console.print("[bold]Findings[/]")
        for line in lines:
            console.print(f"- {line}", soft_wrap=False)
    if args.no_plots:
        table.to_csv(out / "study.csv", index=False)
        collected.rank_table().to_csv(out / "ranks.csv", index=False)
        console.print(f"tables in {out}")
        return 0
    outputs = write_outputs(collected, out)
    console.print(f"tables (study.csv/.parquet, ranks, files, excluded), plots (PNG, SVG) and the report in {out}")
    console.print(f"report: {outputs.report}")
    return 0


def _print_excluded(console: Console, collected: analysis.Collected) -> None:
    for excluded in collected.excluded:
        style = "yellow" if excluded.status == "skipped" else "red"
        label = {"skipped": "skipped (run marked skipped)"}.get(excluded.status, f"skipped ({excluded.status} run)")
        console.print(f"[{style}]{label}[/] {excluded.run}: {excluded.reason}", soft_wrap=True)


def _rich(frame: pd.DataFrame, title: str, formats: dict[str, object]) -> Table:
    view = Table(title=title, title_justify="left", title_style="bold")
    columns = [c for c in frame.columns if c in formats or c in TEXT_KEYS]
    for column in columns:
        view.add_column(column.replace("_", " "), justify="left" if column in TEXT_KEYS else "right",
                        overflow="fold")
    for _, row in frame.iterrows():
        cells = []
        for column in columns:
            value, how = row[column], formats.get(column)
            if value is None or (isinstance(value, float) and pd.isna(value)):
                cells.append("—")
            elif callable(how):
                cells.append(how(value))
            elif isinstance(how, str):
                cells.append(how.format(value))
            else:
                cells.append(str(value))
        view.add_row(*cells)
    return view


def _checkpoint_table(table: pd.DataFrame) -> Table:
    summary = analysis.checkpoint_summary(table)
    return _rich(summary, "Checkpoints: stall = max over ranks of the time save blocked training; durable = max over "
                          "ranks of save start -> files fsync'd; committed = rank 0 wrote latest (medians over "
                          "checkpoints and runs; rank spread = slowest - fastest rank; write pct of storage = write "
                          "throughput / the storage's write bandwidth in baseline.json)",
                 {"runs": "{}", "checkpoints": "{}", "ranks": "{}", "bytes": fmt_bytes, "files": "{:.0f}",
                  "stall_s": fmt_s, "stall_rank_spread_s": fmt_s, "durable_s": fmt_s, "committed_s": fmt_s,
                  "write_MBps": fmt_rate, "write_pct_of_storage": fmt_share, "stall_overhead_pct": "{:.1f}%"})


def _restart_table(table: pd.DataFrame) -> Table:
    summary = analysis.restart_summary(table)
    summary = summary.rename(columns={c: label for c, label in RESTART_PART_COLUMNS})
    summary = summary.rename(columns={"restart_s": "total"})
    formats = {"runs": "{}", "total": fmt_s, **{label: fmt_s for _, label in RESTART_PART_COLUMNS},
               "bytes_read": fmt_bytes, "read_MBps": fmt_rate, "read_pct_of_storage": fmt_share, "cache": None,
               "exact": None}
    view = _rich(summary, "Restarts: launch -> end of first resumed iteration, max over ranks; each part max over "
                          "ranks (engine none: nothing restored, the start-up floor); read = bytes read / ckpt load; "
                          "read pct of storage = read / the storage's read bandwidth in baseline.json (above 100% only "
                          "from a warm cache)",
                 formats)
    return view


def _file_table(files: pd.DataFrame) -> Table:
    summary = analysis.file_summary(files)
    return _rich(summary, "Checkpoint files per kind: files per checkpoint, most on one rank, sizes (min/median/max)",
                 {"kind": None, "files_per_checkpoint": "{:.0f}", "files_per_rank_max": "{}", "min_bytes": fmt_bytes,
                  "median_bytes": fmt_bytes, "max_bytes": fmt_bytes, "bytes_per_checkpoint": fmt_bytes})


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Summarize every run folder under a path: a console summary, tables (CSV, Parquet), plots (PNG, SVG), report.html.

    python analysis/summarize.py logs/ [--out logs/summary] [--failures-per-gpu-hour F] [--gpus G]

Figures: stall = max over ranks of the time checkpointing blocked training; slowdown = what the iterations a save's
background work overlapped took beyond the clean median iteration; cost = stall + slowdown, a checkpoint's whole cost
to training (the goodput's C); durable = max over
ranks of the time from the start of the save until the rank's files were fsync'd; restart = max over
ranks of launch -> end of the first resumed iteration; goodput = the share of wall time kept at the optimal
checkpoint interval (Young/Daly) for F failures per GPU-hour on G GPUs. Runs marked skipped (e.g. an optional engine
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
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from restartbench import analysis, goodput  # noqa: E402
from restartbench.analysis import RESTART_PART_COLUMNS, collect  # noqa: E402
from restartbench.analysis.baselines import limit_summary  # noqa: E402
from restartbench.report import (  # noqa: E402
    GOODPUT_FORMATS,
    findings,
    fmt_bytes,
    fmt_rate,
    fmt_s,
    fmt_share,
    write_outputs,
)
from restartbench.whatif.cluster import ClusterError, load_cluster  # noqa: E402
from restartbench.whatif.fit import FitError, read_fit  # noqa: E402
from restartbench.whatif.validation import beside_measured  # noqa: E402

TEXT_KEYS = ("preset", "layout", *analysis.SETUP_KEYS, "engine", "kind", "cache", "exact", "write_limit", "read_limit",
             "cost_basis", "run_id", "verdict", "verdicts", "tag", "requested_tag", "fell_back_from", "tool", "side",
             "method", "judged")


def _positive(kind: type, what: str):
    """An argparse type: a number of ``kind`` above 0, refused by argparse (usage, exit code 2) otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} above 0")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="folder holding run folders (searched recursively)")
    parser.add_argument("--out", type=Path, help="where tables, plots and report.html go (default: <logs>/summary)")
    parser.add_argument("--no-plots", action="store_true", help="tables and console summary only")
    parser.add_argument("--failures-per-gpu-hour", type=_positive(float, "a number"),
                        default=goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                        help="failure rate of the goodput model (default %(default).3g: Llama 3's 419 interruptions "
                             "in 54 days on 16,384 GPUs)")
    parser.add_argument("--gpus", type=_positive(int, "a whole number"),
                        help="GPUs the failure rate applies to (default: each run's own world size)")
    parser.add_argument("--what-if", type=Path, metavar="CLUSTER_FILE",
                        help="also show, beside each run's measured figures, what restartbench.whatif predicts for its "
                             "configuration on this cluster (a cluster file, clusters/*.yaml): a check, not a "
                             "replacement")
    args = parser.parse_args(argv)
    console = Console(width=max(120, shutil.get_terminal_size((160, 24)).columns), highlight=False)
    if not args.logs.is_dir():
        console.print(f"[red]error:[/] {escape(str(args.logs))} is not a folder")
        return 2
    try:  # a cluster file that cannot be used is refused before anything is read or written
        cluster = load_cluster(args.what_if) if args.what_if else None
        what_if = (cluster, read_fit(cluster.fit_path())) if cluster else None
    except (ClusterError, FitError) as error:
        console.print(f"[red]error:[/] --what-if: {escape(str(error))}")
        return 2
    out = args.out or args.logs / "summary"
    try:  # before reading any run: a place that cannot hold the results is said at once
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = escape(str(error.strerror or error))
        console.print(f"[red]error:[/] the results cannot go to {escape(str(out))} ({why}); choose a writable folder "
                      "with --out")
        return 2
    start = time.perf_counter()
    collected = collect(args.logs)
    elapsed = time.perf_counter() - start
    _print_excluded(console, collected)
    for warning in collected.warnings:
        console.print(f"[yellow]warning[/] {escape(warning)}")
    table = collected.table()
    if table.empty:
        console.print(f"no complete runs under {args.logs}")
        return 1
    partial = sum(e.training_kept for e in collected.excluded)
    console.print(f"{table['run_id'].nunique() - partial} complete run(s)"
                  + (f" and {partial} whose training only is kept (their restart never finished)" if partial else "")
                  + f" read in {elapsed:.2f} s")
    console.print(_checkpoint_table(table))
    console.print(_restart_table(table))
    limits = limit_summary(table)
    if not limits.empty:
        console.print(_limit_table(limits))
    if "ds_init_parts" in table.columns and table["ds_init_parts"].notna().any():
        console.print(_ds_init_table(table))
    if (table["kind"] == "restart").sum() > table.loc[table["kind"] == "restart", "run_id"].nunique():
        console.print(_attempt_table(table))
    if "restore_layout" in table.columns and (table["restore_layout"].notna()
                                              & (table["restore_layout"] != table["layout"])).any():
        console.print(_relayout_table(table))
    console.print(_file_table(collected.file_table()))
    rates = analysis.goodput_table(table, args.failures_per_gpu_hour, args.gpus)
    console.print(_goodput_table(rates, analysis.goodput_assumptions(args.failures_per_gpu_hour, args.gpus)))
    if what_if:
        beside = beside_measured(table, *what_if)
        console.print(_what_if_table(beside, what_if[0]))
        beside.to_csv(out / "whatif.csv", index=False)
    lines = findings(table)
    if lines:
        console.print("[bold]Findings[/]")
        for line in lines:
            console.print(f"- {escape(line)}", soft_wrap=False)
    if args.no_plots:
        table.to_csv(out / "study.csv", index=False)
        collected.rank_table().to_csv(out / "ranks.csv", index=False)
        rates.to_csv(out / "goodput.csv", index=False)
        console.print(f"tables in {out}")
        return 0
    outputs = write_outputs(collected, out, failures_per_gpu_hour=args.failures_per_gpu_hour, gpus=args.gpus)
    console.print(f"tables (study.csv/.parquet, ranks, files, excluded, goodput, restart_spans, restart_memory), "
                  f"plots (PNG, SVG) and the report in {out}")
    console.print(f"report: {outputs.report}")
    return 0


def _what_if_table(beside: pd.DataFrame, cluster) -> Table:
    """The prediction beside the measured figures of each run (``restartbench.whatif``)."""
    grid = Table(title=f"what-if on {cluster.name} (prediction beside measurement; error = predicted / measured - 1)")
    for column in ("run", "engine", "part", "measured s", "predicted s", "error"):
        grid.add_column(column)
    for row in beside.itertuples(index=False):
        if row.note:
            grid.add_row(escape(str(row.run_id)), escape(str(row.engine)), escape(row.note), "", "", "")
            continue
        grid.add_row(escape(str(row.run_id)), escape(str(row.engine)), row.part, f"{row.measured_s:.3g}",
                     f"{row.predicted_s:.3g}", f"{100 * row.error:+.0f} %")
    return grid


def _print_excluded(console: Console, collected: analysis.Collected) -> None:
    for excluded in collected.excluded:
        style = "yellow" if excluded.status == "skipped" else "red"
        label = {"skipped": "skipped (run marked skipped)"}.get(excluded.status, f"skipped ({excluded.status} run)")
        if excluded.training_kept:
            label = f"restart left out ({excluded.status} run)"
        console.print(f"[{style}]{label}[/] {escape(str(excluded.run))}: {escape(excluded.reason)}", soft_wrap=True)


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
    summary = _beside(analysis.checkpoint_summary(table), "stall_s", ["slowdown_s", "cost_s"])
    return _rich(summary.rename(columns={"cost_s": "whole_cost_s", "overlapped_iterations": "overlapped"}),
                 "Checkpoints: stall = max over ranks of the time save blocked training; slowdown = what the "
                 "iterations overlapping the save's background work (end of save -> files durable) took beyond the "
                 "clean median iteration, over the checkpoints whose background work ended during training (the "
                 "last save's is waited for after training); whole cost = stall + slowdown; overlapped = iterations "
                 "per checkpoint; "
                 "durable = max over ranks of save start -> files fsync'd; committed = rank 0 wrote latest (medians "
                 "over checkpoints and runs; rank spread = slowest - fastest rank; write pct of storage = write "
                 "throughput / the storage's write limit in baseline.json, the winning method's median (Storage "
                 "limits, below); write limit = the most serious note of the configuration's checkpoints: 'defect: "
                 "above the limit's max' where one wrote faster than the method's fastest pass (a finding says "
                 "what to investigate), 'limit underestimated' above 105% of a baseline without spread)",
                 {"runs": "{}", "checkpoints": "{}", "ranks": "{}", "bytes": fmt_bytes, "files": "{:.0f}",
                  "stall_s": fmt_s, "slowdown_s": fmt_s, "whole_cost_s": fmt_s, "overlapped": "{:.0f}",
                  "stall_rank_spread_s": fmt_s, "durable_s": fmt_s, "committed_s": fmt_s,
                  "write_MBps": fmt_rate, "write_pct_of_storage": fmt_share, "write_limit": None,
                  "stall_overhead_pct": "{:.1f}%"})


def _beside(frame: pd.DataFrame, anchor: str, columns: list[str]) -> pd.DataFrame:
    """``frame`` with ``columns`` (those it has) moved right after ``anchor``."""
    moved = [c for c in columns if c in frame.columns]
    rest = [c for c in frame.columns if c not in moved]
    if anchor not in rest:
        return frame
    at = rest.index(anchor) + 1
    return frame[[*rest[:at], *moved, *rest[at:]]]


def _restart_table(table: pd.DataFrame) -> Table:
    summary = analysis.restart_summary(table)
    summary = summary.rename(columns={c: label for c, label in RESTART_PART_COLUMNS})
    summary = summary.rename(columns={"restart_s": "total", "restart_less_checks_s": "without checks"})
    formats = {"runs": "{}", "attempts": "{}", "verdicts": None, "total": fmt_s, "without checks": fmt_s,
               **{label: fmt_s for _, label in RESTART_PART_COLUMNS},
               "bytes_read": fmt_bytes, "read_MBps": fmt_rate, "read_pct_of_storage": fmt_share, "read_limit": None,
               "restore_peak_rss_bytes": fmt_bytes, "resume_spike": "{:.2f}x",
               "cache": None, "exact": None}
    view = _rich(summary, "Restarts: medians over runs and their restore attempts (those that restored) of launch "
                          "-> end of first resumed iteration, max over ranks; without checks = the total less the "
                          "harness's own checks on the critical rank (manifest check, page-cache eviction, "
                          "exactness proof: a job that checks nothing); each part max over ranks (engine none: "
                          "nothing restored, the start-up floor); read = bytes read / ckpt load; read pct of storage "
                          "= read / the storage's read limit in baseline.json, the winning method's median (Storage "
                          "limits, below); read limit = 'defect: above the limit's max' where a restore that was not "
                          "warm read faster than the method's fastest pass, 'warm cache' where memory answered, "
                          "'limit underestimated' above 105% of a baseline without spread; "
                          "restore peak rss = the largest host RSS of any rank in any restart part, sampled at 100 "
                          "Hz; resume spike = it / steady training's peak)",
                 formats)
    return view


def _limit_table(limits: pd.DataFrame) -> Table:
    """The limits the ratios above are set against: the winning method and its spread (``limit_summary``)."""
    return _rich(limits, "Storage limits the ratios are set against (baseline.json of each run or a folder above it): "
                         "per storage, tool, side and winning method, the runs, the method's passes per run (n) and "
                         "its spread: min = the slowest pass of any run, median = the median of the runs' limits, max "
                         "= the fastest pass of any run; judged = how a throughput above it is read",
                 {"runs": "{}", "n": "{:.0f}", "min_MBps": fmt_rate, "median_MBps": fmt_rate, "max_MBps": fmt_rate,
                  "storage": None})


def _ds_init_table(table: pd.DataFrame) -> Table:
    summary = analysis.ds_init_summary(table)
    formats = {column: fmt_s for column in summary.columns if column not in TEXT_KEYS}
    return _rich(summary, "Inside deepspeed.initialize (restart): DeepSpeed's own set-up stages, each the max over "
                          "ranks, median over runs and attempts; the five slowest by name, the rest as other stages; "
                          "collective wait = time inside collectives (mostly waiting for slower ranks); other = "
                          "the call's time outside every timed stage; parts sum = their sum (each from its slowest "
                          "rank, so it can exceed one rank's call)", formats)


def _attempt_table(table: pd.DataFrame) -> Table:
    """Every restore attempt its own row: the run's own restore is attempt 1, each --restore relaunch another."""
    attempts = table[table["kind"] == "restart"][["run_id", "engine", "attempt", "requested_tag", "tag",
                                                  "fell_back_from", "verdict", "cache", "restart_s",
                                                  "restart_ckpt_load_s"]]
    formats = {"run_id": None, "attempt": "{:.0f}", "requested_tag": None, "tag": None, "fell_back_from": None,
               "verdict": None, "restart_s": fmt_s, "restart_ckpt_load_s": fmt_s}
    return _rich(attempts.rename(columns={"restart_s": "total", "restart_ckpt_load_s": "ckpt load"}),
                 "Restore attempts: each its own row (1: the run's own restore; 2, 3...: ./submit-job.sh --restore); "
                 "total and ckpt load max over ranks; refused and failed attempts have no time",
                 {**formats, "total": fmt_s, "ckpt load": fmt_s})


def _relayout_table(table: pd.DataFrame) -> Table:
    summary = analysis.relayout_summary(table).rename(columns={
        "layout": "saved on", "restore_layout": "restarted on", "restart_s": "total", "restart_convert_s": "convert",
        "restart_ckpt_load_s": "ckpt load", "convert_bytes_read": "convert read", "convert_bytes_written":
        "convert wrote", "convert_files_written": "files written", "bytes_read": "load read",
        "process_bytes_read": "process read"})
    formats = {"attempts": "{}", "verdicts": None, "skip_reason": None, "total": fmt_s, "convert": fmt_s,
               "ckpt load": fmt_s, "convert read": fmt_bytes, "convert wrote": fmt_bytes, "files written": "{:.0f}",
               "load read": fmt_bytes, "process read": fmt_bytes, "loss_diff": "{:+.2e}"}
    return _rich(summary, "Restarts on another layout (--restore-layout) beside the same layout's: medians over "
                          "attempts, max over ranks; convert = the engine's offline conversion (DeepSpeed's "
                          "ds_to_universal.py, run by rank 0 while the others wait) with what it read and wrote; "
                          "ckpt load after a conversion reads what it has just written (page cache); load read = "
                          "what the engine's load reported reading, process read = what the kernel counted the "
                          "ranks reading during it (DeepSpeed's universal load reads outside the files it reports); "
                          "loss diff = iteration K+1's loss less the "
                          "uninterrupted run's; exactness is on the consolidated state (verdicts); skipped = the "
                          "engine cannot restart there (skip reason)", formats)


def _goodput_table(rates: pd.DataFrame, assumptions: str) -> Table:
    return _rich(rates, f"Goodput at the optimal checkpoint interval. {assumptions}. C = checkpoint cost, R = restart, "
                        "MTBF = 1 / (F x G), interval = Daly's optimum τ* (at least one iteration); lost: shares of "
                        "wall time spent in checkpoints C/(τ+C), re-done work (τ+C)/2M and restarts R/M; goodput = "
                        "what is left (engine none and emulated runs have none)",
                 GOODPUT_FORMATS)


def _file_table(files: pd.DataFrame) -> Table:
    summary = analysis.file_summary(files)
    return _rich(summary, "Checkpoint files per kind: files per checkpoint, most on one rank, sizes (min/median/max)",
                 {"kind": None, "files_per_checkpoint": "{:.0f}", "files_per_rank_max": "{}", "min_bytes": fmt_bytes,
                  "median_bytes": fmt_bytes, "max_bytes": fmt_bytes, "bytes_per_checkpoint": fmt_bytes})


if __name__ == "__main__":
    sys.exit(main())

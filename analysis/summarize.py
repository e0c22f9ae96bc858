#!/usr/bin/env python3
"""Summarize every run folder under a path: tables (CSV, Parquet), a console summary and plots.

    python analysis/summarize.py logs/ [--out logs/summary]

Figures: stall = max over ranks of the time checkpointing blocked training; durable = max over
ranks of the time from the start of the save until the rank's files were fsync'd; restart = max over
ranks of launch -> end of the first resumed iteration. Failed or incomplete runs are listed and skipped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from restartbench.analysis import collect, file_statistics  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, help="folder holding run folders (searched recursively)")
    parser.add_argument("--out", type=Path, help="where tables and plots go (default: <logs>/summary)")
    args = parser.parse_args(argv)
    console = Console(width=max(120, shutil.get_terminal_size((160, 24)).columns))
    if not args.logs.is_dir():
        console.print(f"[red]error:[/] {args.logs} is not a folder")
        return 2
    out = args.out or args.logs / "summary"
    collected = collect(args.logs)
    for run_dir, reason in collected.skipped:
        console.print(f"[yellow]skipped[/] {run_dir}: {reason}")
    table = collected.table()
    if table.empty:
        console.print(f"no complete runs under {args.logs}")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "study.csv", index=False)
    table.to_parquet(out / "study.parquet", index=False)
    stats = file_statistics(collected.file_table())
    stats.to_csv(out / "files.csv", index=False)
    console.print(_checkpoint_table(table))
    console.print(_restart_table(table))
    _plot_checkpoints(table, out)
    _plot_restarts(table, out)
    console.print(f"tables and plots in {out}")
    return 0


def _checkpoint_table(table) -> Table:
    view = Table(title="Checkpoints: stall = max over ranks of the time save blocked training; "
                       "durable = max over ranks of save start -> files fsync'd")
    for column in ("preset", "layout", "engine", "tag", "ranks", "MB", "files", "stall s", "durable s", "MB/s durable"):
        view.add_column(column, justify="right" if column not in ("preset", "layout", "engine", "tag") else "left")
    for row in table[table["kind"] == "checkpoint"].itertuples():
        view.add_row(row.preset, row.layout, row.engine, row.tag, str(row.ranks), f"{row.bytes / 1e6:.1f}",
                     str(int(row.files)), f"{row.stall_max_s:.3f}", f"{row.durable_rank_max_s:.3f}",
                     f"{row.bytes / 1e6 / row.durable_rank_max_s:.1f}")
    return view


def _restart_table(table) -> Table:
    restarts = table[table["kind"] == "restart"]
    parts = [c for c in restarts.columns if c.startswith("restart ") and c.endswith(" s")]
    view = Table(title="Restarts: launch -> end of first resumed iteration, seconds; each part max over ranks")
    for column in ("preset", "layout", "engine", "total", *[p[len("restart "):-2] for p in parts], "cache", "exact"):
        view.add_column(column, overflow="fold")
    for _, row in restarts.iterrows():
        view.add_row(row["preset"], row["layout"], row["engine"], f"{row['restart_s']:.2f}",
                     *[f"{row[p]:.2f}" for p in parts], str(row["cache"]), str(row["exact"]))
    return view


def _plot_checkpoints(table, out: Path) -> None:
    ckpt = table[table["kind"] == "checkpoint"]
    means = ckpt.groupby(["preset", "layout", "engine"])[["stall_max_s", "durable_rank_max_s"]].mean()
    labels = [" ".join(index) for index in means.index]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 4))
    positions = range(len(labels))
    ax.bar([p - 0.2 for p in positions], means["stall_max_s"], width=0.4, label="training stall (max over ranks)")
    ax.bar([p + 0.2 for p in positions], means["durable_rank_max_s"], width=0.4,
           label="until durable (fsync'd; max over ranks)")
    ax.set_xticks(list(positions), labels, rotation=20, ha="right")
    ax.set_ylabel("seconds (mean over checkpoints)")
    ax.set_title("Checkpoint cost per preset, layout and engine")
    ax.legend()
    _save(fig, out / "checkpoint_cost")


def _plot_restarts(table, out: Path) -> None:
    restarts = table[table["kind"] == "restart"]
    parts = [c for c in restarts.columns if c.startswith("restart ") and c.endswith(" s")]
    labels = [f"{r.preset} {r.layout} {r.engine}" for r in restarts.itertuples()]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 4))
    bottom = [0.0] * len(labels)
    for part in parts:
        values = restarts[part].fillna(0).tolist()
        ax.bar(labels, values, bottom=bottom, label=part[len("restart "):-2])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds (each part max over ranks)")
    ax.set_title("Where restart time goes")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    _save(fig, out / "restart_phases")


def _save(fig, stem: Path) -> None:
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(stem.with_suffix(suffix), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

"""The goodput figure: per configuration each engine's share of wall time lost against the checkpoint interval,
Daly's optimum marked (``plot_goodput``), and how the goodput table's columns are shown (``GOODPUT_FORMATS``)."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from restartbench import analysis, goodput
from restartbench.report.style import (
    MAX_FACETS,
    config_label,
    empty_figure,
    engine_colors,
    facets_of,
    figure_grid,
    figure_header,
    fmt_duration,
    fmt_s,
    rows_of,
)


def plot_goodput(table: pd.DataFrame, failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                 gpus: int | None = None) -> Figure:
    """Per preset/layout: each engine's share of wall time lost (checkpoints, re-done work, restarts) against the
    checkpoint interval, from its measured C and R (``analysis.goodput_table``), the optimum τ* marked."""
    rows = analysis.goodput_table(table, failures_per_gpu_hour, gpus)
    if rows.empty:
        return empty_figure("No goodput: it needs a checkpoint's cost, a restart and an iteration time "
                      "(engine none saves nothing; emulated runs neither train nor restart).")
    keys, facets = facets_of(rows)
    shown = facets[:MAX_FACETS]
    colors = engine_colors(analysis.engine_order(rows["engine"].unique()))
    fig, axes = figure_grid(len(shown), 2, 11 / min(2, len(shown)), 4.0)
    for ax, values in zip(axes, shown):
        part = rows_of(rows, keys, values)
        low = max(part["iteration_s"].min(), part["interval_s"].min() / 30)
        intervals = np.geomspace(low, max(part["interval_s"].max() * 30, low * 10), 200)
        for _, row in part.iterrows():
            lost = [100 * goodput.at_interval(t, row["cost_s"], row["restart_s"], row["mtbf_s"]).lost_share
                    for t in intervals]
            best = 100 - row["goodput_pct"]
            ax.plot(intervals, lost, color=colors[row["engine"]],
                    label=f"{row['engine']}: τ* {fmt_duration(row['interval_s'])}, goodput {row['goodput_pct']:.6g}%")
            ax.plot([row["interval_s"]], [best], marker="o", color=colors[row["engine"]], markersize=6, zorder=3)
        _lost_axes(ax)
        first = part.iloc[0]
        ax.set_title(f"{config_label(first, keys)} · {first['gpus']} GPUs · MTBF {fmt_duration(first['mtbf_s'])}",
                     fontsize=10)
        ax.legend(fontsize=7.5, frameon=False)
        ax.grid(which="both", alpha=0.25)
    more = f"; {len(facets) - len(shown)} more configurations in goodput.csv" if len(facets) > len(shown) else ""
    subtitle = textwrap.fill(analysis.goodput_assumptions(failures_per_gpu_hour, gpus)
                             + f". Dots: Daly's optimum τ*{more}", 135)
    figure_header(fig, "Time lost to checkpoints, re-done work and restarts against the checkpoint interval", subtitle,
                  [], 1)
    return fig


def _lost_axes(ax: Any) -> None:
    """Log axes of the interval (as a duration) and of the share of wall time lost (in %)."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_duration(v)))
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval τ (training time between checkpoints)", fontsize=8.5)
    ax.set_ylabel("wall time lost, % (100 − goodput)", fontsize=8.5)


#: How the goodput table's columns are shown (console and report).
GOODPUT_FORMATS: dict[str, Any] = {
    "runs": None, "cost_s": fmt_s, "cost_basis": None, "restart_s": fmt_s, "iteration_s": fmt_s, "gpus": None,
    "mtbf_s": fmt_duration, "interval_s": fmt_duration, "interval_iterations": "{:.0f}", "checkpoint_pct": "{:.3g}%",
    "rework_pct": "{:.3g}%", "restart_pct": "{:.3g}%", "goodput_pct": "{:.6g}%"}

"""The restart's host memory figure: per configuration one restart's RSS over time (the attempt nearest its median),
the max over ranks and each rank's, the critical rank's parts shaded and the two peaks (``plot_restart_memory``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from restartbench import analysis
from restartbench.report.style import (
    MAX_FACETS,
    PART_COLORS,
    config_label,
    empty_figure,
    figure_grid,
    figure_header,
    fmt_bytes,
    fmt_s,
)


def plot_restart_memory(table: pd.DataFrame, memory: pd.DataFrame, spans: pd.DataFrame) -> Figure:
    """Per preset/layout and engine: one restart's host RSS over time (``memory_table``; the restore attempt nearest
    its configuration's median restart, ``analysis.typical_restarts``), the max over ranks as a black line and each
    rank's as a grey one, the critical rank's restart parts shaded (``span_table``), steady training's peak dashed and
    the restart's own peak (unthinned) dotted."""
    drawn = analysis.typical_restarts(table)
    if not drawn.empty and not memory.empty:
        drawn = drawn.merge(memory[["run_id", "attempt"]].drop_duplicates(), on=["run_id", "attempt"])
    if drawn.empty or memory.empty:
        return empty_figure("No memory over time: no restart recorded its ranks' timelines (rank.memory).")
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    shown = drawn.head(MAX_FACETS)
    fig, axes = figure_grid(len(shown), 2, 11 / min(2, len(shown)), 3.4)
    labels: dict[str, None] = {}
    for ax, (_, row) in zip(axes, shown.iterrows()):
        samples, row_spans = _of_attempt(memory, row), _of_attempt(spans, row)
        critical = row["path_rank"] if pd.notna(row["path_rank"]) else samples["rank"].min()
        end = row["restart_s"] if pd.notna(row["restart_s"]) else samples["t_s"].max()
        labels.update(dict.fromkeys(_shade_parts(ax, row_spans[row_spans["rank"] == critical], end)))
        _memory_lines(ax, samples, row, end)
        cache = f"{row['cache']} cache" if isinstance(row["cache"], str) else "nothing read"
        title = f"{config_label(row, keys)} · {row['engine']} · {cache}"
        ax.set_title(title + (f" · attempt {row['attempt']:.0f}" if row["attempt"] > 1 else ""), fontsize=9.5)
    handles = [Patch(color=PART_COLORS.get(label, "#bbbbbb"), alpha=0.35, label=label) for label in labels]
    handles += [plt.Line2D([], [], color="black", lw=1.6, label="max over ranks"),
                plt.Line2D([], [], color="#888888", lw=0.7, label="one rank"),
                plt.Line2D([], [], color="#d62728", ls="--", label="steady training's peak"),
                plt.Line2D([], [], color="black", ls=":", label="restart's peak (unthinned)")]
    more = f"; {len(drawn) - len(shown)} more in restart_memory.csv" if len(drawn) > len(shown) else ""
    figure_header(fig, "Host memory during the restart: relaunch → end of the first resumed iteration",
            f"{_sampling(memory)}; shaded: the critical rank's restart parts; each configuration's median restart"
            f"{more}", handles, min(len(handles), 8), 7.5)
    return fig


def _of_attempt(frame: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    return frame[(frame["run_id"] == row["run_id"]) & (frame["attempt"] == row["attempt"])]


def _shade_parts(ax, spans: pd.DataFrame, end: float) -> list[str]:
    """One rank's restart parts as shaded spans (a line where too short to see), named at the top where wide enough
    (``end``: the axis' end); the parts drawn."""
    top = ax.get_xaxis_transform()  # x in seconds, y in axes fractions
    for _, span in spans.iterrows():
        color = PART_COLORS.get(span["part"], "#bbbbbb")
        ax.axvspan(span["start_s"], span["end_s"], color=color, alpha=0.35, lw=0, gid=f"part:{span['part']}")
        if span["end_s"] - span["start_s"] < 0.005 * end:
            ax.axvline(span["start_s"], color=color, lw=0.8)
        if span["end_s"] - span["start_s"] >= 0.08 * end:
            ax.text((span["start_s"] + span["end_s"]) / 2, 0.97, span["part"], transform=top, ha="center", va="top",
                    fontsize=6.5)
    return list(spans["part"])


def _memory_lines(ax, samples: pd.DataFrame, row: pd.Series, end: float) -> None:
    """Each rank's RSS (up to 16 ranks), the max over ranks, and the two peaks, from the relaunch to ``end``."""
    if samples["rank"].nunique() <= 16:
        for _, rank in samples.groupby("rank"):
            ax.plot(rank["t_s"], rank["rss_bytes"], color="#888888", lw=0.7, alpha=0.8)
    envelope = analysis.max_over_ranks(samples)
    ax.plot(envelope["t_s"], envelope["rss_bytes"], color="black", lw=1.6, gid="max over ranks")
    part = f" ({row['peak_rss_part']})" if isinstance(row["peak_rss_part"], str) else ""
    # (value, color, style, name, where the name goes): training's on the left, over the launch (no samples yet)
    peaks = [(row["train_peak_rss_bytes"], "#d62728", "--", "training peak", 0.0, "left"),
             (row["restore_peak_rss_bytes"], "black", ":", f"restart peak{part}", end * 1.02, "right")]
    for value, color, style, what, x, align in peaks:
        if pd.notna(value):
            ax.axhline(value, color=color, ls=style, lw=1.1)
            ax.text(x, value, f" {what} {fmt_bytes(value)} ", color=color, fontsize=7, ha=align, va="bottom")
    top = np.nanmax([samples["rss_bytes"].max(), *[float(v) for v, *_ in peaks if pd.notna(v)]])
    ax.set_xlim(0, end * 1.02)
    ax.set_ylim(0, top * 1.25)  # room for the parts' names above the peaks
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v) if v > 0 else "0"))
    ax.set_xlabel("seconds from the relaunch", fontsize=8)
    ax.set_ylabel("host RSS", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _sampling(memory: pd.DataFrame) -> str:
    """What was measured, from the samples: host RSS, the sampling rate, and how far apart the kept points are."""
    resolution = memory["resolution_s"].dropna()
    rate = f" sampled at {1 / resolution.median():.0f} Hz" if not resolution.empty else ""
    kept = memory.sort_values("t_s").groupby(["run_id", "attempt", "rank"])["t_s"].diff().median()
    return f"host RSS{rate} (drawn: a point every ~{fmt_s(kept)} per rank)"

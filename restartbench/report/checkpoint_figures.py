"""The checkpoint section's figures: each engine's stall, whole cost and durable time per configuration with every
rank's own as a dot (``plot_checkpoint_cost``), and the write and read throughput against the storage's measured
bandwidth (``plot_throughput``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from restartbench import analysis
from restartbench.report.style import (
    HEADER_IN,
    MAX_FACETS,
    config_label,
    empty_figure,
    engine_colors,
    facets_of,
    figure_grid,
    figure_header,
    fmt_rate,
    fmt_s,
    rows_of,
)

#: The checkpoint figure's bars: (offset, tidy-table column, rank-table column or None, label, bar style).
COST_BARS = ((-0.27, "stall_max_s", "stall_s", "stall", {}),
             (0.0, "cost_s", None, "cost", {"alpha": 0.7, "hatch": "..."}),
             (0.27, "durable_rank_max_s", "durable_s", "durable", {"alpha": 0.45, "hatch": "///"}))


def plot_checkpoint_cost(table: pd.DataFrame, rank_table: pd.DataFrame | None = None) -> Figure:
    """Per preset/layout: each engine's training stall, whole cost (stall + slowdown of the iterations its background
    work overlapped) and time until durable (median over checkpoints of the max over ranks; whiskers min-max), with
    every rank's own stall and durable time as a dot."""
    ckpt = table[table["kind"] == "checkpoint"] if not table.empty else table
    if ckpt.empty:
        return empty_figure("No checkpoints measured (only runs of engine 'none', or no complete runs).")
    keys, facets = facets_of(ckpt)
    shown = facets[:MAX_FACETS]
    engines_all = analysis.engine_order(ckpt["engine"].unique())
    colors = engine_colors(engines_all)
    width = max(5.6, 1.7 * len(engines_all) + 1.5)
    fig, axes = figure_grid(len(shown), 3, width, 3.6)
    ranks = rank_table[rank_table["kind"] == "checkpoint"] if rank_table is not None and not rank_table.empty else None
    rng = np.random.default_rng(0)  # the dots' jitter, drawn facet after facet
    for ax, values in zip(axes, shown):
        part = rows_of(ckpt, keys, values)
        engines = analysis.engine_order(part["engine"].unique())
        top = max([_engine_cost_bars(ax, i, part[part["engine"] == engine], colors[engine], ranks, rng)
                   for i, engine in enumerate(engines)], default=0.0)
        _label_cost_facet(ax, engines, top, part.iloc[0], keys)
    legend = [Patch(facecolor="#777777", label="stall: save blocked training (max over ranks)"),
              Patch(facecolor="#777777", alpha=0.7, hatch="...",
                    label="cost: stall + slowdown of overlapped iterations"),
              Patch(facecolor="#777777", alpha=0.45, hatch="///", label="durable: until files fsync'd"),
              plt.Line2D([], [], marker="o", ls="", color="black", markersize=3, label="one rank")]
    more = f"; {len(facets) - len(shown)} more configurations in the tables" if len(facets) > len(shown) else ""
    figure_header(fig, "Checkpoint cost per engine",
                  f"median over checkpoints and runs (whiskers min–max); lower cost is better{more}", legend, 2)
    return fig


def _engine_cost_bars(ax, i: int, rows: pd.DataFrame, color: str, ranks: pd.DataFrame | None,
                      rng: np.random.Generator) -> float:
    """One engine's three bars (``COST_BARS``) at x = ``i``, each with its min-max whisker, its ranks' dots and its
    median written on top; the highest point drawn."""
    top = 0.0
    for offset, column, rank_column, _label, style in COST_BARS:
        series = _bar_values(rows, column)
        if series.empty:
            continue
        median, low, high = series.median(), series.min(), series.max()
        ax.bar(i + offset, median, width=0.25, color=color, edgecolor=color, **style)
        if high > low:
            ax.errorbar(i + offset, median, yerr=[[median - low], [high - median]], color="black", capsize=3, lw=0.8)
        if ranks is not None and rank_column is not None:
            dots = ranks[ranks["run_id"].isin(rows["run_id"]) & ranks["tag"].isin(rows["tag"])][rank_column].dropna()
            ax.scatter(i + offset + rng.uniform(-0.1, 0.1, len(dots)), dots, s=7, color="black", alpha=0.55,
                       zorder=3, linewidths=0)
            high = max(high, dots.max()) if not dots.empty else high
        ax.annotate(fmt_s(median), (i + offset, high), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=6.5)
        top = max(top, high)
    return top


def _label_cost_facet(ax, engines: list[str], top: float, first: pd.Series, keys: list[str]) -> None:
    """A facet's ticks (each bar's name under it, the engine under its three bars), limits and title."""
    x = np.arange(len(engines))
    ax.set_xticks([i + bar[0] for i in x for bar in COST_BARS], [bar[3] for bar in COST_BARS] * len(engines),
                  fontsize=6.5)
    sec = ax.secondary_xaxis(location=0)
    sec.set_xticks(x, engines, fontsize=10, fontweight="bold")
    sec.tick_params("x", length=0, pad=15)
    ax.set_ylim(0, top * 1.22 if top > 0 else 1)
    ax.set_xlim(-0.55, len(engines) - 0.45)
    ax.set_ylabel("seconds")
    ax.set_title(f"{config_label(first, keys)} · {first['ranks']} ranks · {first['device']}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _bar_values(rows: pd.DataFrame, column: str) -> pd.Series:
    """A bar's values, one per checkpoint of one engine; the whole cost is one value, ``analysis.checkpoint_summary``'s
    (the median stall plus the median slowdown of the checkpoints whose background work training saw end)."""
    if column not in rows:
        return pd.Series(dtype=float)
    if column == "cost_s":
        return analysis.checkpoint_summary(rows)["cost_s"].dropna()
    return pd.to_numeric(rows[column], errors="coerce").dropna()


def plot_throughput(table: pd.DataFrame) -> Figure:
    """Write (bytes / durable time) and restore read (bytes read / load time) throughput per configuration, against
    the storage's measured bandwidth (baseline.json) where one exists."""
    ckpt = analysis.checkpoint_summary(table)
    rest = analysis.restart_summary(table)
    if ckpt.empty:
        return empty_figure("No checkpoints measured: no throughput to show.")
    keys = analysis.group_keys(table)
    merged = ckpt.merge(rest.reindex(columns=[*keys, "read_MBps", "cache", "baseline_read_MBps"]), on=keys, how="left")
    storages = list(dict.fromkeys(table["storage"].fillna("run folder")))
    storages = [s for s in storages if (merged.get("storage", pd.Series(["run folder"] * len(merged))) == s).any()
                or "storage" not in merged]
    if "storage" not in merged:
        merged["storage"] = table["storage"].iloc[0]
        storages = [table["storage"].iloc[0]]
    heights = [0.42 * len(merged[merged["storage"] == s]) + 1.2 for s in storages]
    fig, axes = plt.subplots(len(storages), 1, figsize=(10, sum(heights) + 0.5 + HEADER_IN), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    xmax = np.nanmax(np.concatenate([merged["write_MBps"].to_numpy(float), merged["read_MBps"].to_numpy(float),
                                     merged["baseline_write_MBps"].to_numpy(float),
                                     merged["baseline_read_MBps"].to_numpy(float), [1.0]]))
    for ax, storage in zip(axes[:, 0], storages):
        _throughput_panel(ax, merged[merged["storage"] == storage].reset_index(drop=True), keys, storage, xmax)
    axes[-1, 0].set_xlabel("MB/s (10^6 bytes per second; medians over checkpoints and runs)")
    handles = [Patch(color="#4C72B0", label="checkpoint write: all ranks' bytes / durable time (max over ranks)"),
               Patch(color="#DD8452", label="restore read: bytes read / ckpt load (max over ranks)"),
               plt.Line2D([], [], ls="--", color="black", label="storage baseline (baseline.json)")]
    figure_header(fig, "Throughput against the storage's measured bandwidth",
            "a warm page cache lets reads run faster than the storage itself", handles, 3, 8)
    return fig


def _throughput_panel(ax, part: pd.DataFrame, keys: list[str], storage: str, xmax: float) -> None:
    """One storage's bars: each configuration's write and restore read throughput, written at their ends, against
    the storage's measured bandwidth."""
    y = np.arange(len(part))[::-1]
    ax.barh(y + 0.18, part["write_MBps"], height=0.34, color="#4C72B0", label="write: bytes / durable time")
    ax.barh(y - 0.18, part["read_MBps"], height=0.34, color="#DD8452", label="restore read: bytes read / load time")
    for yi, (_, row) in zip(y, part.iterrows()):
        for offset, column in ((0.18, "write_MBps"), (-0.18, "read_MBps")):
            if pd.notna(row[column]):
                ax.annotate(fmt_rate(row[column]), (row[column], yi + offset), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=7.5)
    labels = [f"{config_label(r, [k for k in keys if k != 'storage'])} · {r['engine']}"
              + (f"\n({r['cache']} cache)" if isinstance(r.get("cache"), str) else "") for _, r in part.iterrows()]
    ax.set_yticks(y, labels, fontsize=8)
    _baseline_marks(ax, part)
    ax.set_xlim(0, xmax * 1.25)
    ax.set_ylim(-0.7, len(part))
    ax.set_title(f"storage: {storage}", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _baseline_marks(ax, part: pd.DataFrame) -> None:
    """The storage's measured write and read bandwidth (baseline.json) as dashed lines, or a note that none was."""
    write_base = part["baseline_write_MBps"].dropna()
    read_base = part["baseline_read_MBps"].dropna()
    if write_base.empty and read_base.empty:
        ax.text(0.98, 0.5, "no baseline measured\n(no baseline.json for this storage)", transform=ax.transAxes,
                ha="right", va="center", fontsize=9, color="#aa0000",
                bbox={"boxstyle": "round", "fc": "white", "ec": "#aa0000"})
    for base, color, what in ((write_base, "#4C72B0", "storage write"), (read_base, "#DD8452", "storage read")):
        if not base.empty:
            value = float(base.median())
            ax.axvline(value, color=color, ls="--", lw=1.2)
            ax.text(value, len(part) - 0.4, f" {what} {fmt_rate(value)}", color=color, fontsize=7.5,
                    va="bottom", rotation=0)

"""Figures and the self-contained HTML report, built from the tables of ``restartbench.analysis``.

Every figure function takes the tables (``Collected.table()``, ``rank_table()``, ``file_table()``, ``span_table()``,
``memory_table()``)
and returns a matplotlib Figure, so that ``analysis/summarize.py``, the report and the notebooks
draw the same thing. ``write_outputs(collected, out)`` writes the tables, every figure (PNG and
SVG) and ``report.html`` (figures inlined as PNG, no external file needed).
"""

from __future__ import annotations

import base64
import html
import io
import math
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from restartbench import analysis, goodput
from restartbench.analysis import MB, RESTART_PART_COLUMNS, Collected
from restartbench.engines import engine_names

MAX_FACETS = 24
MAX_ROWS = 60
KIND_COLORS = {"layer": "#4C72B0", "model": "#8172B3", "optimizer": "#DD8452", "other": "#999999"}
PART_COLORS = {  # start-up parts in blues, the checkpoint read stands out (an offline conversion before it too)
    "launch": "#c6dbef", "imports": "#9ecae1", "dist init": "#6baed6", "model build": "#4292c6",
    "ds init": "#2171b5", "engine setup": "#08519c", "convert": "#fdae6b", "ckpt load": "#e6550d",
    "verify": "#bdbdbd", "gaps": "#e0e0e0",
    "1st iter": "#31a354",
}
_DARK_PARTS = ("model build", "ds init", "engine setup", "ckpt load", "1st iter")
_TAB = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
        "#393b79", "#637939", "#843c39")  # tab10 without its grey (grey marks "predicted"/neutral in the legends)


# -- formatting ----------------------------------------------------------------------------------------


def fmt_s(value: Any) -> str:
    """Seconds for people: 8.4 ms, 57 ms, 1.23 s, 95 s; '—' when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    value = float(value)
    if value < 0.01:
        return f"{value * 1e3:.1f} ms"
    if value < 1:
        return f"{value * 1e3:.0f} ms"
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def fmt_duration(value: Any) -> str:
    """Long spans for people (an MTBF, a checkpoint interval): fmt_s up to 100 s, then minutes, hours, days, years
    (365 days)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or float(value) < 100:
        return fmt_s(value)
    value = float(value)
    if value < 7200:
        return f"{value / 60:.3g} min"
    if value < 172_800:
        return f"{value / 3600:.3g} h"
    return f"{value / 86_400:.3g} days" if value < 730 * 86_400 else f"{value / (365 * 86_400):.3g} years"


def fmt_bytes(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    value = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}" if value / scale < 100 else f"{value / scale:.0f} {unit}"
    return f"{value:.0f} B"


def fmt_rate(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.0f} MB/s" if value >= 10 else f"{value:.2g} MB/s"


def fmt_share(value: Any) -> str:
    """A throughput as a share of the storage baseline (percent)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def engine_colors(engines) -> dict[str, tuple]:
    """A fixed color per engine: the registry's order, so an engine has the same color in every figure."""
    known = engine_names()
    colors = {}
    extra = 0
    for engine in engines:
        if engine in known:
            colors[engine] = _TAB[known.index(engine) % len(_TAB)]
        else:
            colors[engine] = _TAB[(len(known) + extra) % len(_TAB)]
            extra += 1
    return colors


def _config_label(row: pd.Series | dict, keys: list[str]) -> str:
    return " · ".join(str(row[k]) for k in keys if k != "engine")


def _facets(table: pd.DataFrame) -> tuple[list[str], list[tuple]]:
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    values = list(table.groupby(keys, dropna=False).groups) if not table.empty else []
    values = [v if isinstance(v, tuple) else (v,) for v in values]
    return keys, values


def _subset(table: pd.DataFrame, keys: list[str], values: tuple) -> pd.DataFrame:
    mask = pd.Series(True, index=table.index)
    for key, value in zip(keys, values):
        mask &= table[key].isna() if (isinstance(value, float) and math.isnan(value)) else table[key] == value
    return table[mask]


def _grid(n: int, ncols: int, width: float, height: float, **kwargs) -> tuple[Figure, list]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + HEADER_IN), squeeze=False, **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _empty(message: str) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True)
    return fig


HEADER_IN = 1.0  # inches above the axes for the title, subtitle and legend


def _header(fig: Figure, title: str, subtitle: str, handles: list, ncol: int, fontsize: float = 8.5,
            header_in: float = HEADER_IN) -> None:
    """Title, one-line subtitle and the legend above the axes (at fixed distances in inches; ``header_in`` for them
    all, more than ``HEADER_IN`` for a legend of more than two rows), then lay out the axes."""
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=13, fontweight="bold", x=0.01, ha="left", y=1 - 0.1 / height, va="top")
    fig.text(0.01, 1 - 0.42 / height, subtitle, fontsize=9, ha="left", va="top", color="#333333")
    if handles:
        fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.005, 1 - 0.6 / height), ncol=ncol,
                   fontsize=fontsize, frameon=False, handlelength=1.4, columnspacing=1.1)
    fig.tight_layout()
    fig.subplots_adjust(top=1 - (header_in + 0.3) / height)  # tight_layout leaves room for the suptitle only


# -- figures -------------------------------------------------------------------------------------------


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
        return _empty("No checkpoints measured (only runs of engine 'none', or no complete runs).")
    keys, facets = _facets(ckpt)
    shown = facets[:MAX_FACETS]
    engines_all = analysis.engine_order(ckpt["engine"].unique())
    colors = engine_colors(engines_all)
    width = max(5.6, 1.7 * len(engines_all) + 1.5)
    fig, axes = _grid(len(shown), 3, width, 3.6)
    ranks = rank_table[rank_table["kind"] == "checkpoint"] if rank_table is not None and not rank_table.empty else None
    rng = np.random.default_rng(0)
    for ax, values in zip(axes, shown):
        part = _subset(ckpt, keys, values)
        engines = analysis.engine_order(part["engine"].unique())
        x = np.arange(len(engines))
        top = 0.0
        for i, engine in enumerate(engines):
            rows = part[part["engine"] == engine]
            for offset, column, rank_column, _label, style in COST_BARS:
                series = _bar_values(rows, column)
                if series.empty:
                    continue
                median, low, high = series.median(), series.min(), series.max()
                ax.bar(i + offset, median, width=0.25, color=colors[engine], edgecolor=colors[engine], **style)
                if high > low:
                    ax.errorbar(i + offset, median, yerr=[[median - low], [high - median]], color="black",
                                capsize=3, lw=0.8)
                if ranks is not None and rank_column is not None:
                    dots = ranks[ranks["run_id"].isin(rows["run_id"]) & ranks["tag"].isin(rows["tag"])][rank_column]
                    dots = dots.dropna()
                    ax.scatter(i + offset + rng.uniform(-0.1, 0.1, len(dots)), dots, s=7, color="black", alpha=0.55,
                               zorder=3, linewidths=0)
                    high = max(high, dots.max()) if not dots.empty else high
                ax.annotate(fmt_s(median), (i + offset, high), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=6.5)
                top = max(top, high)
        ax.set_xticks([i + bar[0] for i in x for bar in COST_BARS], [bar[3] for bar in COST_BARS] * len(engines),
                      fontsize=6.5)
        sec = ax.secondary_xaxis(location=0)
        sec.set_xticks(x, engines, fontsize=10, fontweight="bold")
        sec.tick_params("x", length=0, pad=15)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xlim(-0.55, len(engines) - 0.45)
        ax.set_ylabel("seconds")
        first = part.iloc[0]
        ax.set_title(f"{_config_label(first, keys)} · {first['ranks']} ranks · {first['device']}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    legend = [Patch(facecolor="#777777", label="stall: save blocked training (max over ranks)"),
              Patch(facecolor="#777777", alpha=0.7, hatch="...",
                    label="cost: stall + slowdown of overlapped iterations"),
              Patch(facecolor="#777777", alpha=0.45, hatch="///", label="durable: until files fsync'd"),
              plt.Line2D([], [], marker="o", ls="", color="black", markersize=3, label="one rank")]
    more = f"; {len(facets) - len(shown)} more configurations in the tables" if len(facets) > len(shown) else ""
    _header(fig, "Checkpoint cost per engine", f"median over checkpoints and runs (whiskers min–max); lower cost is "
                                               f"better{more}", legend, 2)
    return fig


def _bar_values(rows: pd.DataFrame, column: str) -> pd.Series:
    """A bar's values, one per checkpoint of one engine; the whole cost is one value, ``analysis.checkpoint_summary``'s
    (the median stall plus the median slowdown of the checkpoints whose background work training saw end)."""
    if column not in rows:
        return pd.Series(dtype=float)
    if column == "cost_s":
        return analysis.checkpoint_summary(rows)["cost_s"].dropna()
    return pd.to_numeric(rows[column], errors="coerce").dropna()


def plot_restart_phases(table: pd.DataFrame) -> Figure:
    """Per preset/layout and engine: the restart's critical path as stacked bars (the parts of the last rank ready to
    train, median over runs), the total (max over ranks) as a marker, and beneath the ds init part its stages
    (``analysis.ds_init_summary`` of the critical rank), collective waits hatched; engine none (nothing restored) is
    the start-up floor."""
    restarts = table[table["kind"] == "restart"] if not table.empty else table
    if restarts.empty:
        return _empty("No restarts measured.")
    summary = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    stages = _ds_init_stages(table, summary)
    facets = list(summary.groupby(keys, dropna=False, sort=False).groups)
    facets = [f if isinstance(f, tuple) else (f,) for f in facets]
    shown, total_rows = [], 0
    for f in facets:
        n = len(_subset(summary, keys, f))
        if total_rows + n > MAX_ROWS and shown:
            break
        shown.append(f)
        total_rows += n
    path_columns = [(c, label) for c, label in analysis.PATH_COLUMNS if c in summary]
    names = list(dict.fromkeys(name for row_stages in stages for name in row_stages))
    legend = len(path_columns) + 1 + len(names)  # parts, total, stages
    ncol = legend if legend <= 11 else math.ceil(legend / 3)
    header = HEADER_IN + 0.2 * max(0, math.ceil(legend / ncol) - 2)  # a third row of the legend
    row_height = 0.75 if names else 0.55  # room for the ds init strip beneath a bar
    heights = [row_height * len(_subset(summary, keys, f)) + 0.75 for f in shown]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, sum(heights) + 0.5 + header), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    sums = summary[[c for c, _ in path_columns]].fillna(0).sum(axis=1) if path_columns else summary["restart_s"]
    xmax = float(np.nanmax([*summary["restart_s"].to_numpy(dtype=float), *sums.to_numpy(dtype=float), 1e-3]))
    for ax, values in zip(axes[:, 0], shown):
        rows = _subset(summary, keys, values)
        part = rows.reset_index(drop=True)
        y = np.arange(len(part))[::-1]
        for yi, (_, row), row_stages in zip(y, part.iterrows(), [stages[i] for i in rows.index]):
            left = 0.0
            for column, label in path_columns:
                width = row[column]
                if width is None or pd.isna(width) or width <= 0:
                    continue
                bar = ax.barh(yi, width, left=left, color=PART_COLORS.get(label, "#bbbbbb"), height=0.62,
                              edgecolor="white", linewidth=0.6, hatch="xx" if label in ("verify", "gaps") else None)
                bar.patches[0].set_gid(f"part:{label}")
                if width >= 0.07 * xmax:
                    ax.text(left + width / 2, yi, f"{label}\n{fmt_s(width)}", ha="center", va="center", fontsize=7,
                            color="white" if label in _DARK_PARTS else "black")
                if label == "ds init" and row_stages:
                    _ds_init_strip(ax, yi, left, width, row_stages, xmax)
                left += width
            if pd.notna(row["restart_s"]):
                ax.plot([row["restart_s"]], [yi], marker="D", color="black", markersize=5, zorder=4)
                ax.annotate(fmt_s(row["restart_s"]), (max(left, row["restart_s"]), yi), xytext=(6, 0),
                            textcoords="offset points", va="center", fontsize=8.5, fontweight="bold")
        labels = []
        for _, row in part.iterrows():
            if not row["restores_checkpoint"]:
                labels.append(f"{row['engine']}: start-up floor\n(nothing restored)")
            else:
                load = fmt_s(row["restart_ckpt_load_s"])
                labels.append(f"{row['engine']}\nckpt load {load}, {row['cache'] or '?'} cache")
        ax.set_yticks(y, labels, fontsize=8.5)
        floor = part.loc[~part["restores_checkpoint"].astype(bool), "restart_s"]
        if not floor.empty and pd.notna(floor.iloc[0]):
            ax.axvline(floor.iloc[0], color="black", ls="--", lw=0.9)
            ax.text(floor.iloc[0], len(part) - 0.45, " start-up floor (engine none)", fontsize=7.5, va="bottom")
        ax.set_xlim(0, xmax * 1.12)
        ax.set_ylim(-0.75 if names else -0.6, len(part) - 0.2)
        ax.set_title(f"{_config_label(part.iloc[0], keys)} · {part.iloc[0]['ranks']} ranks", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel("seconds from the relaunch (medians over runs)")
    handles = [Patch(facecolor=PART_COLORS[label], hatch="xx" if label in ("verify", "gaps") else None,
                     edgecolor="white", label=label) for _, label in path_columns]
    handles.append(plt.Line2D([], [], marker="D", ls="", color="black", label="total"))
    handles.extend(Patch(label=STAGE_LABELS.get(name, name), **_stage_style(name, names.index(name)))
                   for name in names)
    more = f"; {len(facets) - len(shown)} more configurations in the tables" if len(facets) > len(shown) else ""
    strip = "; under ds init: its stages" if names else ""
    _header(fig, "Where restart time goes: relaunch → end of the first resumed iteration",
            "the parts of the last rank ready to train (all ranks wait for it); orange: reading the checkpoint, "
            f"blue: start-up{strip}{more}", handles, ncol, 7.5, header)
    return fig


#: The ds init strip's work stages, slowest first (purples), the rest, and what was not work.
STAGE_COLORS = ("#3f007d", "#54278f", "#6a51a3", "#807dba", "#9e9ac8", "#bcbddc")
WAIT_STAGE, REST_STAGE = "collective wait", "other"
STAGE_LABELS = {WAIT_STAGE: "collective wait (for other ranks)", REST_STAGE: "other (in no timed stage)"}


def _stage_style(name: str, index: int) -> dict[str, Any]:
    """How a stage of deepspeed.initialize is drawn: work in purples, its untimed rest grey, waiting in
    collectives hatched red on white, so that waiting for other ranks never looks like work."""
    if name == WAIT_STAGE:
        return {"facecolor": "white", "edgecolor": "#cb181d", "hatch": "////"}
    if name == REST_STAGE:
        return {"facecolor": "#d9d9d9", "edgecolor": "white"}
    return {"facecolor": STAGE_COLORS[min(index, len(STAGE_COLORS) - 1)], "edgecolor": "white"}


def _ds_init_stages(table: pd.DataFrame, summary: pd.DataFrame) -> list[dict[str, float]]:
    """Per row of ``summary`` (restart_summary), the critical rank's deepspeed.initialize stages, {name: median s},
    work first (slowest first, then ``other stages``), then ``other`` and ``collective wait``; {} where not timed."""
    stages = analysis.ds_init_summary(table, column="path_ds_init_parts")
    keys = analysis.group_keys(table)
    names = [c for c in stages.columns if c not in (*keys, "parts_sum_s", WAIT_STAGE, REST_STAGE)]
    names += [c for c in (REST_STAGE, WAIT_STAGE) if c in stages.columns]
    merged = summary[keys].merge(stages, on=keys, how="left")
    return [{name: float(row[name]) for name in names if pd.notna(row[name]) and row[name] > 0}
            for _, row in merged.iterrows()]


def _ds_init_strip(ax, yi: float, left: float, width: float, stages: dict[str, float], xmax: float) -> None:
    """Beneath the ds init bar, its stages as shares of it (the medians of the stages need not add up to the median
    of the call), each labelled with its own median where it is wide enough."""
    total = sum(stages.values())
    order = list(stages)
    for name, seconds in stages.items():
        share = width * seconds / total
        bar = ax.barh(yi - 0.42, share, left=left, height=0.2, linewidth=0.5, **_stage_style(name, order.index(name)))
        bar.patches[0].set_gid(f"ds init stage:{name}")
        if share >= 0.0065 * xmax * (len(name) + 8):  # about a 6-point character's width per character
            dark = name not in (WAIT_STAGE, REST_STAGE) and order.index(name) < 4
            ax.text(left + share / 2, yi - 0.42, f"{name} {fmt_s(seconds)}", ha="center", va="center", fontsize=6,
                    color="white" if dark else "black")
        left += share


def plot_restart_memory(table: pd.DataFrame, memory: pd.DataFrame, spans: pd.DataFrame) -> Figure:
    """Per preset/layout and engine: one restart's host RSS over time (``memory_table``; the restore attempt nearest
    its configuration's median restart, ``analysis.typical_restarts``), the max over ranks as a black line and each
    rank's as a grey one, the critical rank's restart parts shaded (``span_table``), steady training's peak dashed and
    the restart's own peak (unthinned) dotted."""
    drawn = analysis.typical_restarts(table)
    if not drawn.empty and not memory.empty:
        drawn = drawn.merge(memory[["run_id", "attempt"]].drop_duplicates(), on=["run_id", "attempt"])
    if drawn.empty or memory.empty:
        return _empty("No memory over time: no restart recorded its ranks' timelines (rank.memory).")
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    shown = drawn.head(MAX_FACETS)
    fig, axes = _grid(len(shown), 2, 11 / min(2, len(shown)), 3.4)
    labels: dict[str, None] = {}
    for ax, (_, row) in zip(axes, shown.iterrows()):
        samples, row_spans = _of_attempt(memory, row), _of_attempt(spans, row)
        critical = row["path_rank"] if pd.notna(row["path_rank"]) else samples["rank"].min()
        end = row["restart_s"] if pd.notna(row["restart_s"]) else samples["t_s"].max()
        labels.update(dict.fromkeys(_shade_parts(ax, row_spans[row_spans["rank"] == critical], end)))
        _memory_lines(ax, samples, row, end)
        cache = f"{row['cache']} cache" if isinstance(row["cache"], str) else "nothing read"
        title = f"{_config_label(row, keys)} · {row['engine']} · {cache}"
        ax.set_title(title + (f" · attempt {row['attempt']:.0f}" if row["attempt"] > 1 else ""), fontsize=9.5)
    handles = [Patch(color=PART_COLORS.get(label, "#bbbbbb"), alpha=0.35, label=label) for label in labels]
    handles += [plt.Line2D([], [], color="black", lw=1.6, label="max over ranks"),
                plt.Line2D([], [], color="#888888", lw=0.7, label="one rank"),
                plt.Line2D([], [], color="#d62728", ls="--", label="steady training's peak"),
                plt.Line2D([], [], color="black", ls=":", label="restart's peak (unthinned)")]
    more = f"; {len(drawn) - len(shown)} more in restart_memory.csv" if len(drawn) > len(shown) else ""
    _header(fig, "Host memory during the restart: relaunch → end of the first resumed iteration",
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


def plot_files_per_rank(files: pd.DataFrame, table: pd.DataFrame | None = None) -> Figure:
    """For the last checkpoint of the latest run of each preset/layout/engine: bytes written per rank, by file kind,
    with the number of files on top."""
    per_rank = analysis.files_per_rank(files)
    if per_rank.empty:
        return _empty("No checkpoint files recorded (inventory.json).")
    latest = (per_rank.sort_values(["run_id", "tag"]).groupby(["preset", "layout", "engine"], sort=False)
              .tail(1)[["preset", "layout", "engine", "run_id", "tag"]])
    latest = analysis.sort_rows(latest, ["preset", "layout", "engine"])
    shown = latest.head(MAX_FACETS)
    max_ranks = int(per_rank["rank"].nunique()) or 1
    fig, axes = _grid(len(shown), 4, max(3.2, 0.45 * max_ranks + 1.6), 3.0, sharey=False)
    for ax, (_, which) in zip(axes, shown.iterrows()):
        rows = per_rank[(per_rank["run_id"] == which["run_id"]) & (per_rank["tag"] == which["tag"])]
        rows = rows.sort_values("rank")
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for kind, color in KIND_COLORS.items():
            values = rows[f"{kind}_bytes"].to_numpy(dtype=float) / MB
            if values.sum() > 0:
                ax.bar(x, values, bottom=bottom, color=color, width=0.7)
                bottom += values
        for xi, total, count in zip(x, bottom, rows["files"]):
            ax.annotate(f"{count} file{'s' if count != 1 else ''}", (xi, total), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [str(r) if pd.notna(r) else "?" for r in rows["rank"]], fontsize=8)
        ax.set_xlabel("rank", fontsize=8)
        ax.set_ylabel("MB written", fontsize=8)
        ax.set_ylim(0, bottom.max() * 1.2 if len(bottom) and bottom.max() > 0 else 1)
        ax.set_title(f"{which['preset']} · {which['layout']} · {which['engine']} ({which['tag']})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles = [Patch(color=color, label=kind) for kind, color in KIND_COLORS.items()]
    more = f"; {len(latest) - len(shown)} more in files_per_rank.csv" if len(latest) > len(shown) else ""
    _header(fig, "Files and bytes per rank (last checkpoint of the latest run)",
            f"bytes each rank wrote, by file kind; number of files on top{more}", handles, 4)
    return fig


def plot_throughput(table: pd.DataFrame) -> Figure:
    """Write (bytes / durable time) and restore read (bytes read / load time) throughput per configuration, against
    the storage's measured bandwidth (baseline.json) where one exists."""
    ckpt = analysis.checkpoint_summary(table)
    rest = analysis.restart_summary(table)
    if ckpt.empty:
        return _empty("No checkpoints measured: no throughput to show.")
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
        part = merged[merged["storage"] == storage].reset_index(drop=True)
        y = np.arange(len(part))[::-1]
        ax.barh(y + 0.18, part["write_MBps"], height=0.34, color="#4C72B0", label="write: bytes / durable time")
        ax.barh(y - 0.18, part["read_MBps"], height=0.34, color="#DD8452", label="restore read: bytes read / load time")
        for yi, (_, row) in zip(y, part.iterrows()):
            for offset, column in ((0.18, "write_MBps"), (-0.18, "read_MBps")):
                if pd.notna(row[column]):
                    ax.annotate(fmt_rate(row[column]), (row[column], yi + offset), xytext=(3, 0),
                                textcoords="offset points", va="center", fontsize=7.5)
        labels = [f"{_config_label(r, [k for k in keys if k != 'storage'])} · {r['engine']}"
                  + (f"\n({r['cache']} cache)" if isinstance(r.get("cache"), str) else "") for _, r in part.iterrows()]
        ax.set_yticks(y, labels, fontsize=8)
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
        ax.set_xlim(0, xmax * 1.25)
        ax.set_ylim(-0.7, len(part))
        ax.set_title(f"storage: {storage}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel("MB/s (10^6 bytes per second; medians over checkpoints and runs)")
    handles = [Patch(color="#4C72B0", label="checkpoint write: all ranks' bytes / durable time (max over ranks)"),
               Patch(color="#DD8452", label="restore read: bytes read / ckpt load (max over ranks)"),
               plt.Line2D([], [], ls="--", color="black", label="storage baseline (baseline.json)")]
    _header(fig, "Throughput against the storage's measured bandwidth",
            "a warm page cache lets reads run faster than the storage itself", handles, 3, 8)
    return fig


def plot_size_check(size: pd.DataFrame) -> Figure:
    """Predicted checkpoint bytes (P·(w + 12)) against measured, per preset/layout/engine, split into weights and
    optimizer state where the file kinds tell."""
    if size.empty:
        return _empty("No checkpoints measured: nothing to compare with the estimate.")
    size = size.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(7.5, 1.3 * len(size) + 2), 3.6 + HEADER_IN))
    x = np.arange(len(size))
    has_parts = {"measured_weights_bytes", "measured_optimizer_bytes"} <= set(size.columns)
    if has_parts:
        bottom = np.zeros(len(size))
        for column, color in (("predicted_weights_bytes", "#4C72B0"), ("predicted_optimizer_bytes", "#DD8452")):
            values = size[column].to_numpy(float) / MB
            ax.bar(x - 0.2, values, 0.38, bottom=bottom, color=color, alpha=0.4, hatch="///", edgecolor=color)
            bottom += np.nan_to_num(values)
        bottom = np.zeros(len(size))
        for column, color in (("measured_weights_bytes", "#4C72B0"), ("measured_optimizer_bytes", "#DD8452"),
                              ("measured_other_bytes", "#999999")):
            if column in size:
                values = size[column].fillna(0).to_numpy(float) / MB
                ax.bar(x + 0.2, values, 0.38, bottom=bottom, color=color)
                bottom += values
    else:
        ax.bar(x - 0.2, size["predicted_bytes"] / MB, 0.38, color="#777777", alpha=0.4, hatch="///")
        ax.bar(x + 0.2, size["measured_bytes"] / MB, 0.38, color="#777777")
    for xi, (_, row) in zip(x, size.iterrows()):
        top = np.nanmax([row["predicted_bytes"], row["measured_bytes"]]) / MB
        ratio = row["measured_vs_predicted"]
        ax.annotate(f"×{ratio:.3f}" if pd.notna(ratio) else "no estimate", (xi, top),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=7.5)
    ax.set_xticks([i + o for i in x for o in (-0.2, 0.2)], ["predicted", "measured"] * len(size), fontsize=7)
    sec = ax.secondary_xaxis(location=0)
    sec.set_xticks(x, [f"{r['preset']} · {r['layout']}\n{r['engine']} · {r['dtype']}" for _, r in size.iterrows()],
                   fontsize=8.5)
    sec.tick_params("x", length=0, pad=14)
    ax.set_ylabel("MB per checkpoint (all ranks)")
    ax.set_ylim(0, np.nanmax(size[["predicted_bytes", "measured_bytes"]].to_numpy(float)) / MB * 1.3)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    handles = [Patch(facecolor="#4C72B0", label="weights (layer + model files)"),
               Patch(facecolor="#DD8452", label="optimizer (fp32 master + Adam moments)"),
               Patch(facecolor="#999999", label="other files"),
               Patch(facecolor="white", edgecolor="black", hatch="///", label="hatched: predicted")]
    _header(fig, "Predicted checkpoint size against measured",
            "predicted: P·(weight bytes + 12); measured: all ranks' files of one checkpoint; ×: measured / predicted",
            handles, 4, 8)
    return fig


def plot_goodput(table: pd.DataFrame, failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                 gpus: int | None = None) -> Figure:
    """Per preset/layout: each engine's share of wall time lost (checkpoints, re-done work, restarts) against the
    checkpoint interval, from its measured C and R (``analysis.goodput_table``), the optimum τ* marked."""
    rows = analysis.goodput_table(table, failures_per_gpu_hour, gpus)
    if rows.empty:
        return _empty("No goodput: it needs a checkpoint's cost, a restart and an iteration time "
                      "(engine none saves nothing; emulated runs neither train nor restart).")
    keys, facets = _facets(rows)
    shown = facets[:MAX_FACETS]
    colors = engine_colors(analysis.engine_order(rows["engine"].unique()))
    fig, axes = _grid(len(shown), 2, 11 / min(2, len(shown)), 4.0)
    for ax, values in zip(axes, shown):
        part = _subset(rows, keys, values)
        low = max(part["iteration_s"].min(), part["interval_s"].min() / 30)
        intervals = np.geomspace(low, max(part["interval_s"].max() * 30, low * 10), 200)
        for _, row in part.iterrows():
            lost = [100 * goodput.at_interval(t, row["cost_s"], row["restart_s"], row["mtbf_s"]).lost_share
                    for t in intervals]
            best = 100 - row["goodput_pct"]
            ax.plot(intervals, lost, color=colors[row["engine"]],
                    label=f"{row['engine']}: τ* {fmt_duration(row['interval_s'])}, goodput {row['goodput_pct']:.6g}%")
            ax.plot([row["interval_s"]], [best], marker="o", color=colors[row["engine"]], markersize=6, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_duration(v)))
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("checkpoint interval τ (training time between checkpoints)", fontsize=8.5)
        ax.set_ylabel("wall time lost, % (100 − goodput)", fontsize=8.5)
        first = part.iloc[0]
        ax.set_title(f"{_config_label(first, keys)} · {first['gpus']} GPUs · MTBF {fmt_duration(first['mtbf_s'])}",
                     fontsize=10)
        ax.legend(fontsize=7.5, frameon=False)
        ax.grid(which="both", alpha=0.25)
    more = f"; {len(facets) - len(shown)} more configurations in goodput.csv" if len(facets) > len(shown) else ""
    subtitle = textwrap.fill(analysis.goodput_assumptions(failures_per_gpu_hour, gpus)
                             + f". Dots: Daly's optimum τ*{more}", 135)
    _header(fig, "Time lost to checkpoints, re-done work and restarts against the checkpoint interval", subtitle, [], 1)
    return fig


#: How the goodput table's columns are shown (console and report).
GOODPUT_FORMATS: dict[str, Any] = {
    "runs": None, "cost_s": fmt_s, "cost_basis": None, "restart_s": fmt_s, "iteration_s": fmt_s, "gpus": None,
    "mtbf_s": fmt_duration, "interval_s": fmt_duration, "interval_iterations": "{:.0f}", "checkpoint_pct": "{:.3g}%",
    "rework_pct": "{:.3g}%", "restart_pct": "{:.3g}%", "goodput_pct": "{:.6g}%"}


FIGURES: dict[str, tuple[str, str]] = {
    "checkpoint_cost": ("Checkpoint stall, whole cost and durable time per engine",
                        "For each preset and layout, three bars per engine. <b>Stall</b> (solid) is what training "
                        "waited for <code>save</code>: the time it blocked the training loop, taken as "
                        "the <b>max over ranks</b> (the slowest rank holds everyone up at the next collective). "
                        "<b>Whole cost</b> (dotted) adds the <b>slowdown</b>: what the iterations that overlapped the "
                        "save's background work (an asynchronous engine's copy and write, from the end of save until "
                        "the rank's files were durable) took beyond the clean median iteration; a synchronous engine "
                        "has none, since the harness waits for durability before the next iteration. It is the median "
                        "stall plus the median slowdown of the checkpoints whose background work training saw end "
                        "(phase 1's last save is waited for after training, so it shows none). "
                        "<b>Durable</b> (hatched) runs from the start of the save until the rank's files were fsync'd "
                        "to stable storage (for an asynchronous engine: its background write finished), again the max "
                        "over ranks. Bars are medians over checkpoints and runs, whiskers the min–max; each dot is "
                        "one rank of one checkpoint, so the per-rank spread stays visible."),
    "restart_phases": ("Restart time as stacked phases",
                       "From the relaunch of the job to the end of the first resumed iteration. The bars follow the "
                       "<b>critical path</b>: the parts of the last rank ready to train (every rank waits for it in "
                       "the first iteration, a collective), so they add up to the total (diamond: the max over ranks "
                       "of launch → end of first iteration); medians over runs. The table below gives each part's max "
                       "over ranks instead. Only the orange part (ckpt load: read, deserialize, copy into model and "
                       "optimizer) depends on the checkpoint; the blue parts are start-up any relaunch pays; "
                       "<i>verify</i> is the harness's exactness check and <i>gaps</i> the time between measured "
                       "spans. Engine <code>none</code> restores nothing: its bar is the <b>start-up floor</b> (dashed "
                       "line). Each label gives the restore's page-cache state (<code>cache</code> field of the "
                       "<code>restore.load</code> event): <i>warm</i> means the files may have come from memory. "
                       "The thin strip under <i>ds init</i> splits <code>deepspeed.initialize</code> into DeepSpeed's "
                       "own set-up stages as the critical rank timed them (<code>restartbench/ds_init_timing.py</code>;"
                       " each stage its own time, nested stages taken out), in purples the five slowest stages and "
                       "the rest of them, in grey the call's time in no timed stage, hatched red the time spent inside "
                       "collectives (barrier, broadcast, <code>new_group</code>...): mostly waiting for slower ranks, "
                       "not work. The strip gives each stage's share of the bar (medians over runs; a label its "
                       "median)."),
    "restart_memory": ("Host memory during the restart",
                       "What the restart holds in host memory from the relaunch to the end of the first resumed "
                       "iteration: each rank's resident set size (RSS, <code>/proc/self/statm</code>, sampled by a "
                       "thread of the rank, <code>restartbench/memwatch.py</code>) as a grey line, their <b>max over "
                       "ranks</b> in black, for the restore attempt nearest each configuration's median restart. The "
                       "shaded spans are the restart parts of the critical rank (the one the restart figure's bar "
                       "follows; a part too short to shade is a line). A rank records its timeline thinned to at most "
                       "a few hundred points, so a spike shorter than the gap between two points can be missing from "
                       "the lines; the dotted line is the restart's peak from every sample (the largest span peak of "
                       "any rank and part, named). The dashed red line is steady training's peak: the largest RSS of "
                       "any rank in a phase-1 iteration. A restart peak above it is memory that resuming needs and "
                       "training does not (where jobs run out of memory on resume). Host memory only: a GPU's memory "
                       "is not in it. Each title gives the restore's page-cache state (cold or warm)."),
    "files_per_rank": ("Files and bytes per rank",
                       "Bytes each rank wrote for one checkpoint (the last of the latest run), split by file kind, "
                       "with the number of files above the bar. Uneven bars show which ranks carry the I/O (for "
                       "example data-parallel rank 0 writing all the weights)."),
    "throughput": ("Throughput against the storage baseline",
                   "Checkpoint write throughput = all ranks' bytes / durable time (max over ranks); restore read "
                   "throughput = bytes read / ckpt load time. Dashed lines: the storage's own bandwidth from a "
                   "<code>baseline.json</code> (e.g. fio) in the run folder or a parent folder, where one exists."),
    "checkpoint_size": ("Predicted against measured checkpoint size",
                        "The prediction made before launching (<code>python -m restartbench.plan</code>: every file "
                        "the run's engine writes for this preset and layout, from the engine's own code on "
                        "shape-only tensors) against the files actually written. Engines without a prediction "
                        "(decoupled, datastates) are set against DeepSpeed's default engine's. The weights/optimizer "
                        "split uses the rough rule parameters × weight bytes and parameters × 12 bytes."),
    "goodput": ("Goodput: the checkpoint interval the measurements imply",
                "Young and Daly's first-order model (<code>restartbench/goodput.py</code>): failures arrive at a "
                "constant rate F per GPU-hour on G GPUs, so the job's mean time between failures is M = 1/(F·G); "
                "each checkpoint costs training C, and a failure loses half a checkpoint period of work plus the "
                "restart R. Shares of wall time at interval τ: checkpoints C/(τ+C), re-done work (τ+C)/2M, restarts "
                "R/M; goodput is what is left. τ* is Daly's optimum √(2CM)·(1 + ⅓√(C/2M) + ⅑·C/2M) − C, never "
                "below one iteration. C is the <b>whole cost</b> of a checkpoint: its stall plus the slowdown of "
                "the iterations its background work overlapped (see the first figure). R is the restart as "
                "measured on this machine (max over ranks); on another machine or scale it differs."),
}


def figures(collected: Collected, failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
            gpus: int | None = None) -> dict[str, Figure]:
    """Every figure of the report; the goodput's at ``failures_per_gpu_hour`` on ``gpus`` (None: each run's
    world size)."""
    table, ranks, files = collected.table(), collected.rank_table(), collected.file_table()
    return {
        "checkpoint_cost": plot_checkpoint_cost(table, ranks),
        "restart_phases": plot_restart_phases(table),
        "restart_memory": plot_restart_memory(table, collected.memory_table(), collected.span_table()),
        "files_per_rank": plot_files_per_rank(files, table),
        "throughput": plot_throughput(table),
        "checkpoint_size": plot_size_check(analysis.size_check(table, files)),
        "goodput": plot_goodput(table, failures_per_gpu_hour, gpus),
    }


def save_figure(fig: Figure, stem: Path, dpi: int = 110) -> dict[str, Path]:
    paths = {}
    for suffix in (".png", ".svg"):
        path = stem.with_suffix(suffix)
        fig.savefig(path, dpi=dpi)
        paths[suffix] = path
    return paths


# -- findings: the sentences at the top of the report ----------------------------------------------------


def findings(table: pd.DataFrame) -> list[str]:
    """Plain sentences: first which engine stalls training least overall, then per configuration the stall ranking,
    engines whose files become durable long after training resumed, and what the restart time is made of."""
    if table.empty:
        return []
    ckpt = analysis.checkpoint_summary(table)
    rest = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    configs = list(dict.fromkeys([*map(tuple, ckpt[keys].astype(str).values),
                                  *map(tuple, rest[keys].astype(str).values)]))
    out, winners = [], []
    for values in configs:
        c = ckpt[(ckpt[keys].astype(str) == list(values)).all(axis=1)].sort_values("stall_s", kind="stable")
        r = rest[(rest[keys].astype(str) == list(values)).all(axis=1)]
        ranks = pd.concat([c["ranks"], r["ranks"]]).max()
        sentences = []
        if not c.empty and pd.notna(c.iloc[0]["stall_s"]):
            best = c.iloc[0]
            winners.append(best["engine"])
            text = (f"{best['engine']} stalls training least: {fmt_s(best['stall_s'])} per checkpoint (max over ranks, "
                    f"median of {int(best['checkpoints'])}")
            if pd.notna(best["stall_iterations"]):
                text += f"; {best['stall_iterations']:.2g} iterations' worth"
            text += f"), files durable after {fmt_s(best['durable_s'])}"
            others = [f"{row['engine']} {fmt_s(row['stall_s'])} ({row['stall_s'] / best['stall_s']:.1f}×)"
                      for _, row in c.iloc[1:].iterrows() if best["stall_s"] and pd.notna(row["stall_s"])]
            sentences.append(text + (f"; then {', '.join(others)}." if others else "; the only engine measured here."))
            sentences.extend(_whole_cost_sentences(c))
            late = [row for _, row in c.iterrows() if pd.notna(row["durable_s"]) and row["stall_s"]
                    and row["durable_s"] > 2 * row["stall_s"] and row["durable_s"] - row["stall_s"] > 0.005]
            if late:
                sentences.append(", ".join(f"{row['engine']} ({fmt_s(row['stall_s'])} stall, durable after "
                                           f"{fmt_s(row['durable_s'])})" for row in late)
                                 + (" returns" if len(late) == 1 else " return")
                                 + " to training well before the files are durable (a synchronous engine leaves "
                                   "them in the page cache until they are fsync'd; an asynchronous one goes on "
                                   "writing in the background): a crash in that window loses the checkpoint.")
        restoring = r[r["restores_checkpoint"].astype(bool) & r["restart_s"].notna()]
        floor = r[~r["restores_checkpoint"].astype(bool) & r["restart_s"].notna()]
        if not restoring.empty:
            totals = ", ".join(f"{fmt_s(row['restart_s'])} ({row['engine']})" for _, row in restoring.iterrows())
            loads = restoring["restart_ckpt_load_s"].dropna()
            share = (restoring["restart_ckpt_load_s"] / restoring["restart_s"]).dropna()
            caches = ", ".join(sorted({str(x) for x in restoring["cache"].dropna()})) or "unknown"
            text = f"Restart takes {totals} from relaunch to the end of the first resumed iteration."
            if not loads.empty:
                span = (fmt_s(loads.min()) if loads.min() == loads.max()
                        else f"{fmt_s(loads.min())}–{fmt_s(loads.max())}")
                text += (f" Reading the checkpoint is {span} (at most {100 * share.max():.1f}% of it; "
                         f"{caches} page cache)")
            path = [(label, restoring[column].median()) for column, label in analysis.PATH_COLUMNS
                    if column in restoring and label not in ("ckpt load", "1st iter", "gaps", "verify")]
            path = sorted([(label, v) for label, v in path if pd.notna(v)], key=lambda p: -p[1])[:3]
            if path:
                text += "; the time goes to start-up: " + ", ".join(f"{label} {fmt_s(v)}" for label, v in path)
            text += "."
            if not floor.empty:
                base = floor.iloc[0]["restart_s"]
                text += (f" A relaunch that restores nothing (engine none) takes {fmt_s(base)}: the start-up floor "
                         "every restart pays.")
            if "warm" in caches:
                text += (" A warm cache means some of the checkpoint was in memory when the restore began, so reads "
                         "may have come from memory, not storage.")
            sentences.append(text)
        elif not floor.empty:
            sentences.append(f"Engine none relaunches without a checkpoint in {fmt_s(floor.iloc[0]['restart_s'])}: "
                             "the start-up floor every restart pays.")
        device = table.loc[(table[keys].astype(str) == list(values)).all(axis=1), "device"].dropna()
        where = " · ".join(values) + f" ({int(ranks)} ranks" + (f", {device.iloc[0]}" if not device.empty else "") + ")"
        out.append(f"{where}: " + " ".join(sentences))
    out.extend(_limit_findings(ckpt, rest, keys))
    if winners:
        counts = pd.Series(winners).value_counts()
        lead = counts.index[0]
        out.insert(0, f"Least training stall: {lead} in {counts.iloc[0]} of {len(winners)} configuration(s)"
                   + (f" (others: {', '.join(f'{e} {n}' for e, n in counts.iloc[1:].items())})." if len(counts) > 1
                      else "."))
    return out


def _whole_cost_sentences(ckpt: pd.DataFrame) -> list[str]:
    """Engines of one configuration whose background work cost training more than their stall, and the least whole
    cost where it is another engine than the least stall (``ckpt``: its checkpoint_summary rows, by stall)."""
    if "cost_s" not in ckpt:
        return []
    costly = [row for _, row in ckpt.iterrows() if pd.notna(row["slowdown_s"]) and row["slowdown_s"] > 0.005
              and row["slowdown_s"] > row["stall_s"]]
    out = []
    if costly:
        out.append("; ".join(f"{row['engine']}'s background work slows the {row['overlapped_iterations']:.0f} "
                             f"iteration(s) it overlaps by {fmt_s(row['slowdown_s'])}, so a checkpoint costs "
                             f"training {fmt_s(row['cost_s'])} in all"
                             + (f", {row['cost_s'] / row['stall_s']:.1f}× its" if row["stall_s"] > 0 else ", its")
                             + f" {fmt_s(row['stall_s'])} stall" for row in costly) + ".")
    cheapest = ckpt.dropna(subset=["cost_s"]).sort_values("cost_s", kind="stable")
    if not cheapest.empty and not ckpt.empty and cheapest.iloc[0]["engine"] != ckpt.iloc[0]["engine"]:
        best = cheapest.iloc[0]
        out.append(f"The least whole cost (stall + slowdown) is {best['engine']}'s: {fmt_s(best['cost_s'])} per "
                   "checkpoint.")
    return out


def _limit_findings(ckpt: pd.DataFrame, rest: pd.DataFrame, keys: list[str]) -> list[str]:
    """One sentence per configuration whose throughput went above 105 % of the storage's measured bandwidth."""
    out = []
    for summary, side, column, flag in ((ckpt, "wrote", "write_pct_of_storage", "write_limit"),
                                        (rest, "restored", "read_pct_of_storage", "read_limit")):
        if flag not in summary:
            continue
        for _, row in summary[summary[flag].fillna("").str.startswith(analysis.LIMIT_UNDERESTIMATED)].iterrows():
            where = " · ".join(str(row[k]) for k in keys) + f" · {row['engine']}"
            out.append(f"Limit underestimated: {where} {side} at {fmt_share(row[column])} of the storage's measured "
                       f"bandwidth (median; {row[flag].removeprefix(analysis.LIMIT_UNDERESTIMATED).strip(' ()')} "
                       "above 105 %): baseline.json measured the storage too low, so this ratio is no engine beating "
                       "the disk.")
    return out


# -- HTML report ------------------------------------------------------------------------------------------


@dataclass
class Outputs:
    out: Path
    tables: dict[str, Path] = field(default_factory=dict)
    figures: dict[str, dict[str, Path]] = field(default_factory=dict)
    report: Path | None = None


def write_outputs(collected: Collected, out: Path, *, title: str | None = None,
                  failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                  gpus: int | None = None) -> Outputs:
    """Tables (CSV and Parquet), figures (PNG and SVG) and report.html under ``out``; the goodput at
    ``failures_per_gpu_hour`` on ``gpus`` GPUs (None: each run's world size)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    outputs = Outputs(out)
    table, ranks, files = collected.table(), collected.rank_table(), collected.file_table()
    tables = {
        "study": table, "ranks": ranks, "files": analysis.file_statistics(files),
        "files_per_rank": analysis.files_per_rank(files), "file_inventory": files,
        "excluded": collected.excluded_table(),
        "goodput": analysis.goodput_table(table, failures_per_gpu_hour, gpus),
        "restart_spans": collected.span_table(), "restart_memory": collected.memory_table(),
    }
    for name, frame in tables.items():
        outputs.tables[f"{name}.csv"] = _write(frame, out / f"{name}.csv")
        if name in ("study", "ranks", "file_inventory"):
            outputs.tables[f"{name}.parquet"] = _write(frame, out / f"{name}.parquet")
    pngs = {}
    for name, fig in figures(collected, failures_per_gpu_hour, gpus).items():
        outputs.figures[name] = save_figure(fig, out / name)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        pngs[name] = base64.b64encode(buffer.getvalue()).decode("ascii")
        plt.close(fig)
    outputs.report = out / "report.html"
    outputs.report.write_text(render_html(collected, pngs, title=title, goodput_rows=tables["goodput"],
                                          assumptions=analysis.goodput_assumptions(failures_per_gpu_hour, gpus)))
    return outputs


def _write(frame: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        _parquet_safe(frame).to_parquet(path, index=False)
    return path


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding mixed Python types (None/bool, str/float) as Arrow can store them."""
    frame = frame.copy()
    # E721 does not apply: element-wise over the columns' dtypes (a boolean mask), not a type comparison
    for column in frame.columns[frame.dtypes == object]:  # noqa: E721
        values = frame[column].dropna()
        kinds = {type(v) for v in values}
        if kinds <= {bool}:
            frame[column] = frame[column].astype("boolean")
        elif kinds and not kinds <= {str}:
            frame[column] = frame[column].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v))
                                              else str(v))
    return frame


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#555} .findings li{margin:.35em 0} figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.92em;color:#333;margin:.3em 0 .8em} table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:right;white-space:nowrap} th{background:#f4f4f4}
.scroll{overflow-x:auto;max-width:100%}
td.l,th.l{text-align:left} .defs dt{font-weight:bold;margin-top:.5em} .defs dd{margin-left:1.2em}
.skipped{color:#8a6d00} .failed{color:#a00} details{margin:.6em 0} summary{cursor:pointer;color:#235}
code{background:#f4f4f4;padding:0 .2em;border-radius:3px}
"""


def render_html(collected: Collected, pngs: dict[str, str], *, title: str | None = None,
                goodput_rows: pd.DataFrame | None = None, assumptions: str = "") -> str:
    """The report; ``goodput_rows`` (``analysis.goodput_table``) and its ``assumptions`` line under the goodput
    figure."""
    table, ranks, files = collected.table(), collected.rank_table(), collected.file_table()
    esc = html.escape
    title = title or "restartbench: checkpoint stall and restart time"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    n_runs = table["run_id"].nunique() if not table.empty else 0
    excluded = collected.excluded_table()
    n_skipped = int((excluded["status"] == "skipped").sum()) if not excluded.empty else 0
    n_bad = len(excluded) - n_skipped
    parts.append(f"<p class='meta'>{n_runs} complete run(s) under <code>{esc(str(collected.root))}</code>; "
                 f"{n_skipped} skipped by design, {n_bad} failed, incomplete or unreadable (listed at the end). "
                 f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.</p>")
    if not table.empty:
        parts.append(_setup_html(table))
        items = findings(table)
        if items:
            parts.append("<h2>Findings</h2><ul class='findings'>" + "".join(_finding_html(t) for t in items)
                         + "</ul>")
    parts.append(_DEFINITIONS)
    for name, (heading, caption) in FIGURES.items():
        if name not in pngs:
            continue
        parts.append(f"<h2>{esc(heading)}</h2><figure><img alt='{esc(heading)}' "
                     f"src='data:image/png;base64,{pngs[name]}'><figcaption>{caption} "
                     f"(Also <code>{name}.svg</code> and <code>{name}.png</code> next to this report.)"
                     f"</figcaption></figure>")
        parts.append(_goodput_html(goodput_rows, assumptions) if name == "goodput"
                     else _figure_tables(name, collected, table, ranks, files))
    parts.append(_relayout_html(table))
    parts.append(_excluded_html(collected))
    if collected.warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{esc(w)}</li>" for w in collected.warnings) + "</ul>")
    glossary = "".join(f"<dt><code>{esc(k)}</code></dt><dd>{esc(v)}</dd>" for k, v in analysis.TABLE_COLUMNS.items())
    parts.append("<h2>Tables</h2><p>Everything above comes from <code>study.csv</code> / <code>study.parquet</code> "
                 "(one row per run × checkpoint or restart), <code>ranks.*</code> (the same per rank), "
                 "<code>files.csv</code>, <code>files_per_rank.csv</code>, <code>file_inventory.*</code>, "
                 "<code>restart_spans.csv</code> and <code>restart_memory.csv</code> (every restore's spans and "
                 "memory samples per rank, seconds from the relaunch) and <code>excluded.csv</code>, written next to "
                 "this report.</p>"
                 f"<details><summary>Columns of study.csv</summary><dl class='defs'>{glossary}</dl></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _goodput_html(rows: pd.DataFrame | None, assumptions: str) -> str:
    if rows is None or rows.empty:
        return ""
    view = _view(rows, GOODPUT_FORMATS)
    glossary = "".join(f"<dt><code>{html.escape(k)}</code></dt><dd>{html.escape(v)}</dd>"
                       for k, v in analysis.GOODPUT_COLUMNS.items())
    return (f"<p>{html.escape(assumptions)}.</p>" + _html_table(view)
            + _details("Columns of goodput.csv", f"<dl class='defs'>{glossary}</dl>"))


def _finding_html(text: str) -> str:
    head, sep, rest = text.partition(": ")
    return f"<li><b>{html.escape(head)}</b>{sep}{html.escape(rest)}</li>" if sep else f"<li>{html.escape(text)}</li>"


_DEFINITIONS = """
<h2>What is measured</h2><dl class='defs'>
<dt>Stall</dt><dd>The time <code>save</code> blocked training on a rank (the <code>checkpoint.save</code> span); a
checkpoint's stall is the <b>max over ranks</b>, since the slowest rank holds the others at the next collective.
This is what training actually waited.</dd>
<dt>Slowdown and whole cost</dt><dd>After an asynchronous engine's <code>save</code> returns, its copy and write go
on in the background until the rank's files are durable, and slow the iterations they overlap. A checkpoint's
<b>slowdown</b> is the sum, over those iterations, of their time (max over ranks) beyond the clean median iteration
(the iterations that overlapped no save's work); its <b>whole cost</b> is the stall plus the slowdown, and is the C
of the goodput. A synchronous engine's slowdown is 0: the harness waits for durability before the next
iteration.</dd>
<dt>Durable</dt><dd>From the start of the save until that rank's files were on stable storage (fsync'd; for an
asynchronous engine, when its background write finished); the <b>max over ranks</b>. Until then a crash can lose the
checkpoint.</dd>
<dt>Committed</dt><dd>When rank 0 wrote <code>latest</code>, after every rank was durable: from then on a restart
uses this checkpoint.</dd>
<dt>Restart</dt><dd>The <b>max over ranks</b> of launch → end of the first resumed iteration, with each part
(launch, imports, distributed init, model build, <code>deepspeed.initialize</code>, checkpoint load, first iteration)
also its max over ranks in the tables. The figure stacks the parts of the critical rank (the last one ready to train),
which add up to the total.</dd>
<dt>Page cache</dt><dd>The <code>cache</code> field of the restore, measured (<code>mincore</code>) on every node
just before the load: <i>cold</i> means no byte of the checkpoint was in memory, so every read came from the storage;
<i>warm</i> means some bytes were (<code>resident_fraction</code> says how much): either \
<code>--restore-cache warm</code>
was asked for, or the storage keeps files in memory (tmpfs, /dev/shm) and eviction could not take them out.</dd>
<dt>Throughput</dt><dd>All ranks' bytes of a checkpoint over its durable time (write), bytes read over the load time
(restore); MB = 10<sup>6</sup> bytes.</dd>
<dt>Per-rank spread</dt><dd>Kept, not averaged away: dots in the stall figure, the spread columns below and
<code>ranks.csv</code>.</dd></dl>
"""


def _setup_html(table: pd.DataFrame) -> str:
    cols = [c for c in ("device", "backend", "gpu", "host", "storage", "dtype", "torch", "deepspeed", "python")
            if c in table.columns]
    setups = table.groupby(cols, dropna=False)["run_id"].nunique().rename("runs").reset_index()
    setups = setups.dropna(axis=1, how="all")
    configs = table.groupby(["preset", "layout"], dropna=False).agg(
        ranks=("ranks", "max"), engines=("engine", lambda s: ", ".join(analysis.engine_order(s.unique()))),
        runs=("run_id", "nunique")).reset_index()
    return ("<h2>Setup</h2><p>Device, software and storage of the runs:</p>" + _html_table(setups)
            + "<p>Configurations measured:</p>" + _html_table(configs))


def _figure_tables(name: str, collected: Collected, table: pd.DataFrame, ranks: pd.DataFrame,
                   files: pd.DataFrame) -> str:
    if table.empty:
        return ""
    if name == "checkpoint_cost":
        summary = analysis.checkpoint_summary(table)
        view = _view(summary, {"runs": None, "checkpoints": None, "ranks": None, "stall_s": fmt_s,
                               "slowdown_s": fmt_s, "cost_s": fmt_s, "overlapped_iterations": "{:.0f}",
                               "seen_checkpoints": "{:.0f}",
                               "stall_rank_spread_s": fmt_s, "durable_s": fmt_s, "durable_rank_spread_s": fmt_s,
                               "committed_s": fmt_s, "iteration_s": fmt_s, "stall_overhead_pct": "{:.1f}%",
                               "bytes": fmt_bytes, "files": "{:.0f}", "write_MBps": fmt_rate,
                               "write_pct_of_storage": fmt_share, "write_limit": None})
        spread = analysis.rank_spread(ranks)
        spread = spread[spread["kind"] == "checkpoint"] if not spread.empty else spread
        detail = _view(spread.head(300), {"run_id": None, "tag": None, "stall_s_min": fmt_s, "stall_s_max": fmt_s,
                                          "stall_s_slowest_rank": None, "durable_s_min": fmt_s,
                                          "durable_s_max": fmt_s, "durable_s_slowest_rank": None,
                                          "bytes_min": fmt_bytes, "bytes_max": fmt_bytes, "files_min": None,
                                          "files_max": None}, keys=["preset", "layout", "engine"])
        view = view.rename(columns={"cost_s": "whole cost"})
        return ("<p>Per configuration (medians; <i>whole cost</i> = stall + slowdown, over the <i>seen "
                "checkpoints</i>: those whose background work ended while training ran; <i>iteration</i> = the clean "
                "median, iterations that overlapped no save's work; <i>rank spread</i> = slowest − fastest rank of a "
                "checkpoint; <i>overhead</i> = stall / (save interval × iteration time + stall)):</p>"
                + _html_table(view)
                + _details(f"Per-rank spread of every checkpoint ({len(spread)} rows"
                           + (", first 300" if len(spread) > 300 else "") + ")", _html_table(detail)))
    if name == "restart_phases":
        summary = analysis.restart_summary(table)
        fmt = {"runs": None, "restart_s": fmt_s, "rank_spread_s": fmt_s,
               **{column: fmt_s for column, _ in RESTART_PART_COLUMNS}, "bytes_read": fmt_bytes,
               "read_MBps": fmt_rate, "read_pct_of_storage": fmt_share, "read_limit": None, "cache": None,
               "exact": None}
        view = _view(summary, fmt).rename(columns={c: label for c, label in RESTART_PART_COLUMNS})
        stages = analysis.ds_init_summary(table, column="path_ds_init_parts")
        stage_view = _view(stages, {c: fmt_s for c in stages.columns if c not in analysis.group_keys(table)})
        return ("<p>Per configuration (medians over runs; each part max over ranks):</p>" + _html_table(view)
                + _details(f"deepspeed.initialize in its stages, the critical rank's (the strip; {len(stages)} rows)",
                           _html_table(stage_view)))
    if name == "restart_memory":
        drawn = analysis.typical_restarts(table)
        view = _view(drawn, {"run_id": None, "attempt": "{:.0f}", "cache": None, "restart_s": fmt_s,
                             "restore_peak_rss_bytes": fmt_bytes, "peak_rss_part": None,
                             "train_peak_rss_bytes": fmt_bytes, "resume_spike": "{:.2f}×"},
                     keys=analysis.group_keys(table))
        return ("<p>The restarts drawn (per-rank samples in <code>restart_memory.csv</code>, each part's span and "
                "peak in <code>restart_spans.csv</code>):</p>" + _html_table(view))
    if name == "files_per_rank":
        summary = analysis.file_summary(files)
        view = _view(summary, {"kind": None, "files_per_checkpoint": "{:.0f}", "files_per_rank_max": None,
                               "min_bytes": fmt_bytes, "median_bytes": fmt_bytes, "max_bytes": fmt_bytes,
                               "bytes_per_checkpoint": fmt_bytes}, keys=["preset", "layout", "engine"])
        overall = view[view["kind"] == "all"].drop(columns="kind")
        return ("<p>Files per checkpoint, the most on one rank, and the file-size distribution (min / median / max):"
                "</p>" + _html_table(overall)
                + _details(f"The same per file kind: layer, model, optimizer, other ({len(view)} rows)",
                           _html_table(view)))
    if name == "throughput":
        baselines = table.dropna(subset=["baseline_tool"]) if "baseline_tool" in table else table.iloc[0:0]
        if baselines.empty:
            return ("<p><b>No baseline measured</b>: no <code>baseline.json</code> in any run folder or its parents. "
                    "Write one with the storage's fio result, e.g. <code>{\"tool\": \"fio\", \"write_MBps\": 1830, "
                    "\"read_MBps\": 2950, \"target\": \"/path\", \"block_size\": \"1M\", \"jobs\": 8, "
                    "\"direct\": true}</code>.</p>")
        view = baselines.groupby(["storage", "baseline_tool"], dropna=False).agg(
            write=("baseline_write_MBps", "median"), read=("baseline_read_MBps", "median"),
            runs=("run_id", "nunique")).reset_index()
        return "<p>Storage baselines used:</p>" + _html_table(_view(view, {"write": fmt_rate, "read": fmt_rate,
                                                                              "runs": None}, keys=["storage",
                                                                                                   "baseline_tool"]))
    if name == "checkpoint_size":
        size = analysis.size_check(table, files)
        fmt = {"params": "{:.0f}", "predicted_bytes": fmt_bytes, "measured_bytes": fmt_bytes,
               "measured_vs_predicted": "×{:.3f}", "predicted_weights_bytes": fmt_bytes,
               "measured_weights_bytes": fmt_bytes, "predicted_optimizer_bytes": fmt_bytes,
               "measured_optimizer_bytes": fmt_bytes, "measured_other_bytes": fmt_bytes}
        return _html_table(_view(size, fmt, keys=["preset", "layout", "dtype", "engine"]))
    return ""


def _view(frame: pd.DataFrame, formats: dict[str, Any], keys: list[str] | None = None) -> pd.DataFrame:
    """The key columns and the listed ones, formatted as text."""
    if frame.empty:
        return frame
    keys = keys if keys is not None else [k for k in frame.columns if k in ("preset", "layout", *analysis.SETUP_KEYS,
                                                                           "engine")]
    columns = [*keys, *[c for c in formats if c in frame.columns and c not in keys]]
    view = frame[columns].copy()
    for column, how in formats.items():
        if column not in view or how is None:
            continue
        if callable(how):
            view[column] = view[column].map(how)
        else:
            view[column] = view[column].map(lambda v, h=how: "—" if pd.isna(v) else h.format(v))
    return view


DISPLAY_NAMES = {
    "stall_s": "stall", "slowdown_s": "slowdown", "seen_checkpoints": "seen checkpoints",
    "stall_rank_spread_s": "stall rank spread", "durable_s": "durable",
    "durable_rank_spread_s": "durable rank spread", "committed_s": "committed", "iteration_s": "iteration",
    "stall_overhead_pct": "stall overhead", "write_MBps": "write", "write_pct_of_storage": "write / storage",
    "read_pct_of_storage": "read / storage", "restart_s": "restart", "write_limit": "write limit check",
    "read_limit": "read limit check", "cost_s": "C", "cost_basis": "C is", "mtbf_s": "MTBF",
    "interval_s": "τ*", "interval_iterations": "τ* (iterations)", "checkpoint_pct": "lost: checkpoints",
    "rework_pct": "lost: re-done work", "restart_pct": "lost: restarts", "goodput_pct": "goodput",
    "rank_spread_s": "rank spread", "read_MBps": "read", "files_per_checkpoint": "files / ckpt",
    "files_per_rank_max": "most files on a rank", "min_bytes": "min size", "median_bytes": "median size",
    "max_bytes": "max size", "bytes_per_checkpoint": "bytes / ckpt", "predicted_bytes": "predicted",
    "measured_bytes": "measured", "measured_vs_predicted": "measured / predicted",
    "predicted_weights_bytes": "predicted weights", "measured_weights_bytes": "measured weights",
    "predicted_optimizer_bytes": "predicted optimizer", "measured_optimizer_bytes": "measured optimizer",
    "measured_other_bytes": "measured other", "stall_s_min": "stall min", "stall_s_max": "stall max",
    "stall_s_slowest_rank": "slowest (stall)", "durable_s_min": "durable min", "durable_s_max": "durable max",
    "durable_s_slowest_rank": "slowest (durable)", "bytes_min": "bytes min", "bytes_max": "bytes max",
    "files_min": "files min", "files_max": "files max", "baseline_tool": "tool",
    "restore_peak_rss_bytes": "restart peak", "peak_rss_part": "peak in", "train_peak_rss_bytes": "training peak",
    "resume_spike": "restart / training peak", "parts_sum_s": "sum",
}


def _relayout_html(table: pd.DataFrame) -> str:
    """Restarts on another layout beside the same layout's, per engine (empty where none was measured)."""
    summary = analysis.relayout_summary(table)
    if summary.empty or (summary["restore_layout"] == summary["layout"]).all():
        return ""
    return ("<h2>Restarts on another layout</h2><p>Per engine, the layout phase 1 saved on (<code>layout</code>) and "
            "the one restarted on (<code>restore_layout</code>; the run's own is the comparison): medians over "
            "attempts of the restart and its parts, max over ranks. <code>restart_convert_s</code> is the engine's "
            "offline conversion (DeepSpeed's <code>ds_to_universal.py</code>, run by rank 0 while the others wait) "
            "with what it read and wrote; a load after it reads what it has just written (page cache), where an "
            "engine that reshards at load reads the checkpoint as written. Exactness is on the consolidated state "
            "(every parameter's fp32 weights and Adam moments at full shape): see <code>verdicts</code>; "
            "<code>loss_diff</code> is iteration K+1's loss less the uninterrupted run's (the reduction order "
            "changes with tp and dp). A skipped restart says why the engine cannot make it.</p>"
            + _html_table(summary))


def _html_table(frame: pd.DataFrame) -> str:
    if frame is None or frame.empty:
        return "<p><i>(none)</i></p>"
    head = "".join(f"<th class='{'l' if _is_text(frame[c]) else ''}'>"
                   f"{html.escape(DISPLAY_NAMES.get(str(c), str(c).replace('_', ' ')))}</th>" for c in frame.columns)
    rows = []
    for values in frame.itertuples(index=False):
        cells = "".join(f"<td class='{'l' if _is_text(frame[c]) else ''}'>{html.escape(_cell(v))}</td>"
                        for c, v in zip(frame.columns, values))
        rows.append(f"<tr>{cells}</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def _is_text(series: pd.Series) -> bool:
    values = series.dropna()
    return (not values.empty and isinstance(values.iloc[0], str)
            and not any(ch.isdigit() for ch in str(values.iloc[0])[:1]))


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def _excluded_html(collected: Collected) -> str:
    excluded = collected.excluded_table()
    if excluded.empty:
        return "<h2>Runs left out</h2><p>None: every run folder found was complete and readable.</p>"
    skipped = excluded[excluded["status"] == "skipped"]
    bad = excluded[excluded["status"] != "skipped"]
    out = ["<h2>Runs left out</h2>"]
    if not skipped.empty:
        out.append("<h3 class='skipped'>Skipped by design</h3><p>These runs were not executed, e.g. an optional engine "
                   "whose package is not installed; they are not failures.</p>"
                   + _html_table(skipped[["run_id", "preset", "layout", "engine", "reason"]]))
    if not bad.empty:
        out.append("<h3 class='failed'>Failed, incomplete or unreadable</h3>"
                   + _html_table(bad[["run_id", "status", "preset", "layout", "engine", "reason"]]))
    return "".join(out)

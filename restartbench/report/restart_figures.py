"""The restart section's figure: the restart's critical path as stacked parts per engine, the total marked, engine
none as the start-up floor, and beneath the ds init part ``deepspeed.initialize``'s own stages
(``plot_restart_phases``)."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from restartbench import analysis
from restartbench.report.style import (
    DARK_PARTS,
    HEADER_IN,
    MAX_ROWS,
    PART_COLORS,
    config_label,
    empty_figure,
    figure_header,
    fmt_s,
    rows_of,
)

#: Parts drawn hatched: the harness's own checks (not what a training job's restart costs) and the gaps.
UNPAINTED = (*analysis.HARNESS_PARTS, "gaps")


def plot_restart_phases(table: pd.DataFrame) -> Figure:
    """Per preset/layout and engine: the restart's critical path as stacked bars (the parts of the last rank ready to
    train, median over runs), the total (max over ranks) as a marker, and beneath the ds init part its stages
    (``analysis.ds_init_summary`` of the critical rank), collective waits hatched; engine none (nothing restored) is
    the start-up floor."""
    restarts = table[table["kind"] == "restart"] if not table.empty else table
    if restarts.empty:
        return empty_figure("No restarts measured.")
    summary = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    stages = _ds_init_stages(table, summary)
    facets = [f if isinstance(f, tuple) else (f,) for f in summary.groupby(keys, dropna=False, sort=False).groups]
    shown = _facets_that_fit(summary, keys, facets)
    path_columns = [(c, label) for c, label in analysis.PATH_COLUMNS if c in summary]
    names = list(dict.fromkeys(name for row_stages in stages for name in row_stages))
    ncol, header = _legend_layout(len(path_columns) + 1 + len(names))  # parts, total, stages
    fig, axes = _facet_axes(summary, keys, shown, header, strips=bool(names))
    xmax = _x_extent(summary, path_columns)
    for ax, values in zip(axes[:, 0], shown):
        rows = rows_of(summary, keys, values)
        _draw_facet(ax, rows, [stages[i] for i in rows.index], path_columns, keys, xmax, strips=bool(names))
    axes[-1, 0].set_xlabel("seconds from the relaunch (medians over runs)")
    more = f"; {len(facets) - len(shown)} more configurations in the tables" if len(facets) > len(shown) else ""
    strip = "; under ds init: its stages" if names else ""
    figure_header(fig, "Where restart time goes: relaunch → end of the first resumed iteration",
                  "the parts of the last rank ready to train (all ranks wait for it); orange: reading the checkpoint, "
                  f"blue: start-up, hatched grey: the harness's own checks and the gaps{strip}{more}",
                  _legend_handles(path_columns, names), ncol, 7.5, header)
    return fig


def _facets_that_fit(summary: pd.DataFrame, keys: list[str], facets: list[tuple]) -> list[tuple]:
    """The first facets (configurations) whose rows add up to at most ``MAX_ROWS`` bars, at least one; the rest are
    left to the tables."""
    shown, total_rows = [], 0
    for f in facets:
        n = len(rows_of(summary, keys, f))
        if total_rows + n > MAX_ROWS and shown:
            break
        shown.append(f)
        total_rows += n
    return shown


def _legend_layout(entries: int) -> tuple[int, float]:
    """The legend's columns (one row up to 11 entries, else three rows) and the header's height in inches, taller
    for a third row."""
    ncol = entries if entries <= 11 else math.ceil(entries / 3)
    return ncol, HEADER_IN + 0.2 * max(0, math.ceil(entries / ncol) - 2)


def _facet_axes(summary: pd.DataFrame, keys: list[str], shown: list[tuple], header: float,
                strips: bool) -> tuple[Figure, np.ndarray]:
    """One axes per facet, stacked, each as tall as its bars (taller with the ds init ``strips`` beneath them)."""
    row_height = 0.75 if strips else 0.55
    heights = [row_height * len(rows_of(summary, keys, f)) + 0.75 for f in shown]
    return plt.subplots(len(shown), 1, figsize=(11, sum(heights) + 0.5 + header), squeeze=False,
                        gridspec_kw={"height_ratios": heights})


def _x_extent(summary: pd.DataFrame, path_columns: list[tuple[str, str]]) -> float:
    """The longest bar or total of any facet, so that every facet shares one scale (at least 1 ms)."""
    sums = summary[[c for c, _ in path_columns]].fillna(0).sum(axis=1) if path_columns else summary["restart_s"]
    return float(np.nanmax([*summary["restart_s"].to_numpy(dtype=float), *sums.to_numpy(dtype=float), 1e-3]))


def _draw_facet(ax, rows: pd.DataFrame, row_stages: list[dict[str, float]], path_columns: list[tuple[str, str]],
                keys: list[str], xmax: float, strips: bool) -> None:
    """One configuration's engines, a bar each from the top, labelled with its load and cache, and engine none's
    total as the start-up floor across them."""
    part = rows.reset_index(drop=True)
    y = np.arange(len(part))[::-1]
    for yi, (_, row), stages in zip(y, part.iterrows(), row_stages):
        _draw_restart(ax, yi, row, stages, path_columns, xmax)
    ax.set_yticks(y, [_engine_label(row) for _, row in part.iterrows()], fontsize=8.5)
    floor = part.loc[~part["restores_checkpoint"].astype(bool), "restart_s"]
    if not floor.empty and pd.notna(floor.iloc[0]):
        ax.axvline(floor.iloc[0], color="black", ls="--", lw=0.9)
        ax.text(floor.iloc[0], len(part) - 0.45, " start-up floor (engine none)", fontsize=7.5, va="bottom")
    ax.set_xlim(0, xmax * 1.12)
    ax.set_ylim(-0.75 if strips else -0.6, len(part) - 0.2)
    ax.set_title(f"{config_label(part.iloc[0], keys)} · {part.iloc[0]['ranks']} ranks", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _draw_restart(ax, yi: float, row: pd.Series, stages: dict[str, float], path_columns: list[tuple[str, str]],
                  xmax: float) -> None:
    """One restart at height ``yi``: its parts stacked from the left (the ds init part with its stages beneath),
    then its total as a marker with its value."""
    left = 0.0
    for column, label in path_columns:
        width = row[column]
        if width is None or pd.isna(width) or width <= 0:
            continue
        _draw_part(ax, yi, left, width, label, xmax)
        if label == "ds init" and stages:
            _ds_init_strip(ax, yi, left, width, stages, xmax)
        left += width
    if pd.notna(row["restart_s"]):
        ax.plot([row["restart_s"]], [yi], marker="D", color="black", markersize=5, zorder=4)
        ax.annotate(fmt_s(row["restart_s"]), (max(left, row["restart_s"]), yi), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8.5, fontweight="bold")


def _draw_part(ax, yi: float, left: float, width: float, label: str, xmax: float) -> None:
    """One part of a restart's bar, its gid ``part:<label>``, labelled inside where it is wide enough."""
    bar = ax.barh(yi, width, left=left, color=PART_COLORS.get(label, "#bbbbbb"), height=0.62, edgecolor="white",
                  linewidth=0.6, hatch="xx" if label in UNPAINTED else None)
    bar.patches[0].set_gid(f"part:{label}")
    if width >= 0.07 * xmax:
        ax.text(left + width / 2, yi, f"{label}\n{fmt_s(width)}", ha="center", va="center", fontsize=7,
                color="white" if label in DARK_PARTS else "black")


def _engine_label(row: pd.Series) -> str:
    """A bar's tick label: the engine with its load and page cache, or engine none as the floor."""
    if not row["restores_checkpoint"]:
        return f"{row['engine']}: start-up floor\n(nothing restored)"
    return f"{row['engine']}\nckpt load {fmt_s(row['restart_ckpt_load_s'])}, {row['cache'] or '?'} cache"


def _legend_handles(path_columns: list[tuple[str, str]], names: list[str]) -> list:
    """The parts as drawn, the total's marker, then the ds init stages (``names``, in the strips' order)."""
    handles = [Patch(facecolor=PART_COLORS[label], hatch="xx" if label in UNPAINTED else None,
                     edgecolor="white", label=label) for _, label in path_columns]
    handles.append(plt.Line2D([], [], marker="D", ls="", color="black", label="total"))
    handles.extend(Patch(label=STAGE_LABELS.get(name, name), **_stage_style(name, names.index(name)))
                   for name in names)
    return handles


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

"""How the report writes and draws: numbers for people (seconds, durations, bytes, rates, shares), the colours of
engines, file kinds and restart parts, and the figure scaffolding every figure shares (facets, grids, the header
above the axes, the figure that says there is nothing to draw)."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from restartbench import analysis
from restartbench.engines import engine_names

MAX_FACETS = 24
MAX_ROWS = 60
KIND_COLORS = {"layer": "#4C72B0", "model": "#8172B3", "optimizer": "#DD8452", "other": "#999999"}
PART_COLORS = {  # start-up parts in blues, the checkpoint read stands out (an offline conversion before it too),
    # the harness's own checks and the gaps in greys
    "launch": "#c6dbef", "imports": "#9ecae1", "dist init": "#6baed6", "model build": "#4292c6",
    "ds init": "#2171b5", "engine setup": "#08519c", "convert": "#fdae6b", "ckpt load": "#e6550d",
    "check files": "#969696", "cache": "#a6a6a6", "verify": "#bdbdbd", "gaps": "#e0e0e0",
    "1st iter": "#31a354",
}
DARK_PARTS = ("model build", "ds init", "engine setup", "ckpt load", "1st iter")
_TAB = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
        "#393b79", "#637939", "#843c39")  # tab10 without its grey (grey marks "predicted"/neutral in the legends)


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


def config_label(row: pd.Series | dict, keys: list[str]) -> str:
    return " · ".join(str(row[k]) for k in keys if k != "engine")


def facets_of(table: pd.DataFrame) -> tuple[list[str], list[tuple]]:
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    values = list(table.groupby(keys, dropna=False).groups) if not table.empty else []
    values = [v if isinstance(v, tuple) else (v,) for v in values]
    return keys, values


def rows_of(table: pd.DataFrame, keys: list[str], values: tuple) -> pd.DataFrame:
    mask = pd.Series(True, index=table.index)
    for key, value in zip(keys, values):
        mask &= table[key].isna() if (isinstance(value, float) and math.isnan(value)) else table[key] == value
    return table[mask]


def figure_grid(n: int, ncols: int, width: float, height: float, **kwargs) -> tuple[Figure, list]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + HEADER_IN), squeeze=False, **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def empty_figure(message: str) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True)
    return fig


HEADER_IN = 1.0  # inches above the axes for the title, subtitle and legend


def figure_header(fig: Figure, title: str, subtitle: str, handles: list, ncol: int, fontsize: float = 8.5,
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


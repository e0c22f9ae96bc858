"""The checkpoint files' figures: bytes and files each rank wrote, by file kind (``plot_files_per_rank``), and the
predicted checkpoint size against the measured one (``plot_size_check``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from restartbench import analysis
from restartbench.analysis import MB
from restartbench.report.style import HEADER_IN, KIND_COLORS, MAX_FACETS, empty_figure, figure_grid, figure_header


def plot_files_per_rank(files: pd.DataFrame, table: pd.DataFrame | None = None) -> Figure:
    """For the last checkpoint of the latest run of each preset/layout/engine: bytes written per rank, by file kind,
    with the number of files on top."""
    per_rank = analysis.files_per_rank(files)
    if per_rank.empty:
        return empty_figure("No checkpoint files recorded (inventory.json).")
    latest = (per_rank.sort_values(["run_id", "tag"]).groupby(["preset", "layout", "engine"], sort=False)
              .tail(1)[["preset", "layout", "engine", "run_id", "tag"]])
    latest = analysis.sort_rows(latest, ["preset", "layout", "engine"])
    shown = latest.head(MAX_FACETS)
    max_ranks = int(per_rank["rank"].nunique()) or 1
    fig, axes = figure_grid(len(shown), 4, max(3.2, 0.45 * max_ranks + 1.6), 3.0, sharey=False)
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
    figure_header(fig, "Files and bytes per rank (last checkpoint of the latest run)",
            f"bytes each rank wrote, by file kind; number of files on top{more}", handles, 4)
    return fig


def _size_bars(ax, size: pd.DataFrame, x: np.ndarray) -> None:
    """Each configuration's predicted (hatched, left) and measured (right) bytes, stacked by weights, optimizer and
    other files where the file kinds tell, else whole."""
    if not {"measured_weights_bytes", "measured_optimizer_bytes"} <= set(size.columns):
        ax.bar(x - 0.2, size["predicted_bytes"] / MB, 0.38, color="#777777", alpha=0.4, hatch="///")
        ax.bar(x + 0.2, size["measured_bytes"] / MB, 0.38, color="#777777")
        return
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


def plot_size_check(size: pd.DataFrame) -> Figure:
    """Predicted checkpoint bytes (P·(w + 12)) against measured, per preset/layout/engine, split into weights and
    optimizer state where the file kinds tell."""
    if size.empty:
        return empty_figure("No checkpoints measured: nothing to compare with the estimate.")
    size = size.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(7.5, 1.3 * len(size) + 2), 3.6 + HEADER_IN))
    x = np.arange(len(size))
    _size_bars(ax, size, x)
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
    figure_header(fig, "Predicted checkpoint size against measured",
            "predicted: P·(weight bytes + 12); measured: all ranks' files of one checkpoint; ×: measured / predicted",
            handles, 4, 8)
    return fig

"""Figures and the self-contained HTML report, built from the tables of ``restartbench.analysis``.

Every figure function takes the tables (``Collected.table()``, ``rank_table()``, ``file_table()``, ``span_table()``,
``memory_table()``)
and returns a matplotlib Figure, so that ``analysis/summarize.py``, the report and the notebooks
draw the same thing. ``write_outputs(collected, out)`` writes the tables, every figure (PNG and
SVG) and ``report.html`` (figures inlined as PNG, no external file needed).

The package, by concern: ``style`` (formatting, colours, the figures' scaffolding), one module per section's figures
(``checkpoint_figures``, ``restart_figures``, ``memory_figure``, ``file_figures``, ``goodput_figure``),
``findings`` (the sentences at the top), and the page: ``captions``, ``html_tables`` and ``page``. Every public name
is importable from ``restartbench.report``.
"""

from __future__ import annotations

from restartbench.report.captions import DEFINITIONS, FIGURES
from restartbench.report.checkpoint_figures import COST_BARS, plot_checkpoint_cost, plot_throughput
from restartbench.report.file_figures import plot_files_per_rank, plot_size_check
from restartbench.report.findings import findings
from restartbench.report.goodput_figure import GOODPUT_FORMATS, plot_goodput
from restartbench.report.html_tables import DISPLAY_NAMES
from restartbench.report.memory_figure import plot_restart_memory
from restartbench.report.page import Outputs, figures, render_html, save_figure, write_outputs
from restartbench.report.restart_figures import STAGE_COLORS, STAGE_LABELS, plot_restart_phases
from restartbench.report.style import (
    HEADER_IN,
    KIND_COLORS,
    MAX_FACETS,
    MAX_ROWS,
    PART_COLORS,
    engine_colors,
    fmt_bytes,
    fmt_duration,
    fmt_rate,
    fmt_s,
    fmt_share,
)

__all__ = [
    "COST_BARS", "DEFINITIONS", "DISPLAY_NAMES", "FIGURES", "GOODPUT_FORMATS", "HEADER_IN", "KIND_COLORS",
    "MAX_FACETS", "MAX_ROWS", "PART_COLORS", "STAGE_COLORS", "STAGE_LABELS", "Outputs", "engine_colors", "figures",
    "findings", "fmt_bytes", "fmt_duration", "fmt_rate", "fmt_s", "fmt_share", "plot_checkpoint_cost",
    "plot_files_per_rank", "plot_goodput", "plot_restart_memory", "plot_restart_phases", "plot_size_check",
    "plot_throughput", "render_html", "save_figure", "write_outputs",
]

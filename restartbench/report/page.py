"""The page: every figure of the report (``figures``), the tables, figures and ``report.html`` written to a folder
(``write_outputs``), and the self-contained HTML page itself (``render_html``, figures inlined as PNG)."""

from __future__ import annotations

import base64
import html
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from restartbench import analysis, goodput
from restartbench.analysis import Collected
from restartbench.report.captions import DEFINITIONS, FIGURES
from restartbench.report.checkpoint_figures import plot_checkpoint_cost, plot_throughput
from restartbench.report.file_figures import plot_files_per_rank, plot_size_check
from restartbench.report.findings import findings
from restartbench.report.goodput_figure import plot_goodput
from restartbench.report.html_tables import excluded_html, figure_tables, goodput_html, relayout_html, setup_html
from restartbench.report.memory_figure import plot_restart_memory
from restartbench.report.restart_figures import plot_restart_phases


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


CSS = """
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
             f"<style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>", counts_html(collected, table)]
    if not table.empty:
        parts.append(setup_html(table))
        items = findings(table)
        if items:
            parts.append("<h2>Findings</h2><ul class='findings'>" + "".join(finding_html(t) for t in items)
                         + "</ul>")
    parts.append(DEFINITIONS)
    for name, (heading, caption) in FIGURES.items():
        if name not in pngs:
            continue
        parts.append(f"<h2>{esc(heading)}</h2><figure><img alt='{esc(heading)}' "
                     f"src='data:image/png;base64,{pngs[name]}'><figcaption>{caption} "
                     f"(Also <code>{name}.svg</code> and <code>{name}.png</code> next to this report.)"
                     f"</figcaption></figure>")
        parts.append(goodput_html(goodput_rows, assumptions) if name == "goodput"
                     else figure_tables(name, table, ranks, files))
    parts.append(relayout_html(table))
    parts.append(excluded_html(collected))
    if collected.warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{esc(w)}</li>" for w in collected.warnings) + "</ul>")
    parts += [tables_html(), "</body></html>"]
    return "\n".join(parts)


def counts_html(collected: Collected, table: pd.DataFrame) -> str:
    """How many runs the report holds, and how many it leaves out (skipped by design, or failed)."""
    n_runs = table["run_id"].nunique() if not table.empty else 0
    excluded = collected.excluded_table()
    n_skipped = int((excluded["status"] == "skipped").sum()) if not excluded.empty else 0
    n_bad = len(excluded) - n_skipped
    return (f"<p class='meta'>{n_runs} complete run(s) under <code>{html.escape(str(collected.root))}</code>; "
            f"{n_skipped} skipped by design, {n_bad} failed, incomplete or unreadable (listed at the end). "
            f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.</p>")


def tables_html() -> str:
    """The files the report's figures come from, and the columns of study.csv."""
    esc = html.escape
    glossary = "".join(f"<dt><code>{esc(k)}</code></dt><dd>{esc(v)}</dd>" for k, v in analysis.TABLE_COLUMNS.items())
    return ("<h2>Tables</h2><p>Everything above comes from <code>study.csv</code> / <code>study.parquet</code> "
            "(one row per run × checkpoint or restart), <code>ranks.*</code> (the same per rank), "
            "<code>files.csv</code>, <code>files_per_rank.csv</code>, <code>file_inventory.*</code>, "
            "<code>restart_spans.csv</code> and <code>restart_memory.csv</code> (every restore's spans and "
            "memory samples per rank, seconds from the relaunch) and <code>excluded.csv</code>, written next to "
            "this report.</p>"
            f"<details><summary>Columns of study.csv</summary><dl class='defs'>{glossary}</dl></details>")


def finding_html(text: str) -> str:
    head, sep, rest = text.partition(": ")
    return f"<li><b>{html.escape(head)}</b>{sep}{html.escape(rest)}</li>" if sep else f"<li>{html.escape(text)}</li>"

"""The report's tables in HTML: the tables under each figure (``figure_tables``), the setup, the goodput, the
restarts on another layout and the runs left out, and how a table is formatted (``view_of``, ``html_table``)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from restartbench import analysis
from restartbench.analysis import RESTART_PART_COLUMNS, Collected
from restartbench.analysis.baselines import limit_summary
from restartbench.report.goodput_figure import GOODPUT_FORMATS
from restartbench.report.style import fmt_bytes, fmt_rate, fmt_s, fmt_share


def figure_tables(name: str, table: pd.DataFrame, ranks: pd.DataFrame, files: pd.DataFrame) -> str:
    """The tables under figure ``name`` (``ranks``: the per-rank table, ``files``: the file table); empty for a figure
    without tables of its own, or where no run was collected."""
    tables = _FIGURE_TABLES.get(name)
    return "" if table.empty or tables is None else tables(table, ranks, files)


#: How each table's columns are shown (None: as they are), by the figure it stands under.
_CHECKPOINT_FORMATS = {"runs": None, "checkpoints": None, "ranks": None, "stall_s": fmt_s, "slowdown_s": fmt_s,
                       "cost_s": fmt_s, "overlapped_iterations": "{:.0f}", "seen_checkpoints": "{:.0f}",
                       "stall_rank_spread_s": fmt_s, "durable_s": fmt_s, "durable_rank_spread_s": fmt_s,
                       "committed_s": fmt_s, "iteration_s": fmt_s, "stall_overhead_pct": "{:.1f}%",
                       "bytes": fmt_bytes, "files": "{:.0f}", "write_MBps": fmt_rate, "write_pct_of_storage": fmt_share,
                       "write_limit": None}
_RANK_SPREAD_FORMATS = {"run_id": None, "tag": None, "stall_s_min": fmt_s, "stall_s_max": fmt_s,
                        "stall_s_slowest_rank": None, "durable_s_min": fmt_s, "durable_s_max": fmt_s,
                        "durable_s_slowest_rank": None, "bytes_min": fmt_bytes, "bytes_max": fmt_bytes,
                        "files_min": None, "files_max": None}
_RESTART_FORMATS = {"runs": None, "restart_s": fmt_s, "restart_less_checks_s": fmt_s, "rank_spread_s": fmt_s,
                    **{column: fmt_s for column, _ in RESTART_PART_COLUMNS}, "bytes_read": fmt_bytes,
                    "read_MBps": fmt_rate, "read_pct_of_storage": fmt_share, "read_limit": None, "cache": None,
                    "exact": None}
_RESTART_MEMORY_FORMATS = {"run_id": None, "attempt": "{:.0f}", "cache": None, "restart_s": fmt_s,
                           "restore_peak_rss_bytes": fmt_bytes, "peak_rss_part": None,
                           "train_peak_rss_bytes": fmt_bytes, "resume_spike": "{:.2f}×"}
_FILE_FORMATS = {"kind": None, "files_per_checkpoint": "{:.0f}", "files_per_rank_max": None, "min_bytes": fmt_bytes,
                 "median_bytes": fmt_bytes, "max_bytes": fmt_bytes, "bytes_per_checkpoint": fmt_bytes}
_LIMIT_FORMATS = {"method": None, "runs": None, "n": "{:.0f}", "min_MBps": fmt_rate, "median_MBps": fmt_rate,
                  "max_MBps": fmt_rate, "judged": None}
_SIZE_FORMATS = {"params": "{:.0f}", "predicted_bytes": fmt_bytes, "measured_bytes": fmt_bytes,
                 "measured_vs_predicted": "×{:.3f}", "predicted_weights_bytes": fmt_bytes,
                 "measured_weights_bytes": fmt_bytes, "predicted_optimizer_bytes": fmt_bytes,
                 "measured_optimizer_bytes": fmt_bytes, "measured_other_bytes": fmt_bytes}
#: Where no run folder or its parents holds a baseline.json: what to write there.
_NO_BASELINE = ("<p><b>No baseline measured</b>: no <code>baseline.json</code> in any run folder or its parents. "
                "Write one with the storage's fio result, e.g. <code>{\"tool\": \"fio\", \"write_MBps\": 1830, "
                "\"read_MBps\": 2950, \"target\": \"/path\", \"block_size\": \"1M\", \"jobs\": 8, "
                "\"direct\": true}</code>.</p>")


def _checkpoint_cost_tables(table: pd.DataFrame, ranks: pd.DataFrame) -> str:
    """Per configuration, the checkpoint summary; folded beneath it, every checkpoint's spread over its ranks (the
    first 300)."""
    view = view_of(analysis.checkpoint_summary(table), _CHECKPOINT_FORMATS).rename(columns={"cost_s": "whole cost"})
    spread = analysis.rank_spread(ranks)
    spread = spread[spread["kind"] == "checkpoint"] if not spread.empty else spread
    detail = view_of(spread.head(300), _RANK_SPREAD_FORMATS, keys=["preset", "layout", "engine"])
    return ("<p>Per configuration (medians; <i>whole cost</i> = stall + slowdown, over the <i>seen "
            "checkpoints</i>: those whose background work ended while training ran; <i>iteration</i> = the clean "
            "median, iterations that overlapped no save's work; <i>rank spread</i> = slowest − fastest rank of a "
            "checkpoint; <i>overhead</i> = stall / (save interval × iteration time + stall)):</p>"
            + html_table(view)
            + details(f"Per-rank spread of every checkpoint ({len(spread)} rows"
                      + (", first 300" if len(spread) > 300 else "") + ")", html_table(detail)))


def _restart_phases_tables(table: pd.DataFrame) -> str:
    """Per configuration, the restart and its parts; folded beneath it, deepspeed.initialize's stages (the figure's
    strip)."""
    summary = analysis.restart_summary(table)
    view = view_of(summary, _RESTART_FORMATS).rename(columns={c: label for c, label in RESTART_PART_COLUMNS})
    stages = analysis.ds_init_summary(table, column="path_ds_init_parts")
    stage_view = view_of(stages, {c: fmt_s for c in stages.columns if c not in analysis.group_keys(table)})
    return ("<p>Per configuration (medians over runs; each part max over ranks; <i>restart without checks</i> "
            "= restart less the harness's own checks on the critical path: manifest check, page-cache eviction, "
            "exactness proof):</p>" + html_table(view)
            + details(f"deepspeed.initialize in its stages, the critical rank's (the strip; {len(stages)} rows)",
                      html_table(stage_view)))


def _restart_memory_table(table: pd.DataFrame) -> str:
    """The restarts the memory figure draws, with their peaks."""
    view = view_of(analysis.typical_restarts(table), _RESTART_MEMORY_FORMATS, keys=analysis.group_keys(table))
    return ("<p>The restarts drawn (per-rank samples in <code>restart_memory.csv</code>, each part's span and "
            "peak in <code>restart_spans.csv</code>):</p>" + html_table(view))


def _files_per_rank_tables(files: pd.DataFrame) -> str:
    """The files of a checkpoint over all kinds; folded beneath it, the same per file kind."""
    view = view_of(analysis.file_summary(files), _FILE_FORMATS, keys=["preset", "layout", "engine"])
    overall = view[view["kind"] == "all"].drop(columns="kind")
    return ("<p>Files per checkpoint, the most on one rank, and the file-size distribution (min / median / max):"
            "</p>" + html_table(overall)
            + details(f"The same per file kind: layer, model, optimizer, other ({len(view)} rows)",
                      html_table(view)))


def _throughput_table(table: pd.DataFrame) -> str:
    """The storage limits the throughputs are judged against, or how to measure them where no run has one."""
    baselines = table.dropna(subset=["baseline_tool"]) if "baseline_tool" in table else table.iloc[0:0]
    if baselines.empty:
        return _NO_BASELINE
    view = view_of(limit_summary(baselines), _LIMIT_FORMATS, keys=["storage", "tool", "side"])
    return ("<p>Storage limits the ratios are set against: per side, the method that won (the best of several "
            "fio methods, its median the limit) and its spread over its passes (<i>min</i> / <i>max</i>: the "
            "slowest and fastest pass of any run; <i>n</i>: passes per run). A throughput above the max is a "
            "defect to investigate (the findings name each); a baseline without spread (an older "
            "<code>baseline.json</code>) keeps the 105 % rule:</p>" + html_table(view))


def setup_html(table: pd.DataFrame) -> str:
    cols = [c for c in ("device", "backend", "gpu", "host", "storage", "dtype", "torch", "deepspeed", "python")
            if c in table.columns]
    setups = table.groupby(cols, dropna=False)["run_id"].nunique().rename("runs").reset_index()
    setups = setups.dropna(axis=1, how="all")
    configs = table.groupby(["preset", "layout"], dropna=False).agg(
        ranks=("ranks", "max"), engines=("engine", lambda s: ", ".join(analysis.engine_order(s.unique()))),
        runs=("run_id", "nunique")).reset_index()
    return ("<h2>Setup</h2><p>Device, software and storage of the runs:</p>" + html_table(setups)
            + "<p>Configurations measured:</p>" + html_table(configs))


def goodput_html(rows: pd.DataFrame | None, assumptions: str) -> str:
    if rows is None or rows.empty:
        return ""
    view = view_of(rows, GOODPUT_FORMATS)
    glossary = "".join(f"<dt><code>{html.escape(k)}</code></dt><dd>{html.escape(v)}</dd>"
                       for k, v in analysis.GOODPUT_COLUMNS.items())
    return (f"<p>{html.escape(assumptions)}.</p>" + html_table(view)
            + details("Columns of goodput.csv", f"<dl class='defs'>{glossary}</dl>"))


def relayout_html(table: pd.DataFrame) -> str:
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
            + html_table(summary))


def _size_check_table(table: pd.DataFrame, files: pd.DataFrame) -> str:
    return html_table(view_of(analysis.size_check(table, files), _SIZE_FORMATS,
                              keys=["preset", "layout", "dtype", "engine"]))


_FIGURE_TABLES: dict[str, Callable[[pd.DataFrame, pd.DataFrame, pd.DataFrame], str]] = {
    "checkpoint_cost": lambda table, ranks, files: _checkpoint_cost_tables(table, ranks),
    "restart_phases": lambda table, ranks, files: _restart_phases_tables(table),
    "restart_memory": lambda table, ranks, files: _restart_memory_table(table),
    "files_per_rank": lambda table, ranks, files: _files_per_rank_tables(files),
    "throughput": lambda table, ranks, files: _throughput_table(table),
    "checkpoint_size": lambda table, ranks, files: _size_check_table(table, files),
}
"""Figure name -> its tables (the study table, the per-rank table, the file table -> HTML)."""


def excluded_html(collected: Collected) -> str:
    excluded = collected.excluded_table()
    if excluded.empty:
        return "<h2>Runs left out</h2><p>None: every run folder found was complete and readable.</p>"
    skipped = excluded[excluded["status"] == "skipped"]
    bad = excluded[excluded["status"] != "skipped"]
    out = ["<h2>Runs left out</h2>"]
    if not skipped.empty:
        out.append("<h3 class='skipped'>Skipped by design</h3><p>These runs were not executed, e.g. an optional engine "
                   "whose package is not installed; they are not failures.</p>"
                   + html_table(skipped[["run_id", "preset", "layout", "engine", "reason"]]))
    if not bad.empty:
        out.append("<h3 class='failed'>Failed, incomplete or unreadable</h3>"
                   + html_table(bad[["run_id", "status", "preset", "layout", "engine", "reason"]]))
    return "".join(out)


def view_of(frame: pd.DataFrame, formats: dict[str, Any], keys: list[str] | None = None) -> pd.DataFrame:
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
    "read_pct_of_storage": "read / storage", "restart_s": "restart",
    "restart_less_checks_s": "restart without checks", "write_limit": "write limit check",
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


def html_table(frame: pd.DataFrame) -> str:
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


def details(summary: str, body: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"

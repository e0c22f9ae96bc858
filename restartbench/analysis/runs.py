"""One run folder read from its files and events: everything the analysis takes from it, as a ``RunRecord`` that does
not depend on where the folder was collected from (``read_run``). The tables' rows hold placeholders (None) where
the collecting fills in the run's id, its path and its storage baseline (``collecting``), so that a record kept in
the folder (``records``) serves any collected root.

A record is JSON-ready: ``{"excluded": None or {status, reason, preset, layout, engine}, "tables": {name: blocks}}``,
each table (``TABLES``) a list of blocks ``[keys, columns]``: consecutive rows with the same keys, column by column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from restartbench import rundir
from restartbench.analysis.checkpoints import checkpoint_row, rank_checkpoints
from restartbench.analysis.files import run_files
from restartbench.analysis.interference import cost_columns
from restartbench.analysis.reading import plan_columns, predicted_bytes, read_json, require, section
from restartbench.analysis.restart_rows import (
    critical_path,
    memory_columns,
    rank_restarts,
    restart_row,
    restart_spans,
    resume_spike,
    skipped_restarts,
)
from restartbench.engines import options_set
from restartbench.events import EVENTS_FOLDER, Event, read_events
from restartbench.results import (
    checkpoints,
    clean_iteration_time,
    interference,
    restart,
    restore_attempts,
    training_peak_rss,
)
from restartbench.rundir import RunFolderError

RunRecord = dict[str, Any]
#: The tables of a record: the tidy rows, the per-rank rows, the files, the restart spans, the memory samples.
TABLES = ("rows", "ranks", "files", "spans", "memory")
#: The columns the collecting fills in: the run's id (relative to the collected root) and its path.
PLACE_COLUMNS = ("run_id", "run")


#: Added to the reason of a run whose restart never finished but whose training did (``trained_run``).
TRAINING_KEPT = "; its training's checkpoints are kept, its restart is left out"


def read_run(run_dir: Path) -> RunRecord:
    """The record of one run folder; a run that is not complete is a record of its exclusion, with the tables of its
    training where the training finished (``trained_run``). Raises on a folder that cannot be read
    (``RunFolderError``, ``EventFileError`` or any error of a malformed record)."""
    meta = read_json(run_dir / rundir.METADATA, dict)
    if meta.get("status") == "complete":
        return {"excluded": None, "tables": complete_run(run_dir, meta)}
    excluded = exclusion(run_dir, meta)
    trained = trained_run(run_dir, meta) if excluded["status"] in ("failed", "incomplete") else None
    if trained is None:
        return {"excluded": excluded, "tables": {}}
    return {"excluded": {**excluded, "reason": excluded["reason"] + TRAINING_KEPT, "training_kept": True},
            "tables": trained}


def exclusion(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Why a run that is not complete is left out: skipped (by design), failed or incomplete, with the reason."""
    status = meta.get("status")
    kind, reason = {
        "skipped": ("skipped", meta.get("error") or "skipped (no reason recorded)"),
        "failed": ("failed", meta.get("error") or "failed (no error recorded)"),
        "running": ("incomplete", "never finished (status 'running': killed or still going)"),
    }.get(status, ("incomplete", f"unknown status {status!r} in {run_dir / rundir.METADATA}"))
    return {"status": kind, "reason": reason, "preset": meta.get("preset"), "layout": meta.get("layout"),
            "engine": meta.get("engine")}


def complete_run(run_dir: Path, meta: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """The blocks of each table (``TABLES``) of a complete run, kept only once the whole run has been read."""
    events = read_events(run_dir)
    if not events:
        raise RunFolderError(f"{run_dir / EVENTS_FOLDER}: no events recorded, although metadata.json says complete")
    common = common_columns(run_dir, meta, events)
    rows, ranks = checkpoint_rows(events, common)
    restarts, restart_ranks, spans, memory = restart_rows(events, meta, common)
    return run_tables(run_dir, events, common, rows + restarts, ranks + restart_ranks, spans, memory)


def run_tables(run_dir: Path, events: list[dict[str, Any]], common: dict[str, Any], rows: list[dict],
               ranks: list[dict], spans: list, memory: list) -> dict[str, list[list[Any]]]:
    """The record's tables (``TABLES``) from the run's rows, with its checkpoint files."""
    ident = {key: common[key] for key in ("run_id", "run", "preset", "layout", "engine")}
    return {"rows": to_blocks(rows), "ranks": to_blocks(ranks), "spans": spans, "memory": memory,
            "files": to_blocks([{**ident, **entry} for entry in run_files(run_dir, events)])}


def trained_run(run_dir: Path, meta: dict[str, Any]) -> dict[str, list[list[Any]]] | None:
    """The checkpoint tables of a run that failed or was killed after its training: every rank ended the training
    phase, no checkpoint failed, and every checkpoint begun was committed, so its checkpoint figures are whole (a
    restore killed by a timeout loses none of them). No restart rows: the restart is what did not finish. None where
    the training did not finish or its files cannot be read: the run is then left out whole, with the reason it
    failed (not one of its files)."""
    if meta.get("failed_checkpoints"):
        return None
    try:
        events = read_events(run_dir)
        ended = {e["rank"] for e in events if e["phase"] == "train" and e["event"] == Event.PHASE_END}
        saved = checkpoints(events)
        if ended != set(range(meta.get("world_size") or 0)) or not saved or any(
                row["committed_s"] is None for row in saved):
            return None
        common = common_columns(run_dir, meta, events)
        rows, ranks = checkpoint_rows(events, common)
        return run_tables(run_dir, events, common, rows, ranks, [], [])
    except (RunFolderError, LookupError, TypeError, ValueError):  # EventFileError is a ValueError
        return None


def common_columns(run_dir: Path, meta: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The columns every row of the run's tidy table starts with: what ran, where, with which versions; the place
    and baseline columns as placeholders."""
    config = read_json(run_dir / rundir.CONFIG, dict)
    planned = plan_columns(run_dir)
    runtime = meta.get("runtime") or {}
    model, train = section(config, "model", run_dir), section(config, "train", run_dir)
    versions = meta.get("versions") or {}
    return {
        "run_id": None, "run": None, "preset": require(meta, "preset", run_dir / rundir.METADATA),
        "layout": require(meta, "layout", run_dir / rundir.METADATA),
        "tp": planned["tp"], "pp": planned["pp"], "dp": planned["dp"],
        "engine": require(meta, "engine", run_dir / rundir.METADATA),
        "engine_options": options_set(meta["engine"], config.get("engine") or {}, meta.get("device")),
        "dtype": model.get("dtype"),
        "storage": (config.get("storage") or {}).get("checkpoint_dir") or "run folder",
        "client": planned["client"],
        "ranks": meta.get("world_size"), "nodes": planned["nodes"], "device": meta.get("device"),
        "backend": planned["backend"], "gpu": runtime.get("gpu"), "host": meta.get("host"),
        "started": pd.Timestamp(meta["start"], unit="s", tz="UTC").isoformat(timespec="seconds")
        if isinstance(meta.get("start"), (int, float)) else None,
        "torch": versions.get("torch"), "deepspeed": versions.get("deepspeed"), "python": versions.get("python"),
        "restartbench": versions.get("restartbench"),
        "iters": train.get("iters"), "save_interval": train.get("save_interval"),
        "iteration_s": clean_iteration_time(events),
        "predicted_bytes": predicted_bytes(config, planned["checkpoint_bytes_estimate"]),
        "baseline_write_MBps": None, "baseline_read_MBps": None, "baseline_tool": None,
    }


def checkpoint_rows(events: list[dict[str, Any]], common: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """The run's checkpoint rows (one per tag) and their per-rank rows."""
    ident = {key: common[key] for key in ("run_id", "run", "preset", "layout", "engine")}
    rows, ranks = [], []
    per_rank = rank_checkpoints(events)
    costs = interference(events)
    for row in checkpoints(events):
        tag_ranks = [r for r in per_rank if r["tag"] == row["tag"]]
        rows.append({**common, "kind": "checkpoint", **checkpoint_row(row, tag_ranks, common),
                     **cost_columns(costs.get(row["tag"], {}))})
        ranks.extend({**ident, **r} for r in tag_ranks)
    return rows, ranks


def restart_rows(events: list[dict[str, Any]], meta: dict[str, Any], common: dict[str, Any]
                 ) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """The run's restart rows (one per restore attempt, then the skipped ones) and their per-rank rows, and the blocks
    of their spans and memory samples (many rows: made as columns)."""
    ident = {key: common[key] for key in ("run_id", "run", "preset", "layout", "engine")}
    where = {key: common[key] for key in ("run_id", "preset", "layout", "engine")}  # spans, samples: many rows
    rows, ranks, spans, memory = [], [], [], []
    requested = {entry.get("attempt"): entry.get("requested_tag") for entry in meta.get("restarts") or []
                 if isinstance(entry, dict)}
    training_peak = training_peak_rss(events)
    for attempt in restore_attempts(events):
        info = restart(events, attempt)
        attempt_ranks = rank_restarts(events, attempt)
        row = {**restart_row(info, attempt_ranks), "requested_tag": requested.get(attempt),
               **resume_spike(info["peak_rss_bytes"], training_peak)}
        row["restore_layout"] = row["restore_layout"] or common["layout"]
        row["read_pct_of_storage"] = row["read_limit"] = None  # from the storage baseline (baselines.apply_baseline)
        rows.append({**common, "kind": "restart", **row, **critical_path(attempt_ranks, info["total_s"])})
        ranks.extend({**ident, **r} for r in attempt_ranks)
        attempt_spans = restart_spans(events, attempt)
        spans.extend(placed_block(where, attempt_spans))
        memory.extend(placed_columns(where, memory_columns(events, attempt, attempt_spans)))
    rows.extend({**common, "kind": "restart", **entry} for entry in skipped_restarts(meta))
    return rows, ranks, spans, memory


def placed_block(where: dict[str, Any], rows: list[dict[str, Any]]) -> list[list[Any]]:
    """``{**where, **row}`` for rows that all have the same keys, as blocks (none for no rows), made column by
    column."""
    if not rows:
        return []
    keys = list(rows[0])
    return [[[*where, *keys], [[value] * len(rows) for value in where.values()]
             + [[row[key] for row in rows] for key in keys]]]


def placed_columns(where: dict[str, Any], columns: dict[str, list[Any]]) -> list[list[Any]]:
    """``placed_block`` of rows given as columns of one length."""
    count = len(next(iter(columns.values()), []))
    if not count:
        return []
    return [[[*where, *columns], [[value] * count for value in where.values()] + list(columns.values())]]


def to_blocks(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows as blocks ``[keys, columns]``: each run of consecutive rows with the same keys, column by column, the keys
    in the block's first row's order (a later row's order adds no column: ``pd.DataFrame(rows)`` orders the columns
    by first appearance)."""
    blocks: list[list[Any]] = []
    start = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end].keys() != rows[start].keys():
            keys = list(rows[start])
            blocks.append([keys, [[row[key] for row in rows[start:end]] for key in keys]])
            start = end
    return blocks

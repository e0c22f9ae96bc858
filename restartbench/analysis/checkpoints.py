"""Checkpoints: one run's checkpoint rows (one per tag, each figure its aggregate over ranks) and per-rank rows from
its phase-1 events, and ``checkpoint_summary``, their medians per configuration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from restartbench.analysis.baselines import flagged
from restartbench.analysis.columns import MB, MiB
from restartbench.analysis.grouping import group_keys, sort_rows
from restartbench.analysis.interference import interference_aggregations, interference_medians, seen_columns
from restartbench.events import CHECKPOINT_PREFIX, Event
from restartbench.results import since_checkpoint_start


def checkpoint_row(row: dict[str, Any], ranks: list[dict[str, Any]], common: dict[str, Any]) -> dict[str, Any]:
    stall, durable = row["stall_max_s"], row["durable_rank_max_s"]
    iteration, interval = common["iteration_s"], common["save_interval"]
    with_stall = [r for r in ranks if r["stall_s"] is not None]
    with_durable = [r for r in ranks if r["durable_s"] is not None]
    written = [r for r in ranks if r["bytes"] is not None]
    write_mbps = row["bytes"] / MB / durable if durable else None
    return {
        "tag": row["tag"], "step": row["step"], "ranks_saved": row["ranks"],
        "stall_max_s": stall, "stall_min_s": row["stall_min_s"],
        "stall_median_s": _median(r["stall_s"] for r in with_stall),
        "stall_rank": max(with_stall, key=lambda r: r["stall_s"])["rank"] if with_stall else None,
        "stall_iterations": stall / iteration if stall is not None and iteration else None,
        "stall_overhead_pct": 100 * stall / (interval * iteration + stall)
        if stall is not None and iteration and interval else None,
        "wait_durable_max_s": row["wait_durable_max_s"],
        "durable_rank_max_s": durable,
        "durable_rank_min_s": min((r["durable_s"] for r in with_durable), default=None),
        "durable_rank": max(with_durable, key=lambda r: r["durable_s"])["rank"] if with_durable else None,
        "committed_s": row["committed_s"],
        "bytes": row["bytes"], "files": row["files"],
        "bytes_per_rank_max": max((r["bytes"] for r in written), default=None),
        "bytes_per_rank_min": min((r["bytes"] for r in written), default=None),
        "files_per_rank_max": max((r["files"] for r in written), default=None),
        "files_per_rank_min": min((r["files"] for r in written), default=None),
        "write_MBps": write_mbps,
        "write_pct_of_storage": None, "write_limit": None,  # from the storage baseline (baselines.apply_baseline)
        "save_MiBps": row["bytes"] / MiB / durable if durable else None,
    }


def rank_checkpoints(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per checkpoint tag × rank of phase 1: stall (save, plus any later wait of training for the save's
    copies), durable wait, durable time, bytes, files."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for e in events:
        if e["phase"] != "train" or not e["event"].startswith(CHECKPOINT_PREFIX):
            continue
        row = rows.setdefault((e["tag"], e["rank"]), {
            "kind": "checkpoint", "tag": e["tag"], "step": e.get("step"), "rank": e["rank"], "stall_s": None,
            "copy_wait_s": 0.0, "wait_durable_s": None, "durable_s": None, "bytes": None, "files": None})
        if e["event"] == Event.CHECKPOINT_SAVE:
            row["stall_s"] = e["duration_s"] + row["copy_wait_s"]
        elif e["event"] == Event.CHECKPOINT_COPY_WAIT:
            row["copy_wait_s"] += e["duration_s"]
            if row["stall_s"] is not None:
                row["stall_s"] += e["duration_s"]
        elif e["event"] == Event.CHECKPOINT_WAIT_DURABLE:
            row["wait_durable_s"] = e["duration_s"]
        elif e["event"] == Event.CHECKPOINT_DURABLE:
            row.update(durable_s=since_checkpoint_start(e), bytes=e["bytes"], files=e["n_files"])
    return sorted(rows.values(), key=lambda r: (r["step"] or 0, r["rank"]))


def checkpoint_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: medians over runs and checkpoints of the per-checkpoint figures
    (each already the max over ranks), with min and max, and the per-rank spread of the stall. The slowdown and the
    overlapped iterations are medians over the checkpoints whose background work training saw to its end
    (``background_seen``; their number: ``seen_checkpoints``), over all where none was: a save whose work the
    harness waited for, such as phase 1's last, would count its slowdown as 0. The whole cost ``cost_s`` is
    ``stall_s`` + ``slowdown_s``: for a synchronous engine exactly its stall."""
    ckpt = table[table["kind"] == "checkpoint"] if not table.empty else table
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    if ckpt.empty:
        return pd.DataFrame(columns=[*keys, "runs", "checkpoints"])
    ckpt = ckpt.assign(stall_spread_s=ckpt["stall_max_s"] - ckpt["stall_min_s"],
                       durable_spread_s=ckpt["durable_rank_max_s"] - ckpt["durable_rank_min_s"])
    ckpt = seen_columns(ckpt)
    grouped = ckpt.groupby(keys, dropna=False)
    summary = grouped.agg(
        runs=("run_id", "nunique"), checkpoints=("tag", "size"), ranks=("ranks", "max"),
        stall_s=("stall_max_s", "median"), stall_min_s=("stall_max_s", "min"), stall_max_s=("stall_max_s", "max"),
        stall_rank_spread_s=("stall_spread_s", "median"),
        durable_s=("durable_rank_max_s", "median"), durable_min_s=("durable_rank_max_s", "min"),
        durable_max_s=("durable_rank_max_s", "max"), durable_rank_spread_s=("durable_spread_s", "median"),
        committed_s=("committed_s", "median"), bytes=("bytes", "median"), files=("files", "median"),
        bytes_per_rank_max=("bytes_per_rank_max", "median"), bytes_per_rank_min=("bytes_per_rank_min", "median"),
        write_MBps=("write_MBps", "median"), write_pct_of_storage=("write_pct_of_storage", "median"),
        write_limit=("write_limit", flagged), iteration_s=("iteration_s", "median"),
        stall_iterations=("stall_iterations", "median"), stall_overhead_pct=("stall_overhead_pct", "median"),
        baseline_write_MBps=("baseline_write_MBps", "median"),
        **interference_aggregations(),
    ).reset_index()
    interference_medians(summary)
    after_stall = ["slowdown_s", "cost_s", "overlapped_iterations", "seen_checkpoints"]
    rest = [c for c in summary.columns if c not in after_stall]
    at = rest.index("stall_rank_spread_s") + 1
    return sort_rows(summary[[*rest[:at], *after_stall, *rest[at:]]], keys)


def _median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

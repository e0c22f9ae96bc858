"""Restarts of one run from its events: each restore attempt's row (the restart and its parts, max over ranks, and
its critical path), its per-rank rows, its spans and host-memory samples on the restart's clock (seconds since each
rank's launch), and the attempts ``metadata.json`` records as skipped."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from restartbench.analysis.columns import HARNESS_PARTS, MB, PATH_COLUMNS, PATH_PARTS, RESTART_PART_COLUMNS, MiB
from restartbench.events import Event
from restartbench.results import (
    RELAYOUT_CONVERSION,
    RESTART_PARTS,
    attempt_events,
    ds_init_breakdown,
    rank_harness_checks,
)


def restart_row(info: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    parts = info["parts"]
    load = parts.get("ckpt load")
    # a load prefetched on every rank: its span holds the wait and the copy-out, the read ran before it
    read_s = info["prefetch_read_s"] if info.get("prefetched") else load
    totals = [r for r in ranks if r["restart_s"] is not None]
    return {
        "attempt": info["attempt"], "verdict": info["verdict"], "tag": info["tag"],
        "fell_back_from": info["fell_back_from"], "restart_s": info["total_s"],
        "restart_min_s": min((r["restart_s"] for r in totals), default=None),
        "restart_rank": max(totals, key=lambda r: r["restart_s"])["rank"] if totals else None,
        **{column: parts.get(label) for column, label in RESTART_PART_COLUMNS},
        "restores_checkpoint": info["tag"] is not None,
        "bytes_read": info["bytes_read"], "files_read": info["files_read"],
        "process_bytes_read": info["process_bytes_read"],
        "read_deserialize_max_s": max((r["read_deserialize_s"] for r in ranks
                                       if r["read_deserialize_s"] is not None), default=None),
        "read_MBps": info["bytes_read"] / MB / read_s if read_s and info["bytes_read"] else None,
        "load_MiBps": info["bytes_read"] / MiB / read_s if read_s and info["bytes_read"] else None,
        "prefetched": info.get("prefetched"), "prefetch_read_s": info.get("prefetch_read_s"),
        "prefetch_wait_s": info.get("prefetch_wait_s"),
        "cache": info["cache"], "resident_fraction": info["resident_fraction"], "exact": info["exact"],
        "peak_rss_part": info["peak_rss_part"], "ds_init_parts": info["ds_init"],
        "restore_layout": info["restore_layout"], "loss_diff": info["loss_diff"],
        **{f"convert_{name}": info[f"convert_{name}"] for name in RELAYOUT_CONVERSION},
    }


def resume_spike(restore_peak: int | None, training_peak: int | None) -> dict[str, Any]:
    return {"restore_peak_rss_bytes": restore_peak, "train_peak_rss_bytes": training_peak,
            "resume_spike": restore_peak / training_peak if restore_peak and training_peak else None}


def skipped_restarts(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Restarts metadata.json records as skipped (an engine that cannot restart on another layout; nothing was
    launched): a row each, with the reason and no times."""
    return [{"attempt": entry.get("attempt"), "verdict": "skipped", "skip_reason": entry.get("reason"),
             "restore_layout": entry.get("restore_layout"), "restores_checkpoint": False}
            for entry in meta.get("restarts") or [] if isinstance(entry, dict) and entry.get("verdict") == "skipped"]


def rank_restarts(events: list[dict[str, Any]], attempt: int = 1) -> list[dict[str, Any]]:
    """One row per rank of one restore attempt: launch -> end of first resumed iteration, each part, the harness's
    own checks before its first resumed iteration (``check_files_s``, every manifest check summed; ``cache_s``;
    ``verify_s``), bytes read, ``ready_s`` (launch -> start of its first resumed iteration) and its
    ``deepspeed.initialize`` in stages."""
    labels = dict(RESTART_PARTS)
    columns = {label: column for column, label in RESTART_PART_COLUMNS}
    rows: dict[int, dict[str, Any]] = {}
    restore = attempt_events(events, attempt)
    for e in restore:
        row = rows.setdefault(e["rank"], {"kind": "restart", "tag": None, "attempt": attempt, "rank": e["rank"],
                                          "restart_s": None,
                                          "ready_s": None, **{c: None for c, _ in RESTART_PART_COLUMNS},
                                          **dict.fromkeys(_HARNESS_LABELS),
                                          "bytes_read": None, "files_read": None,
                                          "read_deserialize_s": None, "ds_init_parts": None, "_launch": None})
        name = e["event"]
        if name == Event.TRAIN_ITERATION and not e.get("first_after_restore"):
            continue
        if name in labels:
            row[columns[labels[name]]] = e["duration_s"]
        if name == Event.PROCESS_START:
            row["_launch"] = e["start"]
        elif name == Event.TRAIN_ITERATION:
            row["_first"], row["_end"] = e["start"], e["start"] + e["duration_s"]
        elif name == Event.RESTORE_LOAD:
            row.update(tag=e.get("tag"), bytes_read=e.get("bytes"), files_read=e.get("n_files"),
                       read_deserialize_s=e.get("read_deserialize_s"))
        elif name == Event.STARTUP_DS_INITIALIZE:
            row["ds_init_parts"] = ds_init_breakdown([e])
    checks = rank_harness_checks(restore)
    for rank, row in rows.items():
        launch, first, end = row.pop("_launch"), row.pop("_first", None), row.pop("_end", None)
        row["restart_s"] = end - launch if launch is not None and end is not None else None
        row["ready_s"] = first - launch if launch is not None and first is not None else None
        row.update({key: checks.get(rank, {}).get(label) for key, label in _HARNESS_LABELS.items()})
    return [rows[rank] for rank in sorted(rows)]


#: The per-rank column of each of the harness's own checks -> its label (the path's ``HARNESS_PARTS``).
_HARNESS_LABELS = {f"{label.replace(' ', '_')}_s": label for label in HARNESS_PARTS}


#: The spans of a restore the memory figure marks: the restart's parts and the harness's exactness check.
SPAN_PARTS = (*RESTART_PARTS, (Event.RESTORE_VERIFY, "verify"))


def restart_spans(events: list[dict[str, Any]], attempt: int = 1) -> list[dict[str, Any]]:
    """One row per rank and span (``SPAN_PARTS``) of one restore attempt, on the restart's clock: seconds since the
    rank's launch (its ``process.start`` span's start), with the RSS at the span's start and its peak. A rank
    without a launch record has none."""
    restore = attempt_events(events, attempt)
    launches = _launches(restore)
    labels = dict(SPAN_PARTS)
    rows = []
    for e in restore:
        if e["event"] not in labels or e["rank"] not in launches:
            continue
        if e["event"] == Event.TRAIN_ITERATION and not e.get("first_after_restore"):
            continue
        start = e["start"] - launches[e["rank"]]
        rows.append({"attempt": attempt, "rank": e["rank"], "part": labels[e["event"]], "start_s": start,
                     "end_s": start + e["duration_s"], "start_rss_bytes": e.get("start_rss_bytes"),
                     "peak_rss_bytes": e.get("peak_rss_bytes")})
    return sorted(rows, key=lambda r: (r["rank"], r["start_s"]))


def restart_memory(events: list[dict[str, Any]], attempt: int, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per memory sample of each rank's ``rank.memory`` timeline of one restore attempt, moved from the
    process's clock (seconds since ``process_start``) to the restart's (since the rank's launch), each with the span of
    ``spans`` (``restart_spans``' rows of the attempt) it fell in. Records without a timeline give none."""
    columns = memory_columns(events, attempt, spans)
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


#: The columns of a memory sample (``restart_memory``), in order.
MEMORY_SAMPLE_KEYS = ("attempt", "rank", "t_s", "rss_bytes", "part", "resolution_s")


def memory_columns(events: list[dict[str, Any]], attempt: int, spans: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``restart_memory``'s rows as columns (attempt, rank, t_s, rss_bytes, part, resolution_s), made column by
    column: a run has hundreds of samples, and the first read of many runs spent a quarter of its time on them."""
    restore = attempt_events(events, attempt)
    launches = _launches(restore)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start_s"]):  # stable: spans starting together keep their order
        by_rank.setdefault(span["rank"], []).append(span)
    columns: dict[str, list[Any]] = {name: [] for name in MEMORY_SAMPLE_KEYS}
    for e in restore:
        if e["event"] != Event.RANK_MEMORY or e["rank"] not in launches or not e.get("timeline"):
            continue
        rank, offset = e["rank"], e["process_start"] - launches[e["rank"]]
        times = [since_start + offset for since_start, _rss in e["timeline"]]
        columns["attempt"] += [attempt] * len(times)
        columns["rank"] += [rank] * len(times)
        columns["t_s"] += times
        columns["rss_bytes"] += [rss for _since_start, rss in e["timeline"]]
        columns["part"] += parts_at(by_rank.get(rank, []), times)
        columns["resolution_s"] += [e.get("resolution_s")] * len(times)
    return columns


def parts_at(spans: list[dict[str, Any]], times: list[float]) -> list[str | None]:
    """The part (``part_at``) of each time, for one rank's spans sorted by start. The answer can change only at a
    span's start or end: between two such bounds, and at each bound, it is looked up once (the times placed among
    the bounds by numpy: a first read of many runs places hundreds of samples per run)."""
    starts = [span["start_s"] for span in spans]
    bounds = np.array(sorted({*starts, *(span["end_s"] for span in spans)}), dtype=float)
    if not len(times) or not len(bounds) or np.isnan(bounds).any():  # a NaN bound orders nothing: each looked up
        return [part_at(spans, starts, t) for t in times]
    at = np.asarray(times, dtype=float)
    index = np.searchsorted(bounds, at, side="right")  # as bisect_right
    on_bound = (index > 0) & (bounds[np.maximum(index - 1, 0)] == at)
    keys = np.where(on_bound, -index, index)  # at a bound (-index) or between two (index)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    found = [part_at(spans, starts, times[i]) for i in first.tolist()]
    return [found[i] for i in inverse.tolist()]


def _launches(restore: list[dict[str, Any]]) -> dict[int, float]:
    """rank -> its launch (wall clock): the start of its ``process.start`` span, the restart's zero."""
    return {e["rank"]: e["start"] for e in restore if e["event"] == Event.PROCESS_START}


def part_at(spans: list[dict[str, Any]], starts: list[float], t: float) -> str | None:
    """The span (of one rank's, by start; ``starts`` their starts) that holds time ``t``: of those holding it the one
    that started last (at the boundary of two, the later), the first of them where several started together."""
    found = None
    for span in reversed(spans[:bisect_right(starts, t)]):  # started by t, the latest first
        if found is not None and span["start_s"] < found["start_s"]:
            break
        if t <= span["end_s"]:
            found = span
    return found["part"] if found else None


def critical_path(ranks: list[dict[str, Any]], total: float | None) -> dict[str, Any]:
    """The parts of the last rank ready to train (``path_*`` columns), adding up to ``total``, its
    ``deepspeed.initialize`` in stages (``path_ds_init_parts``) and ``restart_less_checks_s``: ``total`` less the
    harness's own checks on that path (``HARNESS_PARTS``; those a rank did not record subtract nothing)."""
    ready = [r for r in ranks if r["ready_s"] is not None]
    if not ready or total is None:
        return {"path_rank": None, **{column: None for column, _ in PATH_COLUMNS}, "path_ds_init_parts": None,
                "restart_less_checks_s": total}
    rank = max(ready, key=lambda r: r["ready_s"])
    by_label = {label: rank[column] for column, label in RESTART_PART_COLUMNS}
    by_label.update({label: rank[key] for key, label in _HARNESS_LABELS.items()})
    path = {label: by_label.get(label) for label in PATH_PARTS if label not in ("gaps", "1st iter")}
    path["1st iter"] = max(total - rank["ready_s"], 0.0)
    path["gaps"] = max(rank["ready_s"] - sum(v for k, v in path.items() if v is not None and k != "1st iter"), 0.0)
    checks = sum(path[label] for label in HARNESS_PARTS if path[label] is not None)
    return {"path_rank": rank["rank"], **{column: path.get(label) for column, label in PATH_COLUMNS},
            "path_ds_init_parts": rank["ds_init_parts"], "restart_less_checks_s": total - checks}

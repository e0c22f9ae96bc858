"""Tables across many run folders (used by analysis/summarize.py, the report and the notebooks).

``collect(root)`` finds every run folder under ``root`` (a folder holding ``metadata.json``;
run folders are not searched inside), and returns a ``Collected`` with six tables:

- ``table()``: the tidy table, one row per run × event: ``kind == "checkpoint"`` (one per
  checkpoint tag) or ``kind == "restart"`` (one per restore attempt: the run's own restore is
  attempt 1, each ``./submit-job.sh --restore`` relaunch another; ``tag`` is None for engine
  ``none``, whose restart restores nothing: the start-up floor). Columns: ``TABLE_COLUMNS``.
- ``rank_table()``: the same events per rank (``RANK_COLUMNS``), so that per-rank spread is
  kept rather than averaged away.
- ``file_table()``: every checkpoint file (tag, path, bytes, kind, writing rank), from
  ``inventory.json`` (or, without one, from the ``checkpoint.durable`` events).
- ``span_table()``: every restore attempt's spans per rank on the restart's clock (seconds since the rank's launch):
  the restart's parts and the harness's verify, each with its host RSS at the start and its peak (``SPAN_COLUMNS``).
- ``memory_table()``: every restore attempt's host RSS over time per rank (the ``rank.memory`` timeline, thinned
  by the rank as it wrote it) on the same clock, each sample with the part it fell in (``MEMORY_COLUMNS``).
- ``excluded_table()``: runs left out, each with a ``status`` and a reason:
  ``skipped`` (the run itself was skipped, e.g. an optional engine not installed: by design),
  ``failed``, ``incomplete`` (never finished) or ``unreadable`` (a malformed file, named).

Figures follow the aggregation rules of ``restartbench.results``: a checkpoint's stall is the
max over ranks of the time ``save`` blocked training; durable is the max over ranks of save
start → that rank's files fsync'd; committed is when rank 0 then wrote ``latest``; a restart is
the max over ranks of launch → end of the first resumed iteration, each part its max over ranks.
A checkpoint's whole cost (``cost_s``) is its stall plus ``slowdown_s``: what the iterations its background work
overlapped took beyond the clean median iteration (``results.interference``).
Throughput is the checkpoint's total bytes (all ranks) over its durable time.

Storage baseline: a ``baseline.json`` in the run folder, or in any folder between it and the
collected root (the nearest wins), gives the storage's measured bandwidth::

    {"tool": "fio", "write_MBps": 1830.0, "read_MBps": 2950.0,
     "target": "/lustre/ckpt", "block_size": "1M", "jobs": 8, "direct": true,
     "measured": "2026-11-22T18:00:00Z"}

``write_MBps``/``read_MBps`` (MB = 10^6 bytes, at least one of them) are required; the rest is
shown as given. Where none exists the throughput plot says "no baseline measured".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench import goodput, rundir
from restartbench.baseline import BASELINE_FILE
from restartbench.config import RunConfig
from restartbench.engines import engine_names
from restartbench.estimate import OPTIMIZER_BYTES_PER_PARAM, checkpoint_bytes, weight_bytes
from restartbench.events import CHECKPOINT_PREFIX, EVENTS_FOLDER, Event, EventFileError, read_events
from restartbench.layout import parse_layout
from restartbench.presets import get_preset
from restartbench.results import (
    RELAYOUT_CONVERSION,
    RESTART_PARTS,
    attempt_events,
    checkpoints,
    clean_iteration_time,
    ds_init_breakdown,
    file_kind,
    interference,
    restart,
    restore_attempts,
    since_checkpoint_start,
    training_peak_rss,
    whole_cost,
)
from restartbench.rundir import RunFolderError, RunPlan

MB = 1e6
MiB = 2**20
FILE_KINDS = ("layer", "model", "optimizer", "other")

#: (tidy-table column, label) of each restart part, in launch order.
RESTART_PART_COLUMNS = [(f"restart_{label.replace(' ', '_')}_s", label) for _event, label in RESTART_PARTS]
#: The restart's critical path: the parts of the rank that was last ready to train (its first resumed iteration
#: started last; every rank waits for it there), in launch order. ``verify`` is the harness's exactness check and
#: ``gaps`` the time between spans; with ``1st iter`` they add up to the restart total.
PATH_PARTS = ("launch", "imports", "dist init", "model build", "ds init", "engine setup", "convert", "ckpt load",
              "verify", "gaps", "1st iter")
PATH_COLUMNS = [(f"path_{label.replace(' ', '_')}_s", label) for label in PATH_PARTS]

#: Columns of the tidy table and what each holds (also the glossary of the report).
TABLE_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root",
    "run": "run folder path",
    "kind": "checkpoint (one row per checkpoint tag) or restart (one row per restore attempt of a run)",
    "preset": "model preset", "layout": "canonical parallel layout", "tp": "tensor parallel",
    "pp": "pipeline parallel", "dp": "data parallel", "engine": "checkpoint engine",
    "dtype": "training precision", "storage": "checkpoint folder given by --checkpoint-dir, else 'run folder'",
    "client": "object-store client the checkpoints went through (s3torchconnector or fsspec); None for a folder",
    "ranks": "world size", "nodes": "nodes", "device": "cpu or cuda", "backend": "gloo or nccl",
    "gpu": "GPU model (runtime.json)", "host": "host of rank 0", "started": "run start (UTC)",
    "torch": "torch version", "deepspeed": "DeepSpeed version", "python": "Python version",
    "restartbench": "restartbench version",
    "iters": "phase-1 iterations", "save_interval": "checkpoint every N iterations",
    "iteration_s": "the clean median: median phase-1 iteration time (max over ranks per step, step 1 left out) over "
                   "the iterations that overlapped no checkpoint's background work",
    "predicted_bytes": "one checkpoint's bytes as restartbench.plan predicts the run's engine's files for its config "
                       "(engines without a prediction: DeepSpeed's default engine's)",
    "baseline_write_MBps": "storage write bandwidth from baseline.json (10^6 B/s)",
    "baseline_read_MBps": "storage read bandwidth from baseline.json (10^6 B/s)",
    "baseline_tool": "tool that measured the baseline",
    "tag": "checkpoint tag (restart: the tag restored; None = nothing restored, engine none)",
    "step": "iteration after which the checkpoint was taken",
    "ranks_saved": "ranks that recorded a save of this tag",
    "stall_max_s": "training stall: max over ranks of the time save blocked training",
    "stall_min_s": "min over ranks of the save time", "stall_median_s": "median over ranks of the save time",
    "stall_rank": "rank with the longest save",
    "stall_iterations": "stall_max_s / iteration_s",
    "stall_overhead_pct": "share of training time lost to stalls at this save interval: "
                          "stall / (save_interval · iteration + stall)",
    "overlapped_iterations": "iterations that overlapped this checkpoint's background work on some rank (from the end "
                             "of save to the rank's files durable; each iteration counted for the earliest checkpoint "
                             "it overlapped). 0 for a synchronous engine, and for phase 1's last save, whose "
                             "background work the harness waits for at the end of training (not training time)",
    "slowdown_s": "sum over the overlapped iterations of (iteration time - iteration_s), an iteration's time being its "
                  "max over ranks less any lazy copy wait in it (already in the stall); 0 by construction for a "
                  "synchronous engine (the harness waits for durability before the next iteration)",
    "cost_s": "the checkpoint's whole cost to training: stall_max_s + slowdown_s (a negative slowdown, noise, adds "
              "nothing)",
    "background_seen": "True where on every rank training went on after the save and the files were durable before "
                       "the harness began waiting for them: the background work ended while training ran, so "
                       "slowdown_s covers it; False for phase 1's last save (waited for after training) and where the "
                       "harness waited while the work still ran (a synchronous engine's wait; an asynchronous save "
                       "still writing at the next save: the rest is in wait_durable_max_s, not in slowdown_s)",
    "wait_durable_max_s": "max over ranks of the time the harness waited for durability",
    "durable_rank_max_s": "durable: max over ranks of the checkpoint's start (its first rank's save start) -> the "
                          "rank's files fsync'd",
    "durable_rank_min_s": "min over ranks of the checkpoint's start -> files fsync'd",
    "durable_rank": "rank durable last",
    "committed_s": "the checkpoint's start -> rank 0 wrote latest (after every rank was durable: one clock, so never "
                   "below durable_rank_max_s)",
    "bytes": "bytes of the checkpoint, all ranks", "files": "files of the checkpoint, all ranks",
    "bytes_per_rank_max": "largest bytes written by one rank",
    "bytes_per_rank_min": "smallest bytes written by one rank",
    "files_per_rank_max": "most files written by one rank", "files_per_rank_min": "fewest files written by one rank",
    "write_MBps": "bytes / durable_rank_max_s (10^6 B/s)",
    "write_pct_of_storage": "write_MBps as a share of the storage's write bandwidth (baseline.json: fio for a folder, "
                            "a plain multipart upload for S3), percent",
    "write_limit": "'limit underestimated' where write_pct_of_storage is above 105: the baseline measured the storage "
                   "too low (a ratio above 1 means the limit was measured wrong, not that the engine beat the disk)",
    "save_MiBps": "seed 000's save throughput: bytes / durable_rank_max_s in MiB/s (2^20 B/s); durable_rank_max_s "
                  "is its 'corrected' save duration (save start -> fsync'd, no model set-up or device load in it)",
    "attempt": "restore attempt: 1 is the run's own restore, 2, 3... its restore-only relaunches (--restore)",
    "verdict": "how the attempt ended: exact, not exact, not verified (verification off, or engine none), refused (a "
               "damaged checkpoint, none to restore: no restart time), failed (no restart time) or skipped (the "
               "engine cannot restart on the layout asked for: skip_reason)",
    "requested_tag": "the checkpoint the attempt asked for with --tag (None: the one 'latest' names)",
    "restore_peak_rss_bytes": "the restart's peak host memory: the largest RSS any rank had in any restart part "
                              "(sampled at 100 Hz by restartbench.memwatch; a shorter spike can be missed)",
    "peak_rss_part": "the restart part the peak came in",
    "ds_init_parts": "deepspeed.initialize in DeepSpeed's own stages, {stage: seconds}, each the max over ranks, with "
                     "'collective wait' (time inside collectives: mostly waiting for slower ranks) and 'other' "
                     "(restartbench.ds_init_timing; ds_init_summary gives the medians)",
    "train_peak_rss_bytes": "steady training's peak host memory: the largest RSS of any rank in a phase-1 iteration",
    "resume_spike": "restore_peak_rss_bytes / train_peak_rss_bytes: above 1, resuming needs more host memory than "
                    "training (where jobs run out of memory on resume)",
    "fell_back_from": "the checkpoint the attempt wanted but found damaged, restoring an earlier one instead",
    "restart_s": "restart: max over ranks of launch -> end of the first resumed iteration",
    "restart_min_s": "fastest rank's launch -> end of the first resumed iteration",
    "restart_rank": "slowest rank of the restart",
    **{column: f"restart part '{label}', max over ranks" for column, label in RESTART_PART_COLUMNS},
    "path_rank": "the restart's critical rank: the last one ready to train (everyone waits for it in the first "
                 "iteration)",
    **{column: f"critical path: '{label}' of the critical rank (the path parts add up to restart_s)"
       for column, label in PATH_COLUMNS},
    "path_ds_init_parts": "the critical rank's deepspeed.initialize in its stages, {stage: seconds}, with 'collective "
                          "wait' and 'other' (they add up to the time the call was timed: path_ds_init_s less what "
                          "the span does around it, reading ds_config.json)",
    "restores_checkpoint": "False for engine none: a relaunch that restores nothing (the start-up floor)",
    "bytes_read": "bytes the restore read, all ranks, as the engines report them",
    "files_read": "files the restore read, all ranks",
    "process_bytes_read": "bytes the ranks' processes read during the load, all ranks, as the kernel counted them "
                          "(rchar of /proc/self/io: also what an engine reads outside its reported files, such as "
                          "DeepSpeed's universal load; page cache hits included)",
    "read_deserialize_max_s": "max over ranks of time inside the engine's file reads (read + deserialize)",
    "read_MBps": "bytes_read / ckpt load time (10^6 B/s)",
    "read_limit": "'limit underestimated' where read_pct_of_storage is above 105 on a restore that was not warm; "
                  "'warm cache' where a warm restore read faster than the storage (memory answered, not the disk)",
    "read_pct_of_storage": "read_MBps as a share of the storage's read bandwidth (baseline.json), percent; above 100 "
                           "only when pages were served from a warm page cache (see cache)",
    "load_MiBps": "seed 000's load throughput: bytes_read / restart_ckpt_load_s in MiB/s; restart_ckpt_load_s is its "
                  "'corrected' load duration (no process set-up or model build in it)",
    "cache": "page cache of the checkpoint when the restore began, measured with mincore on every node: cold (no "
             "byte resident) or warm (some bytes may be served from memory)",
    "resident_fraction": "largest share of the checkpoint's pages resident in any node's page cache at restore start",
    "exact": "restore verified exact (None: not verified or nothing restored)",
    "restore_layout": "the layout the restart ran on: the run's own, or another (--restore-layout: proved on the "
                      "consolidated state, see restartbench.consolidated)",
    "loss_diff": "a restart on another layout: iteration K+1's loss less the uninterrupted run's (reduction order "
                 "changes with tp and dp; None on the run's own layout, where the loss must be equal)",
    **{f"convert_{name}": f"the engine's offline conversion for another layout (rank 0): {name.replace('_', ' ')}"
       for name in RELAYOUT_CONVERSION},
    "skip_reason": "a restart the engine cannot make on another layout (verdict skipped, nothing launched): why",
}

RANK_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "kind": "checkpoint or restart", "tag": "tag",
    "attempt": "restore attempt (restart rows)", "rank": "rank",
    "stall_s": "time the checkpoint blocked training on this rank: save, plus copy_wait_s",
    "copy_wait_s": "time training later waited (at the optimizer step) for a lazy save's copies to finish",
    "wait_durable_s": "time waited for this rank's files to be durable",
    "durable_s": "the checkpoint's start (its first rank's save start) -> this rank's files fsync'd",
    "bytes": "bytes written by this rank",
    "files": "files written by this rank", "restart_s": "launch -> end of this rank's first resumed iteration",
    "bytes_read": "bytes this rank read", "files_read": "files this rank read",
    "read_deserialize_s": "time inside this rank's file reads",
    "ds_init_parts": "this rank's deepspeed.initialize in its stages, {stage: seconds}, with 'collective wait' and "
                     "'other' (restartbench.ds_init_timing)",
}

#: Columns of ``span_table()``: one row per restore attempt, rank and span.
SPAN_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "preset": "model preset", "layout": "parallel layout",
    "engine": "checkpoint engine", "attempt": "restore attempt", "rank": "rank",
    "part": "the restart part (launch, imports, dist init, model build, ds init, engine setup, ckpt load, 1st iter) "
            "or verify (the harness's exactness check)",
    "start_s": "seconds from the rank's launch to the span's start (the restart's clock)",
    "end_s": "seconds from the rank's launch to the span's end",
    "start_rss_bytes": "the rank's host RSS as the span began (None for launch: before the process ran)",
    "peak_rss_bytes": "the largest host RSS sampled during the span (restartbench.memwatch, unthinned)",
}

#: Columns of ``memory_table()``: one row per restore attempt, rank and memory sample.
MEMORY_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "preset": "model preset", "layout": "parallel layout",
    "engine": "checkpoint engine", "attempt": "restore attempt", "rank": "rank",
    "t_s": "seconds from the rank's launch (the restart's clock: the span table's and the restart parts')",
    "rss_bytes": "the process's host RSS (/proc/self/statm) at that time",
    "part": "the span of span_table the sample fell in (None: between spans)",
    "resolution_s": "the sampling interval; the timeline the rank recorded keeps an even selection of the samples",
}

SETUP_KEYS = ("dtype", "device", "storage", "client", "nodes")

# -- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Excluded:
    run: Path
    status: str
    """skipped (the run was skipped by design), failed, incomplete or unreadable."""
    reason: str
    preset: str | None = None
    layout: str | None = None
    engine: str | None = None


@dataclass
class Collected:
    root: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return _frame(self.rows, TABLE_COLUMNS)

    def rank_table(self) -> pd.DataFrame:
        return _frame(self.ranks, {"run": "", "preset": "", "layout": "", "engine": "", **RANK_COLUMNS})

    def file_table(self) -> pd.DataFrame:
        return _frame(self.files, dict.fromkeys(("run_id", "run", "preset", "layout", "engine", "tag", "path",
                                                   "bytes", "kind", "rank")))

    def span_table(self) -> pd.DataFrame:
        return _frame(self.spans, SPAN_COLUMNS)

    def memory_table(self) -> pd.DataFrame:
        return _frame(self.memory, MEMORY_COLUMNS)

    def excluded_table(self) -> pd.DataFrame:
        rows = [{"run_id": _run_id(e.run, self.root), "run": str(e.run), "status": e.status, "reason": e.reason,
                 "preset": e.preset, "layout": e.layout, "engine": e.engine} for e in self.excluded]
        return _frame(rows, dict.fromkeys(("run_id", "run", "status", "reason", "preset", "layout", "engine")))

    @property
    def skipped(self) -> list[tuple[Path, str]]:
        """(run folder, 'status: reason') of every run left out."""
        return [(e.run, f"{e.status}: {e.reason}") for e in self.excluded]


def _frame(rows: list[dict[str, Any]], columns: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    order = [c for c in columns if c in frame.columns] + [c for c in frame.columns if c not in columns]
    return frame.reindex(columns=order or list(columns))


def run_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` (or ``root`` itself) holding metadata.json; run folders are not descended into."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if rundir.METADATA in filenames:
            found.append(Path(dirpath))
            dirnames.clear()
        else:
            dirnames.sort()
    return sorted(found)


def collect(root: Path | str) -> Collected:
    root = Path(root)
    collected = Collected(root=root)
    baselines = _BaselineFinder(root, collected.warnings)
    for run_dir in run_folders(root):
        try:
            _collect_run(run_dir, root, collected, baselines)
        except Exception as error:  # noqa: BLE001 - a bad run must never stop the analysis of the others
            meta = _quiet_metadata(run_dir)
            described = isinstance(error, (RunFolderError, EventFileError))  # their message names the file
            reason = str(error) if described else f"{type(error).__name__}: {error}"
            collected.excluded.append(Excluded(run_dir, "unreadable", reason, *meta))
    return collected


def _collect_run(run_dir: Path, root: Path, collected: Collected, baselines: _BaselineFinder) -> None:
    meta = _read_json(run_dir / rundir.METADATA, dict)
    status = meta.get("status")
    ident = (meta.get("preset"), meta.get("layout"), meta.get("engine"))
    if status != "complete":
        kind, reason = {
            "skipped": ("skipped", meta.get("error") or "skipped (no reason recorded)"),
            "failed": ("failed", meta.get("error") or "failed (no error recorded)"),
            "running": ("incomplete", "never finished (status 'running': killed or still going)"),
        }.get(status, ("incomplete", f"unknown status {status!r} in {run_dir / rundir.METADATA}"))
        collected.excluded.append(Excluded(run_dir, kind, reason, *ident))
        return
    config = _read_json(run_dir / rundir.CONFIG, dict)
    planned = _plan_columns(run_dir)
    runtime = meta.get("runtime") or {}
    events = read_events(run_dir)
    if not events:
        raise RunFolderError(f"{run_dir / EVENTS_FOLDER}: no events recorded, although metadata.json says complete")
    run_id = _run_id(run_dir, root)
    model, train = _section(config, "model", run_dir), _section(config, "train", run_dir)
    versions = meta.get("versions") or {}
    iteration = clean_iteration_time(events)
    dtype = model.get("dtype")
    preset = _require(meta, "preset", run_dir / rundir.METADATA)
    baseline = baselines.find(run_dir)
    common = {
        "run_id": run_id, "run": str(run_dir), "preset": preset,
        "layout": _require(meta, "layout", run_dir / rundir.METADATA),
        "tp": planned["tp"], "pp": planned["pp"], "dp": planned["dp"],
        "engine": _require(meta, "engine", run_dir / rundir.METADATA), "dtype": dtype,
        "storage": (config.get("storage") or {}).get("checkpoint_dir") or "run folder",
        "client": planned["client"],
        "ranks": meta.get("world_size"), "nodes": planned["nodes"], "device": meta.get("device"),
        "backend": planned["backend"], "gpu": runtime.get("gpu"), "host": meta.get("host"),
        "started": pd.Timestamp(meta["start"], unit="s", tz="UTC").isoformat(timespec="seconds")
        if isinstance(meta.get("start"), (int, float)) else None,
        "torch": versions.get("torch"), "deepspeed": versions.get("deepspeed"), "python": versions.get("python"),
        "restartbench": versions.get("restartbench"),
        "iters": train.get("iters"), "save_interval": train.get("save_interval"), "iteration_s": iteration,
        "predicted_bytes": _predicted_bytes(config, planned["checkpoint_bytes_estimate"]),
        "baseline_write_MBps": baseline.get("write_MBps"), "baseline_read_MBps": baseline.get("read_MBps"),
        "baseline_tool": baseline.get("tool"),
    }
    ident = {key: common[key] for key in ("run_id", "run", "preset", "layout", "engine")}
    where = {key: common[key] for key in ("run_id", "preset", "layout", "engine")}  # spans, samples: many rows

    rows, ranks, files, spans, memory = [], [], [], [], []  # kept only once the whole run has been read
    per_rank = rank_checkpoints(events)
    costs = interference(events)
    for row in checkpoints(events):
        tag_ranks = [r for r in per_rank if r["tag"] == row["tag"]]
        rows.append({**common, "kind": "checkpoint", **_checkpoint_row(row, tag_ranks, common),
                     **_cost_columns(costs.get(row["tag"], {}))})
        ranks.extend({**ident, **r} for r in tag_ranks)
    requested = {entry.get("attempt"): entry.get("requested_tag") for entry in meta.get("restarts") or []
                 if isinstance(entry, dict)}
    training_peak = training_peak_rss(events)
    for attempt in restore_attempts(events):
        info = restart(events, attempt)
        attempt_ranks = rank_restarts(events, attempt)
        row = {**_restart_row(info, attempt_ranks), "requested_tag": requested.get(attempt),
               **_resume_spike(info["peak_rss_bytes"], training_peak)}
        row["restore_layout"] = row["restore_layout"] or common["layout"]
        row["read_pct_of_storage"] = _percent(row["read_MBps"], common["baseline_read_MBps"])
        row["read_limit"] = limit_note(row["read_pct_of_storage"], row["cache"])
        rows.append({**common, "kind": "restart", **row, **critical_path(attempt_ranks, info["total_s"])})
        ranks.extend({**ident, **r} for r in attempt_ranks)
        attempt_spans = restart_spans(events, attempt)
        spans.extend({**where, **s} for s in attempt_spans)
        memory.extend({**where, **m} for m in restart_memory(events, attempt, attempt_spans))
    rows.extend({**common, "kind": "restart", **entry} for entry in _skipped_restarts(meta))
    files = [{**ident, **entry} for entry in _run_files(run_dir, events)]
    collected.rows.extend(rows)
    collected.ranks.extend(ranks)
    collected.files.extend(files)
    collected.spans.extend(spans)
    collected.memory.extend(memory)


def _skipped_restarts(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Restarts metadata.json records as skipped (an engine that cannot restart on another layout; nothing was
    launched): a row each, with the reason and no times."""
    return [{"attempt": entry.get("attempt"), "verdict": "skipped", "skip_reason": entry.get("reason"),
             "restore_layout": entry.get("restore_layout"), "restores_checkpoint": False}
            for entry in meta.get("restarts") or [] if isinstance(entry, dict) and entry.get("verdict") == "skipped"]


def _resume_spike(restore_peak: int | None, training_peak: int | None) -> dict[str, Any]:
    return {"restore_peak_rss_bytes": restore_peak, "train_peak_rss_bytes": training_peak,
            "resume_spike": restore_peak / training_peak if restore_peak and training_peak else None}


def _plan_columns(run_dir: Path) -> dict[str, Any]:
    """The table's columns from plan.json; empty for a run folder without one."""
    if not (run_dir / rundir.PLAN).exists():
        return dict.fromkeys(("tp", "pp", "dp", "client", "backend", "checkpoint_bytes_estimate")) | {"nodes": 1}
    plan = RunPlan.load(run_dir)
    return {"tp": plan.layout.get("tp"), "pp": plan.layout.get("pp"), "dp": plan.layout.get("dp"),
            "client": (plan.remote or {}).get("client"), "nodes": plan.nnodes, "backend": plan.backend,
            "checkpoint_bytes_estimate": plan.checkpoint_bytes_estimate}


def _checkpoint_row(row: dict[str, Any], ranks: list[dict[str, Any]], common: dict[str, Any]) -> dict[str, Any]:
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
        "write_pct_of_storage": _percent(write_mbps, common["baseline_write_MBps"]),
        "write_limit": limit_note(_percent(write_mbps, common["baseline_write_MBps"])),
        "save_MiBps": row["bytes"] / MiB / durable if durable else None,
    }


def _cost_columns(cost: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's interference (``results.interference``) as table columns."""
    return {column: cost.get(column) for column in ("overlapped_iterations", "slowdown_s", "cost_s",
                                                    "background_seen")}


def _percent(rate: float | None, baseline: float | None) -> float | None:
    """``rate`` as a percentage of the storage's measured bandwidth; None where either is missing."""
    return 100 * rate / baseline if rate is not None and baseline else None


#: Above this share of its measured limit (percent) a throughput says the limit was measured too low (issue 18).
LIMIT_TOLERANCE_PCT = 105.0
LIMIT_UNDERESTIMATED = "limit underestimated"
WARM_CACHE = "warm cache"


def limit_note(pct: float | None, cache: str | None = None) -> str | None:
    """What a throughput above ``LIMIT_TOLERANCE_PCT`` of the storage's baseline means: the baseline is too low
    (``LIMIT_UNDERESTIMATED``), unless a warm page cache answered the reads (``WARM_CACHE``); None at or below it."""
    if pct is None or not pct > LIMIT_TOLERANCE_PCT:
        return None
    return WARM_CACHE if cache == "warm" else LIMIT_UNDERESTIMATED


def _flagged(notes: pd.Series) -> str | None:
    """A summary's note: the most frequent flag and how many of the group's rows carry it (None: none does)."""
    flagged = notes.dropna()
    if flagged.empty:
        return None
    return f"{flagged.mode().iloc[0]} ({len(flagged)} of {len(notes)})"


def _restart_row(info: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    parts = info["parts"]
    load = parts.get("ckpt load")
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
        "read_MBps": info["bytes_read"] / MB / load if load and info["bytes_read"] else None,
        "load_MiBps": info["bytes_read"] / MiB / load if load and info["bytes_read"] else None,
        "cache": info["cache"], "resident_fraction": info["resident_fraction"], "exact": info["exact"],
        "peak_rss_part": info["peak_rss_part"], "ds_init_parts": info["ds_init"],
        "restore_layout": info["restore_layout"], "loss_diff": info["loss_diff"],
        **{f"convert_{name}": info[f"convert_{name}"] for name in RELAYOUT_CONVERSION},
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


def rank_restarts(events: list[dict[str, Any]], attempt: int = 1) -> list[dict[str, Any]]:
    """One row per rank of one restore attempt: launch -> end of first resumed iteration, each part, bytes read,
    ``ready_s`` (launch -> start of its first resumed iteration) and its ``deepspeed.initialize`` in stages."""
    labels = dict(RESTART_PARTS)
    columns = {label: column for column, label in RESTART_PART_COLUMNS}
    rows: dict[int, dict[str, Any]] = {}
    for e in attempt_events(events, attempt):
        row = rows.setdefault(e["rank"], {"kind": "restart", "tag": None, "attempt": attempt, "rank": e["rank"],
                                          "restart_s": None,
                                          "ready_s": None, **{c: None for c, _ in RESTART_PART_COLUMNS},
                                          "verify_s": None, "bytes_read": None, "files_read": None,
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
        elif name == Event.RESTORE_VERIFY:
            row["verify_s"] = e["duration_s"]
        elif name == Event.STARTUP_DS_INITIALIZE:
            row["ds_init_parts"] = ds_init_breakdown([e])
    for row in rows.values():
        launch, first, end = row.pop("_launch"), row.pop("_first", None), row.pop("_end", None)
        row["restart_s"] = end - launch if launch is not None and end is not None else None
        row["ready_s"] = first - launch if launch is not None and first is not None else None
    return [rows[rank] for rank in sorted(rows)]


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
    restore = attempt_events(events, attempt)
    launches = _launches(restore)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for span in spans:
        by_rank.setdefault(span["rank"], []).append(span)
    rows = []
    for e in restore:
        if e["event"] != Event.RANK_MEMORY or e["rank"] not in launches or not e.get("timeline"):
            continue
        offset = e["process_start"] - launches[e["rank"]]
        for since_start, rss in e["timeline"]:
            t = since_start + offset
            rows.append({"attempt": attempt, "rank": e["rank"], "t_s": t, "rss_bytes": rss,
                         "part": _part_at(by_rank.get(e["rank"], []), t), "resolution_s": e.get("resolution_s")})
    return rows


def _launches(restore: list[dict[str, Any]]) -> dict[int, float]:
    """rank -> its launch (wall clock): the start of its ``process.start`` span, the restart's zero."""
    return {e["rank"]: e["start"] for e in restore if e["event"] == Event.PROCESS_START}


def _part_at(spans: list[dict[str, Any]], t: float) -> str | None:
    """The span (of one rank) that holds time ``t``; at the boundary of two, the later."""
    holding = [s for s in spans if s["start_s"] <= t <= s["end_s"]]
    return max(holding, key=lambda s: s["start_s"])["part"] if holding else None


def max_over_ranks(samples: pd.DataFrame) -> pd.DataFrame:
    """One restore attempt's ``memory_table`` rows as one line, ``t_s`` and ``rss_bytes``: at each rank's sample time
    the largest RSS of any rank, each rank holding its last sample until its next (ranks sample at their own times);
    a rank counts from its first sample to its last."""
    if samples.empty:
        return pd.DataFrame(columns=["t_s", "rss_bytes"])
    wide = samples.pivot_table(index="t_s", columns="rank", values="rss_bytes", aggfunc="max").sort_index()
    held = wide.ffill().where(wide.bfill().notna())
    return held.max(axis=1).rename("rss_bytes").rename_axis("t_s").reset_index()


def critical_path(ranks: list[dict[str, Any]], total: float | None) -> dict[str, Any]:
    """The parts of the last rank ready to train (``path_*`` columns), adding up to ``total``, and its
    ``deepspeed.initialize`` in stages (``path_ds_init_parts``)."""
    ready = [r for r in ranks if r["ready_s"] is not None]
    if not ready or total is None:
        return {"path_rank": None, **{column: None for column, _ in PATH_COLUMNS}, "path_ds_init_parts": None}
    rank = max(ready, key=lambda r: r["ready_s"])
    by_label = {label: rank[column] for column, label in RESTART_PART_COLUMNS}
    path = {label: by_label.get(label) for label in PATH_PARTS if label not in ("verify", "gaps", "1st iter")}
    path["verify"] = rank["verify_s"]
    path["1st iter"] = max(total - rank["ready_s"], 0.0)
    path["gaps"] = max(rank["ready_s"] - sum(v for k, v in path.items() if v is not None and k != "1st iter"), 0.0)
    return {"path_rank": rank["rank"], **{column: path.get(label) for column, label in PATH_COLUMNS},
            "path_ds_init_parts": rank["ds_init_parts"]}


def _run_files(run_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checkpoint files (with a tag) from inventory.json, or from the durable events where there is none."""
    path = run_dir / rundir.INVENTORY
    if path.exists():
        entries = _read_json(path, list)
        try:
            return [{"tag": e["tag"], "path": e["path"], "bytes": e["bytes"],
                     "kind": e.get("kind") or file_kind(e["path"]), "rank": e.get("rank")}
                    for e in entries if e.get("tag") is not None]
        except (KeyError, TypeError) as error:
            raise RunFolderError(f"{path}: an entry lacks {error} (expected tag, path, bytes, kind, rank)") from None
    return [{"tag": e["tag"], "path": f["path"], "bytes": f["bytes"], "kind": file_kind(f["path"]), "rank": e["rank"]}
            for e in events if e["event"] == Event.CHECKPOINT_DURABLE for f in e.get("files", [])]


# -- small helpers -----------------------------------------------------------------------------------


def _read_json(path: Path, expected: type | None = None) -> Any:
    try:
        value = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except json.JSONDecodeError as error:
        raise RunFolderError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunFolderError(f"{path}: cannot be read ({error})") from None
    if expected is not None and not isinstance(value, expected):
        raise RunFolderError(f"{path}: expected a JSON {'object' if expected is dict else 'array'}, "
                             f"got {type(value).__name__}")
    return value


def _require(mapping: dict[str, Any], key: str, path: Path) -> Any:
    if mapping.get(key) is None:
        raise RunFolderError(f"{path}: lacks the field {key!r}")
    return mapping[key]


def _section(config: dict[str, Any], name: str, run_dir: Path) -> dict[str, Any]:
    section = config.get(name) or {}
    if not isinstance(section, dict):
        raise RunFolderError(f"{run_dir / rundir.CONFIG}: section {name!r} should be an object")
    return section


def _quiet_metadata(run_dir: Path) -> tuple[str | None, str | None, str | None]:
    """(preset, layout, engine) of a run that could not be read, from metadata.json or else the folder names."""
    try:
        meta = json.loads((run_dir / rundir.METADATA).read_text())
        return meta.get("preset"), meta.get("layout"), meta.get("engine")
    except Exception:  # noqa: BLE001
        parts = run_dir.parts
        return tuple(parts[-4:-1]) if len(parts) >= 4 else (None, None, None)  # type: ignore[return-value]


def _run_id(run_dir: Path, root: Path) -> str:
    rel = os.path.relpath(run_dir, root)
    return run_dir.resolve().name if rel == "." else rel


def _median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _predicted_bytes(config: dict[str, Any], planned: Any) -> int | None:
    """The checkpoint plan's size for the run's configuration and engine (restartbench.plan, to the byte where the
    format allows; cached); the run's own plan.json figure where this version cannot predict it (a preset or
    option it does not know)."""
    try:
        return checkpoint_bytes(RunConfig.from_dict(config))
    except Exception:  # noqa: BLE001 - a config this version cannot read or predict
        return planned


class _BaselineFinder:
    """baseline.json of a run folder or its nearest ancestor up to the root; each folder looked at once."""

    def __init__(self, root: Path, warnings: list[str]):
        self.root = Path(os.path.abspath(root))
        self.warnings = warnings
        self.cache: dict[Path, dict[str, Any]] = {}

    def find(self, run_dir: Path) -> dict[str, Any]:
        folder = Path(os.path.abspath(run_dir))
        chain = []
        while True:
            if folder in self.cache:
                found = self.cache[folder]
                break
            chain.append(folder)
            found = self._read(folder / BASELINE_FILE)
            if found or folder == self.root or folder.parent == folder or self.root not in folder.parents:
                break
            folder = folder.parent
        for seen in chain:
            self.cache[seen] = found
        return found

    def _read(self, path: Path) -> dict[str, Any]:
        if not path.exists():
            return {}
        try:
            value = _read_json(path, dict)
        except RunFolderError as error:
            self.warnings.append(f"{error}; baseline ignored")
            return {}
        numbers = {k: value.get(k) for k in ("write_MBps", "read_MBps")}
        if not any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in numbers.values()):
            self.warnings.append(f"{path}: needs a positive write_MBps or read_MBps (MB/s); baseline ignored")
            return {}
        clean = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None
                 for k, v in numbers.items()}
        return {**clean, "tool": str(value.get("tool") or "unnamed tool"), "path": str(path)}


# -- aggregation shared by the console summary, the report and the notebooks ---------------------------


def group_keys(table: pd.DataFrame) -> list[str]:
    """preset, layout, the setup columns that vary in this table (dtype, device, storage, nodes), engine."""
    varying = [key for key in SETUP_KEYS if key in table.columns and table[key].nunique(dropna=False) > 1]
    return ["preset", "layout", *varying, "engine"]


def engine_order(engines: Iterable[str]) -> list[str]:
    """The registry's order (none, torch, ...) for known engines, then the others alphabetically."""
    known = engine_names()
    present = set(engines)
    return [e for e in known if e in present] + sorted(present - set(known))


def sort_rows(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows sorted by ``keys``, engines in the registry's order (none, torch, ...) rather than by name."""
    if frame.empty or "engine" not in frame.columns:
        return frame.reset_index(drop=True)
    order = {engine: i for i, engine in enumerate(engine_order(frame["engine"].unique()))}
    others = [k for k in keys if k != "engine"]
    return (frame.assign(_engine_order=frame["engine"].map(order))
            .sort_values([*others, "_engine_order"], kind="stable")
            .drop(columns="_engine_order").reset_index(drop=True))


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
    ckpt = _seen_columns(ckpt)
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
        write_limit=("write_limit", _flagged), iteration_s=("iteration_s", "median"),
        stall_iterations=("stall_iterations", "median"), stall_overhead_pct=("stall_overhead_pct", "median"),
        baseline_write_MBps=("baseline_write_MBps", "median"),
        seen_checkpoints=("_seen", "sum"), **{f"_seen_{c}": (f"_seen_{c}", "median") for c in _INTERFERENCE},
        **{f"_all_{c}": (c, "median") for c in _INTERFERENCE},
    ).reset_index()
    for column in _INTERFERENCE:
        seen, every = summary.pop(f"_seen_{column}"), summary.pop(f"_all_{column}")
        summary[column] = seen.where(summary["seen_checkpoints"] > 0, every)
    summary["cost_s"] = [whole_cost(stall, slowdown) if pd.notna(stall) and pd.notna(slowdown) else None
                         for stall, slowdown in zip(summary["stall_s"], summary["slowdown_s"])]
    after_stall = ["slowdown_s", "cost_s", "overlapped_iterations", "seen_checkpoints"]
    rest = [c for c in summary.columns if c not in after_stall]
    at = rest.index("stall_rank_spread_s") + 1
    return sort_rows(summary[[*rest[:at], *after_stall, *rest[at:]]], keys)


#: A checkpoint's interference columns (``results.interference``) that ``checkpoint_summary`` takes medians of.
_INTERFERENCE = ("overlapped_iterations", "slowdown_s")


def _seen_columns(ckpt: pd.DataFrame) -> pd.DataFrame:
    """``_seen`` (background_seen, absent counted False) and ``_seen_<column>``: the interference figures of those
    checkpoints only (NaN elsewhere)."""
    seen = ckpt["background_seen"].eq(True) if "background_seen" in ckpt else pd.Series(False, index=ckpt.index)
    numbers = {c: pd.to_numeric(ckpt[c], errors="coerce") if c in ckpt else pd.Series(float("nan"), index=ckpt.index)
               for c in _INTERFERENCE}
    return ckpt.assign(_seen=seen.astype(int), **numbers, **{f"_seen_{c}": numbers[c].where(seen)
                                                              for c in _INTERFERENCE})


def restart_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: medians over runs and their restore attempts of the restart
    and each part (max over ranks). Attempts that restored nothing (refused, failed) are counted in ``attempts`` and
    ``verdicts`` but have no times in the medians: their start-up was cut short. Restarts on another layout are left
    out (``relayout_summary``)."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = same_layout_restarts(table)
    if restarts.empty:
        return pd.DataFrame(columns=[*keys, "runs", "attempts", "restart_s"])
    verdicts = restarts.groupby(keys, dropna=False).agg(attempts=("run_id", "size"),
                                                        verdicts=("verdict", _verdict_counts)).reset_index()
    timed = restarts[restarts["restart_s"].notna()]
    timed = timed.assign(rank_spread_s=timed["restart_s"] - timed["restart_min_s"])
    grouped = timed.groupby(keys, dropna=False)
    summary = grouped.agg(
        runs=("run_id", "nunique"), ranks=("ranks", "max"), restart_s=("restart_s", "median"),
        restart_min_s=("restart_s", "min"), restart_max_s=("restart_s", "max"),
        rank_spread_s=("rank_spread_s", "median"),
        **{column: (column, "median") for column, _ in RESTART_PART_COLUMNS},
        **{column: (column, "median") for column, _ in PATH_COLUMNS if column in restarts},
        bytes_read=("bytes_read", "median"), files_read=("files_read", "median"), read_MBps=("read_MBps", "median"),
        read_pct_of_storage=("read_pct_of_storage", "median"), read_limit=("read_limit", _flagged),
        restores_checkpoint=("restores_checkpoint", "any"),
        cache=("cache", lambda s: ", ".join(sorted({str(v) for v in s.dropna()})) or None),
        exact=("exact", lambda s: None if s.isna().all() else bool(s.dropna().astype(bool).all())),
        baseline_read_MBps=("baseline_read_MBps", "median"),
        restore_peak_rss_bytes=("restore_peak_rss_bytes", "median"), resume_spike=("resume_spike", "median"),
    ).reset_index()
    summary = verdicts.merge(summary, on=keys, how="left")
    return sort_rows(summary[[*keys, "runs", "attempts", "verdicts", *summary.columns.drop([*keys, "runs",
                                                                                            "attempts", "verdicts"])]],
                     keys)


def same_layout_restarts(table: pd.DataFrame) -> pd.DataFrame:
    """The restart rows of restarts on the run's own layout."""
    if table.empty:
        return table
    restarts = table[table["kind"] == "restart"]
    if "restore_layout" not in restarts.columns:
        return restarts
    return restarts[restarts["restore_layout"].isna() | (restarts["restore_layout"] == restarts["layout"])]


#: The columns of ``relayout_summary``, each a median over the attempts that restarted (max over ranks).
RELAYOUT_COLUMNS = ("restart_s", "restart_convert_s", "restart_ckpt_load_s", "convert_bytes_read",
                    "convert_bytes_written", "convert_files_written", "bytes_read", "process_bytes_read", "loss_diff")


def relayout_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (the one saved on), engine and the layout restarted on (the run's own included, for
    comparison): attempts, verdicts (skipped ones with their reason) and the medians of ``RELAYOUT_COLUMNS``: a
    conversion plus load set against a restart on the same layout, or a direct reshard at load."""
    keys = [*(group_keys(table) if not table.empty else ["preset", "layout", "engine"]), "restore_layout"]
    if table.empty or "restore_layout" not in table.columns:
        return pd.DataFrame(columns=[*keys, "attempts", "verdicts", *RELAYOUT_COLUMNS])
    restarts = table[table["kind"] == "restart"]
    if "skip_reason" not in restarts:  # no attempt was skipped
        restarts = restarts.assign(skip_reason=None)
    counted = restarts.groupby(keys, dropna=False).agg(
        attempts=("run_id", "size"), verdicts=("verdict", _verdict_counts),
        skip_reason=("skip_reason", lambda s: next(iter(s.dropna()), None))).reset_index()
    timed = restarts[restarts["restart_s"].notna()]
    medians = timed.groupby(keys, dropna=False).agg(
        **{column: (column, "median") for column in RELAYOUT_COLUMNS if column in timed}).reset_index()
    summary = counted.merge(medians, on=keys, how="left")
    return sort_rows(summary[[*summary.columns.drop("skip_reason"), "skip_reason"]], keys)


def typical_restarts(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: the one timed restore attempt whose restart is nearest its
    configuration's median (the first in the table on a tie): the restart a figure of one restart draws."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = same_layout_restarts(table)
    timed = restarts[restarts["restart_s"].notna()] if not restarts.empty else restarts
    if timed.empty:
        return timed
    distance = (timed["restart_s"] - timed.groupby(keys, dropna=False)["restart_s"].transform("median")).abs()
    nearest = timed.assign(_distance=distance).sort_values("_distance", kind="stable")
    return sort_rows(nearest.groupby(keys, dropna=False, sort=False).head(1).drop(columns="_distance"), keys)


def _verdict_counts(verdicts: pd.Series) -> str:
    """'3 exact, 1 refused': each verdict of the attempts with its count, most frequent first."""
    counts = verdicts.astype(object).fillna("unknown").value_counts()
    return ", ".join(f"{count} {verdict}" for verdict, count in counts.items())


def ds_init_summary(table: pd.DataFrame, top: int = 5, column: str = "ds_init_parts") -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: ``deepspeed.initialize``'s stages as medians over runs and
    restore attempts: the ``top`` slowest stages by name, the rest as ``other stages``, then ``collective wait`` and
    ``other``, and ``parts_sum_s``, their sum. From ``ds_init_parts`` (the default) each stage is its max over ranks,
    so the sum can exceed any one rank's call; from ``path_ds_init_parts`` the stages are the critical rank's, those
    of the restart figure's ds init bar. Empty where no restart timed the stages."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = table[(table["kind"] == "restart") & table[column].notna()] \
        if not table.empty and column in table.columns else table.iloc[0:0]
    if restarts.empty:
        return pd.DataFrame(columns=[*keys, "parts_sum_s"])
    parts = pd.DataFrame(restarts[column].tolist(), index=restarts.index).fillna(0.0)
    medians = parts.join(restarts[keys]).groupby(keys, dropna=False).median().reset_index()
    fixed = [c for c in ("collective wait", "other") if c in medians]
    stages = [c for c in medians.columns if c not in (*keys, *fixed)]
    ranked = sorted(stages, key=lambda c: -medians[c].max())
    summary = medians[[*keys, *ranked[:top]]].assign(**{"other stages": medians[ranked[top:]].sum(axis=1)})
    summary = summary.join(medians[fixed])
    return summary.assign(parts_sum_s=summary.drop(columns=keys).sum(axis=1))


#: Columns of ``goodput_table`` (after the grouping keys) and what each holds.
GOODPUT_COLUMNS: dict[str, str] = {
    "runs": "runs measured",
    "cost_s": "C: a checkpoint's whole cost to training, the stall (max over ranks) plus the slowdown of the "
              "iterations its background work overlapped (an asynchronous engine's copy and write; 0 for a "
              "synchronous engine), each the median over checkpoints and runs (checkpoint_summary's cost_s)",
    "cost_basis": "what C is made of (checkpoint_cost): stall + slowdown",
    "restart_s": "R: the restart, max over ranks of launch -> end of the first resumed iteration (median over runs), "
                 "as measured on this machine",
    "iteration_s": "the clean median: median phase-1 iteration time (max over ranks) over the iterations that "
                   "overlapped no checkpoint's background work",
    "failures_per_gpu_hour": "F: failures per GPU-hour (--failures-per-gpu-hour; default Llama 3's)",
    "gpus": "G: GPUs of the job the failure rate applies to (--gpus, else the run's own world size)",
    "mtbf_s": "M = 3600 / (F · G): mean time between failures of the job, seconds",
    "interval_s": "τ*: Daly's optimal training time between checkpoints (never below one iteration), seconds",
    "interval_iterations": "τ* in iterations: interval_s / iteration_s",
    "checkpoint_pct": "share of wall time spent in checkpoints at τ*: C / (τ* + C), percent",
    "rework_pct": "share of wall time re-doing work lost at failures at τ*: (τ* + C) / 2M, percent",
    "restart_pct": "share of wall time restarting after failures: R / M, percent",
    "goodput_pct": "share of wall time that is training progress kept: 100 minus the three shares, percent",
}


def checkpoint_cost(summary: pd.DataFrame) -> tuple[pd.Series, str]:
    """C, each configuration's checkpoint cost to training, from ``checkpoint_summary``, and what it is made of: the
    whole cost, stall + slowdown of the iterations a save's background work overlapped (``results.interference``).
    Where no slowdown could be measured (no clean iteration to compare with) C is unknown, not the stall alone."""
    return summary["cost_s"], "stall + slowdown"


def goodput_assumptions(failures_per_gpu_hour: float, gpus: int | None) -> str:
    """The goodput model's assumptions in one line, for every figure and table that shows it."""
    source = " (Llama 3: 419 interruptions in 54 days on 16,384 H100s)" \
        if failures_per_gpu_hour == goodput.LLAMA3_FAILURES_PER_GPU_HOUR else ""
    where = f"{gpus} GPUs" if gpus else "each run's own world size in GPUs"
    return (f"Young/Daly model: failures at a constant {failures_per_gpu_hour:.3g} per GPU-hour{source} on {where}; "
            "C = the whole cost of a checkpoint: its stall plus the slowdown of the iterations its background work "
            "overlapped; R = the restart as measured on this machine")


def goodput_table(table: pd.DataFrame, failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                  gpus: int | None = None) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: the checkpoint interval and goodput that the measured cost C
    (``checkpoint_cost``) and restart R imply at ``failures_per_gpu_hour`` on ``gpus`` GPUs (None: each
    configuration's own world size), by ``restartbench.goodput`` (``GOODPUT_COLUMNS``). Configurations without a
    checkpoint (engine none), a restart total or an iteration time (emulated runs) have none and are left out."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    ckpt, rest = checkpoint_summary(table), restart_summary(table)
    if ckpt.empty or rest.empty:
        return pd.DataFrame(columns=[*keys, *GOODPUT_COLUMNS])
    cost, basis = checkpoint_cost(ckpt)
    merged = ckpt[[*keys, "runs", "ranks", "iteration_s"]].assign(cost_s=cost, cost_basis=basis).merge(
        rest[[*keys, "restart_s"]], on=keys, how="inner").dropna(subset=["cost_s", "restart_s", "iteration_s"])
    rows = [{**row, **_goodput_row(row, failures_per_gpu_hour, gpus)} for row in merged.to_dict("records")]
    return sort_rows(pd.DataFrame(rows).reindex(columns=[*keys, *GOODPUT_COLUMNS]), keys)


def _goodput_row(row: dict[str, Any], failures_per_gpu_hour: float, gpus: int | None) -> dict[str, Any]:
    count = int(gpus or row["ranks"])
    mtbf = goodput.mtbf_s(failures_per_gpu_hour, count)
    budget = goodput.at_optimum(row["cost_s"], row["restart_s"], mtbf, row["iteration_s"])
    return {"failures_per_gpu_hour": failures_per_gpu_hour, "gpus": count, "mtbf_s": mtbf,
            "interval_s": budget.interval_s, "interval_iterations": budget.interval_s / row["iteration_s"],
            "checkpoint_pct": 100 * budget.checkpoint_share, "rework_pct": 100 * budget.rework_share,
            "restart_pct": 100 * budget.restart_share, "goodput_pct": 100 * budget.goodput}


def start_up_floor(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset and layout (and varying setup): the median restart of engine none (nothing restored)."""
    restarts = table[(table["kind"] == "restart") & (table["restores_checkpoint"] == False)] \
        if not table.empty and "restores_checkpoint" in table.columns else table.iloc[0:0]  # noqa: E712
    keys = [k for k in group_keys(table) if k != "engine"] if not table.empty else ["preset", "layout"]
    if restarts.empty:
        return pd.DataFrame(columns=[*keys, "floor_s"])
    return restarts.groupby(keys, dropna=False)["restart_s"].median().rename("floor_s").reset_index()


def file_statistics(files: pd.DataFrame) -> pd.DataFrame:
    """Per run, checkpoint tag and file kind: count and size distribution (min / median / max bytes)."""
    if files.empty:
        return pd.DataFrame(columns=["preset", "layout", "engine", "run_id", "tag", "kind", "files", "total_bytes",
                                     "min_bytes", "median_bytes", "max_bytes"])
    checkpoint_files = files[files["tag"].notna()]
    grouped = checkpoint_files.groupby(["preset", "layout", "engine", "run_id", "tag", "kind"])["bytes"]
    return grouped.agg(files="count", total_bytes="sum", min_bytes="min", median_bytes="median",
                       max_bytes="max").reset_index()


def files_per_rank(files: pd.DataFrame) -> pd.DataFrame:
    """Per run, checkpoint tag and writing rank: files and bytes in total and per kind."""
    columns = ["preset", "layout", "engine", "run_id", "tag", "rank", "files", "bytes",
               *[f"{k}_bytes" for k in FILE_KINDS]]
    if files.empty:
        return pd.DataFrame(columns=columns)
    data = files[files["tag"].notna()].assign(rank=lambda f: f["rank"].astype("Int64"))
    keys = ["preset", "layout", "engine", "run_id", "tag", "rank"]
    totals = data.groupby(keys, dropna=False)["bytes"].agg(files="count", bytes="sum")
    by_kind = data.pivot_table(index=keys, columns="kind", values="bytes", aggfunc="sum", fill_value=0, dropna=False)
    by_kind = by_kind.reindex(columns=list(FILE_KINDS), fill_value=0).add_suffix("_bytes")
    return totals.join(by_kind).reset_index().reindex(columns=columns).fillna(
        {f"{k}_bytes": 0 for k in FILE_KINDS})


def file_summary(files: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout, engine and file kind: files per checkpoint, per rank, and the size distribution."""
    columns = ["preset", "layout", "engine", "kind", "files_per_checkpoint", "files_per_rank_max", "min_bytes",
               "median_bytes", "max_bytes", "bytes_per_checkpoint"]
    if files.empty:
        return pd.DataFrame(columns=columns)
    data = files[files["tag"].notna()]
    keys = ["preset", "layout", "engine"]
    per_ckpt = data.groupby([*keys, "run_id", "tag", "kind"])["bytes"].agg(n="count", total="sum").reset_index()
    per_rank = data.groupby([*keys, "run_id", "tag", "kind", "rank"], dropna=False).size().rename("n").reset_index()
    sizes = data.groupby([*keys, "kind"])["bytes"].agg(min_bytes="min", median_bytes="median", max_bytes="max")
    summary = (per_ckpt.groupby([*keys, "kind"]).agg(files_per_checkpoint=("n", "median"),
                                                     bytes_per_checkpoint=("total", "median"))
               .join(per_rank.groupby([*keys, "kind"])["n"].max().rename("files_per_rank_max"))
               .join(sizes).reset_index())
    total = (per_ckpt.groupby([*keys, "run_id", "tag"]).agg(n=("n", "sum"), total=("total", "sum")).reset_index()
             .groupby(keys).agg(files_per_checkpoint=("n", "median"), bytes_per_checkpoint=("total", "median")))
    all_rank = data.groupby([*keys, "run_id", "tag", "rank"], dropna=False).size().groupby(keys).max()
    total = total.join(all_rank.rename("files_per_rank_max")).join(
        data.groupby(keys)["bytes"].agg(min_bytes="min", median_bytes="median", max_bytes="max")).reset_index()
    summary = pd.concat([summary, total.assign(kind="all")], ignore_index=True)
    kind_order = {k: i for i, k in enumerate((*FILE_KINDS, "all"))}
    summary = summary.assign(_k=summary["kind"].map(lambda k: kind_order.get(k, len(kind_order))))
    return sort_rows(summary.sort_values("_k", kind="stable").drop(columns="_k"), ["preset", "layout", "engine"]) \
        .reindex(columns=columns)


def rank_spread(rank_table: pd.DataFrame) -> pd.DataFrame:
    """Per run and checkpoint tag (and per restart): the per-rank min, median and max of each figure, and the
    slowest rank (``<figure>_slowest_rank``)."""
    keys = ["preset", "layout", "engine", "run_id", "kind", "tag"]
    if rank_table.empty:
        return pd.DataFrame(columns=keys)
    metrics = [m for m in ("stall_s", "durable_s", "bytes", "files", "restart_s", "bytes_read") if m in rank_table]
    grouped = rank_table.groupby(keys, dropna=False, sort=False)
    spread = grouped[metrics].agg(["min", "median", "max"])
    spread.columns = [f"{metric}_{stat}" for metric, stat in spread.columns]
    spread = spread.dropna(axis=1, how="all").reset_index()
    for metric in ("stall_s", "durable_s", "restart_s"):
        if metric not in rank_table:
            continue
        slowest = (rank_table.dropna(subset=[metric]).sort_values(metric, ascending=False, kind="stable")
                   .drop_duplicates(keys)[[*keys, "rank"]].rename(columns={"rank": f"{metric}_slowest_rank"}))
        spread = spread.merge(slowest, on=keys, how="left")
        spread[f"{metric}_slowest_rank"] = spread[f"{metric}_slowest_rank"].astype("Int64")
    return spread


def engine_comparison(table: pd.DataFrame, preset: str | None = None, layout: str | None = None) -> pd.DataFrame:
    """One row per engine for a preset and layout: stall, slowdown and whole cost, durable, committed, throughput,
    restart and its load part, and each engine's stall relative to the least-stalling engine."""
    selected = select(table, preset, layout)
    ckpt = checkpoint_summary(selected)
    rest = restart_summary(selected)
    keys = [k for k in group_keys(selected) if k in ckpt.columns and k in rest.columns] if not selected.empty \
        else ["engine"]
    keep_c = [*keys, "runs", "checkpoints", "stall_s", "slowdown_s", "cost_s", "stall_rank_spread_s", "durable_s",
              "committed_s",
              "stall_overhead_pct", "bytes", "files", "write_MBps", "write_pct_of_storage", "write_limit"]
    keep_r = [*keys, "restart_s", "restart_ckpt_load_s", "read_MBps", "read_pct_of_storage", "read_limit", "cache",
              "exact"]
    merged = pd.merge(ckpt.reindex(columns=keep_c).drop(columns="runs"), rest.reindex(columns=keep_r),
                      on=keys, how="outer")
    if not selected.empty:
        runs = selected.groupby(keys, dropna=False)["run_id"].nunique().rename("runs").reset_index()
        merged = runs.merge(merged, on=keys, how="right")
    if "stall_s" in merged and merged["stall_s"].notna().any():
        best = merged.groupby([k for k in keys if k != "engine"], dropna=False)["stall_s"].transform("min")
        merged["stall_vs_best"] = merged["stall_s"] / best
    return sort_rows(merged, keys)


def select(table: pd.DataFrame, preset: str | None = None, layout: str | None = None,
           engines: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows of one preset / layout / engines (None: all); a layout may be given as tp2pp2 or tp2pp2dp1."""
    if table.empty:
        return table
    mask = pd.Series(True, index=table.index)
    if preset is not None:
        mask &= table["preset"] == preset
    if layout is not None:
        mask &= (table["layout"] == layout) | (table["layout"] == _canonical(layout, table))
    if engines is not None:
        mask &= table["engine"].isin(list(engines))
    return table[mask]


def _canonical(layout: str, table: pd.DataFrame) -> str:
    """tp2pp2 -> the table's tp2pp2dp<N> (dp1 preferred where the name leaves dp open)."""
    try:
        spec = parse_layout(layout)
    except ValueError:
        return layout
    if spec.dp is not None:
        return f"tp{spec.tp}pp{spec.pp}dp{spec.dp}"
    prefix = f"tp{spec.tp}pp{spec.pp}dp"
    matches = sorted(name for name in table["layout"].dropna().unique() if str(name).startswith(prefix))
    return prefix + "1" if prefix + "1" in matches or not matches else matches[0]


LOGS_ENV = "RESTARTBENCH_LOGS"


def logs_from_env(default: str = "logs") -> Path:
    """The logs root for notebooks: $RESTARTBENCH_LOGS, else ``default``; a relative path that does not exist here
    is also tried one folder up (a notebook runs in notebooks/, the logs live at the repository root)."""
    path = Path(os.environ.get(LOGS_ENV) or default).expanduser()
    if not path.is_absolute() and not path.exists() and (Path.cwd().parent / path).exists():
        path = Path.cwd().parent / path
    return path


def pick_configuration(table: pd.DataFrame) -> tuple[str | None, str | None]:
    """The (preset, layout) with the most engines measured (ties: most runs, then name)."""
    if table.empty:
        return None, None
    counts = table.groupby(["preset", "layout"]).agg(engines=("engine", "nunique"), runs=("run_id", "nunique"))
    counts = counts.sort_values(["engines", "runs"], ascending=False, kind="stable")
    preset, layout = counts.index[0]
    return preset, layout


def size_check(table: pd.DataFrame, files: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted checkpoint size (restartbench.plan's total for the run's engine, via estimate.checkpoint_bytes)
    against the measured one, per preset, layout, dtype and engine; with the files, weights (layer + model files)
    and optimizer files against the rough rule P·w and P·12 bytes (the plan's exact per-kind bytes are in
    ``python -m restartbench.plan``)."""
    ckpt = table[table["kind"] == "checkpoint"] if not table.empty else table
    keys = ["preset", "layout", "dtype", "engine"]
    if ckpt.empty:
        return pd.DataFrame(columns=[*keys, "predicted_bytes", "measured_bytes", "measured_vs_predicted"])
    summary = ckpt.groupby(keys, dropna=False).agg(
        runs=("run_id", "nunique"), checkpoints=("tag", "size"), predicted_bytes=("predicted_bytes", "first"),
        measured_bytes=("bytes", "median"), measured_min=("bytes", "min"), measured_max=("bytes", "max"),
    ).reset_index()
    summary["measured_vs_predicted"] = summary["measured_bytes"] / summary["predicted_bytes"]

    def params(preset: str) -> float:
        try:
            return float(get_preset(preset).param_count())
        except Exception:  # noqa: BLE001
            return math.nan

    summary["params"] = summary["preset"].map(params)
    summary["predicted_weights_bytes"] = summary["params"] * summary["dtype"].map(
        lambda d: weight_bytes(d) if isinstance(d, str) else math.nan)
    summary["predicted_optimizer_bytes"] = summary["params"] * OPTIMIZER_BYTES_PER_PARAM
    if files is not None and not files.empty:
        parts = {"layer": "weights", "model": "weights", "optimizer": "optimizer"}
        data = files[files["tag"].notna()].assign(part=lambda f: f["kind"].map(parts).fillna("other"))
        per_ckpt = data.groupby(["run_id", "tag", "part"])["bytes"].sum().unstack("part", fill_value=0)
        per_ckpt = per_ckpt.reindex(columns=["weights", "optimizer", "other"], fill_value=0).reset_index()
        meta = ckpt[["run_id", "tag", *keys]].drop_duplicates()
        parts = meta.merge(per_ckpt, on=["run_id", "tag"], how="inner")
        medians = parts.groupby(keys, dropna=False)[["weights", "optimizer", "other"]].median() \
            .add_prefix("measured_").add_suffix("_bytes").reset_index()
        summary = summary.merge(medians, on=keys, how="left")
    return sort_rows(summary, ["preset", "layout", "dtype", "engine"])

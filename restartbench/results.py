"""Read a run folder's structured results: checkpoints, restart phases, file inventory.

Aggregation rules (the same everywhere a figure is printed):
- a checkpoint's stall is the max over ranks of the time ``save`` blocked training;
- its durable time is the max over ranks of the time from the start of the save until that
  rank's files were on stable storage (fsync'd) — for an asynchronous engine, when its
  background write finished; ``committed_s`` is when rank 0 then wrote ``latest``;
- a restart's time is, over ranks, the max of (end of the first resumed iteration − launch);
  each restart part is reported as its max over ranks, so parts need not add up to the total.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from restartbench import rundir, storage
from restartbench.events import CHECKPOINT_PREFIX, Event, read_events
from restartbench.integrity import MANIFEST
from restartbench.rundir import RunPlan

RESTART_PARTS = (
    (Event.PROCESS_START, "launch"),  # launcher start -> our first line running in the rank
    (Event.STARTUP_IMPORTS, "imports"),
    (Event.STARTUP_DIST_INIT, "dist init"),
    (Event.STARTUP_MODEL_BUILD, "model build"),
    (Event.STARTUP_DS_INITIALIZE, "ds init"),  # deepspeed.initialize
    (Event.STARTUP_ENGINE, "engine setup"),  # the checkpoint engine's own start-up (imports, process groups)
    (Event.RESTORE_LOAD, "ckpt load"),
    (Event.TRAIN_ITERATION, "1st iter"),
)

_KINDS = (
    (re.compile(r"^layer_\d+-.*model_states\.pt"), "layer"),
    (re.compile(r"^mp_rank_\d+_model_states\.pt"), "model"),
    (re.compile(r"optim_states\.pt"), "optimizer"),
    (re.compile(r"^model_pp\d+_tp\d+\.lazy$"), "model"),
    (re.compile(r"^optim_.*\.lazy$"), "optimizer"),
)


def file_kind(name: str) -> str:
    """layer / model / optimizer / other, from DeepSpeed's file naming."""
    base = os.path.basename(name)
    return next((kind for pattern, kind in _KINDS if pattern.search(base)), "other")


def checkpoints(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per checkpoint tag of phase 1."""
    by_tag: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e["phase"] == "train" and e["event"].startswith(CHECKPOINT_PREFIX):
            by_tag[e["tag"]][e["event"]].append(e)
    rows = []
    for tag, kinds in by_tag.items():
        saves, durable = kinds[Event.CHECKPOINT_SAVE], kinds[Event.CHECKPOINT_DURABLE]
        commit = kinds[Event.CHECKPOINT_COMMIT]
        waits = defaultdict(float)  # training's later wait for a lazy engine's copies belongs to the stall
        for e in kinds[Event.CHECKPOINT_COPY_WAIT]:
            waits[e["rank"]] += e["duration_s"]
        stalls = [e["duration_s"] + waits[e["rank"]] for e in saves]
        rows.append({
            "tag": tag,
            "step": saves[0]["step"] if saves else None,
            "ranks": len(saves),
            "stall_max_s": max(stalls, default=None),
            "stall_min_s": min(stalls, default=None),
            "wait_durable_max_s": max((e["duration_s"] for e in kinds[Event.CHECKPOINT_WAIT_DURABLE]), default=None),
            "durable_rank_max_s": max((e["since_save_start_s"] for e in durable), default=None),
            "committed_s": commit[0]["since_save_start_s"] if commit else None,
            "bytes": sum(e["bytes"] for e in durable),
            "files": sum(e["n_files"] for e in durable),
            "bytes_per_rank_max": max((e["bytes"] for e in durable), default=0),
        })
    return sorted(rows, key=lambda r: r["step"] or 0)


def restart(events: list[dict[str, Any]], attempt: int = 1) -> dict[str, Any] | None:
    """Restart parts (max over ranks) and the total, from one restore attempt's events (1: the run's own restore;
    ``restore_attempts`` lists them). Records of two launches of one rank in one attempt (appended by a version
    before attempts had files of their own) are refused: their times would mix the launches."""
    restore = attempt_events(events, attempt)
    if not restore:
        return None
    _refuse_mixed_launches(restore, attempt)
    parts = {}
    for event, label in RESTART_PARTS:
        durations = [e["duration_s"] for e in restore if e["event"] == event
                     and (event != Event.TRAIN_ITERATION or e.get("first_after_restore"))]
        parts[label] = max(durations, default=None)
    launch = {e["rank"]: e["start"] for e in restore if e["event"] == Event.PROCESS_START}
    ends = [e["start"] + e["duration_s"] - launch[e["rank"]] for e in restore
            if e["event"] == Event.TRAIN_ITERATION and e.get("first_after_restore") and e["rank"] in launch]
    loads = [e for e in restore if e["event"] == Event.RESTORE_LOAD]
    results = [e for e in restore if e["event"] == Event.RESTORE_RESULT]
    fallbacks = [e for e in restore if e["event"] == Event.RESTORE_FALLBACK]
    return {
        "attempt": attempt,
        "total_s": max(ends, default=None),
        "parts": parts,
        "tag": loads[0]["tag"] if loads else None,
        "fell_back_from": fallbacks[0]["wanted"] if fallbacks else None,
        "bytes_read": sum(e.get("bytes", 0) for e in loads),
        "files_read": sum(e.get("n_files", 0) for e in loads),
        "cache": loads[0].get("cache") if loads else None,
        "resident_fraction": loads[0].get("resident_fraction") if loads else None,
        "exact": all(e.get("exact") for e in results) if results and results[0].get("verified") else None,
        "verdict": verdict(restore),
    }


def restore_attempts(events: list[dict[str, Any]]) -> list[int]:
    """The restore attempts a run's events hold, in order (records before attempts existed are attempt 1)."""
    return sorted({e.get("attempt", 1) for e in events if e["phase"] == "restore"})


def attempt_events(events: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    return [e for e in events if e["phase"] == "restore" and e.get("attempt", 1) == attempt]


def verdict(restore: list[dict[str, Any]]) -> str:
    """How one restore attempt ended, from its events: exact, not exact, not verified (verification off, or engine
    none, which restores nothing), refused (a rank refused: a damaged checkpoint, none to restore) or failed."""
    results = [e for e in restore if e["event"] == Event.RESTORE_RESULT]
    errors = [e for e in restore if e["event"] == Event.PHASE_ERROR]
    if any(e.get("refused") for e in errors):
        return "refused"
    if errors or not results:
        return "failed"
    if not results[0].get("verified"):
        return "not verified"
    return "exact" if all(e.get("exact") for e in results) else "not exact"


def _refuse_mixed_launches(restore: list[dict[str, Any]], attempt: int) -> None:
    starts: dict[int, int] = defaultdict(int)
    for e in restore:
        if e["event"] == Event.PROCESS_START:
            starts[e["rank"]] += 1
    mixed = sorted(rank for rank, count in starts.items() if count > 1)
    if mixed:
        raise rundir.RunFolderError(
            f"restore attempt {attempt} holds the records of {max(starts.values())} launches of rank {mixed[0]}: an "
            "earlier restartbench appended each relaunch to the same events file, so its restart times would mix "
            "launches (even below zero); measure it again in a new run")


def iteration_time(events: list[dict[str, Any]]) -> float | None:
    """Median phase-1 iteration time (max over ranks per step), checkpoints excluded (they are separate spans)."""
    per_step: dict[int, float] = defaultdict(float)
    for e in events:
        if e["phase"] == "train" and e["event"] == Event.TRAIN_ITERATION and e["step"] > 1:
            per_step[e["step"]] = max(per_step[e["step"]], e["duration_s"])
    return statistics.median(per_step.values()) if per_step else None


def inventory(run_dir: Path) -> list[dict[str, Any]]:
    """Every file the engines wrote under the checkpoint folder: tag, path, bytes, kind, and the rank that wrote it
    (None if not recorded). The harness's own ``<tag>/manifest.json`` is left out: it is not part of the checkpoint."""
    plan = RunPlan.load(run_dir)
    store = storage.open_store(plan.checkpoint_dir, plan.remote)
    writers = {}
    for e in read_events(run_dir):
        if e["event"] == Event.CHECKPOINT_DURABLE:
            for f in e["files"]:
                writers[f["path"]] = e["rank"]
    files = []
    for rel, size in sorted(store.files().items()):
        if os.path.basename(rel) == MANIFEST:
            continue
        tag = rel.split("/")[0] if "/" in rel else None
        files.append({"tag": tag, "path": rel, "bytes": size, "kind": file_kind(rel), "rank": writers.get(rel)})
    return files


def failed_checkpoints(run_dir: Path, phase_failed: bool) -> list[dict[str, Any]]:
    """Checkpoints that never became the latest: a save that failed on some rank, or (when the phase
    died) one that had begun and was never committed — a rank killed mid-save."""
    events = read_events(run_dir, "train")
    committed = {e["tag"] for e in events if e["event"] == Event.CHECKPOINT_COMMIT}
    failed = {e["tag"]: "; ".join(e["errors"]) for e in events if e["event"] == Event.CHECKPOINT_FAILED}
    if phase_failed:
        for e in events:
            if e["event"] == Event.CHECKPOINT_BEGIN and e["tag"] not in committed and e["tag"] not in failed:
                failed[e["tag"]] = "begun, never committed: the phase died during the save"

    plan = RunPlan.load(run_dir)
    store = storage.open_store(plan.checkpoint_dir, plan.remote)
    kept = store.read_text("latest").strip() if store.exists("latest") else None
    return [{"tag": tag, "error": error, "latest_kept": kept} for tag, error in failed.items()]


def write_inventory(run_dir: Path) -> None:
    (Path(run_dir) / rundir.INVENTORY).write_text(json.dumps(inventory(run_dir), indent=1) + "\n")


def summarize_run(run_dir: Path) -> list[str]:
    """A few lines for the terminal, every figure saying what it is."""
    events = read_events(run_dir)
    remote = storage.is_remote(RunPlan.load(run_dir).checkpoint_dir)
    durable = "uploaded" if remote else "fsync'd"
    lines = []
    iteration = iteration_time(events)
    if iteration is not None:
        lines.append(f"iteration time without checkpoint: {iteration:.3f} s (median; max over ranks)")
    for row in checkpoints(events):
        lines.append(
            f"checkpoint {row['tag']}: {row['bytes'] / 1e6:.1f} MB in {row['files']} files from {row['ranks']} ranks; "
            f"training stalled {row['stall_max_s']:.3f} s (max over ranks); durable after "
            f"{row['durable_rank_max_s']:.3f} s ({durable}, max over ranks); committed after {row['committed_s']:.3f} s"
        )
    info = restart(events)
    if info and info["total_s"] is not None:
        parts = ", ".join(f"{label} {value:.2f}" for label, value in info["parts"].items() if value is not None)
        exact = {True: "restore exact (state and resumed loss verified)", False: "RESTORE NOT EXACT",
                 None: "restore not verified"}[info["exact"]]
        cache = "read from S3" if remote else f"{info['cache']} page cache"
        source = f"from {info['tag']} ({cache})" if info["tag"] else "without a checkpoint (engine none)"
        lines.append(f"restart {source}: {info['total_s']:.2f} s from launch to end of first iteration "
                     f"(max over ranks); parts (s, max over ranks): {parts}")
        lines.append(exact)
    return lines

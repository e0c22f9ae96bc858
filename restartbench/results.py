"""Read a run folder's structured results: checkpoints, restart phases, file inventory.

Aggregation rules (the same everywhere a figure is printed):
- a checkpoint's stall is the max over ranks of the time ``save`` blocked training;
- its durable time is the max over ranks of the time from the checkpoint's start (its first rank's
  save start: one clock for every figure of a checkpoint) until that rank's files were on stable
  storage (fsync'd) — for an asynchronous engine, when its background write finished;
  ``committed_s`` is when rank 0 then wrote ``latest``, on the same clock, so never earlier;
- a restart's time is, over ranks, the max of (end of the first resumed iteration − launch);
  each restart part is reported as its max over ranks, so parts need not add up to the total.
"""

from __future__ import annotations

import bisect
import json
import math
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
    (Event.RESTORE_CONVERT, "convert"),  # an offline conversion for another layout (DeepSpeed's universal checkpoint)
    (Event.RESTORE_LOAD, "ckpt load"),
    (Event.TRAIN_ITERATION, "1st iter"),
)
HARNESS_CHECKS = (
    (Event.RESTORE_CHECK_FILES, "check files"),  # the checkpoint's files against its manifest
    (Event.RESTORE_CACHE, "cache"),  # the page cache's eviction and measure before the load
    (Event.RESTORE_VERIFY, "verify"),  # the exactness proof's digest of the restored state
)
"""The spans of a restart that are the harness checking itself, on its path but not what a training job's restart
costs (the analysis subtracts them: ``restart_less_checks_s``)."""

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
    """One row per checkpoint tag of phase 1. ``durable_rank_max_s`` and ``committed_s`` are on one clock, the
    checkpoint's: seconds since its first rank began its save (``since_checkpoint_start_s``), so the commit is never
    earlier than any rank's durability. Records written before that field have each rank's durable time from its own
    save start and the commit from rank 0's (``since_save_start_s``), which the rows then show as they were."""
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
            "durable_rank_max_s": max((since_checkpoint_start(e) for e in durable), default=None),
            "committed_s": since_checkpoint_start(commit[0]) if commit else None,
            "bytes": sum(e["bytes"] for e in durable),
            "files": sum(e["n_files"] for e in durable),
            "bytes_per_rank_max": max((e["bytes"] for e in durable), default=0),
        })
    return sorted(rows, key=lambda r: r["step"] or 0)


def rank_harness_checks(restore: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per rank of one restore attempt, each of the harness's checks (``HARNESS_CHECKS``) on its path: the sum of its
    spans that began before the rank's first resumed iteration (a fallback checks two checkpoints' files; a verify
    after that iteration began is not on the path). A check the rank did not make is absent."""
    first = {e["rank"]: e["start"] for e in restore
             if e["event"] == Event.TRAIN_ITERATION and e.get("first_after_restore")}
    labels = dict(HARNESS_CHECKS)
    per_rank: dict[int, dict[str, float]] = {}
    for e in restore:
        label = labels.get(e["event"])
        if label is not None and (e["rank"] not in first or e["start"] < first[e["rank"]]):
            checks = per_rank.setdefault(e["rank"], {})
            checks[label] = checks.get(label, 0.0) + e["duration_s"]
    return per_rank


def harness_checks(restore: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each of the harness's checks on one restore attempt's path (``rank_harness_checks``), the max over ranks;
    None where no rank made it."""
    ranks = rank_harness_checks(restore).values()
    return {label: max((checks[label] for checks in ranks if label in checks), default=None)
            for _event, label in HARNESS_CHECKS}


def since_checkpoint_start(event: dict[str, Any]) -> float:
    """A durable or commit event's time on its checkpoint's clock (the rank's own save start in older records)."""
    return event.get("since_checkpoint_start_s", event["since_save_start_s"])


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
        "checks": harness_checks(restore),
        "tag": loads[0]["tag"] if loads else None,
        "fell_back_from": fallbacks[0]["wanted"] if fallbacks else None,
        "bytes_read": sum(e.get("bytes", 0) for e in loads),
        "process_bytes_read": _sum_or_none(e.get("process_read_bytes") for e in loads),
        "files_read": sum(e.get("n_files", 0) for e in loads),
        "cache": loads[0].get("cache") if loads else None,
        "resident_fraction": loads[0].get("resident_fraction") if loads else None,
        "exact": all(e.get("exact") for e in results) if results and results[0].get("verified") else None,
        "verdict": verdict(restore),
        **_restart_memory(restore),
        "ds_init": ds_init_breakdown(restore),
        **_prefetch(loads),
        **_relayout(restore, results),
    }


def _prefetch(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the engine read the checkpoint during start-up (``restore.prefetch``) and the load took it from there:
    the read's own time (max over ranks), which the load's span no longer holds, and how long the load still waited
    for it; None where no rank's load was prefetched."""
    used = [e for e in loads if e.get("prefetched")]
    return {"prefetched": bool(used) and len(used) == len(loads),
            "prefetch_read_s": max((e["prefetch_read_s"] for e in used), default=None),
            "prefetch_wait_s": max((e["prefetch_wait_s"] for e in used), default=None)}


def _sum_or_none(values: Any) -> int | None:
    """The sum, or None where a rank did not record the figure (records from before it was taken)."""
    values = list(values)
    return None if not values or None in values else sum(values)


def _relayout(restore: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """A restart on another layout: the layout (None: the run's own), iteration K+1's loss less the uninterrupted
    run's, and what the engine's offline conversion read and wrote (rank 0 converts; None without one)."""
    result = results[0] if results else {}
    converted = next((e for e in restore if e["event"] == Event.RESTORE_CONVERT and e.get("bytes_read") is not None),
                     {})
    return {"restore_layout": result.get("restore_layout"), "loss_diff": result.get("loss_diff"),
            **{f"convert_{name}": converted.get(name) for name in RELAYOUT_CONVERSION}}


#: What a ``restore.convert`` event says the conversion read and wrote (``restartbench.engines.base.Conversion``).
RELAYOUT_CONVERSION = ("files_read", "bytes_read", "files_written", "bytes_written")


def ds_init_breakdown(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """``deepspeed.initialize`` in DeepSpeed's own stages (``restartbench.ds_init_timing``): each stage's time, the
    collectives' waits (``collective wait``) and the rest (``other``), each the max over ranks, from one phase
    attempt's ``startup.ds_initialize`` events; None for records taken before the stages were timed."""
    spans = [e for e in records if e["event"] == Event.STARTUP_DS_INITIALIZE and e.get("parts") is not None]
    if not spans:
        return None
    breakdown: dict[str, float] = defaultdict(float)
    for span in spans:
        figures = {**span["parts"], "collective wait": span.get("collective_wait_s", 0.0),
                   "other": span.get("other_s", 0.0)}
        for name, seconds in figures.items():
            breakdown[name] = max(breakdown[name], seconds)
    return dict(breakdown)


def _restart_memory(restore: list[dict[str, Any]]) -> dict[str, Any]:
    """The restart's peak host memory: the largest span peak (``restartbench.memwatch``) of any rank and restart
    part, and the part it came in; None for records taken before ranks sampled their memory."""
    labels = dict(RESTART_PARTS)
    sampled = [e for e in restore if e["event"] in labels and e.get("peak_rss_bytes") is not None]
    if not sampled:
        return {"peak_rss_bytes": None, "peak_rss_part": None}
    peak = max(sampled, key=lambda e: e["peak_rss_bytes"])
    return {"peak_rss_bytes": peak["peak_rss_bytes"], "peak_rss_part": labels[peak["event"]]}


def training_peak_rss(events: list[dict[str, Any]]) -> int | None:
    """Steady training's peak host memory: the largest ``peak_rss_bytes`` of any rank's phase-1 iteration (saves
    are spans of their own, so their buffers are not in it); None where ranks did not sample their memory."""
    peaks = [e["peak_rss_bytes"] for e in events if e["phase"] == "train" and e["event"] == Event.TRAIN_ITERATION
             and e.get("peak_rss_bytes") is not None]
    return max(peaks, default=None)


def restore_attempts(events: list[dict[str, Any]]) -> list[int]:
    """The restore attempts a run's events hold, in order (records before attempts existed are attempt 1)."""
    return sorted({e.get("attempt", 1) for e in events if e["phase"] == "restore"})


def attempt_events(events: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    return [e for e in events if e["phase"] == "restore" and e.get("attempt", 1) == attempt]


def verdict(restore: list[dict[str, Any]]) -> str:
    """How one restore attempt ended, from its events: exact, not exact, not verified (verification off, or engine
    none, which restores nothing), refused (a rank refused: a damaged checkpoint, none to restore) or failed. A proof
    that found a difference is ``not exact``, although the ranks then stop with an error: that error is its outcome."""
    results = [e for e in restore if e["event"] == Event.RESTORE_RESULT]
    errors = [e for e in restore if e["event"] == Event.PHASE_ERROR]
    if any(e.get("refused") for e in errors):
        return "refused"
    if any(e.get("verified") and not e.get("exact") for e in results):
        return "not exact"
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


# -- interference: what a save's background work costs the iterations it overlaps (issue 18) ---------------------


def durable_wall_clock(save: dict[str, Any], durable: dict[str, Any]) -> float:
    """When one rank's files of a checkpoint were durable, on the wall clock: the start of its ``checkpoint.save``
    span plus the ``checkpoint.durable`` event's ``since_save_start_s`` (train.py measures that on the monotonic
    clock from just before the span began: microseconds apart). The one place that turns a durable event into a
    time: should the events gain another reference (one clock per checkpoint), change it here."""
    return save["start"] + durable["since_save_start_s"]


def background_windows(events: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[float, float]]:
    """(tag, rank) -> (start, end), on the wall clock, of that rank's background work for a phase-1 checkpoint: from
    the end of its ``checkpoint.save`` span (save returned, training may go on) until its files were durable. Empty
    (end <= start) where the files were durable when save returned. A synchronous engine's window lies inside the
    harness's wait for durability, before the next iteration: no iteration overlaps it, by construction."""
    saves = {(e["tag"], e["rank"]): e for e in _train(events, Event.CHECKPOINT_SAVE)}
    windows = {}
    for durable in _train(events, Event.CHECKPOINT_DURABLE):
        save = saves.get((durable["tag"], durable["rank"]))
        if save is not None:
            windows[durable["tag"], durable["rank"]] = (save["start"] + save["duration_s"],
                                                       durable_wall_clock(save, durable))
    return windows


def whole_cost(stall: float | None, slowdown: float | None) -> float | None:
    """A checkpoint's whole cost to training: its stall plus its slowdown, a negative slowdown (iterations faster
    than the clean median: noise) counting as none."""
    return stall + max(slowdown, 0.0) if stall is not None and slowdown is not None else None


def clean_iteration_time(events: list[dict[str, Any]]) -> float | None:
    """Median phase-1 iteration time (max over ranks per step, step 1 left out) over the iterations that overlapped
    no checkpoint's background work (``background_windows``): training's pace without checkpointing."""
    return _Interference(events).clean_s


def interference(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase-1 checkpoint tag, what its background work cost training beyond the stall:

    - ``overlapped_iterations``: iterations (steps) that overlapped its window on some rank (each counted for the
      earliest checkpoint it overlapped), phase 1's last save included: training goes on after it until its
      background work has ended on every rank (``restartbench.train``);
    - ``slowdown_s``: Σ (iteration time − the clean median) over them, an iteration's time being the max over ranks of
      its span less any wait of a lazy engine's optimizer step for the save's copies in it (``checkpoint.copy_wait``,
      already in the stall); None without a clean median (no iteration overlapped nothing);
    - ``cost_s``: the stall (``checkpoints``' ``stall_max_s``) + ``slowdown_s``, the checkpoint's whole cost; a
      negative slowdown (the overlapped iterations ran faster than the clean median: noise, not a gain) adds
      nothing, so the cost is never below the stall;
    - ``background_seen``: True where, on every rank, training went on after the save and its background work had
      ended before the harness began waiting for the files (``checkpoint.wait_durable``: the engine said so as the
      wait began, ``background_done``, or the files were durable by then): the work ended while training ran, so
      the slowdown covers it. False where the harness waited while the work still ran: a synchronous engine's wait
      right after save (no iteration between: its slowdown is 0), an asynchronous save still writing at the next
      save or after phase 1's last iterations (the rest is in ``wait_durable_max_s``), or an engine that cannot
      tell without waiting (DeepSpeed's decoupled writer).

    Runs without phase-1 iterations (emulated) have None for the first three."""
    return _Interference(events).per_checkpoint()


def _train(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["phase"] == "train" and e["event"] == name]


class _Interference:
    """The phase-1 iterations set against the checkpoints' background windows (``interference``)."""

    def __init__(self, events: list[dict[str, Any]]):
        self.events = events
        self.windows = background_windows(events)
        self.spans = {(e["rank"], e["step"]): (e["start"], e["start"] + e["duration_s"])
                      for e in _train(events, Event.TRAIN_ITERATION) if e["step"] > 1}
        self.by_rank: dict[int, list[tuple[float, float, int]]] = defaultdict(list)  # (start, end, step), in order
        for (rank, step), (start, end) in sorted(self.spans.items(), key=lambda item: item[1]):
            self.by_rank[rank].append((start, end, step))
        self.step_s = self._step_times()
        self.owner = self._owners()
        clean = [seconds for step, seconds in self.step_s.items() if step not in self.owner]
        self.clean_s = statistics.median(clean) if clean else None

    def _step_times(self) -> dict[int, float]:
        """step -> max over ranks of the iteration's time less the copy waits inside it (by when they began)."""
        waits: dict[tuple[int, int], float] = defaultdict(float)
        for e in _train(self.events, Event.CHECKPOINT_COPY_WAIT):
            step = self._iteration_at(e["rank"], e["time"])
            if step is not None:
                waits[e["rank"], step] += e["duration_s"]
        step_s: dict[int, float] = {}
        for (rank, step), (start, end) in self.spans.items():
            step_s[step] = max(step_s.get(step, float("-inf")), end - start - waits[rank, step])
        return step_s

    def _owners(self) -> dict[int, str]:
        """step -> the earliest checkpoint (by step) whose window an iteration of that step overlapped on its rank.
        Every window has its save (``background_windows``), so every window's tag has a step."""
        save_step = {e["tag"]: e["step"] for e in _train(self.events, Event.CHECKPOINT_SAVE)}
        owner: dict[int, str] = {}
        for (tag, rank), (low, high) in sorted(self.windows.items(), key=lambda item: save_step[item[0][0]]):
            for _start, _end, step in self._overlapping(rank, low, high):
                owner.setdefault(step, tag)
        return owner

    def _iteration_at(self, rank: int, at: float) -> int | None:
        """The step of the rank's iteration under way at ``at``: the last to begin at or before it, unless it had ended
        before. A wait that begins as one iteration ends and the next begins is the next's, and only the next's."""
        touching = self._overlapping(rank, at, at, closed=True)
        return touching[-1][2] if touching else None

    def _overlapping(self, rank: int, low: float, high: float, closed: bool = False) -> list[tuple[float, float, int]]:
        """The rank's iterations overlapping (low, high), or touching [low, high] when ``closed``; a rank's iterations
        follow one another, so their ends are in order too."""
        spans = self.by_rank.get(rank, [])
        first = bisect.bisect_left(spans, low, key=lambda span: span[1]) if closed else \
            bisect.bisect_right(spans, low, key=lambda span: span[1])
        found = []
        for span in spans[first:]:
            if span[0] > high or (span[0] == high and not closed):
                break
            found.append(span)
        return found

    def per_checkpoint(self) -> dict[str, dict[str, Any]]:
        stalls = {row["tag"]: row["stall_max_s"] for row in checkpoints(self.events)}
        seen = self._seen()
        rows = {}
        for tag, stall in stalls.items():
            steps = [step for step, owner in self.owner.items() if owner == tag]
            slowdown = self._slowdown(steps)
            rows[tag] = {"overlapped_iterations": len(steps) if self.spans else None, "slowdown_s": slowdown,
                         "cost_s": whole_cost(stall, slowdown),
                         "background_seen": seen.get(tag, False)}
        return rows

    def _slowdown(self, steps: list[int]) -> float | None:
        if not self.spans or (steps and self.clean_s is None):
            return None
        return math.fsum(self.step_s[step] - self.clean_s for step in steps)

    def _seen(self) -> dict[str, bool]:
        """tag -> on every rank, training went on after the save (an iteration other than the reference began after
        it) and its background work had ended before the harness began waiting for the files: the engine said so
        (``background_done``) or they were durable by then (no wait recorded: True)."""
        waits = {(e["tag"], e["rank"]): e for e in _train(self.events, Event.CHECKPOINT_WAIT_DURABLE)}
        last: dict[int, float] = {}
        for e in _train(self.events, Event.TRAIN_ITERATION):
            if not e.get("reference"):
                last[e["rank"]] = max(last.get(e["rank"], float("-inf")), e["start"])
        seen: dict[str, bool] = {}
        for (tag, rank), (low, high) in self.windows.items():
            wait = waits.get((tag, rank))
            ended = wait is None or wait.get("background_done") is True or high <= wait["start"]
            went_on = last.get(rank, float("-inf")) >= low
            seen[tag] = seen.get(tag, True) and went_on and ended
        return seen


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
            f"training stalled {row['stall_max_s']:.3f} s (max over ranks); since the first rank began its save, "
            f"durable after {row['durable_rank_max_s']:.3f} s ({durable}, max over ranks), committed after "
            f"{row['committed_s']:.3f} s"
        )
    info = restart(events)
    if info and info["total_s"] is not None:
        parts = ", ".join(f"{label} {value:.2f}" for label, value in info["parts"].items() if value is not None)
        proof = "state and resumed loss verified" if info["restore_layout"] is None else (
            f"consolidated state verified; resumed loss {info['loss_diff']:+.2e} from the uninterrupted run's")
        exact = {True: f"restore exact ({proof})", False: "RESTORE NOT EXACT",
                 None: "restore not verified"}[info["exact"]]
        cache = "read from S3" if remote else {"converted": "loaded from what the conversion had just written"}.get(
            info["cache"], f"{info['cache']} page cache")
        source = f"from {info['tag']} ({cache})" if info["tag"] else "without a checkpoint (engine none)"
        if info["restore_layout"]:
            source += f" on {info['restore_layout']}"
        if info["prefetch_read_s"] is not None:
            parts += (f"; the read ran from before the model build (prefetch): {info['prefetch_read_s']:.2f} s, "
                      f"of which the load waited {info['prefetch_wait_s']:.2f} s")
        checks = ", ".join(f"{label} {value:.2f}" for label, value in info["checks"].items() if value is not None)
        if checks:
            parts += f"; besides them the harness's own checks, which a job's restart does not make: {checks}"
        lines.append(f"restart {source}: {info['total_s']:.2f} s from launch to end of first iteration "
                     f"(max over ranks); parts (s, max over ranks): {parts}")
        lines.append(exact)
    return lines

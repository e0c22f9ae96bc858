"""Structured per-rank events: one JSON object per line, never scraped from logs.

Every rank of every phase attempt writes ``<run>/events/<record>-rank<NNNNN>.jsonl`` (``events_file``;
``phase_record``: ``train``, ``restore``, ``restore-2``...), a file of its own. A record always has ``event``,
``phase``, ``rank`` and ``time`` (wall clock, s since the epoch), and a restore's its ``attempt``; a span
(``with log.span(Event.CHECKPOINT_SAVE, step=4) as extra:``) adds ``start`` and ``duration_s`` (monotonic clock)
plus whatever the body put in ``extra``.
A span whose body raises is still written, with ``error`` set, and the error re-raised.

The event names (``Event``), their fields and the files are the run-folder contract the analysis reads;
they are listed in README.md ("Run folder"). ``read_events`` is the one reader.

This module owns the ``events/`` folder of a run folder (``restartbench.rundir`` the rest): ``EventLog``
computes its file from the run folder, and this module and ``rundir`` are leaves that may not import each other.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import orjson


class Event:
    """Every event name a rank writes, grouped by phase; each with what it records and its main fields."""

    # -- start-up of a phase: the restart's parts (spans) --------------------------------------------------------
    PROCESS_START = "process.start"  # launch -> this rank's code running; host, node, node_rank, local_rank, pid
    STARTUP_IMPORTS = "startup.imports"  # importing torch and DeepSpeed
    STARTUP_DIST_INIT = "startup.dist_init"  # the default process group's set-up; backend
    STARTUP_MODEL_BUILD = "startup.model_build"  # building the pipeline module
    STARTUP_DS_INITIALIZE = "startup.ds_initialize"  # deepspeed.initialize; parts, collective_wait_s, collectives,
    # other_s, timed_s (restartbench.ds_init_timing)
    STARTUP_ENGINE = "startup.engine"  # the checkpoint engine's own set-up; engine, what it set up, pinned_bytes
    STARTUP_WORKAROUND = "startup.workaround"  # the harness changed the rank's environment; note (what and why)
    # -- training --------------------------------------------------------------------------------------------------
    TRAIN_ITERATION = "train.iteration"  # one iteration (span); step, loss, reference, after_save, clean or
    # first_after_restore
    # -- phase 1's checkpoints: each has tag and step -------------------------------------------------------------
    CHECKPOINT_BEGIN = "checkpoint.begin"  # a save starts (begun, never committed: a lost checkpoint); engine
    CHECKPOINT_SAVE = "checkpoint.save"  # the time save blocked training, the stall (span); engine
    CHECKPOINT_WORKAROUND = "checkpoint.workaround"  # the engine answered a DeepSpeed call its own way; note
    CHECKPOINT_COPY_WAIT = "checkpoint.copy_wait"  # a lazy engine's later wait for the save's copies; duration_s
    CHECKPOINT_WAIT_DURABLE = "checkpoint.wait_durable"  # the harness waiting for this rank's files (span);
    # background_done: what the engine said of its background work as the wait began
    CHECKPOINT_DURABLE = "checkpoint.durable"  # this rank's files are stable; files, bytes, n_files; when, in s:
    # since_save_start_s from the rank's own save start, since_checkpoint_start_s from the first rank's (one clock)
    CHECKPOINT_CHECKSUM = "checkpoint.checksum"  # hashing this rank's files for the manifest (span)
    PROOF_DIGEST = "proof.digest"  # the exactness proof's digest of the state saved (kind "state") or of the weights
    # after iteration K+1 (kind "module") (span); tag, kind, digest_tensor_bytes, digest_chunks, digest_threads,
    # digest_copy_s, digest_hash_s (verify.DigestCost); the harness's own time, outside every measured figure
    CHECKPOINT_COMMIT = "checkpoint.commit"  # rank 0 wrote the manifest and latest; since_save_start_s (rank 0's
    # save start), since_checkpoint_start_s (the first rank's: never before any rank's durable time on that clock)
    CHECKPOINT_REMOVED = "checkpoint.removed"  # --keep-checkpoints: rank 0 removed this older committed checkpoint
    # (manifest first, then its files) once a newer one committed; tag (the removed one), step, bytes, n_files,
    # committed (the newer tag), keep (span: the removal's time)
    CHECKPOINT_FAILED = "checkpoint.failed"  # a save failed on some rank; errors, target, free_bytes, needed_bytes_...
    RANK_RESOURCES = "rank.resources"  # after each checkpoint; open_fds, rss_bytes, threads, children
    RANK_MEMORY = "rank.memory"  # at the end of a phase: the process's RSS over time; process_start, timeline
    # ([[s since process_start, bytes], ...]), peak_rss_bytes (the phase's, unthinned), resolution_s
    # -- phase 2's restore -----------------------------------------------------------------------------------------
    RESTORE_CHECK_FILES = "restore.check_files"  # the manifest check of a checkpoint's files (span); problems
    RESTORE_FALLBACK = "restore.fallback"  # the wanted checkpoint was damaged; wanted, restored
    RESTORE_CACHE = "restore.cache"  # the page cache before the load: evicted for a cold restore, then measured
    # with mincore (span); cache, resident_fraction, cache_requested
    RESTORE_CONVERT = "restore.convert"  # an engine's offline conversion for another layout (span; rank 0 converts,
    # the others wait); converted_tag, files_read, bytes_read, files_written, bytes_written, command
    RESTORE_PREFETCH = "restore.prefetch"  # an engine's early read started, before the model is built (span: the
    # start only; the read runs on, and restore.load records its times); tag, files, direct_io, pinned
    RESTORE_LOAD = "restore.load"  # the checkpoint's load (span); bytes, n_files, read_deserialize_s, cache; after a
    # prefetch: prefetched, prefetch_wait_s, prefetch_setup_s, prefetch_read_s, prefetch_started/_ended (wall),
    # prefetch_bytes, prefetch_error / prefetch_unused where it was not used
    RESTORE_VERIFY = "restore.verify"  # the digest comparison (span)
    RESTORE_RESULT = "restore.result"  # exact, verified, problems, the resumed loss
    # -- how a phase ended on a rank -------------------------------------------------------------------------------
    PHASE_ERROR = "phase.error"  # error (and the one it was raised while handling)
    PHASE_END = "phase.end"  # the phase ended normally
    FAULT_INJECTED = "fault.injected"  # a test's fault struck (restartbench.faults); fault, tag or step


EVENT_NAMES = frozenset(value for name, value in vars(Event).items() if name.isupper())
CHECKPOINT_PREFIX = "checkpoint."
"""What every name of a checkpoint's events (``Event.CHECKPOINT_*``) begins with."""

EVENTS_FOLDER = "events"


def events_file(run_dir: str | Path, record: str, rank: int) -> Path:
    """The events one rank wrote in one phase record (``phase_record``)."""
    return Path(run_dir) / EVENTS_FOLDER / f"{record}-rank{rank:05d}.jsonl"


def phase_record(phase: str, attempt: int = 1) -> str:
    """The name one launch of a phase keeps its records under (events files, logs): ``train``; ``restore`` for the
    run's own restart (attempt 1); ``restore-2``, ``restore-3``... for each restore-only relaunch
    (``./submit-job.sh --restore``). Every attempt has files of its own: nothing appends to an earlier one's."""
    return phase if attempt == 1 else f"{phase}-{attempt}"


class RecordsExistError(FileExistsError):
    """A launch found the records of its phase attempt already written: a run folder's records are never appended
    to. The message says how to measure again."""


class SpanWatch(Protocol):
    """What a span records besides its time (``restartbench.memwatch.MemoryWatch``: its peak memory)."""

    def span_begin(self) -> None: ...

    def span_fields(self, start: float) -> dict[str, Any]: ...


class EventLog:
    """JSON-lines writer for one rank of one phase attempt, flushed per record. The file must not exist yet
    (``RecordsExistError``): an attempt's records are its own. A restore's records carry their ``attempt``; with a
    ``watch``, every span also records what it measured during the span (its peak memory)."""

    def __init__(self, run_dir: Path, phase: str, rank: int, attempt: int = 1, watch: SpanWatch | None = None):
        self.phase = phase
        self.rank = rank
        self.watch = watch
        self._attempt = {"attempt": attempt} if phase == "restore" else {}
        path = events_file(run_dir, phase_record(phase, attempt), rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = path.open("x", buffering=1)
        except FileExistsError:
            raise RecordsExistError(
                f"{path} exists: phase {phase_record(phase, attempt)} of {run_dir} was launched before, and a run "
                "folder's records are never appended to. To measure the restart again, relaunch it as a new "
                f"attempt: ./submit-job.sh --restore {run_dir}") from None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "phase": self.phase, "rank": self.rank, **self._attempt, "time": time.time(),
                  **fields}
        self._file.write(json.dumps(record) + "\n")
        return record

    def span(self, event: str, **fields: Any) -> AbstractContextManager[dict[str, Any]]:
        return span_on([self], event, **fields)

    def close(self) -> None:
        self._file.close()


@contextmanager
def span_on(logs: Iterable[EventLog], event: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """One timed span recorded in every log of ``logs`` (one rank's, or every rank a process runs when the work is
    done once for all of them), with what the body put in the dict it gets, ``error`` if the body raised, and what
    the first log's watch measured (the ranks of one process share their process's memory)."""
    logs = list(logs)
    watch = next((log.watch for log in logs if log.watch is not None), None)
    extra: dict[str, Any] = {}
    if watch is not None:
        watch.span_begin()
    start_wall, start = time.time(), time.perf_counter()
    try:
        yield extra
    except BaseException as error:
        extra["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        duration = time.perf_counter() - start
        watched = watch.span_fields(start_wall) if watch is not None else {}
        for log in logs:
            log.emit(event, start=start_wall, duration_s=duration, **fields, **watched, **extra)


# -- reading ---------------------------------------------------------------------------------------------------

_SPANS = (Event.PROCESS_START, Event.STARTUP_IMPORTS, Event.STARTUP_DIST_INIT, Event.STARTUP_MODEL_BUILD,
          Event.STARTUP_DS_INITIALIZE, Event.STARTUP_ENGINE, Event.TRAIN_ITERATION, Event.CHECKPOINT_SAVE,
          Event.CHECKPOINT_WAIT_DURABLE, Event.RESTORE_CHECK_FILES, Event.RESTORE_CACHE, Event.RESTORE_CONVERT,
          Event.RESTORE_PREFETCH, Event.RESTORE_LOAD, Event.RESTORE_VERIFY)
#: Fields the readers rely on, per event (README "Run folder"); other events and fields are not checked.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    **{name: ("start", "duration_s") for name in _SPANS},
    Event.TRAIN_ITERATION: ("start", "duration_s", "step"),
    Event.CHECKPOINT_SAVE: ("start", "duration_s", "tag", "step"),
    Event.CHECKPOINT_WAIT_DURABLE: ("start", "duration_s", "tag"),
    Event.CHECKPOINT_DURABLE: ("tag", "since_save_start_s", "bytes", "n_files"),
    Event.CHECKPOINT_COMMIT: ("tag", "since_save_start_s"),
}
_NUMERIC = frozenset(("start", "duration_s", "since_save_start_s", "bytes", "n_files", "step", "rank"))
_NUMBER_TYPES = (int, float)
#: event -> (fields that must be numbers, other fields that must be present)
_CHECKS = {event: (tuple(f for f in fields if f in _NUMERIC), tuple(f for f in fields if f not in _NUMERIC))
           for event, fields in REQUIRED_FIELDS.items()}


class EventFileError(ValueError):
    """An events file cannot be read or holds a malformed event; the message names the file and line."""


def read_events(run_dir: str | Path, record: str | None = None, rank: int | None = None) -> list[dict[str, Any]]:
    """Every event of a run (or of one phase record such as ``train`` or ``restore-2``, one ``rank``), file by file
    in name order, each checked for the
    fields the readers use (``REQUIRED_FIELDS``). A run without an events folder has none; a malformed line, a torn
    last one included, raises ``EventFileError`` naming the file and line."""
    records: list[dict[str, Any]] = []
    for path in _event_files(Path(run_dir) / EVENTS_FOLDER, record, rank):
        records.extend(_read_event_file(path))
    return records


def _event_files(folder: Path, record: str | None, rank: int | None) -> list[str]:
    """The files of ``folder`` named after ``record`` and ``rank`` (``events_file``), either one left open."""
    prefix = f"{record}-rank" if record is not None else ""
    suffix = f"-rank{rank:05d}.jsonl" if rank is not None else ".jsonl"
    try:
        names = sorted(entry.name for entry in os.scandir(folder)
                       if entry.name.startswith(prefix) and entry.name.endswith(suffix))
    except FileNotFoundError:
        return []
    return [os.path.join(folder, name) for name in names]


def decode_json(text: str | bytes) -> Any:
    """JSON as json reads it, through orjson where orjson reads the text (five times json's speed on an events file,
    twice on an analysis record), else json: NaN and Infinity, which json writes and orjson refuses, and integers
    beyond 64 bits."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _read_event_file(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise EventFileError(f"{path}: cannot be read ({error})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    try:  # one parse per file: much faster than one per line
        records = decode_json("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        raise EventFileError(_first_bad_line(path, text)) from None
    checks, numbers, nothing = _CHECKS, _NUMBER_TYPES, ((), ())
    for index, record in enumerate(records):
        try:  # fast path: every field there and of the right type
            numeric, present = checks.get(record["event"], nothing)
            ok = "phase" in record and type(record["rank"]) is int
            for name in numeric:
                ok = ok and type(record[name]) in numbers
            for name in present:
                ok = ok and name in record
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise EventFileError(f"{path}:{_line_number(text, index)}: {_event_problem(record)}")
    return records


def _first_bad_line(path: str, text: str) -> str:
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            json.loads(line) if line.strip() else None
        except json.JSONDecodeError as error:
            return f"{path}:{number}: not a JSON event line ({error.msg})"
    return f"{path}: not JSON lines"


def _event_problem(record: Any) -> str:
    if not isinstance(record, dict):
        return f"an event must be a JSON object, not {type(record).__name__}"
    missing = [name for name in ("event", "phase", "rank") if name not in record]
    if missing:
        return f"event record lacks {', '.join(missing)}"
    needed = REQUIRED_FIELDS.get(record["event"], ())
    missing = [name for name in needed if name not in record]
    if missing:
        return f"event {record['event']!r} lacks field(s) {', '.join(missing)}"
    for name in ("rank", *needed):
        value = record[name]
        if name in _NUMERIC and type(value) not in _NUMBER_TYPES:
            return f"event {record['event']!r}: field {name!r} should be a number, got {value!r}"
    return f"malformed event {record.get('event')!r}"


def _line_number(text: str, index: int) -> int:
    seen = -1
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            seen += 1
            if seen == index:
                return number
    return 0


# -- errors of many ranks, in few lines ------------------------------------------------------------------------


def by_message(pairs: Iterable[tuple[Any, str]]) -> dict[str, list[Any]]:
    """{message: [who, ...]} in first-seen order: one line per distinct error, not one per rank or step."""
    grouped: dict[str, list[Any]] = {}
    for who, message in pairs:
        grouped.setdefault(message, []).append(who)
    return grouped


def number_ranges(numbers: Iterable[int]) -> str:
    """[5, 0, 1, 2] -> '0–2, 5': distinct numbers in order, consecutive ones as ranges."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def ranks_label(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0–3', 'ranks 0–1, 4, 6–7'."""
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {number_ranges(ranks)}"


def rank_errors(outcomes: Iterable[dict[str, Any]]) -> list[str]:
    """'ranks 0–3: RuntimeError: ...' for each distinct error of the ranks' outcomes ({'rank', 'error'})."""
    grouped = by_message((o["rank"], o["error"]) for o in outcomes if o["error"])
    return [f"{ranks_label(ranks)}: {message}" for message, ranks in grouped.items()]

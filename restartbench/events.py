"""Structured per-rank events: one JSON object per line, never scraped from logs.

Every rank of every phase appends to ``<run>/events/<phase>-rank<NNNNN>.jsonl``.
A record always has ``event``, ``phase``, ``rank`` and ``time`` (wall clock, s since
the epoch); a span (``with log.span("checkpoint.save", step=4) as extra:``) adds
``start`` and ``duration_s`` (monotonic clock) plus whatever the body put in ``extra``.
A span whose body raises is still written, with ``error`` set, and the error re-raised.

The event names and their fields are the run-folder contract the analysis reads;
they are listed in README.md ("Run folder").
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator


def events_path(run_dir: Path, phase: str, rank: int) -> Path:
    return Path(run_dir) / "events" / f"{phase}-rank{rank:05d}.jsonl"


class EventLog:
    """Append-only JSON-lines writer for one rank of one phase, flushed per record."""

    def __init__(self, run_dir: Path, phase: str, rank: int):
        self.phase = phase
        self.rank = rank
        path = events_path(run_dir, phase, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "phase": self.phase, "rank": self.rank, "time": time.time(), **fields}
        self._file.write(json.dumps(record) + "\n")
        return record

    @contextmanager
    def span(self, event: str, **fields: Any) -> Iterator[dict[str, Any]]:
        extra: dict[str, Any] = {}
        start_wall, start = time.time(), time.perf_counter()
        try:
            yield extra
        except BaseException as error:
            extra["error"] = f"{type(error).__name__}: {error}"
            raise
        finally:
            self.emit(event, start=start_wall, duration_s=time.perf_counter() - start, **fields, **extra)

    def close(self) -> None:
        self._file.close()


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every event of a run, all phases and ranks; a malformed line raises naming file and line."""
    records = []
    for path in sorted((Path(run_dir) / "events").glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON event line ({error.msg})") from None
    return records


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

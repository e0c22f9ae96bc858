"""Collecting: every run folder under a root (``run_folders``) read into one ``Collected``, whose tables are the
runs' records concatenated column by column (``collect``).

A run folder is read from its record (``records``) where the record is current, else from its files and events
(``runs.read_run``), the first read of many folders in parallel across the machine's cores; the record is then kept
in the folder for the next read. Either way the run gives the same rows: the record is the parse, kept. What depends
on the collected root, the run's id, its path and its storage baseline, is filled in here, never kept.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from restartbench import rundir
from restartbench.analysis import records
from restartbench.analysis.baselines import BaselineFinder, apply_baseline
from restartbench.analysis.columns import MEMORY_COLUMNS, RANK_COLUMNS, SPAN_COLUMNS, TABLE_COLUMNS
from restartbench.analysis.reading import quiet_metadata
from restartbench.analysis.runs import TABLES, RunRecord, read_run
from restartbench.events import EventFileError
from restartbench.rundir import RunFolderError

#: A worker process of the first read is worth starting for this many folders to parse, not fewer.
RUNS_PER_WORKER = 32
EXCLUDED_COLUMNS = ("run_id", "run", "status", "reason", "preset", "layout", "engine")
FILE_COLUMNS = dict.fromkeys(("run_id", "run", "preset", "layout", "engine", "tag", "path", "bytes", "kind", "rank"))


@dataclass(frozen=True)
class Excluded:
    run: Path
    status: str
    """skipped (the run was skipped by design), failed, incomplete or unreadable."""
    reason: str
    preset: str | None = None
    layout: str | None = None
    engine: str | None = None


class Columns:
    """A table built column by column from blocks of rows, as ``pd.DataFrame(rows)`` builds one from the rows: the
    columns in the order they first appear, NaN where a row lacks a column. A column may come encoded
    (``records.encode_column``); a deferred block (``defer``) is decoded only when the table is asked for."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {}
        self.count = 0
        self.pending: list[tuple[dict[str, Any], int]] = []

    def add(self, block: dict[str, Any], count: int) -> None:
        """Append ``count`` rows given as {column: values or an encoded column}."""
        if self.pending:
            self.settle()
        for name, values in block.items():
            column = self.columns.setdefault(name, [])
            if len(column) < self.count:
                column.extend([np.nan] * (self.count - len(column)))
            column.extend(values if type(values) is list else records.decode_column(values))
        self.count += count

    def defer(self, block: dict[str, Any], count: int) -> None:
        """``add`` when the table is asked for (its many rows, such as memory samples, cost time only then)."""
        self.pending.append((block, count))

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        for block, count in pending:
            self.add(block, count)

    def frame(self, order: dict[str, Any]) -> pd.DataFrame:
        """The table, the columns of ``order`` first (in its order), then the others as they came."""
        self.settle()
        for column in self.columns.values():
            column.extend([np.nan] * (self.count - len(column)))
        frame = pd.DataFrame(self.columns) if self.columns else pd.DataFrame()
        ordered = [c for c in order if c in frame.columns] + [c for c in frame.columns if c not in order]
        return frame.reindex(columns=ordered or list(order))


#: The tables whose blocks are decoded only when asked for: many rows per run, and no printed table needs them.
DEFERRED = ("spans", "memory")


@dataclass
class Collected:
    root: Path
    tables: dict[str, Columns] = field(default_factory=lambda: {name: Columns() for name in TABLES})
    excluded: list[Excluded] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return self.tables["rows"].frame(TABLE_COLUMNS)

    def rank_table(self) -> pd.DataFrame:
        return self.tables["ranks"].frame({"run": "", "preset": "", "layout": "", "engine": "", **RANK_COLUMNS})

    def file_table(self) -> pd.DataFrame:
        return self.tables["files"].frame(FILE_COLUMNS)

    def span_table(self) -> pd.DataFrame:
        return self.tables["spans"].frame(SPAN_COLUMNS)

    def memory_table(self) -> pd.DataFrame:
        return self.tables["memory"].frame(MEMORY_COLUMNS)

    def excluded_table(self) -> pd.DataFrame:
        rows = [{"run_id": run_id_of(e.run, self.root), "run": str(e.run), "status": e.status, "reason": e.reason,
                 "preset": e.preset, "layout": e.layout, "engine": e.engine} for e in self.excluded]
        return pd.DataFrame(rows).reindex(columns=list(EXCLUDED_COLUMNS))

    @property
    def skipped(self) -> list[tuple[Path, str]]:
        """(run folder, 'status: reason') of every run left out."""
        return [(e.run, f"{e.status}: {e.reason}") for e in self.excluded]


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


def collect(root: Path | str, *, keep_records: bool = True, workers: int | None = None) -> Collected:
    """Every run folder under ``root``, each from its current record or else from its events (``keep_records``:
    use and keep records; False reads every folder from its events and keeps nothing). Folders without a current
    record are read by ``workers`` processes (None: one per core where there are enough folders; 1: in this
    process)."""
    root = Path(root)
    collected = Collected(root=root)
    baselines = BaselineFinder(root, collected.warnings)
    folders = run_folders(root)
    with collector_paused():
        kept = [records.load(folder) if keep_records else None for folder in folders]
        unread = [folder for folder, record in zip(folders, kept) if record is None]
        parsed = dict(zip(unread, read_runs(unread, keep_records, workers)))
        for folder, record in zip(folders, kept):
            add_run(collected, folder, record if record is not None else parsed[folder], baselines)
    return collected


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the tables grow: they hold no cycles, and every full collection
    would scan all they hold so far (the work per run grew with the runs read: issue 27)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_runs(folders: list[Path], keep: bool, workers: int | None) -> list[RunRecord]:
    """Each folder's record from its events (kept in the folder where ``keep``), in order; in parallel where
    worthwhile, after the first folder is read here: it loads what every read needs (the size prediction imports
    torch and DeepSpeed, seconds) once, for the worker processes to start with."""
    count = workers if workers is not None else min(len(os.sched_getaffinity(0)), len(folders) // RUNS_PER_WORKER)
    if count <= 1 or len(folders) < 2:
        return [read_folder(folder, keep) for folder in folders]
    first = read_folder(folders[0], keep)
    with ProcessPoolExecutor(max_workers=count) as pool:
        rest = folders[1:]
        chunk = max(1, len(rest) // (count * 8))
        return [first, *pool.map(read_folder, rest, [keep] * len(rest), chunksize=chunk)]


def read_folder(run_dir: Path, keep: bool) -> RunRecord:
    """One folder's record from its events, kept in the folder (encoded, as ``records.load`` gives it) where ``keep``;
    a folder that cannot be read is a record of its exclusion as unreadable, never kept (its reason may not be about
    the files)."""
    inputs = records.fingerprint(run_dir) if keep else []
    try:
        record = read_run(run_dir)
    except Exception as error:  # noqa: BLE001 - a bad run must never stop the analysis of the others
        described = isinstance(error, (RunFolderError, EventFileError))  # their message names the file
        reason = str(error) if described else f"{type(error).__name__}: {error}"
        preset, layout, engine = quiet_metadata(run_dir)
        return {"excluded": {"status": "unreadable", "reason": reason, "preset": preset, "layout": layout,
                             "engine": engine}, "tables": {}}
    if not keep:
        return record
    encoded = records.encode(record)  # also what a worker sends back: a few strings, not every sample
    records.save(run_dir, encoded, inputs)
    return encoded


def add_run(collected: Collected, run_dir: Path, record: RunRecord, baselines: BaselineFinder) -> None:
    """One run's record into the collected tables, with its id, path and storage baseline filled in."""
    if record["excluded"]:
        collected.excluded.append(Excluded(run_dir, **record["excluded"]))
        return
    place = {"run_id": run_id_of(run_dir, collected.root), "run": str(run_dir)}
    baseline = baselines.find(run_dir)
    for name in TABLES:
        table = collected.tables[name]
        for keys, columns in record["tables"][name]:
            count = records.column_length(columns[0]) if columns else 0
            block = dict(zip(keys, columns))
            block.update({key: {"same": value, "n": count} for key, value in place.items() if key in block})
            if name in DEFERRED:
                table.defer(block, count)
                continue
            if name == "rows" and any(type(column) is not list for column in columns):  # many rows: encoded
                block = {key: records.decode_column(column) for key, column in block.items()}
            if name == "rows":
                apply_baseline(block, baseline)
            table.add(block, count)


def run_id_of(run_dir: Path, root: Path) -> str:
    rel = os.path.relpath(run_dir, root)
    return run_dir.resolve().name if rel == "." else rel

"""Collecting: every run folder under a root (``run_folders``) read into one ``Collected``, whose tables are the
runs' records concatenated column by column (``collect``).

A run folder is read from its record (``records``) where the record is current, else from its files and events
(``runs.read_run``), the first read of many folders in parallel across the machine's cores; the record is then kept
in the folder for the next read. Either way the run gives the same rows: the record is the parse, kept. What depends
on the collected root, the run's id and its path, is filled in here, never kept; so is a storage baseline found above
the folder. The folder's own baseline.json is an input of the record like its events, so a record keeps the rows
with its columns filled in (``based``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench import rundir
from restartbench.analysis import records
from restartbench.analysis.baselines import BaselineFinder, apply_baseline
from restartbench.analysis.blocks import Columns, collector_paused
from restartbench.analysis.columns import MEMORY_COLUMNS, RANK_COLUMNS, SPAN_COLUMNS, TABLE_COLUMNS
from restartbench.analysis.reading import quiet_metadata
from restartbench.analysis.runs import TABLES, RunRecord, read_run
from restartbench.baseline import BASELINE_FILE
from restartbench.events import EventFileError
from restartbench.rundir import RunFolderError

#: A worker process of the first read is worth starting for this many folders to parse, not fewer.
RUNS_PER_WORKER = 32
#: The most folders a worker reads before sending their records back: the collecting adds them as they come.
RUNS_PER_CHUNK = 64
EXCLUDED_COLUMNS = ("run_id", "run", "status", "reason", "preset", "layout", "engine", "training_kept")
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
    training_kept: bool = False
    """Its restart is what is left out: its training finished whole and its checkpoint rows are in the tables."""


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
                 "preset": e.preset, "layout": e.layout, "engine": e.engine, "training_kept": e.training_kept}
                for e in self.excluded]
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
        add_runs(collected, folders, baselines, keep_records, workers)
    return collected


def add_runs(collected: Collected, folders: list[Path], baselines: BaselineFinder, keep_records: bool,
             workers: int | None) -> None:
    """Each folder into the collected tables, in order, from its current record or else from its events (``collect``).
    The records read die with this call, before the garbage collector is back: 10,000 of them hold millions of lists,
    which its first pass would scan."""
    kept = [records.load(folder) if keep_records else None for folder in folders]
    parsed = read_runs([folder for folder, record in zip(folders, kept) if record is None], keep_records, workers)
    for folder, record in zip(folders, kept):  # the parsed ones added as they come, in order
        add_run(collected, folder, record if record is not None else next(parsed), baselines)
    for table in collected.tables.values():
        table.seal()


def read_runs(folders: list[Path], keep: bool, workers: int | None) -> Iterator[RunRecord]:
    """Each folder's record from its events (kept in the folder where ``keep``), in order; in parallel where
    worthwhile, after the first folder is read here: it loads what every read needs (the size prediction imports
    torch and DeepSpeed, seconds) once, for the worker processes to start with."""
    count = workers if workers is not None else min(len(os.sched_getaffinity(0)), len(folders) // RUNS_PER_WORKER)
    if count <= 1 or len(folders) < 2:
        yield from (read_folder(folder, keep) for folder in folders)
        return
    yield read_folder(folders[0], keep)
    with ProcessPoolExecutor(max_workers=count) as pool:
        rest = folders[1:]
        chunk = max(1, min(RUNS_PER_CHUNK, len(rest) // (count * 8)))
        yield from pool.map(read_folder, rest, [keep] * len(rest), chunksize=chunk)


def read_folder(run_dir: Path, keep: bool) -> RunRecord:
    """One folder's record from its events, kept in the folder (encoded, as ``records.load`` gives it, with the
    folder's own storage baseline: ``own_baseline``) where ``keep``; a folder that cannot be read is a record of its
    exclusion as unreadable, never kept (its reason may not be about the files)."""
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
    own = own_baseline(run_dir)
    based = isinstance(own, dict) and bool(record["tables"])
    if based:  # the folder's own, an input of the record like its events: the rows kept with its columns filled in
        tables = record["tables"]
        record = {**record, "tables": {**tables, "rows": [based_rows(*block, own) for block in tables["rows"]]}}
    encoded = {**records.encode(record), "baseline": own, "based": based}  # also what a worker sends back
    records.save(run_dir, encoded, inputs)
    return encoded


#: A record's ``baseline`` that leaves the folder's own baseline.json to the ``BaselineFinder`` at every collect.
FIND = "find"


def own_baseline(run_dir: Path) -> dict[str, Any] | str | None:
    """The folder's own baseline.json as the ``BaselineFinder`` reads it, for the record (opening it was a fifth of a
    read from records): None where it gives nothing (the finder looks above the folder), ``FIND`` where the finder
    should read it at each collect (it warns: the warning is the collect's), else what it gives but its path (where
    the folder is then)."""
    warnings: list[str] = []
    found = BaselineFinder(run_dir, warnings).find(run_dir)
    if warnings:
        return FIND
    if not found:
        return None
    own = {key: value for key, value in found.items() if key != "path"}
    if found.get("path") != baseline_path(run_dir) or json.loads(json.dumps(own)) != own:  # JSON keeps it as it is
        return FIND
    return own


def run_baseline(run_dir: Path, record: RunRecord, baselines: BaselineFinder) -> dict[str, Any]:
    """The baseline of a run: its own from its record (``own_baseline``), else the ``BaselineFinder``'s."""
    own = record.get("baseline", FIND)
    if isinstance(own, dict):
        return {**own, "path": baseline_path(run_dir)}
    if own is None:  # nothing of its own: the nearest folder above it, up to the root
        return {} if Path(os.path.abspath(run_dir)) == baselines.root else baselines.find(run_dir.parent)
    return baselines.find(run_dir)


def baseline_path(run_dir: Path) -> str:
    return os.path.join(os.path.abspath(run_dir), BASELINE_FILE)  # os.path: Path's parsing was a tenth of a read


def add_run(collected: Collected, run_dir: Path, record: RunRecord, baselines: BaselineFinder) -> None:
    """One run's record into the collected tables, with its id, path and storage baseline filled in."""
    if record["excluded"]:  # with the tables of its training where that finished (runs.trained_run)
        collected.excluded.append(Excluded(run_dir, **record["excluded"]))
    if not record["tables"]:
        return
    place = {"run_id": run_id_of(run_dir, collected.root), "run": str(run_dir)}
    baseline = None if record.get("based") else run_baseline(run_dir, record, baselines)
    for name in TABLES:
        table = collected.tables[name]
        for keys, columns in record["tables"][name]:
            count = records.column_length(columns[0]) if columns else 0
            if name == "rows" and baseline is not None:
                keys, columns = based_rows(keys, columns, baseline)
            table.add(*placed(keys, columns, count, place), count)


def based_rows(keys: list[str], columns: list[Any], baseline: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """A block of the tidy table decoded, with its storage baseline's columns filled in (``apply_baseline``)."""
    if set(map(type, columns)) != {list}:  # many rows: encoded
        columns = [records.decode_column(column) for column in columns]
    block = dict(zip(keys, columns))
    apply_baseline(block, baseline)
    return list(block), list(block.values())


def placed(keys: list[str], columns: list[Any], count: int, place: dict[str, str]) -> tuple[tuple[str, ...], list]:
    """The block's keys and columns with the run's place (``runs.PLACE_COLUMNS``) filled in, as values or, for many
    rows, encoded."""
    columns = list(columns)
    for key, value in place.items():
        if key in keys:
            columns[keys.index(key)] = [value] * count if count < records.SHORT else {"same": value, "n": count}
    return tuple(keys), columns


def run_id_of(run_dir: Path, root: Path) -> str:
    """The run folder's path relative to the root (the folder's own name where it is the root)."""
    folder, top = str(run_dir), str(root)
    if folder.startswith(top) and folder[len(top):len(top) + 1] == os.sep and top != os.curdir:
        return folder[len(top) + 1:]  # as relpath gives it, found under root by run_folders: a tenth of add_run
    rel = os.path.relpath(run_dir, root)
    return run_dir.resolve().name if rel == "." else rel

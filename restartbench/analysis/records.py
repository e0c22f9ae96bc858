"""The per-run record kept in a run folder (``RECORD_FILE``): what the analysis read from the folder
(``runs.RunRecord``), written once, read instead of the events on every later collect.

A record is used only where it is provably current:

- ``code``: a hash of every module of the restartbench package, of the templates and vendored code the size
  prediction reads, and of the versions of torch, DeepSpeed and TorchSnapshot it runs (``code_version``). A record
  made by other code, the analysis or anything it calls (the results' aggregation rules, the size prediction), is
  not used.
- ``inputs``: the name, size and modification time (ns) of every file the analysis reads from the folder
  (``INPUT_FILES``, the folder's own baseline.json among them, and every ``events/*.jsonl``, ``fingerprint``), taken
  before they were read. A file edited, added or removed since is a different fingerprint, and the folder is read
  from its events again.
- A record is not written where an input changed within ``RACY_NS`` of the record's own modification time (both
  times from the file system's clock): an edit in the same clock tick as the write it follows could keep the
  modification time, and the record would not see it.

The file is JSON (json writes it, orjson reads it: ``decode_json``; tuples come back as lists, which the records never
hold), written to a temporary file in the folder and renamed over the old one, so that a reader never sees half a
record. A folder the analysis may not write to simply has none. Each column of a block is stored as the shortest
exact form that reads fast (``encode_column``): one value where all are the same (of one type), runs of equal
values, the float64 or int64 bytes (base64) where all are floats or all ints, else the list of values.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import itertools
import json
import os
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from restartbench import rundir
from restartbench.analysis.runs import RunRecord
from restartbench.baseline import BASELINE_FILE
from restartbench.events import EVENTS_FOLDER, decode_json

RECORD_FILE = "analysis-record.json"
# 6: a run whose restart never finished keeps its training (runs.trained_run); 5: rows with the folder's own
# baseline filled in ("based"); 4: the restart rows' harness checks
#: The record's own layout; a change of it changes ``code_version`` too.
RECORD_FORMAT = 6
#: The run folder's files the analysis reads, besides the events (the baseline: the folder's own, kept in the record).
INPUT_FILES = (rundir.METADATA, rundir.CONFIG, rundir.PLAN, rundir.INVENTORY, BASELINE_FILE)
#: An input modified this close to the record (ns, either side) makes the record unsafe to keep.
RACY_NS = 2_000_000_000
PACKAGE = Path(__file__).resolve().parents[1]
#: The packages whose versions the size prediction (``restartbench.plan``) depends on.
PREDICTION_PACKAGES = ("torch", "deepspeed", "torchsnapshot")


@functools.cache
def code_version() -> str:
    """A hash of the record format, the versions of the packages the size prediction runs, and the source of every
    module of the restartbench package, the templates and the vendored code, by path."""
    digest = hashlib.blake2b(f"record format {RECORD_FORMAT}".encode(), digest_size=16)
    for package in PREDICTION_PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            digest.update(f"{package}=={version(package)}\0".encode())
    root = PACKAGE.parent
    for path in sorted([*PACKAGE.rglob("*.py"), *root.glob("templates/*"), *root.glob("third_party/**/*.py")]):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(run_dir: Path) -> list[list[Any]]:
    """[name, size, mtime_ns] of every input of the run folder (None, None: absent), in a fixed order."""
    folder = os.fspath(run_dir)
    try:
        events = sorted(f"{EVENTS_FOLDER}/{e.name}" for e in os.scandir(os.path.join(folder, EVENTS_FOLDER))
                        if e.name.endswith(".jsonl"))
    except FileNotFoundError:
        events = []
    return [_stat_entry(folder, name) for name in (*INPUT_FILES, *events)]


def _stat_entry(folder: str, name: str) -> list[Any]:
    try:
        stat = os.stat(os.path.join(folder, name))
    except FileNotFoundError:
        return [name, None, None]
    return [name, stat.st_size, stat.st_mtime_ns]


def load(run_dir: Path) -> RunRecord | None:
    """The folder's record where it is current (made by this code, from the inputs as they are now), else None."""
    try:
        stored = decode_json((run_dir / RECORD_FILE).read_bytes())  # orjson where it can: half json's time
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("code") != code_version():
        return None
    record = stored.get("record")
    if stored.get("inputs") != fingerprint(run_dir) or not isinstance(record, dict):
        return None
    if record.get("excluded") and stored.get("made_for") != str(run_dir):  # a reason may name the folder
        return None
    return record  # its columns as encode_column made them: decode_column gives the values


def encode(record: RunRecord) -> RunRecord:
    """The record with each column as ``encode_column`` stores it (what ``save`` keeps and ``load`` gives)."""
    return {"excluded": record["excluded"], "tables": {name: [[keys, [encode_column(c) for c in columns]]
                                                              for keys, columns in blocks]
                                                       for name, blocks in record["tables"].items()}}


def save(run_dir: Path, encoded: RunRecord, inputs: list[list[Any]]) -> bool:
    """Keep the ``encode``d record read from the inputs whose ``fingerprint`` was ``inputs`` (taken before reading
    them) in the folder; False where it is not kept (a folder not writable, an input too recent)."""
    payload = json.dumps({"format": RECORD_FORMAT, "code": code_version(), "inputs": inputs,
                          "made_for": str(run_dir), "record": encoded}, separators=(",", ":"))
    temporary = run_dir / f".{RECORD_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "x", encoding="utf-8") as handle:
            handle.write(payload)
        written = os.stat(temporary).st_mtime_ns
        if any(mtime is not None and abs(written - mtime) < RACY_NS for _name, _size, mtime in inputs):
            os.unlink(temporary)
            return False
        os.replace(temporary, run_dir / RECORD_FILE)
    except OSError:
        temporary.unlink(missing_ok=True)
        return False
    return True


INT64 = (-(2**63), 2**63 - 1)
#: Columns shorter than this stay lists: JSON reads a list with no work of ours (most columns: a run's few rows).
SHORT = 8
#: Values one ``{"same": value}`` may stand for: immutable, so that the rows can share one.
SCALARS = {str, int, float, bool, type(None)}


def encode_column(values: list[Any]) -> Any:
    """A column as ``{"same": value, "n": rows}`` (every value the same scalar, of one type), ``{"runs": [[value,
    count], ...]}`` (scalars in runs, four rows a run or more), ``{"f8": base64}`` (all floats), ``{"i8": base64}``
    (all ints within int64) or the list itself; ``decode_column`` gives back the same values."""
    if len(values) < SHORT:
        return values
    kinds = set(map(type, values))
    if not kinds <= SCALARS:
        return values
    if kinds == {float} or (kinds == {int} and INT64[0] <= min(values) and max(values) <= INT64[1]):
        return number_column(values, "f8" if kinds == {float} else "i8")
    runs = value_runs(values, kinds)
    if len(kinds) == 1 and len(runs) == 1:
        return {"same": values[0], "n": len(values)}
    return {"runs": runs} if len(runs) * 4 <= len(values) else values


def number_column(values: list[Any], kind: str) -> Any:
    """``encode_column`` of all floats or all ints within int64 (``kind`` f8 or i8), its runs found by numpy, as
    ``value_runs`` finds them (== between neighbours: NaN never equals): the first read encodes hundreds of memory
    samples per run."""
    array = np.array(values, dtype=f"<{kind}")
    changes = np.flatnonzero(array[1:] != array[:-1]) + 1
    if not len(changes):
        return {"same": values[0], "n": len(values)}
    if (len(changes) + 1) * 4 <= len(values):
        starts, ends = [0, *changes.tolist()], [*changes.tolist(), len(values)]
        return {"runs": [[values[start], end - start] for start, end in zip(starts, ends)]}
    return {kind: base64.b64encode(array.tobytes()).decode("ascii")}


def value_runs(values: list[Any], kinds: set[type]) -> list[list[Any]]:
    """[value, count] for each run of equal values of one type (scalars of ``kinds``: NaN never equals, and stays a
    run of one). Where no two values of different kinds can be equal and there is no float (no NaN), ``groupby``'s
    == between neighbours is the rule, at C speed: the first read encodes thousands of memory samples' labels."""
    if float not in kinds and not {int, bool} <= kinds:
        return [[value, len(tuple(group))] for value, group in itertools.groupby(values)]
    runs: list[list[Any]] = []
    for value in values:
        if runs and runs[-1][0] == value and type(runs[-1][0]) is type(value):
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def column_length(column: Any) -> int:
    """The rows of an encoded column, without decoding it."""
    if isinstance(column, list):
        return len(column)
    if "same" in column:
        return column["n"]
    if "runs" in column:
        return sum(count for _value, count in column["runs"])
    text = column.get("f8") or column["i8"]
    return (len(text) * 3 // 4 - text[-2:].count("=")) // 8


def decode_column(column: Any) -> list[Any]:
    if isinstance(column, list):
        return column
    if "same" in column:
        return [column["same"]] * column["n"]
    if "runs" in column:
        return [value for value, count in column["runs"] for value in [value] * count]
    kind = "f8" if "f8" in column else "i8"
    return np.frombuffer(base64.b64decode(column[kind]), dtype=f"<{kind}").tolist()

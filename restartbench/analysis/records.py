"""The per-run record kept in a run folder (``RECORD_FILE``): what the analysis read from the folder
(``runs.RunRecord``), written once, read instead of the events on every later collect.

A record is used only where it is provably current:

- ``code``: a hash of every module of the restartbench package, of the templates and vendored code the size
  prediction reads, and of the versions of torch, DeepSpeed and TorchSnapshot it runs (``code_version``). A record
  made by other code, the analysis or anything it calls (the results' aggregation rules, the size prediction), is
  not used.
- ``inputs``: the name, size and modification time (ns) of every file the analysis reads from the folder
  (``INPUT_FILES`` and every ``events/*.jsonl``, ``fingerprint``), taken before they were read. A file edited,
  added or removed since is a different fingerprint, and the folder is read from its events again.
- A record is not written where an input changed within ``RACY_NS`` of the record's own modification time (both
  times from the file system's clock): an edit in the same clock tick as the write it follows could keep the
  modification time, and the record would not see it.

The file is JSON (the standard library reads it; tuples come back as lists, which the records never hold), written
to a temporary file in the folder and renamed over the old one, so that a reader never sees half a record. A folder
the analysis may not write to simply has none.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from restartbench import rundir
from restartbench.analysis.runs import RunRecord
from restartbench.events import EVENTS_FOLDER

RECORD_FILE = "analysis-record.json"
#: The record's own layout; a change of it changes ``code_version`` too.
RECORD_FORMAT = 1
#: The run folder's files the analysis reads, besides the events.
INPUT_FILES = (rundir.METADATA, rundir.CONFIG, rundir.PLAN, rundir.INVENTORY)
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
    entries = [_stat_entry(run_dir / name, name) for name in INPUT_FILES]
    try:
        names = sorted(e.name for e in os.scandir(run_dir / EVENTS_FOLDER) if e.name.endswith(".jsonl"))
    except FileNotFoundError:
        names = []
    return entries + [_stat_entry(run_dir / EVENTS_FOLDER / name, f"{EVENTS_FOLDER}/{name}") for name in names]


def _stat_entry(path: Path, name: str) -> list[Any]:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return [name, None, None]
    return [name, stat.st_size, stat.st_mtime_ns]


def load(run_dir: Path) -> RunRecord | None:
    """The folder's record where it is current (made by this code, from the inputs as they are now), else None."""
    try:
        stored = json.loads((run_dir / RECORD_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("code") != code_version():
        return None
    record = stored.get("record")
    if stored.get("inputs") != fingerprint(run_dir) or not isinstance(record, dict):
        return None
    if record.get("excluded") and stored.get("made_for") != str(run_dir):  # a reason may name the folder
        return None
    return record


def save(run_dir: Path, record: RunRecord, inputs: list[list[Any]]) -> bool:
    """Keep ``record``, read from the inputs whose ``fingerprint`` was ``inputs`` (taken before reading them), in the
    folder; False where it is not kept (a folder not writable, an input too recent)."""
    payload = json.dumps({"format": RECORD_FORMAT, "code": code_version(), "inputs": inputs,
                          "made_for": str(run_dir), "record": record}, separators=(",", ":"))
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

"""The storage baseline a run's throughput is set against: ``baseline.json`` in the run folder or the nearest folder
above it up to the collected root (``BaselineFinder``), the baseline columns it gives a run's rows
(``apply_baseline``), and the note a throughput above its measured limit carries (``limit_note``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench.analysis.reading import read_json
from restartbench.baseline import BASELINE_FILE
from restartbench.rundir import RunFolderError

#: The columns a run's rows take from its baseline, all rows alike.
BASELINE_COLUMNS = {"baseline_write_MBps": "write_MBps", "baseline_read_MBps": "read_MBps", "baseline_tool": "tool"}


def apply_baseline(rows: dict[str, list[Any]], baseline: dict[str, Any]) -> None:
    """Fill, in place, one run's tidy-table rows (columns of equal length, ``kind`` among them) from its
    ``baseline``: the baseline columns, and each throughput as a share of it with its limit note (checkpoint rows:
    write; restart rows that read: read)."""
    count = len(rows["kind"])
    for column, key in BASELINE_COLUMNS.items():
        rows[column] = [baseline.get(key)] * count
    if "write_pct_of_storage" in rows:
        shares = [percent(rate, baseline.get("write_MBps")) if kind == "checkpoint" else None
                  for kind, rate in zip(rows["kind"], rows["write_MBps"])]
        rows["write_pct_of_storage"] = shares
        rows["write_limit"] = [limit_note(share) for share in shares]
    if "read_pct_of_storage" in rows:
        shares = [percent(rate, baseline.get("read_MBps")) for rate in rows["read_MBps"]]
        rows["read_pct_of_storage"] = shares
        rows["read_limit"] = [limit_note(share, cache) for share, cache in zip(shares, rows["cache"])]


def percent(rate: float | None, baseline: float | None) -> float | None:
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


def flagged(notes: pd.Series) -> str | None:
    """A summary's note: the most frequent flag and how many of the group's rows carry it (None: none does)."""
    flagged = notes.dropna()
    if flagged.empty:
        return None
    return f"{flagged.mode().iloc[0]} ({len(flagged)} of {len(notes)})"


class BaselineFinder:
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
            value = read_json(path, dict)
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

"""The storage limit a run's throughput is set against: ``baseline.json`` in the run folder or the nearest folder
above it up to the collected root (``BaselineFinder``), the baseline columns it gives a run's rows
(``apply_baseline``), the judgement of each throughput against the limit's spread (``limit_note``), and the limits a
table's ratios were set against (``limit_summary``).

The judgement (issue 26). A baseline.json written since issue 26 holds each side's limit as the best of several
methods, repeated: ``write_MBps`` is the winning method's median (``write_best``), ``write_spread_MBps`` its
{n, min_MBps, median_MBps, max_MBps} over the repeats (``read_…`` likewise). A throughput at or below the winner's
max is within what the limit's own measurement reached: nothing to note. Above it, ``LIMIT_DEFECT``: no engine reads
or writes faster than the disk, so the figure or the limit is wrong, and the report's findings name the run, the
ratio, the method and its spread and what to look at (``restartbench.report.findings``). A warm restore above it is
``WARM_CACHE`` instead (memory answered, which no disk limit bounds). An older baseline.json, with only
``write_MBps``/``read_MBps`` (or an object store's, one plain upload and download), has no spread: its ratios keep the
rule from before issue 26, above ``LIMIT_TOLERANCE_PCT`` of the limit ``LIMIT_UNDERESTIMATED``. So does a spread of
fewer than ``SPREAD_MIN_PASSES`` passes (a run's own baseline measures each method once): one pass's max is its median,
and noise alone would put half of the engines above it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench.analysis.reading import read_json
from restartbench.baseline import BASELINE_FILE
from restartbench.rundir import RunFolderError

SIDES = ("write", "read")
#: The passes of the winning method that make its max a bound: with fewer, the max is not judged against.
SPREAD_MIN_PASSES = 3
#: The columns a run's rows take from its baseline, all rows alike: each side's limit (the winning method's median),
#: the method that won, and its spread over the repeats (n passes, min, max; None for a baseline without one).
BASELINE_COLUMNS = {
    **{f"baseline_{side}_{key}": f"{side}_{key}" for side in SIDES
       for key in ("MBps", "best", "n", "min_MBps", "max_MBps")},
    "baseline_tool": "tool",
}


def apply_baseline(rows: dict[str, list[Any]], baseline: dict[str, Any]) -> None:
    """Fill, in place, one run's tidy-table rows (columns of equal length, ``kind`` among them) from its
    ``baseline``: the baseline columns, and each throughput as a share of the limit with its judgement
    (``limit_note``; checkpoint rows: write; restart rows that read: read)."""
    count = len(rows["kind"])
    for column, key in BASELINE_COLUMNS.items():
        rows[column] = [baseline.get(key)] * count
    if "write_pct_of_storage" in rows:
        shares = [percent(rate, baseline.get("write_MBps")) if kind == "checkpoint" else None
                  for kind, rate in zip(rows["kind"], rows["write_MBps"])]
        top = top_pct(baseline.get("write_MBps"), baseline.get("write_max_MBps"))
        rows["write_pct_of_storage"] = shares
        rows["write_limit"] = [limit_note(share, top_pct=top) for share in shares]
    if "read_pct_of_storage" in rows:
        shares = [percent(rate, baseline.get("read_MBps")) for rate in rows["read_MBps"]]
        top = top_pct(baseline.get("read_MBps"), baseline.get("read_max_MBps"))
        rows["read_pct_of_storage"] = shares
        rows["read_limit"] = [limit_note(share, cache, top) for share, cache in zip(shares, rows["cache"])]


def percent(rate: float | None, baseline: float | None) -> float | None:
    """``rate`` as a percentage of the storage's measured bandwidth; None where either is missing."""
    return 100 * rate / baseline if rate is not None and baseline else None


def top_pct(limit: float | None, top: float | None) -> float | None:
    """The limit's max as a percentage of the limit (its median): the share above which a throughput is a defect;
    None where the baseline has no spread (``top`` None)."""
    return 100 * top / limit if limit and _number(top) else None


#: Baselines without a spread (older baseline.json, object stores): above this share of the limit (percent) a
#: throughput says the limit was measured too low, the rule before issue 26 (issue 18).
LIMIT_TOLERANCE_PCT = 105.0
LIMIT_DEFECT = "defect: above the limit's max"
LIMIT_UNDERESTIMATED = "limit underestimated"
WARM_CACHE = "warm cache"
#: The notes, most serious first: a summary of several rows shows the first present (``flagged``).
NOTES = (LIMIT_DEFECT, LIMIT_UNDERESTIMATED, WARM_CACHE)


def limit_note(pct: float | None, cache: str | None = None, top_pct: float | None = None) -> str | None:
    """The judgement of a throughput ``pct`` percent of its limit, the limit's max being ``top_pct`` percent of it:
    None at or below the max; above it ``LIMIT_DEFECT``, or ``WARM_CACHE`` where a warm page cache answered the reads
    (``cache`` "warm"). A baseline without a spread (``top_pct`` None) keeps the old rule: above
    ``LIMIT_TOLERANCE_PCT``, ``LIMIT_UNDERESTIMATED`` (or ``WARM_CACHE``)."""
    bar = LIMIT_TOLERANCE_PCT if top_pct is None else top_pct
    if pct is None or not pct > bar:
        return None
    if cache == "warm":
        return WARM_CACHE
    return LIMIT_UNDERESTIMATED if top_pct is None else LIMIT_DEFECT


def flagged(notes: pd.Series) -> str | None:
    """A summary's note: the most serious note among the group's rows (``NOTES``) and how many of them carry it (None:
    none does)."""
    present = notes.dropna()
    if present.empty:
        return None
    note = min(present.unique(), key=lambda n: NOTES.index(n) if n in NOTES else len(NOTES))
    return f"{note} ({int((present == note).sum())} of {len(notes)})"


def limit_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The limits the table's ratios were set against: per storage, tool, side and winning method, the runs, the
    passes per run (``n``) and the spread (the least min, the median of the limits, the largest max); ``judged`` says
    how a ratio to it is judged. A baseline without a spread (older, or of fewer than ``SPREAD_MIN_PASSES`` passes)
    has its spread None and is judged by the old rule."""
    columns = ["storage", "tool", "side", "method", "runs", "n", "min_MBps", "median_MBps", "max_MBps", "judged"]
    if table.empty or "baseline_tool" not in table:
        return pd.DataFrame(columns=columns)
    parts = []
    for side in SIDES:
        if f"baseline_{side}_max_MBps" not in table:  # a table made before issue 26's columns
            continue
        rows = table.dropna(subset=[f"baseline_{side}_MBps"])
        if rows.empty:
            continue
        runs = rows.drop_duplicates("run_id")
        spread = runs[f"baseline_{side}_max_MBps"].notna()
        parts.append(pd.DataFrame({
            "storage": runs["storage"], "tool": runs["baseline_tool"], "side": side,
            "method": runs[f"baseline_{side}_best"], "run_id": runs["run_id"],
            "n": runs[f"baseline_{side}_n"], "min_MBps": runs[f"baseline_{side}_min_MBps"],
            "median_MBps": runs[f"baseline_{side}_MBps"], "max_MBps": runs[f"baseline_{side}_max_MBps"],
            "judged": spread.map({True: "above the max: defect",
                                  False: f"no spread (older baseline.json, or under {SPREAD_MIN_PASSES} passes): "
                                         f"above {LIMIT_TOLERANCE_PCT:.0f} %, limit underestimated"})}))
    if not parts:
        return pd.DataFrame(columns=columns)
    every = pd.concat(parts, ignore_index=True)
    summary = every.groupby(["storage", "tool", "side", "method", "judged"], dropna=False, sort=False).agg(
        runs=("run_id", "nunique"), n=("n", "median"), min_MBps=("min_MBps", "min"),
        median_MBps=("median_MBps", "median"), max_MBps=("max_MBps", "max")).reset_index()
    return summary[columns]


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
        if not any(_number(v) for v in numbers.values()):
            self.warnings.append(f"{path}: needs a positive write_MBps or read_MBps (MB/s); baseline ignored")
            return {}
        clean: dict[str, Any] = {k: float(v) if _number(v) else None for k, v in numbers.items()}
        for side in SIDES:
            clean.update(self._spread(path, side, clean[f"{side}_MBps"], value))
        return {**clean, "tool": str(value.get("tool") or "unnamed tool"), "path": str(path)}

    def _spread(self, path: Path, side: str, limit: float | None, value: dict[str, Any]) -> dict[str, Any]:
        """``side``'s winning method and its spread ({side}_best, _n, _min_MBps, _max_MBps), all None where the
        baseline has none (an older one) or it does not fit the limit (a warning says so: the old rule judges)."""
        none = {f"{side}_{key}": None for key in ("best", "n", "min_MBps", "max_MBps")}
        spread = value.get(f"{side}_spread_MBps")
        if limit is None or spread is None:
            return none
        fields = spread if isinstance(spread, dict) else {}
        low, top, n = fields.get("min_MBps"), fields.get("max_MBps"), fields.get("n")
        best = value.get(f"{side}_best")
        if not (_number(low) and _number(top) and _number(n) and low <= limit <= top and isinstance(best, str)):
            self.warnings.append(f"{path}: {side}_spread_MBps {spread!r} with {side}_best {best!r} is not a spread "
                                 f"of {side}_MBps {limit:g} (positive min_MBps <= it <= max_MBps, a count n, the "
                                 "method's name); its ratios are judged by the old rule, as for a baseline without "
                                 "spread")
            return none
        if n < SPREAD_MIN_PASSES:  # a method, but no spread to judge by: the old rule, as the summary says
            return {**none, f"{side}_best": best, f"{side}_n": int(n)}
        return {f"{side}_best": best, f"{side}_n": int(n), f"{side}_min_MBps": float(low),
                f"{side}_max_MBps": float(top)}


def _number(value: Any) -> bool:
    """A positive int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

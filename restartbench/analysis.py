"""Tables across many run folders (used by analysis/summarize.py and the notebooks).

``collect(root)`` finds every run folder under ``root`` (a folder holding ``metadata.json``),
skips failed or incomplete runs with a reason, and returns one tidy row per run × event:
``kind == "checkpoint"`` (one per checkpoint tag) or ``kind == "restart"``. Figures follow
the aggregation rules of ``restartbench.results`` (max over ranks; durable = committed
after every rank's fsync).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench.events import read_events
from restartbench.results import checkpoints, iteration_time, restart


@dataclass
class Collected:
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def file_table(self) -> pd.DataFrame:
        return pd.DataFrame(self.files)


def run_folders(root: Path) -> list[Path]:
    return sorted(path.parent for path in Path(root).rglob("metadata.json"))


def collect(root: Path) -> Collected:
    collected = Collected()
    for run_dir in run_folders(root):
        try:
            _collect_run(run_dir, collected)
        except (OSError, ValueError, KeyError, TypeError) as error:
            collected.skipped.append((run_dir, f"unreadable: {error}"))
    return collected


def _collect_run(run_dir: Path, collected: Collected) -> None:
    meta = _read_json(run_dir / "metadata.json")
    if meta.get("status") != "complete":
        reason = meta.get("error") or "never finished (status 'running': killed or still going)"
        collected.skipped.append((run_dir, f"status {meta.get('status')!r}: {reason}"))
        return
    config = _read_json(run_dir / "config.json")
    events = read_events(run_dir)
    common = {
        "run": str(run_dir), "preset": meta["preset"], "layout": meta["layout"], "engine": meta["engine"],
        "ranks": meta["world_size"], "device": meta["device"], "dtype": config["model"]["dtype"],
        "storage": config["storage"]["checkpoint_dir"] or "run folder",
        "torch": meta["versions"].get("torch"), "deepspeed": meta["versions"].get("deepspeed"),
        "iteration_s": iteration_time(events),
    }
    for row in checkpoints(events):
        collected.rows.append({**common, "kind": "checkpoint", **row})
    info = restart(events)
    if info:
        parts = {f"restart {label} s": value for label, value in info.pop("parts").items()}
        collected.rows.append({**common, "kind": "restart", "restart_s": info.pop("total_s"), **info, **parts})
    inventory = run_dir / "inventory.json"
    if inventory.exists():
        for entry in _read_json(inventory):
            collected.files.append({"run": str(run_dir), "preset": meta["preset"], "layout": meta["layout"],
                                    "engine": meta["engine"], **entry})


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None


def file_statistics(files: pd.DataFrame) -> pd.DataFrame:
    """Per run, checkpoint tag and file kind: count and size distribution."""
    if files.empty:
        return files
    checkpoint_files = files[files["tag"].notna()]
    grouped = checkpoint_files.groupby(["preset", "layout", "engine", "run", "tag", "kind"])["bytes"]
    return grouped.agg(files="count", total_bytes="sum", min_bytes="min", median_bytes="median",
                       max_bytes="max").reset_index()

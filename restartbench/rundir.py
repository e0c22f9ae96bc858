"""The run folder's contract: where each file of a run lives, named once for the writers and the readers.

A run folder ``<logs>/<preset>/<layout>/<engine>/<stamp>`` holds::

    config.json      the run configuration (restartbench.config.RunConfig)
    plan.json        what the checks derived from it (study.Plan)
    metadata.json    status, versions, phases, failed checkpoints
    ds_config.json   the DeepSpeed JSON; launch.sh and the batch job script beside it
    events/<phase>-rank<NNNNN>.jsonl   every rank's timed events, written and read by restartbench.events only
    <phase>.stdout.log, <phase>.stderr.log
    runtime.json, inventory.json, baseline.json
    checkpoints/     unless --checkpoint-dir points elsewhere
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CONFIG = "config.json"
PLAN = "plan.json"
METADATA = "metadata.json"
DS_CONFIG = "ds_config.json"
LAUNCH_SCRIPT = "launch.sh"
RUNTIME = "runtime.json"
INVENTORY = "inventory.json"
CHECKPOINTS = "checkpoints"
STAMP_FORMAT = "%Y%m%d-%H%M%S"
PLACEHOLDER_STAMP = "00000000-000000"
"""The stamp of a run folder that does not exist yet (as long as a real one): what the predictor names it."""


def run_folder(logs: str | Path, preset: str, layout: str, engine: str, stamp: str = PLACEHOLDER_STAMP) -> Path:
    """``<logs>/<preset>/<layout>/<engine>/<stamp>``."""
    return Path(logs) / preset / layout / engine / stamp


def new_run_folder(logs: str | Path, preset: str, layout: str, engine: str) -> Path:
    """A run folder named after the time now, with ``-N`` appended while the name is taken."""
    stamp = time.strftime(STAMP_FORMAT)
    base = run_folder(logs, preset, layout, engine, stamp)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{stamp}-{n}")
    return candidate


def phase_log(run_dir: str | Path, phase: str, stream: str) -> Path:
    """What a phase's launch printed on ``stream`` (stdout or stderr)."""
    return Path(run_dir) / f"{phase}.{stream}.log"


def write_json(path: str | Path, value: Any) -> None:
    """Write ``value`` as JSON through a temporary file and a rename: a reader sees the old file or the new one."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())

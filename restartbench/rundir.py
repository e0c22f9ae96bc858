"""The run folder's contract: where each file of a run lives, named once for the writers and the readers.

A run folder ``<logs>/<preset>/<layout>/<engine>/<stamp>`` holds::

    config.json      the run configuration (restartbench.config.RunConfig)
    plan.json        what the checks derived from it (RunPlan)
    metadata.json    status, versions, phases, failed checkpoints
    ds_config.json   the DeepSpeed JSON; launch.sh and the batch job script beside it
    events/<phase>-rank<NNNNN>.jsonl   every rank's timed events, written and read by restartbench.events only
    <phase>.stdout.log, <phase>.stderr.log
    runtime.json, inventory.json, baseline.json
    layouts/<layout>/  plan.json, ds_config.json and launch.sh of a restart on another layout (--restore-layout)
    checkpoints/     unless --checkpoint-dir points elsewhere
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, fields
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
LAYOUTS = "layouts"
STAMP_FORMAT = "%Y%m%d-%H%M%S"
STAMP_SUFFIX_BYTES = 3
"""Random bytes after the time in a run folder's name (6 hex digits): launches in the same second differ."""
PLACEHOLDER_STAMP = "00000000-000000-000000"
"""The stamp of a run folder that does not exist yet (as long as a real one): what the predictor names it."""


def run_folder(logs: str | Path, preset: str, layout: str, engine: str, stamp: str = PLACEHOLDER_STAMP) -> Path:
    """``<logs>/<preset>/<layout>/<engine>/<stamp>``."""
    return Path(logs) / preset / layout / engine / stamp


def new_run_folder(logs: str | Path, preset: str, layout: str, engine: str) -> Path:
    """A run folder's path, named after the time now and a random suffix: unique however many launches start in the
    same second on however many nodes, with no look at what exists (``create_run_folder`` makes it, or refuses)."""
    stamp = f"{time.strftime(STAMP_FORMAT)}-{secrets.token_hex(STAMP_SUFFIX_BYTES)}"
    return run_folder(logs, preset, layout, engine, stamp)


def create_run_folder(path: str | Path) -> None:
    """Create the run folder itself, atomically: its parents may exist (other launches make them too), the folder
    may not (FileExistsError: another launch owns it, and nothing of it is touched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()


def launch_folder(run_dir: str | Path, restore_layout: str | None = None) -> Path:
    """Where a launch's plan.json, ds_config.json and launch.sh are: the run folder itself, or for a restart on
    another layout (``restore_layout``, a canonical layout name), ``layouts/<layout>/`` inside it."""
    return Path(run_dir) if restore_layout is None else Path(run_dir) / LAYOUTS / restore_layout


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


class RunFolderError(ValueError):
    """A file of a run folder is missing or malformed, or was written by another version; the message names it."""


@dataclass
class RunPlan:
    """Everything derived from the config that the launch and the ranks need: plan.json, written once by the
    launcher (``restartbench.study.plan_run``) and read by the launcher, every rank and the analysis."""

    preset: dict[str, Any]
    layout: dict[str, int]
    layout_name: str
    world_size: int
    nnodes: int
    nproc_per_node: int
    device: str
    backend: str
    grad_accum: int
    run_dir: str
    checkpoint_dir: str
    master_port: int
    checkpoint_bytes_estimate: int
    memory_per_rank_estimate: str
    launcher: str
    remote: dict[str, Any] | None = None
    """For an object-store checkpoint_dir (s3://, gs://), how to reach it (storage.S3Settings or GCSSettings: the
    scheme, client, endpoint, region, addressing, where the credentials come from — never their values); None for
    a folder."""

    def save(self, run_dir: str | Path) -> None:
        write_json(Path(run_dir) / PLAN, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> RunPlan:
        """The plan of a run folder; one with a field missing or unknown is refused (another version wrote it)."""
        path = Path(run_dir) / PLAN
        try:
            stored = read_json(path)
        except json.JSONDecodeError as error:
            raise RunFolderError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
        if not isinstance(stored, dict):
            raise RunFolderError(f"{path}: expected a JSON object, got {type(stored).__name__}")
        names = [f.name for f in fields(cls)]
        missing = ", ".join(repr(name) for name in names if name not in stored)
        unknown = ", ".join(repr(name) for name in stored if name not in names)
        if missing or unknown:
            found = "; ".join(filter(None, [missing and f"it lacks the field(s) {missing}",
                                            unknown and f"it has the unknown field(s) {unknown}"]))
            raise RunFolderError(f"{path} was written by another version of restartbench: {found}. Plan and run it "
                                 "again with this version (config-n-run.py), or read it with the version that wrote it")
        return cls(**stored)

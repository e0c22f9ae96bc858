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

A run folder can be moved or copied: the paths inside it are relative to it. plan.json names its run folder relative
to its own folder (``.``, or ``../..`` in ``layouts/<layout>/``) and the checkpoints relative to the run folder, or,
outside it (a ``--checkpoint-dir`` elsewhere, s3://, gs://), by absolute path or URL with ``checkpoint_external``
true; launch.sh finds the run folder from its own place. Loaded, a plan's paths are absolute again. Run folders
written before (absolute paths) still read; one that has moved since is ``moved_from`` its recorded place.
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


def read_metadata(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's metadata.json; one that is not a JSON object is refused naming the file (RunFolderError)."""
    path = Path(run_dir) / METADATA
    try:
        meta = read_json(path)
    except json.JSONDecodeError as error:
        meta = error
    if not isinstance(meta, dict):
        what = (f"is not valid JSON ({meta.msg} at line {meta.lineno})" if isinstance(meta, json.JSONDecodeError)
                else f"holds {type(meta).__name__}, not a JSON object")
        raise RunFolderError(f"{path} {what}: it is the run's record of its status, phases and restore attempts, and "
                             "nothing can be added to it. Put back the file from the folder this run was copied from "
                             "(or a backup); nothing was written")
    return meta


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

    @property
    def checkpoint_external(self) -> bool:
        """The checkpoints are outside the run folder (a --checkpoint-dir elsewhere, an object store): they do not
        move with it."""
        return not _inside(self.checkpoint_dir, self.run_dir)

    def save(self, folder: str | Path) -> None:
        """Write plan.json into ``folder`` (the run folder, or ``layouts/<layout>/`` in it), paths relative."""
        write_json(Path(folder) / PLAN, self.stored(folder))

    def stored(self, folder: str | Path) -> dict[str, Any]:
        """plan.json's content in ``folder``: the run folder relative to ``folder``, the checkpoints relative to the
        run folder unless external (then as they are, marked so)."""
        stored = asdict(self)
        stored["run_dir"] = os.path.relpath(os.path.abspath(self.run_dir), os.path.abspath(folder))
        if not self.checkpoint_external:
            stored["checkpoint_dir"] = os.path.relpath(os.path.abspath(self.checkpoint_dir),
                                                       os.path.abspath(self.run_dir))
        stored[CHECKPOINT_EXTERNAL] = self.checkpoint_external
        return stored

    @classmethod
    def load(cls, folder: str | Path) -> RunPlan:
        """The plan in ``folder`` (a run folder, or ``layouts/<layout>/`` in one), its paths absolute where the
        folder is now; one with a field missing or unknown is refused (another version wrote it)."""
        stored = _plan_json(Path(folder) / PLAN)
        stored.pop(CHECKPOINT_EXTERNAL, None)  # absent from plans written before run folders could move
        cls._check_fields(Path(folder) / PLAN, stored)
        stored["run_dir"], stored["checkpoint_dir"] = _absolute_paths(Path(folder), stored["run_dir"],
                                                                      stored["checkpoint_dir"])
        return cls(**stored)

    @classmethod
    def _check_fields(cls, path: Path, stored: dict[str, Any]) -> None:
        names = [f.name for f in fields(cls)]
        missing = ", ".join(repr(name) for name in names if name not in stored)
        unknown = ", ".join(repr(name) for name in stored if name not in names)
        if missing or unknown:
            found = "; ".join(filter(None, [missing and f"it lacks the field(s) {missing}",
                                            unknown and f"it has the unknown field(s) {unknown}"]))
            raise RunFolderError(f"{path} was written by another version of restartbench: {found}. Plan and run it "
                                 "again with this version (config-n-run.py), or read it with the version that wrote it")


CHECKPOINT_EXTERNAL = "checkpoint_external"
"""plan.json's mark of checkpoints outside the run folder, named by absolute path or URL."""


def _plan_json(path: Path) -> dict[str, Any]:
    try:
        stored = read_json(path)
    except FileNotFoundError:
        raise RunFolderError(f"{path} is missing: {path.parent} is no run folder planned by config-n-run.py (or its "
                             "plan.json was not copied with it)") from None
    except json.JSONDecodeError as error:
        raise RunFolderError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(stored, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(stored).__name__}")
    return stored


def _inside(path: str, folder: str) -> bool:
    """``path`` (a local path, not a URL) is ``folder`` or lies under it."""
    return "://" not in path and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def _run_folder_of(folder: Path) -> Path:
    """The run folder a plan.json in ``folder`` belongs to: ``folder`` itself, or two up from ``layouts/<layout>/``."""
    return folder.parent.parent if folder.parent.name == LAYOUTS else folder


def _absolute_paths(folder: Path, run_dir: str, checkpoint_dir: str) -> tuple[str, str]:
    """A stored plan's run folder and checkpoint location as absolute paths (a URL as it is). A relative run folder
    is relative to ``folder``, relative checkpoints to the run folder. A plan written with absolute paths whose run
    folder has since moved reads its checkpoints under the recorded run folder from the folder's place now."""
    if not os.path.isabs(run_dir):
        run_dir = os.path.normpath(os.path.join(os.path.abspath(folder), run_dir))
    elif _moved(run_dir, here := os.path.abspath(_run_folder_of(folder))):  # written before run folders could move
        if os.path.isabs(checkpoint_dir) and _inside(checkpoint_dir, run_dir):
            checkpoint_dir = os.path.normpath(os.path.join(here, os.path.relpath(checkpoint_dir, run_dir)))
        run_dir = here
    if "://" in checkpoint_dir or os.path.isabs(checkpoint_dir):
        return run_dir, checkpoint_dir
    return run_dir, os.path.normpath(os.path.join(run_dir, checkpoint_dir))


def _moved(recorded: str, here: str) -> bool:
    try:
        return not os.path.samefile(recorded, here)
    except OSError:  # the recorded folder is gone
        return True


def moved_from(run_dir: str | Path) -> str | None:
    """Where a run folder written before run folders could move (its plan.json and launch.sh name it by absolute
    path) was written, when it is not there now: its launch.sh would run there. None for a run folder whose paths are
    relative to it, or one still where it was written."""
    recorded = _plan_json(Path(run_dir) / PLAN).get("run_dir")
    if not isinstance(recorded, str) or not os.path.isabs(recorded):
        return None
    return recorded if _moved(recorded, os.path.abspath(run_dir)) else None

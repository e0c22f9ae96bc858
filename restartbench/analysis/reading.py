"""Reading a run folder's JSON files for the analysis: each file checked as it is read, every error naming the file
(``RunFolderError``), the columns plan.json gives, and the checkpoint size this version predicts for the run."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from restartbench import rundir
from restartbench.config import RunConfig
from restartbench.estimate import checkpoint_bytes
from restartbench.rundir import RunFolderError, RunPlan


def read_json(path: Path, expected: type | None = None) -> Any:
    try:
        value = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except json.JSONDecodeError as error:
        raise RunFolderError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunFolderError(f"{path}: cannot be read ({error})") from None
    if expected is not None and not isinstance(value, expected):
        raise RunFolderError(f"{path}: expected a JSON {'object' if expected is dict else 'array'}, "
                             f"got {type(value).__name__}")
    return value


def require(mapping: dict[str, Any], key: str, path: Path) -> Any:
    if mapping.get(key) is None:
        raise RunFolderError(f"{path}: lacks the field {key!r}")
    return mapping[key]


def section(config: dict[str, Any], name: str, run_dir: Path) -> dict[str, Any]:
    section = config.get(name) or {}
    if not isinstance(section, dict):
        raise RunFolderError(f"{run_dir / rundir.CONFIG}: section {name!r} should be an object")
    return section


def quiet_metadata(run_dir: Path) -> tuple[str | None, str | None, str | None]:
    """(preset, layout, engine) of a run that could not be read, from metadata.json or else the folder names."""
    try:
        meta = json.loads((run_dir / rundir.METADATA).read_text())
        return meta.get("preset"), meta.get("layout"), meta.get("engine")
    except Exception:  # noqa: BLE001
        parts = run_dir.parts
        return tuple(parts[-4:-1]) if len(parts) >= 4 else (None, None, None)  # type: ignore[return-value]


def plan_columns(run_dir: Path) -> dict[str, Any]:
    """The table's columns from plan.json; empty for a run folder without one."""
    if not (run_dir / rundir.PLAN).exists():
        return dict.fromkeys(("tp", "pp", "dp", "client", "backend", "checkpoint_bytes_estimate")) | {"nodes": 1}
    plan = RunPlan.load(run_dir)
    return {"tp": plan.layout.get("tp"), "pp": plan.layout.get("pp"), "dp": plan.layout.get("dp"),
            "client": (plan.remote or {}).get("client"), "nodes": plan.nnodes, "backend": plan.backend,
            "checkpoint_bytes_estimate": plan.checkpoint_bytes_estimate}


def predicted_bytes(config: dict[str, Any], planned: Any) -> int | None:
    """The checkpoint plan's size for the run's configuration and engine (restartbench.plan, to the byte where the
    format allows; cached); the run's own plan.json figure where this version cannot predict it (a preset or
    option it does not know)."""
    predicted = _predicted_from_text(json.dumps(config, sort_keys=True))
    return planned if predicted is None else predicted


@functools.lru_cache(maxsize=1024)
def _predicted_from_text(config: str) -> int | None:
    """The prediction of one config.json (as canonical JSON text: runs of one configuration share it, and reading
    the config again costs as much as the rest of a run's parse); None where this version cannot make one."""
    try:
        return checkpoint_bytes(RunConfig.from_dict(json.loads(config)))
    except Exception:  # noqa: BLE001 - a config this version cannot read or predict
        return None

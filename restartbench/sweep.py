"""Sweeps: the study's cross-product, resumable. ``python -m restartbench.sweep FILE [--dry-run]``.

A sweep file (YAML)::

    presets: [tiny]
    layouts: [tp2pp2, pp2dp2]
    engines: [torch, none]
    repetitions: 2
    options:                 # any run-configuration field, by its name (see config-n-run.py --help)
      dtype: fp32
      iters: 4
    logs: logs/sweep-demo    # optional; default: logs/<sweep file name>

Every cell (preset × layout × engine × repetition) has a fixed run folder,
``<logs>/<preset>/<layout>/<engine>/rep<N>``, so a rerun skips the cells whose folder is
complete, leaves running or submitted ones alone, and retries the rest after moving the
failed or interrupted attempt aside (``rep<N>.attempt<K>``: the evidence is kept). With
``launcher: slurm`` and ``submit: true`` in the options, each cell is its own batch job.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from restartbench import engines, rundir
from restartbench.cli import run
from restartbench.config import RunConfig, check_allowed, check_type, leaf_fields
from restartbench.errors import StudyError
from restartbench.progress import say
from restartbench.study import plan_run

LIST_KEYS = ("presets", "layouts", "engines")
KNOWN_KEYS = set(LIST_KEYS) | {"repetitions", "options", "logs"}
UNSWEEPABLE = {"preset", "layout", "engine", "run_dir", "logs", "dry_run"}
DONE, RUNNING, FAILED, PENDING = "done", "running", "failed", "pending"


class SweepError(ValueError):
    pass


@dataclass(frozen=True)
class Cell:
    preset: str
    layout: str
    engine: str
    repetition: int

    def describe(self) -> str:
        return f"{self.preset} {self.layout} {self.engine} rep{self.repetition}"


@dataclass
class Sweep:
    cells: list[Cell]
    options: dict[str, Any]
    logs: Path


def load_sweep(path: Path) -> Sweep:
    """Parse and check a sweep file; every problem names the key and what is expected."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SweepError(f"cannot read sweep file {path}: {error}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping with keys {sorted(KNOWN_KEYS)}")
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise SweepError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    lists = {key: _string_list(path, key, data.get(key)) for key in LIST_KEYS}
    repetitions = data.get("repetitions", 1)
    if not isinstance(repetitions, int) or isinstance(repetitions, bool) or repetitions < 1:
        raise SweepError(f"{path}: 'repetitions' must be a whole number ≥ 1, got {repetitions!r}")
    options = _options(path, data.get("options") or {})
    _check_engine_options_read(path, options, lists["engines"])
    cells = [Cell(preset, layout, engine, repetition)
             for preset, layout, engine in itertools.product(*lists.values())
             for repetition in range(1, repetitions + 1)]
    logs = data.get("logs")
    if logs is not None and (not isinstance(logs, str) or not logs.strip()):
        raise SweepError(f"{path}: 'logs' must be a folder name, got {logs!r}")
    return Sweep(cells, options, Path(logs or Path("logs") / Path(path).stem))


def _string_list(path: Path, key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, (str, int)) for v in value):
        raise SweepError(f"{path}: {key!r} must be a non-empty list of names, got {value!r}")
    return [str(v) for v in value]


def _options(path: Path, options: Any) -> dict[str, Any]:
    """Options by leaf name, each type-checked against the run configuration."""
    if not isinstance(options, dict):
        raise SweepError(f"{path}: 'options' must be a mapping of option names to values")
    leaves = {leaf.name: (section, leaf) for section, leaf in leaf_fields()}
    settable = sorted(set(leaves) - UNSWEEPABLE)
    for name, value in options.items():
        if name not in settable:
            raise SweepError(f"{path}: option {name!r} cannot be set in a sweep; settable: {settable}")
        try:
            check_type(*leaves[name], value)
            check_allowed(leaves[name][1], value)
        except ValueError as error:
            raise SweepError(f"{path}: option {error}") from None
    return dict(options)


def _check_engine_options_read(path: Path, options: dict[str, Any], names: list[str]) -> None:
    """An engine's option that none of the sweep's engines reads is refused: every cell would go without it. (An
    unknown engine's name is refused with its cell.)"""
    read = {name for engine in names if engine in engines.engine_names()
            for name in engines.engine_info(engine).options}
    unread = sorted((set(options) & set(engines.option_defaults())) - read)
    if unread:
        raise SweepError(f"{path}: option(s) {unread} are read by none of the sweep's engines ({', '.join(names)}): "
                         "drop them, or add the engines they are for (config-n-run.py --help says whose each is)")


def cell_config(sweep: Sweep, cell: Cell) -> RunConfig:
    """The cell's run configuration: the sweep's options, less the engine options its engine does not read (another
    engine of the sweep's), so that its config.json sets only what its run uses."""
    sections: dict[str, dict[str, Any]] = {}
    foreign = set(engines.option_defaults()) - set(engines.engine_info(cell.engine).options) \
        if cell.engine in engines.engine_names() else set()
    for section, leaf in leaf_fields():
        if leaf.name in sweep.options and leaf.name not in foreign:
            sections.setdefault(section, {})[leaf.name] = sweep.options[leaf.name]
    sections.setdefault("model", {})["preset"] = cell.preset
    sections.setdefault("layout", {})["layout"] = cell.layout
    sections.setdefault("engine", {})["engine"] = cell.engine
    sections.setdefault("paths", {})["logs"] = str(sweep.logs)
    cfg = RunConfig.from_dict(sections)
    plan = plan_run(dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, dry_run=True)))
    cfg.paths.run_dir = str(Path(plan.run_dir).parent / f"rep{cell.repetition}")
    return cfg


def unique_cells(configs: dict[Cell, RunConfig]) -> tuple[dict[Cell, RunConfig], dict[Cell, list[Cell]]]:
    """One cell per run folder: cells whose layouts are one layout written differently (tp2pp2, pp2tp2,
    TP2PP2dp1) share their canonical folder, so they are one cell. Returns the kept cells and, for each, the others
    that named it again."""
    kept: dict[Cell, RunConfig] = {}
    first_of: dict[str, Cell] = {}
    duplicates: dict[Cell, list[Cell]] = {}
    for cell, cfg in configs.items():
        first = first_of.setdefault(cfg.paths.run_dir, cell)
        if first is cell:
            kept[cell] = cfg
        else:
            duplicates.setdefault(first, []).append(cell)
    return kept, duplicates


def cell_state(run_dir: Path) -> str:
    """done, running (a batch job still queued or running), failed (or interrupted), or pending."""
    path = run_dir / rundir.METADATA
    if not path.exists():
        return PENDING if not run_dir.exists() else FAILED
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError:
        return FAILED
    status = meta.get("status")
    if status in ("complete", "skipped"):
        return DONE
    if status == "prepared":
        return PENDING
    if status in ("submitted", "running") and meta.get("job_id") and _slurm_job_alive(meta["job_id"]):
        return RUNNING
    return FAILED


def _slurm_job_alive(job_id: str) -> bool:
    if shutil.which("squeue") is None:
        return False
    queued = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True)
    return queued.returncode == 0 and bool(queued.stdout.strip())


def set_aside(run_dir: Path) -> Path:
    """Move a failed or interrupted attempt out of the cell's place, keeping it for inspection."""
    attempt = 1
    while (target := run_dir.with_name(f"{run_dir.name}.attempt{attempt}")).exists():
        attempt += 1
    run_dir.rename(target)
    return target


def run_sweep(path: Path, dry_run: bool = False) -> int:
    sweep = load_sweep(path)
    configs, duplicates = unique_cells({cell: cell_config(sweep, cell) for cell in sweep.cells})
    for first, others in duplicates.items():
        say(f"{', '.join(other.describe() for other in others)}: the same cell as {first.describe()} "
            f"(one run folder, {configs[first].paths.run_dir}), run once")
    states = {cell: cell_state(Path(cfg.paths.run_dir)) for cell, cfg in configs.items()}
    say(f"sweep {path}: {len(configs)} cells under {sweep.logs}; " + _tally(states))
    if dry_run:
        for cell, state in states.items():
            say(f"  {state:8s} {cell.describe()} -> {configs[cell].paths.run_dir}")
        return 0
    for index, (cell, cfg) in enumerate(configs.items(), start=1):
        run_dir = Path(cfg.paths.run_dir)
        states[cell] = cell_state(run_dir)  # again, now: another sweep may have run the cell meanwhile
        if states[cell] in (DONE, RUNNING):  # never moved aside
            say(f"cell {index}/{len(configs)} {cell.describe()}: {states[cell]}, skipped")
            continue
        if run_dir.exists():
            say(f"cell {index}/{len(configs)} {cell.describe()}: earlier attempt moved to {set_aside(run_dir).name}")
        say(f"cell {index}/{len(configs)} {cell.describe()}: running")
        try:
            run(cfg)
        except StudyError as error:
            say(f"cell {cell.describe()}: error: {error}")
        states[cell] = cell_state(run_dir)
        say(f"sweep progress: {_tally(states)}")
    return 0 if all(state in (DONE, RUNNING) for state in states.values()) else 1


def _tally(states: dict[Cell, str]) -> str:
    counts = Counter(states.values())
    return ", ".join(f"{counts[s]} {s}" for s in (DONE, RUNNING, FAILED, PENDING))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="submit-job.sh --sweep", description="Run (or resume) a study sweep.")
    parser.add_argument("file", type=Path, help="sweep file (YAML)")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and their state; run nothing")
    args = parser.parse_args(argv)
    try:
        return run_sweep(args.file, args.dry_run)
    except (SweepError, StudyError) as error:
        say(f"error: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

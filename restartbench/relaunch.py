"""Restart a run again from its kept checkpoints: ``./submit-job.sh --restore RUN_DIR [--repeat N] [--tag TAG]``.

At scale, training up to a checkpoint is what costs; restarting from it does not. Each relaunch is a new restore
attempt of the run (2, 3...; the run's own restore is attempt 1): a fresh launch of the restore phase on the run's
layout, cold (its page cache evicted first) unless ``--restore-cache warm``, with records of its own:
``events/restore-N-rank*.jsonl``, ``restore-N.stdout.log`` and ``.stderr.log``, and an entry in ``metadata.json``'s
``restarts`` (start, end, exit code, the options it chose, the checkpoint it restored, whether it fell back, its
verdict). Nothing appends to an earlier attempt's records; the run's status and phase 1's records stay as they were.
``analysis/summarize.py`` gives each attempt its own restart row, and the medians over them.

``--restore-layout LAYOUT`` restarts on another parallel layout (tp, pp, dp; the run's global batch kept): its plan,
DeepSpeed JSON and launch script go to ``layouts/<layout>/``; the engine restores there by its converter (DeepSpeed's
universal checkpoints) or at load, and an engine that can do neither is recorded as a ``skipped`` attempt with the
reason, without a launch.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from restartbench import engines, rundir, storage
from restartbench.config import RunConfig
from restartbench.config_fields import flag
from restartbench.errors import StudyError
from restartbench.events import EVENTS_FOLDER, phase_record
from restartbench.integrity import committed_tags
from restartbench.launchers import LAUNCHERS, Launcher
from restartbench.progress import say
from restartbench.rank_args import ATTEMPT_OPTIONS, add_attempt_options
from restartbench.run_plan import free_port, plan_layout_restart
from restartbench.rundir import RunFolderError, RunPlan
from restartbench.study import prepare_layout_restart, refuse_if_moved, restart_record, run_phase, skipped_restart

LOCK_FILE = ".restore.lock"
"""Held while a relaunch runs: two at once would share the checkpoint's page cache and the run's port."""
FINISHED = ("complete", "failed")
"""Run statuses whose phases are over: a restore may be measured again."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen = {name: getattr(args, name) for name in ("tag", "restore_layout", *ATTEMPT_OPTIONS)
              if getattr(args, name) is not None}
    try:
        return relaunch(args.run_dir, args.repeat, chosen)
    except (StudyError, RunFolderError) as refusal:
        say(f"error: {refusal}")
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="submit-job.sh --restore", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder whose phase 1 committed "
                        "checkpoints (the folder holding metadata.json)")
    parser.add_argument("--repeat", type=_at_least_one, default=1, help="restore attempts, one after another "
                        "(default 1)")
    parser.add_argument("--tag", help="restore this committed checkpoint (such as step2) instead of the one 'latest' "
                        "names")
    parser.add_argument("--restore-layout", metavar="LAYOUT", help="restart on another parallel layout (such as "
                        "pp2dp2 or dp4), keeping the run's global batch; default: the run's own")
    add_attempt_options(parser)
    return parser


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def relaunch(run_dir: Path, repeat: int, chosen: dict[str, Any]) -> int:
    """Run ``repeat`` restore attempts of ``run_dir`` with the options ``chosen``; 0 when every one was exact (or,
    for engine none and unverified runs, ended normally)."""
    run_dir = Path(run_dir)
    cfg, plan, meta = _restartable(run_dir, chosen.get("tag"))
    launcher = _launcher_here(plan)
    verdicts = []
    if chosen.get("restore_layout") and meta.get("emulation"):
        raise StudyError(f"run {run_dir} is emulated (--emulate), and an emulated restore loads on the run's own "
                         "layout only; leave out --restore-layout, or measure the restart on another layout with a "
                         "real run")
    with _only_relaunch(run_dir):
        if chosen.get("restore_layout"):
            plan, chosen = _on_layout(cfg, plan, chosen)
            if plan is None:
                return _skipped(run_dir, meta, chosen, engines.engine_info(cfg.engine.engine).not_resharded)
        for _ in range(repeat):
            verdicts.append(_attempt(run_dir, cfg, plan, launcher, chosen, meta))
    return 0 if all(v in ("exact", "not verified") for v in verdicts) else 1


def _on_layout(cfg: RunConfig, plan: RunPlan, chosen: dict[str, Any]) -> tuple[RunPlan | None, dict[str, Any]]:
    """The plan of the restarts on the layout ``chosen`` names, written into the run folder (None: the engine cannot
    restart on another layout), and ``chosen`` with the layout's canonical name. A layout the run cannot restart on
    is refused whatever the engine."""
    changed, layout_plan = plan_layout_restart(cfg, plan, chosen["restore_layout"])
    chosen = {**chosen, "restore_layout": layout_plan.layout_name}
    if not engines.engine_info(cfg.engine.engine).reshards:
        return None, chosen
    prepare_layout_restart(changed, layout_plan)
    return layout_plan, chosen


def _skipped(run_dir: Path, meta: dict[str, Any], chosen: dict[str, Any], reason: str) -> int:
    """Record a restart the engine cannot make as a ``skipped`` attempt, with the reason; nothing is launched."""
    attempt = next_attempt(run_dir, meta)
    meta.setdefault("restarts", []).append(skipped_restart(attempt, chosen, reason))
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"restore attempt {attempt}: skipped (--restore-layout {chosen['restore_layout']}): engine "
        f"{meta.get('engine')} {reason}")
    return 0


def _restartable(run_dir: Path, tag: str | None) -> tuple[RunConfig, RunPlan, dict[str, Any]]:
    """The run's config, plan and metadata, once it is known to hold something to restart from (``tag``, if
    given)."""
    if not (run_dir / rundir.METADATA).is_file():
        raise StudyError(f"{run_dir} is not a run folder (no {rundir.METADATA}); give the folder config-n-run.py "
                         "printed as 'run folder ...'")
    meta = rundir.read_metadata(run_dir)
    refuse_if_moved(run_dir)
    try:
        cfg = RunConfig.load(run_dir / rundir.CONFIG)
    except (OSError, ValueError) as error:
        raise StudyError(f"{run_dir} has no config.json this version can read ({error}); restore it from the "
                         "folder this run was copied from") from None
    plan = RunPlan.load(run_dir)
    if meta.get("status") not in FINISHED:
        raise StudyError(f"run {run_dir} has not finished (status {meta.get('status')!r}): its phases may still be "
                         "running; restore it again once it is complete or failed")
    if not engines.engine_info(cfg.engine.engine).saves_state:  # nothing to check or restore
        return cfg, plan, meta
    _checkpoints_present(run_dir, plan)
    committed = committed_tags(storage.open_store(plan.checkpoint_dir, plan.remote))
    if not committed:
        raise StudyError(f"{plan.checkpoint_dir} holds no committed checkpoint of run {run_dir} (a tag with its "
                         "manifest), so there is nothing to restore")
    if tag is not None and tag not in committed:
        raise StudyError(f"--tag {tag} is not a committed checkpoint of run {run_dir}; its committed checkpoints "
                         f"are {', '.join(committed)}")
    return cfg, plan, meta


def _checkpoints_present(run_dir: Path, plan: RunPlan) -> None:
    """A run folder whose checkpoint folder is gone (moved or copied without it, or an external one removed) is
    refused, saying where it looked."""
    if plan.remote or Path(plan.checkpoint_dir).is_dir():
        return
    where = ("its external --checkpoint-dir, outside the run folder" if plan.checkpoint_external else
             f"the run folder's own {rundir.CHECKPOINTS}/")
    raise StudyError(f"the checkpoints of run {run_dir} are gone: looked in {plan.checkpoint_dir} ({where}), which "
                     "is not a folder. Put them back there (a copied run folder needs its checkpoints/ copied too) "
                     "and relaunch; nothing was written")


def _launcher_here(plan: RunPlan) -> Launcher:
    """The run's launcher, where it can start the run's ranks from here."""
    launcher = LAUNCHERS[plan.launcher]
    if launcher.job_template and not launcher.inside_allocation():
        how = "salloc --nodes" if launcher.name == "slurm" else "qsub -I -l select="
        raise StudyError(f"run {plan.run_dir} ran under {launcher.name} on {plan.nnodes} node(s); relaunch its "
                         f"restore inside an allocation of as many nodes ({how}{plan.nnodes} ...), then run "
                         f"./submit-job.sh --restore {plan.run_dir} there")
    return launcher


@contextmanager
def _only_relaunch(run_dir: Path) -> Iterator[None]:
    """Hold the run's relaunch lock; refuse if another relaunch of the run holds it."""
    with open(run_dir / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StudyError(f"another --restore of {run_dir} is running; wait for it to end (two at once would "
                             "share the checkpoint's page cache and the run's port)") from None
        yield


def _attempt(run_dir: Path, cfg: RunConfig, plan: RunPlan, launcher: Launcher, chosen: dict[str, Any],
             meta: dict[str, Any]) -> str:
    """One restore attempt, recorded in metadata.json before its launch and after; its verdict."""
    attempt = next_attempt(run_dir, meta)
    record = phase_record("restore", attempt)
    rank_args = ("--attempt", str(attempt),
                 *(arg for name, value in chosen.items() for arg in (flag(name), value)))
    restarts = meta.setdefault("restarts", [])
    restarts.append({"attempt": attempt, "record": record, **chosen, "verdict": "running"})
    rundir.write_json(run_dir / rundir.METADATA, meta)
    env = {"RB_MASTER_PORT": str(free_port())} if plan.nnodes == 1 else {}
    launch_dir = rundir.launch_folder(run_dir, chosen.get("restore_layout"))
    result = run_phase(run_dir, record, launcher.phase_command(launch_dir, "restore", plan.nnodes, rank_args),
                       cfg.launch.phase_timeout_s, env)
    restarts[-1] = restart_record(run_dir, attempt, result, chosen)
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(_summary(restarts[-1]))
    return restarts[-1]["verdict"]


def next_attempt(run_dir: Path, meta: dict[str, Any]) -> int:
    """One more than any attempt metadata.json lists or an events file names (a relaunch killed before it wrote
    metadata.json still left its files)."""
    listed = [r["attempt"] for r in meta.get("restarts", [])]
    found = [int(name.split("-")[1]) for name in _event_file_names(run_dir)
             if name.startswith("restore-") and name.split("-")[1].isdigit()]
    had_first = (meta.get("phases") or {}).get("restore") is not None
    return max([1 if had_first else 0, *listed, *found]) + 1


def _event_file_names(run_dir: Path) -> list[str]:
    folder = run_dir / EVENTS_FOLDER
    return os.listdir(folder) if folder.is_dir() else []


def _summary(entry: dict[str, Any]) -> str:
    on = f" on {entry['restore_layout']}" if entry.get("restore_layout") else ""
    what = f"restore attempt {entry['attempt']}{on}: {entry['verdict']}"
    if entry["restart_s"] is None:  # run_phase said why
        return f"{what}; its records: events/{entry['record']}-rank*.jsonl, {entry['record']}.stderr.log"
    fell_back = f", fell back from {entry['fell_back_from']}" if entry["fell_back_from"] else ""
    cache = {"remote": "read from the object store", "converted": "loaded from what the conversion had just written"
             }.get(entry["cache"], f"{entry['cache']} page cache")
    source = f"from {entry['tag']}{fell_back} ({cache})" if entry["tag"] else "without a checkpoint"
    return (f"{what} {source}: {entry['restart_s']:.2f} s from launch to the end of the first resumed iteration "
            "(max over ranks)")


if __name__ == "__main__":
    sys.exit(main())

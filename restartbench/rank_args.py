"""The command line of a rank program (``restartbench.train``, ``restartbench.emulate``), as ``launch.sh PHASE
[OPTIONS]`` passes it: the run folder, the phase, and for a restore the attempt and what a restore-only relaunch
(``./submit-job.sh --restore``) may choose for it. Stdlib only: a rank's imports are a measured restart part."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from restartbench.config import LaunchConfig, RunConfig
from restartbench.config_fields import flag

#: The launch options an attempt may set for itself, each a ``LaunchConfig`` field (its choices and help).
ATTEMPT_OPTIONS = ("on_corrupt", "restore_cache")


@dataclass(frozen=True)
class RankArgs:
    run_dir: Path
    phase: str
    attempt: int
    """1: the run's own restore; 2, 3...: restore-only relaunches, each with records of its own."""
    tag: str | None
    """The committed checkpoint to restore; None: the one ``latest`` names."""
    restore_layout: str | None
    """A restart on another layout (its canonical name): the launch's plan and DeepSpeed JSON are in
    ``layouts/<layout>/`` of the run folder; None: the run's own layout."""
    on_corrupt: str | None
    restore_cache: str | None

    def attempt_config(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with the options this attempt chose (config.json stays as the run wrote it)."""
        chosen = {name: getattr(self, name) for name in ATTEMPT_OPTIONS if getattr(self, name) is not None}
        return dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, **chosen))


def parse_rank_args(argv: list[str] | None, description: str) -> RankArgs:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--phase", required=True, choices=("train", "restore"))
    parser.add_argument("--attempt", type=int, default=1, help="restore attempt (1: the run's own restore)")
    parser.add_argument("--tag", help="restore this committed checkpoint instead of the one 'latest' names")
    parser.add_argument("--restore-layout", help="restart on this layout, planned in layouts/<layout>/")
    add_attempt_options(parser)
    args = parser.parse_args(argv)
    if args.attempt < 1:
        parser.error(f"--attempt must be at least 1 (got {args.attempt})")
    return RankArgs(**vars(args))


def add_attempt_options(parser: argparse.ArgumentParser) -> None:
    """The launch options an attempt may choose (``ATTEMPT_OPTIONS``), with their choices and help from
    ``LaunchConfig``: the same on the rank's command line and on ``./submit-job.sh --restore``'s."""
    launch = {f.name: f for f in dataclasses.fields(LaunchConfig)}
    for name in ATTEMPT_OPTIONS:
        parser.add_argument(flag(name), choices=launch[name].metadata["choices"],
                            help=f"{launch[name].metadata['doc']} Default: as the run was configured (config.json).")

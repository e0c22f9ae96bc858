"""The command line of one run (``config-n-run.py``): a real study run, or an emulated one (``--emulate``)."""

from __future__ import annotations

from restartbench.config import RunConfig, config_from_args
from restartbench.emulated_study import run_emulation
from restartbench.errors import StudyError
from restartbench.progress import say
from restartbench.study import run_study


def run(cfg: RunConfig) -> int:
    """Plan, write the run folder and run it: checkpoint I/O only on CPU processes when ``--emulate`` is given."""
    return run_emulation(cfg) if cfg.emulation.emulate else run_study(cfg)


def main(argv: list[str]) -> int:
    cfg = config_from_args(argv)
    try:
        return run(cfg)
    except StudyError as error:
        say(f"error: {error}")
        return 2

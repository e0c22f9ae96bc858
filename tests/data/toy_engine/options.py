"""The toy engine's one option: a field of the run's ``EngineConfig`` and ``--toy-file-prefix`` of
``config-n-run.py``, with nothing else to change (docs/adding-an-engine.md)."""

from __future__ import annotations

from dataclasses import dataclass

from restartbench.config_fields import Allowed, opt


@dataclass
class ToyOptions:
    toy_file_prefix: str = opt("toy", "toy: how each rank's checkpoint file is named, <prefix>-rank<N>.pt.",
                               allowed=Allowed(pattern=r"[A-Za-z0-9_-]+", says="letters, digits, _ and -"))

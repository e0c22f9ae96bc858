"""restartbench's memoised results (``functools.cache`` on the model's layers, the stage tensors per preset and
layout, the plans), emptied on demand: for a process that must run the code again rather than read what it kept."""

from __future__ import annotations

import sys


def forget_memoised() -> None:
    """Empty the cache of every memoised function in restartbench's loaded modules."""
    for name, module in list(sys.modules.items()):
        if name.startswith("restartbench"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()

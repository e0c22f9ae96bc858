"""Making written files durable: fsync a file and the folder that names it.

A leaf module (standard library only) shared by the stores (``restartbench.storage``) and the engines.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(paths: list[str]) -> None:
    """fsync each file, then each distinct parent folder (so the names are durable too)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in sorted({os.path.dirname(p) for p in paths}):
        fsync_dir(folder)

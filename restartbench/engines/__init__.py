"""Checkpoint engines behind one small interface, registered by name.

An engine is registered with an ``EngineInfo``: its name, the class that runs it, the
``checkpoint`` block it puts in the DeepSpeed JSON and the environment it needs. The
harness calls, on every rank:

- ``save(ds_engine, save_dir, tag)``: returns when training may continue (the *stall*);
- ``wait_until_durable()``: returns when this rank's bytes are on stable storage (fsync'd);
- ``load(ds_engine, load_dir, tag)``: restores model, optimizer and scheduler state;
- ``written()``: the files this rank wrote for the last save, with sizes.

After every rank is durable the harness commits the checkpoint (``commit_latest``), so
a checkpoint is named ``latest`` only once all of its files are on disk.

This module imports no torch: the registry is read by the launcher and ``--dry-run`` too.
An engine whose package is missing is reported by ``missing_requirements`` with the
command that installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EngineInfo:
    name: str
    module: str
    """Module (under restartbench.engines) that defines the engine class."""
    cls: str
    summary: str
    checkpoint_block: dict[str, Any] = field(default_factory=dict)
    """The ``checkpoint`` section of the DeepSpeed JSON that selects this engine."""
    launch_env: dict[str, str] = field(default_factory=dict)
    """Environment variables the engine needs in every rank (exported by the launch script)."""
    requires: tuple[tuple[str, str], ...] = ()
    """(importable module, how to install it) pairs the engine cannot run without."""


_REGISTRY: dict[str, EngineInfo] = {}


def register(info: EngineInfo) -> None:
    _REGISTRY[info.name] = info


register(EngineInfo("torch", "restartbench.engines.deepspeed_engines", "TorchEngine",
                         "DeepSpeed's default engine: torch.save of every file, synchronous"))


class UnknownEngineError(ValueError):
    pass


def engine_names() -> list[str]:
    return list(_REGISTRY)


def engine_info(name: str) -> EngineInfo:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownEngineError(f"unknown checkpoint engine {name!r}; known engines: {', '.join(_REGISTRY)}") from None


def missing_requirements(name: str) -> list[str]:
    """Human lines for each package the engine needs and cannot import here; empty when it can run."""
    return [
        f"engine {name!r} needs the Python module {module!r}: {how}"
        for module, how in engine_info(name).requires
        if importlib.util.find_spec(module) is None
    ]


def checkpoint_block(name: str) -> dict[str, Any]:
    return dict(engine_info(name).checkpoint_block)


def launch_env(name: str) -> dict[str, str]:
    return dict(engine_info(name).launch_env)


def create_engine(name: str, options: dict[str, Any] | None = None):
    info = engine_info(name)
    cls = getattr(importlib.import_module(info.module), info.cls)
    return cls(**(options or {}))


def commit_latest(save_dir: str | Path, tag: str) -> None:
    """Point ``latest`` at ``tag`` atomically and durably (write, fsync, rename, fsync the folder)."""
    save_dir = Path(save_dir)
    tmp = save_dir / "latest.tmp"
    with tmp.open("w") as handle:
        handle.write(tag)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, save_dir / "latest")
    fsync_dir(save_dir)


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


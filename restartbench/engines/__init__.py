"""Checkpoint engines, registered by name.

An engine is registered with an ``EngineInfo``: its name, the class that runs it, the ``checkpoint`` block it
puts in the DeepSpeed JSON and the environment it needs. Its class is a ``CheckpointEngine``: what the harness
calls on every rank, and when, is ``restartbench/engines/base.py``.

This module imports no torch: the registry is read by the launcher and ``--dry-run`` too.
An engine whose package is missing is reported by ``missing_requirements`` with the
command that installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from restartbench.config import EngineConfig
from restartbench.durability import fsync_files
from restartbench.engines.base import CheckpointEngine
from restartbench.storage import LocalStore, ObjectStore, StorageError


@dataclass(frozen=True)
class EngineInfo:
    name: str
    module: str
    """Module that defines the engine class (imported only on the ranks)."""
    cls: str
    summary: str
    ds_config: Callable[[EngineConfig], dict[str, Any]] = lambda options: {}
    """Top-level sections this engine adds to the DeepSpeed JSON, built from the engine options."""
    launch_env: Callable[[str], dict[str, str]] = lambda device: {}
    """Device ("cpu", "cuda") -> environment variables the engine needs in every rank (exported by the launch script)."""
    requires: tuple[tuple[str, str], ...] = ()
    """(importable module, how to install it) pairs the engine cannot run without."""
    system_check: Callable[[], list[str]] = lambda: []
    """Problems with non-Python components the engine needs (system libraries), each with how to fix it."""
    skip_when_missing: bool = False
    """A missing requirement marks the run skipped (the engine is optional to the study), not failed."""
    known_issues: dict[str, str] = field(default_factory=dict)
    """Device ("cpu", "cuda") -> how the engine as shipped is known to fail there. The run still goes
    ahead (the study measures engines as they are, failures included); the note is printed and kept
    in metadata.json so that a failure is read with its known cause."""
    object_store: bool = False
    """The engine can checkpoint to an object-store location (s3://, gs://): its class overrides
    ``CheckpointEngine.for_store``; ``none`` writes nothing, so any location will do."""


_REGISTRY: dict[str, EngineInfo] = {}


def register(info: EngineInfo) -> None:
    _REGISTRY[info.name] = info


def _writer_block(decoupled: bool) -> Callable[[EngineConfig], dict[str, Any]]:
    def block(options: EngineConfig) -> dict[str, Any]:
        return {"checkpoint": {"writer": {"type": "fast", "decoupled": decoupled,
                                          "io_buffer_size": options.io_buffer_mb * 2**20,
                                          "io_buffer_double": True, "show_statistics": False,
                                          "data_parallel": options.writer_data_parallel}}}
    return block


def _torch_extensions_dir() -> str:
    """Where torch caches JIT-built ops (DeepSpeed's async_io, pin_memory, utils): the user's choice, else
    inside the virtual environment, so the first run's build (minutes on a small CPU) is reused."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    if sys.prefix != sys.base_prefix:
        return os.path.join(sys.prefix, "torch_extensions")
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")


def _libaio_missing() -> list[str]:
    """DeepSpeed's async_io op (FastPersist's writer) is JIT-built against libaio: its header must be
    there, unless the op is already built (cached JIT build or DeepSpeed installed with its ops)."""
    include_dirs = ["/usr/include", "/usr/local/include"] + [
        d for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH") for d in os.environ.get(var, "").split(":") if d]
    if any(os.path.isfile(os.path.join(d, "libaio.h")) for d in include_dirs):
        return []
    built = list(Path(_torch_extensions_dir()).glob("async_io/async_io*.so"))
    spec = importlib.util.find_spec("deepspeed")
    if spec and spec.origin:
        built += list((Path(spec.origin).parent / "ops" / "aio").glob("async_io_op*.so"))
    if built:
        return []
    return ["DeepSpeed's async_io op needs libaio, which is not installed (no libaio.h): install the system package "
            "'libaio-dev' (apt-get install libaio-dev; 'libaio-devel' with dnf/yum); scripts/setup-env.sh does it "
            "when run as root"]


def _writer_env(device: str) -> dict[str, str]:
    """What DeepSpeed's writer engines need in each rank. Their CROSS_RANK/CROSS_SIZE (which DeepSpeed's own
    launcher exports) launch.sh exports for every run: the node's rank, the nodes. FastPersist page-locks its
    I/O buffer; on a CPU-only machine only DeepSpeed's native pinning backend (its pin_memory op, mlock) can, as
    torch's pin_memory() needs an accelerator. On a GPU the engine is left as shipped: torch's pinning."""
    native_pinning = {"DS_PIN_MEMORY_BACKEND": "native"} if device == "cpu" else {}
    return {**native_pinning, "TORCH_EXTENSIONS_DIR": _torch_extensions_dir()}


_DS = "restartbench.engines.deepspeed_engines"

register(EngineInfo("none", "restartbench.engines.baseline", "NoCheckpoint",
                    "no checkpoint: the baseline iteration time, and a relaunch that restores nothing",
                    object_store=True))
register(EngineInfo("torch", _DS, "TorchEngine", "DeepSpeed's default engine: torch.save of every file, synchronous",
                    object_store=True))
_DECOUPLED = ("as shipped, DeepSpeed's decoupled writer fails with ZeRO-1 in a PipelineEngine: its writer processes "
              "refuse the non-leaf fp32 partitions ('Cowardly refusing to serialize non-leaf tensor'), so every save "
              "is recorded as failed and nothing is committed.")
register(EngineInfo("fastpersist", _DS, "FastPersistEngine",
                    "DeepSpeed FastPersist writer: aligned buffers, libaio", ds_config=_writer_block(False),
                    launch_env=_writer_env, system_check=_libaio_missing))
register(EngineInfo("decoupled", _DS, "DecoupledEngine",
                    "DeepSpeed decoupled writer: background writer processes", ds_config=_writer_block(True),
                    launch_env=_writer_env, system_check=_libaio_missing,
                    known_issues={"cpu": _DECOUPLED, "cuda": _DECOUPLED}))
register(EngineInfo("datastates", _DS, "DataStatesEngine",
                    "DeepSpeed's DataStates-LLM engine: lazy asynchronous copies to a pinned host cache",
                    ds_config=lambda options: {"datastates_ckpt": {"host_cache_size": options.host_cache_gb}},
                    requires=(("datastates", "build it from https://github.com/DataStates/datastates-llm "
                                             "(not on PyPI; needs CMake, nanobind and CUDA)"),),
                    skip_when_missing=True))
register(EngineInfo("torchsnapshot", "restartbench.engines.torchsnapshot_engine", "TorchSnapshotEngine",
                    "TorchSnapshot 0.1.0 with the study's patch (every rank saves its own distinct state)",
                    requires=(("torchsnapshot", "pip install torchsnapshot==0.1.0"),)))
register(EngineInfo("dcp", "restartbench.engines.dcp_engine", "DCPEngine",
                    "PyTorch Distributed Checkpoint, synchronous save", object_store=True))
register(EngineInfo("dcp-async", "restartbench.engines.dcp_engine", "AsyncDCPEngine",
                    "PyTorch Distributed Checkpoint, async_save (staging, then a background write)",
                    object_store=True))
register(EngineInfo("lazy", "restartbench.engines.lazy_engine", "LazyEngine",
                    "restartbench's lazy engine: reused host buffer, copies overlapped with the next fwd/bwd, "
                    "streamed fsync'd flush"))


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
    info = engine_info(name)
    return [
        f"engine {name!r} needs the Python module {module!r}: {how}"
        for module, how in info.requires
        if importlib.util.find_spec(module) is None
    ] + [f"engine {name!r}: {problem}" for problem in info.system_check()]


def object_store_engines() -> list[str]:
    """Engines that can checkpoint to an s3:// location."""
    return [name for name, info in _REGISTRY.items() if info.object_store]


def known_issue(name: str, device: str) -> str | None:
    return engine_info(name).known_issues.get(device)


def ds_config_sections(options: EngineConfig) -> dict[str, Any]:
    return engine_info(options.engine).ds_config(options)


def launch_env(name: str, device: str) -> dict[str, str]:
    return engine_info(name).launch_env(device)


def create_engine(options: EngineConfig) -> CheckpointEngine:
    info = engine_info(options.engine)
    cls = getattr(importlib.import_module(info.module), info.cls)
    if not (isinstance(cls, type) and issubclass(cls, CheckpointEngine)):
        raise TypeError(f"engine {info.name!r} is registered with {info.module}.{info.cls}, which is not a "
                        "subclass of restartbench.engines.base.CheckpointEngine: the harness drives only classes "
                        "that implement that contract")
    return cls(options)


def durable_now(records: list[Any]) -> float:
    """fsync the files of these records (anything with a ``path``) and their folders; return the
    ``time.perf_counter()`` at which they were durable (what ``wait_until_durable`` returns)."""
    fsync_files([record.path for record in records])
    return time.perf_counter()


def refuse_unless_object_store(name: str, location: str) -> None:
    """Raise StorageError unless engine ``name`` can checkpoint to the object-store ``location``."""
    able = object_store_engines()
    if name not in able:
        raise StorageError(f"engine {name!r} writes local files only, so it cannot checkpoint to {location}; "
                           f"with an object-store --checkpoint-dir use --engine {', '.join(able)}, or give a "
                           "local --checkpoint-dir")


def engine_for_target(engine: CheckpointEngine, store: LocalStore | ObjectStore) -> CheckpointEngine:
    """The checkpoint engine that writes to ``store``: ``engine`` itself for a folder, for an object store the one
    its ``for_store`` gives (StorageError from an engine that cannot)."""
    return engine.for_store(store) if store.remote else engine

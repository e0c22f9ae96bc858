"""Checkpoint engines, registered by name.

Each engine lives in a folder of its own, ``restartbench/engines/<folder>/``: its class (``engine.py``), the
prediction of its files (``predict.py``), its emulation (``emulate.py``), and its registry entries (``ENGINES``, an
``EngineInfo`` each, in the folder's ``__init__.py``). ``ENGINE_FOLDERS`` below lists the folders. What the harness
calls on every rank, and when, is ``restartbench/engines/base.py``.

An engine folder with options holds them in ``options.py``, one dataclass (``engine_options``): ``restartbench.config``
makes its ``EngineConfig`` of them, so each is a key of config.json's ``engine`` section and an option of
``config-n-run.py``. The engines that read one name it (``EngineInfo.options``); another engine's run refuses it
(``ignored_options``).

This module imports no torch: the registry is read by the launcher and ``--dry-run`` too.
An engine whose package is missing is reported by ``missing_requirements`` with the
command that installs it.

``restartbench.config`` imports this package (the folders, their options, the engines' names), so neither this
module nor a folder's ``__init__.py`` imports ``restartbench.config``: the registry takes the run's engine options
as ``base.EngineOptions`` (what it reads of ``config.EngineConfig``), a folder as its own options class.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any

from restartbench.config_fields import device_default, flag, saved_value
from restartbench.engines.base import (
    CheckpointEngine,
    Converter,
    CostTraits,
    EngineInfo,
    EngineOptions,
    ModuleSplit,
    Prefetcher,
    load,
)
from restartbench.storage import LocalStore, ObjectStore, StorageError

_REGISTRY: dict[str, EngineInfo] = {}


def register(info: EngineInfo) -> None:
    _REGISTRY[info.name] = info


#: The engine folders, each registering its ``ENGINES`` in this order (the order of tables and plots). Adding an
#: engine: its folder (restartbench/engines/<folder>/, see docs/adding-an-engine.md), and its name here.
ENGINE_FOLDERS = ("none", "deepspeed", "torchsnapshot", "dcp", "lazy")

for _folder in ENGINE_FOLDERS:
    for _info in importlib.import_module(f"restartbench.engines.{_folder}").ENGINES:
        register(_info)


def engine_options() -> dict[str, type]:
    """Folder -> the dataclass of its ``options.py``, for the folders that have one, in ``ENGINE_FOLDERS``' order."""
    found = {}
    for folder in ENGINE_FOLDERS:
        name = f"restartbench.engines.{folder}.options"
        if importlib.util.find_spec(name) is not None:
            found[folder] = _options_class(importlib.import_module(name))
    return found


def _options_class(module: Any) -> type:
    """The one dataclass an ``options.py`` defines (imported ones, such as ``Allowed``, are not its own)."""
    own = [value for value in vars(module).values() if isinstance(value, type) and dataclasses.is_dataclass(value)
           and value.__module__ == module.__name__]
    if len(own) != 1:
        raise TypeError(f"{module.__file__} must define one dataclass, the engine's options; it defines "
                        f"{len(own)}: {', '.join(cls.__name__ for cls in own) or 'none'}")
    return own[0]


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


def ds_config_sections(options: EngineOptions) -> dict[str, Any]:
    return engine_info(options.engine).ds_config(options)


def converter(name: str) -> Converter | None:
    """The engine's offline conversion for a restart on another layout (``EngineInfo.converter``), imported; None
    where it has none."""
    ref = engine_info(name).converter
    return load(ref) if ref else None


def cost_traits(name: str) -> CostTraits:
    """How the engine's save and load spend their time beyond its files (``EngineInfo.cost``); an emulated run's
    name (``torch-emulated``) stands for its engine's."""
    return engine_info(base_engine(name)).cost


def module_split(name: str) -> ModuleSplit | None:
    """The engine's share-out of a stage module among its replicas (``CostTraits.module_split``), imported; None
    where one replica, or every one, writes it whole."""
    ref = cost_traits(name).module_split
    return load(ref) if ref else None


def prefetcher(name: str) -> Prefetcher | None:
    """The engine's early read on a relaunch (``EngineInfo.prefetcher``), imported; None where it has none."""
    ref = engine_info(name).prefetcher
    return load(ref) if ref else None


def option_fields() -> dict[str, dataclasses.Field]:
    """Every engine option (the engine folders' ``options.py``), by name."""
    return {field.name: field for cls in engine_options().values() for field in dataclasses.fields(cls)}


def option_defaults() -> dict[str, Any]:
    """Every engine option and its default."""
    return {name: field.default for name, field in option_fields().items()}


def ignored_options(options: EngineOptions) -> list[str]:
    """A line for each engine option set away from its default that the run's engine does not read
    (``EngineInfo.options``), saying whose it is and what to do; empty when there is none."""
    readers: dict[str, list[str]] = {}
    for info in _REGISTRY.values():
        for name in info.options:
            readers.setdefault(name, []).append(info.name)
    mine = set(engine_info(options.engine).options)
    return [f"{flag(name)} is an option of {_names(readers.get(name, []))}, and this run's engine is "
            f"{options.engine}: the run would ignore it while its config.json said it was set. Drop it, or choose "
            f"{' or '.join(f'--engine {reader}' for reader in readers.get(name, []))}."
            for name, default in option_defaults().items() if name not in mine and getattr(options, name) != default]


def options_set(engine: str, section: dict[str, Any], device: str | None) -> str:
    """The engine's own options (``EngineInfo.options``) that a run's config.json ``engine`` section sets away from
    what a run on ``device`` has by default, as config-n-run.py's words: ``--lazy-chunk-mb 8``; '' where it sets
    none. A key the section lacks was written before the option existed: the run had what it had then
    (``config_fields.saved_value``); an option whose default depends on the device is compared with its default
    there (``--no-lazy-direct-io`` on CUDA, nothing on the CPU). An engine not registered here has none."""
    info, fields = _REGISTRY.get(engine), option_fields()
    words = []
    for name in info.options if info else ():
        value, usual = saved_value(fields[name], section, device), device_default(fields[name], device)
        if value != usual:
            words.append(flag(name) if value is True else flag(name, negated=True) if value is False
                         else f"{flag(name)} {value}")
    return " ".join(words)


def _names(engines: list[str]) -> str:
    if len(engines) == 1:
        return f"the {engines[0]} engine"
    return f"the {', '.join(engines[:-1])} and {engines[-1]} engines"


def launch_env(name: str, device: str) -> dict[str, str]:
    return engine_info(name).launch_env(device)


class NotEmulatedError(ValueError):
    """The engine has no emulator (its registry entry says why)."""


def emulated_engines() -> list[str]:
    """Engines ``--emulate`` can go through."""
    return [name for name, info in _REGISTRY.items() if info.emulator]


EMULATED_SUFFIX = "-emulated"


def listed_as(engine: str, emulated: bool) -> str:
    """The name a run of ``engine`` is listed under (metadata.json, run folder, the fit's engines): an emulated run's
    is ``<engine>-emulated``, so that no table mixes it with real runs of the engine."""
    return engine + EMULATED_SUFFIX if emulated else engine


def is_emulated(listed: str) -> bool:
    """Whether a listed name (``listed_as``) is an emulated run's."""
    return listed.endswith(EMULATED_SUFFIX)


def base_engine(listed: str) -> str:
    """The engine a listed name stands for: ``torch-emulated`` → ``torch``."""
    return listed.removesuffix(EMULATED_SUFFIX)


def emulator_class(name: str) -> Any:
    """The engine's ``restartbench.emulator.Emulator`` subclass; NotEmulatedError says why an engine has none."""
    info = engine_info(name)
    if info.emulator is None:
        raise NotEmulatedError(f"engine {name!r} is not emulated: {info.not_emulated}")
    return load(info.emulator)


def create_engine(options: EngineOptions) -> CheckpointEngine:
    info = engine_info(options.engine)
    cls = getattr(importlib.import_module(info.module), info.cls)
    if not (isinstance(cls, type) and issubclass(cls, CheckpointEngine)):
        raise TypeError(f"engine {info.name!r} is registered with {info.module}.{info.cls}, which is not a "
                        "subclass of restartbench.engines.base.CheckpointEngine: the harness drives only classes "
                        "that implement that contract")
    return cls(options)


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

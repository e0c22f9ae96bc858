"""The engine contract (restartbench/engines/base.py) holds for every registered engine, and the registry
refuses what breaks it. Fast: no launch, no engine is run."""

from __future__ import annotations

import importlib
import inspect

import pytest

from restartbench import engines
from restartbench.config import EngineConfig
from restartbench.engines.base import CheckpointEngine, load
from restartbench.engines.deepspeed.engine import ObjectStoreTorchEngine, TorchEngine
from restartbench.engines.none.engine import NoCheckpoint
from restartbench.storage import LocalStore, ObjectLocation, ObjectStore, S3Settings, StorageError

PRESENT = [name for name in engines.engine_names() if not engines.missing_requirements(name)]
"""Engines whose requirements this environment has (all but the optional datastates, usually)."""


def _registered_class(name: str) -> type:
    info = engines.engine_info(name)
    return getattr(importlib.import_module(info.module), info.cls)


class CompleteEngine(CheckpointEngine):
    """Implements the abstract methods and nothing else."""

    def save(self, ds_engine, save_dir, tag):
        pass

    def wait_until_durable(self):
        return 0.0

    def written(self):
        return []

    def load(self, ds_engine, load_dir, tag):
        pass

    def read(self):
        return []


class NotAnEngine:
    """Has an engine's methods, but not the contract's class."""

    def __init__(self, options):
        raise AssertionError("create_engine must refuse the class before constructing it")


def not_a_class(options):
    raise AssertionError("create_engine must refuse a function before calling it")


def _object_store() -> ObjectStore:
    return ObjectStore(ObjectLocation.parse("s3://bucket/run"), S3Settings(None, "us-east-1", True, "none"))


@pytest.mark.parametrize("name", PRESENT)
def test_every_registered_engine_implements_the_contract(name):
    cls = _registered_class(name)
    assert issubclass(cls, CheckpointEngine), f"{cls.__name__} is not a CheckpointEngine"
    assert not cls.__abstractmethods__, f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} unimplemented"
    writes_to_object_stores = cls.for_store is not CheckpointEngine.for_store
    assert writes_to_object_stores == engines.engine_info(name).object_store, \
        "an engine registered with object_store overrides for_store, and only such an engine"
    assert "prefetched" in inspect.signature(cls.prepare).parameters, \
        "prepare keeps the base class's parameters: the harness passes what a prefetcher started"
    early = engines.prefetcher(name)
    assert early is None or (callable(early.enabled) and callable(early.start)), \
        "a registered prefetcher is a restartbench.engines.base.Prefetcher"


def test_the_engines_that_must_run_here_are_checked():
    assert set(engines.engine_names()) - set(PRESENT) <= {
        name for name in engines.engine_names() if engines.engine_info(name).skip_when_missing}


@pytest.mark.parametrize("missing", ["save", "wait_until_durable", "written", "load", "read"])
def test_an_engine_missing_a_contract_method_cannot_be_created(missing):
    methods = {"save", "wait_until_durable", "written", "load", "read"} - {missing}
    toy = type("Toy", (CheckpointEngine,), {name: getattr(CompleteEngine, name) for name in methods})
    with pytest.raises(TypeError, match=rf"abstract.*{missing}"):
        toy()


def test_the_optional_hooks_have_defaults_the_harness_can_call():
    engine = CompleteEngine()
    assert engine.prepare(ds_engine=None) == {} and engine.prepare(None, prefetched=None) == {}
    assert engine.load_fields() == {}
    assert list(engine.workarounds) == []
    assert engine.on_copy_wait is None
    assert engine.asynchronous is False


@pytest.mark.parametrize("cls_name", ["NotAnEngine", "not_a_class"])
def test_create_engine_refuses_a_class_outside_the_contract(monkeypatch, cls_name):
    impostor = engines.EngineInfo("impostor", __name__, cls_name, "not a checkpoint engine",
                                  not_predicted="a test double", not_emulated="a test double",
                                  not_resharded="a test double")
    registered = engines.engine_info
    monkeypatch.setattr(engines, "engine_info", lambda name: impostor if name == "impostor" else registered(name))
    with pytest.raises(TypeError, match=rf"engine 'impostor' is registered with {__name__}\.{cls_name}, which is "
                                        r"not a subclass of restartbench\.engines\.base\.CheckpointEngine"):
        engines.create_engine(EngineConfig(engine="impostor"))


def test_create_engine_gives_a_checkpoint_engine():
    assert isinstance(engines.create_engine(EngineConfig(engine="none")), NoCheckpoint)


def test_an_engine_without_for_store_refuses_an_object_store_naming_those_that_can():
    with pytest.raises(StorageError) as refused:
        engines.engine_for_target(CompleteEngine(), _object_store())
    message = str(refused.value)
    assert "CompleteEngine cannot write to s3://bucket/run" in message
    assert "use --engine " + ", ".join(engines.object_store_engines()) in message
    assert {"torch", "dcp"} <= set(engines.object_store_engines())


def test_engine_for_target_keeps_the_engine_for_a_folder_and_asks_it_for_an_object_store(tmp_path):
    options = EngineConfig(engine="torch")
    engine = CompleteEngine()
    assert engines.engine_for_target(engine, LocalStore(tmp_path)) is engine
    none = NoCheckpoint(EngineConfig(engine="none"))
    assert engines.engine_for_target(none, _object_store()) is none, "'none' writes nothing: any location will do"
    to_store = engines.engine_for_target(TorchEngine(options), _object_store())
    assert type(to_store) is ObjectStoreTorchEngine and to_store.store.location == "s3://bucket/run"


@pytest.mark.parametrize("refs", [{}, {"predictor": "m:P", "not_predicted": "why", "not_emulated": "why"},
                                  {"not_predicted": "why"}, {"not_predicted": "why", "emulator": "m:E",
                                                             "not_emulated": "why"}])
def test_a_registry_entry_names_its_predictor_and_emulator_or_says_why_not(refs):
    with pytest.raises(ValueError,
                       match="give either a (predictor|emulator) or, in not_(predicted|emulated), the reason"):
        engines.EngineInfo("half", "m", "C", "an entry missing a predictor or an emulator, or with both", **refs)


@pytest.mark.parametrize("how", [{}, {"converter": "m:C", "reshards_at_load": True},
                                 {"reshards_at_load": True, "not_resharded": "why"}])
def test_a_registry_entry_says_how_it_restarts_on_another_layout_exactly_once(how):
    with pytest.raises(ValueError, match="say how it restarts on another layout"):
        engines.EngineInfo("half", "m", "C", "an entry", not_predicted="why", not_emulated="why", **how)


def test_every_registered_engine_restarts_on_another_layout_or_says_why_not():
    """The converters named are importable ``Converter``s; an engine that cannot says why, in words."""
    for name in engines.engine_names():
        info = engines.engine_info(name)
        if info.converter:
            converter = load(info.converter)
            assert callable(converter.convert) and isinstance(converter.ds_config, dict), name
        assert info.reshards == (not info.not_resharded) and (info.reshards or len(info.not_resharded) > 40), name
    assert engines.engine_info("torch").converter and engines.engine_info("none").reshards_at_load


def test_every_registered_engine_is_predicted_and_emulated_or_says_why_not():
    for name in engines.engine_names():
        info = engines.engine_info(name)
        assert bool(info.predictor) != bool(info.not_predicted) and bool(info.emulator) != bool(info.not_emulated)

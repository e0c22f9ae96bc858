"""Each engine's options live in its folder (restartbench/engines/<folder>/options.py), and config.py's EngineConfig
is made of them: none is declared in config.py, no two folders declare one name, and config.json's engine section
is what it was, so old run folders load."""

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, fields

import pytest
from conftest import ROOT

from restartbench.config import EngineConfig, RunConfig, build_parser, engine_config_class
from restartbench.config_fields import flag, opt
from restartbench.engines import ENGINE_FOLDERS, engine_options, option_defaults


def test_a_field_is_spelled_as_its_command_line_option():
    """The one spelling every message and command line uses (config.py's parser among them)."""
    assert flag("lazy_direct_io") == "--lazy-direct-io"
    assert flag("lazy_direct_io", negated=True) == "--no-lazy-direct-io"
    parser_options = {o for action in build_parser()._actions for o in action.option_strings}
    defaults = option_defaults()
    assert {flag(name) for name in defaults} <= parser_options
    assert {flag(name, negated=True) for name, default in defaults.items() if isinstance(default, bool)} \
        <= parser_options


def test_config_py_declares_no_engine_option():
    """Every field of EngineConfig but the engine's name is declared by an engine folder's options.py."""
    owners = {name: cls.__module__ for cls in EngineConfig.__mro__ for name in vars(cls).get("__annotations__", {})
              if cls is not EngineConfig}
    assert [name for name, module in owners.items() if module == "restartbench.config"] == ["engine"]
    assert {module for name, module in owners.items() if name != "engine"} == {
        f"restartbench.engines.{folder}.options" for folder in engine_options()}
    assert list(engine_options()) == ["deepspeed", "lazy"]


def test_the_engine_section_keeps_its_keys_order_and_defaults():
    assert RunConfig().to_dict()["engine"] == {
        "engine": "torch", "io_buffer_mb": 64, "writer_data_parallel": "replica", "host_cache_gb": 4.0,
        "dp_read_once": False, "lazy_chunk_mb": 64, "lazy_io_threads": 4, "lazy_direct_io": None,
        "lazy_prefetch": False}
    assert list(RunConfig().to_dict()["engine"]) == [
        "engine", "io_buffer_mb", "writer_data_parallel", "host_cache_gb", "dp_read_once", "lazy_chunk_mb",
        "lazy_io_threads", "lazy_direct_io", "lazy_prefetch"]


@pytest.mark.parametrize("stored", sorted((ROOT / "tests" / "data" / "real_runs").glob("*/config.json")),
                         ids=lambda path: path.parent.name)
def test_a_stored_run_folders_engine_section_loads_as_it_was(stored):
    """Every option it saved, as saved; an option added since (lazy_direct_io, lazy_prefetch: 2026-11-27) at its
    default."""
    saved = json.loads(stored.read_text())["engine"]
    loaded, defaults = RunConfig.load(stored).to_dict()["engine"], RunConfig().to_dict()["engine"]
    assert {key: loaded[key] for key in saved} == saved
    assert {key: value for key, value in loaded.items() if key not in saved} == {
        key: value for key, value in defaults.items() if key not in saved}


@dataclass
class First:
    chunk_mb: int = opt(1, "first: a chunk.")


@dataclass
class Second:
    chunk_mb: int = opt(2, "second: a chunk too.")


@dataclass
class Deep:
    depth: int = opt(3, "deep: a depth.")


@dataclass
class Named:
    engine: str = opt("mine", "an option that takes the engine's name.")


def test_two_folders_declaring_one_option_are_refused_naming_both():
    with pytest.raises(TypeError, match=r"the engine option 'chunk_mb' is declared twice, in "
                                        r"restartbench/engines/one/options.py \(First\) and in "
                                        r"restartbench/engines/two/options.py \(Second\): rename one of them"):
        engine_config_class({"one": First, "two": Second})


def test_an_option_named_engine_is_refused():
    with pytest.raises(TypeError, match=r"'engine' is declared twice, in restartbench/config.py \(EngineChoice\) "
                                        r"and in restartbench/engines/one/options.py \(Named\)"):
        engine_config_class({"one": Named})


def test_the_options_follow_the_engines_name_in_the_folders_order():
    made = engine_config_class({"two": Deep, "one": First})
    assert [leaf.name for leaf in fields(made)] == ["engine", "depth", "chunk_mb"]
    assert made(chunk_mb=5).chunk_mb == 5 and made().depth == 3


def imported_modules(path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names] + [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]


@pytest.mark.parametrize("folder", [f for f in ENGINE_FOLDERS
                                    if (ROOT / "restartbench" / "engines" / f / "options.py").exists()])
def test_options_modules_import_only_the_standard_library_and_config_fields(folder):
    """config.py imports them: anything they import, every program that reads a configuration would."""
    modules = imported_modules(ROOT / "restartbench" / "engines" / folder / "options.py")
    assert [m for m in modules if m.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
            and m != "restartbench.config_fields"] == []


@pytest.mark.parametrize("first", ["restartbench.config", "restartbench.engines.lazy.options",
                                   "restartbench.engines.deepspeed", "restartbench.engines"])
def test_config_and_the_registry_import_in_either_order(first):
    """config imports the registry, whose package and folders must not import config back (a cycle)."""
    code = f"import {first}; from restartbench.config import EngineConfig; print(EngineConfig().lazy_io_threads)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.strip() == "4", proc.stderr[-2000:]

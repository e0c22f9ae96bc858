"""The architecture as checked code: import layers (import-linter), no private names across modules, style (ruff),
and the launcher side free of torch."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "restartbench"
BIN = Path(sys.executable).parent


def _layer_modules() -> set[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    return {name.strip() for layer in layers for name in layer.split("|")}


def _top_level_modules() -> set[str]:
    modules = {f"restartbench.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return modules | {f"restartbench.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}


def test_import_layers_hold():
    """lint-imports checks every import, those inside functions too, against the layers in pyproject.toml."""
    proc = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_every_module_has_a_layer():
    """A module missing from the layers would be free to import anything: each one is placed."""
    assert _top_level_modules() - _layer_modules() == set()
    assert _layer_modules() - _top_level_modules() == set()  # and no layer names a module that is gone


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _root(node: ast.expr) -> str | None:
    """The name an expression like ``a.b.c`` starts from."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


#: Calls that name an attribute as a string: ``setattr(x, "_name", ...)``, ``monkeypatch.setattr(x, "_name", ...)``,
#: ``mock.patch.object(x, "_name")``, and so on.
NAMED_BY_STRING = {"setattr", "delattr", "getattr", "hasattr", "object"}
#: Calls that name a target as a dotted string: ``monkeypatch.setattr("restartbench.x._name", ...)``, ``mock.patch``.
DOTTED_TARGET = {"setattr", "delattr", "patch"}


def _made_objects(tree: ast.AST, aliases: set[str]) -> set[str]:
    """Names assigned an object made by calling a name in ``aliases``: ``x = LazyEngine(...)``, and
    ``x, y = LazyEngine(...), []``."""
    made = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if (isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    and len(target.elts) == len(node.value.elts)):
                pairs = zip(target.elts, node.value.elts, strict=True)
            made |= {name.id for name, value in pairs if isinstance(name, ast.Name) and isinstance(value, ast.Call)
                     and _root(value.func) in aliases}
    return made


def private_uses(path: Path) -> list[str]:
    """Another module's private names used in ``path``: ``from restartbench.x import _name``; ``x._name`` where x is
    a name imported from restartbench (a module) or an object made by calling one (``saver = LazyEngine(...)``); and a
    private name patched as a string, ``setattr(x, "_name", ...)`` (or monkeypatch's, getattr, mock.patch.object)
    where x (or x.y...) starts from either, and ``monkeypatch.setattr("restartbench.x._name", ...)``. A third-party
    object (DeepSpeed's ``DeepSpeedEngine``) is not restartbench's: its privates are not flagged; nor is ``x.y._name``
    read or written, y possibly such an object (``engine.jobs.pool._threads``: the standard library's pool)."""
    tree = ast.parse(path.read_text())
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("restartbench"):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("restartbench")}
    made = _made_objects(tree, aliases)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases | made):
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.Call) and node.args:
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            first, name = node.args[0], _text(node.args[1]) if len(node.args) > 1 else None
            if (called in NAMED_BY_STRING and name is not None and _private(name)
                    and _root(first) in aliases | made):
                found.append(f'{called}({ast.unparse(first)}, "{name}") (line {node.lineno})')
            elif (called in DOTTED_TARGET and (dotted := _text(first)) is not None
                    and dotted.startswith("restartbench.") and any(map(_private, dotted.split(".")))):
                found.append(f'{called}("{dotted}") (line {node.lineno})')
    return found


def _offenders(paths: list[Path]) -> dict[str, list[str]]:
    found = {str(p.relative_to(ROOT)): private_uses(p) for p in sorted(paths)}
    return {path: uses for path, uses in found.items() if uses}


def test_no_module_uses_a_private_name_of_another():
    assert _offenders(list(PACKAGE.rglob("*.py"))) == {}


#: Outside the package: what uses it (its tests, the benchmarks, the analysis scripts, the launcher).
USERS = ("tests", "bench", "analysis")
LAUNCHER = ROOT / "config-n-run.py"


def test_no_test_or_script_uses_a_private_name_of_the_package():
    """Tests and scripts go through each module's public names too: a helper a test needs is public."""
    paths = [path for folder in USERS for path in (ROOT / folder).rglob("*.py")] + [LAUNCHER]
    assert _offenders(paths) == {}


def test_the_private_name_check_finds_both_forms(tmp_path):
    source = tmp_path / "offender.py"
    source.write_text("from restartbench.study import _preset\nfrom restartbench import study\nstudy._kill_tree(1)\n")
    assert private_uses(source) == ["from restartbench.study import _preset", "study._kill_tree (line 3)"]


def test_the_private_name_check_finds_private_names_patched_as_strings(tmp_path):
    """A restartbench module, an object made from a restartbench class, and a dotted path: each flagged; DeepSpeed's
    own class and a public name are not."""
    source = tmp_path / "offender.py"
    source.write_text(
        "from deepspeed.runtime.engine import DeepSpeedEngine\n"
        "from restartbench.engines.lazy import copies\nfrom restartbench.engines.lazy.engine import LazyEngine\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(copies, '_cuda_call', None)\n"
        "    engine = LazyEngine(None)\n"
        "    monkeypatch.setattr(engine.saver, '_stream', None)\n"
        "    setattr(copies, '_x', 1)\n"
        "    monkeypatch.setattr('restartbench.pagecache._libc', None)\n"
        "    monkeypatch.setattr(DeepSpeedEngine, '_configure_optimizer', None)\n"
        "    monkeypatch.setattr(copies, 'cuda_call', None)\n"
        "    monkeypatch.setattr('restartbench.analysis.collect', None)\n")
    assert private_uses(source) == [
        'setattr(copies, "_cuda_call") (line 5)', 'setattr(engine.saver, "_stream") (line 7)',
        'setattr(copies, "_x") (line 8)', 'setattr("restartbench.pagecache._libc") (line 9)']


def test_the_private_name_check_finds_private_attributes_of_objects_made_from_the_package(tmp_path):
    """An object made by calling a restartbench class (tuple-unpacked too): its private attribute, read or written, is
    flagged; a public one, one of an object reached through it, and a local object's are not."""
    source = tmp_path / "offender.py"
    source.write_text(
        "import types\nfrom restartbench.engines.lazy.engine import LazyEngine\n"
        "from restartbench.engines.deepspeed.engine import DataStatesEngine\n"
        "def test():\n"
        "    saver, seen = LazyEngine(None), []\n"
        "    saver._gpu_waits = []\n"
        "    engine = DataStatesEngine(None)\n"
        "    assert engine._ds_engine is None and saver.gpu_waits == []\n"
        "    assert engine.jobs.pool._threads\n"
        "    local = types.SimpleNamespace(_x=1)\n"
        "    assert local._x\n")
    assert private_uses(source) == ["saver._gpu_waits (line 6)", "engine._ds_engine (line 8)"]


def test_planning_and_rendering_import_no_torch():
    """The launcher, --dry-run and the analysis run where torch may be absent or slow to import."""
    code = ("import sys, restartbench.cli, restartbench.sweep, restartbench.report\n"
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_ruff_finds_nothing():
    """The rules chosen in pyproject.toml ([tool.ruff]), over the whole repository."""
    proc = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

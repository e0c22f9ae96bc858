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


def private_imports(path: Path) -> list[str]:
    """``from restartbench.x import _name`` and ``x._name`` where x is a restartbench module imported by name."""
    tree = ast.parse(path.read_text())
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("restartbench"):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name.startswith("restartbench")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


def _offenders(paths: list[Path]) -> dict[str, list[str]]:
    found = {str(p.relative_to(ROOT)): private_imports(p) for p in sorted(paths)}
    return {path: names for path, names in found.items() if names}


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
    assert private_imports(source) == ["from restartbench.study import _preset", "study._kill_tree (line 3)"]


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

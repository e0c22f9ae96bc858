"""The notebooks: saved without outputs, built on the package's functions, and executed (nbclient) against the
session's real runs (plus a copy of them under a second engine name, so that there are engines to compare)."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"compare_engines.ipynb", "checkpoint_size.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear outputs before saving"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_built_on_the_package(path):
    """The table comes from restartbench.analysis, the logs path from $RESTARTBENCH_LOGS; no copied code."""
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "analysis.collect(" in source and "analysis.logs_from_env()" in source
    assert "def " not in source and "json.load" not in source and "read_events" not in source


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """The python3 kernel; installed into a temporary prefix (offline) where this environment lacks one."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        install(prefix=str(tmp_path / "kernel"))
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "kernel" / "share" / "jupyter"))
    return "python3"


@pytest.fixture
def two_engine_logs(study_logs, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(study_logs, logs, ignore=shutil.ignore_patterns("checkpoints"))
    for run in sorted(p.parent for p in logs.glob("*/*/torch/*/metadata.json")):
        copy = run.parent.parent / "other-engine" / run.name
        shutil.copytree(run, copy)
        meta = json.loads((copy / "metadata.json").read_text())
        meta["engine"] = "other-engine"
        (copy / "metadata.json").write_text(json.dumps(meta))
    return logs


@pytest.mark.multirank
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, two_engine_logs, kernel, monkeypatch, tmp_path):
    from nbclient import NotebookClient

    monkeypatch.setenv("RESTARTBENCH_LOGS", str(two_engine_logs))
    monkeypatch.delenv("RESTARTBENCH_PRESET", raising=False)
    monkeypatch.delenv("RESTARTBENCH_LAYOUT", raising=False)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name=kernel, timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "6 complete run(s)" in text
    assert images >= 1
    if path.name == "compare_engines.ipynb":
        assert "engines torch, other-engine" in text and "Least training stall" in text
        assert images >= 2
    if path.name == "checkpoint_size.ipynb":
        assert "0 more than 10% away from the prediction" in text

"""Adding an engine takes its folder and one registry line (docs/adding-an-engine.md): a toy engine
(tests/data/toy_engine) installed into a copy of the repository is run for real, its option (its folder's
options.py) is an option of config-n-run.py and a key of config.json, and the plan and --emulate each say why they
do not cover it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

REGISTRY_LINE = 'ENGINE_FOLDERS = ("none", "deepspeed", "torchsnapshot", "dcp", "lazy")'


def repository_with_the_toy_engine(into: Path) -> Path:
    """A copy of the repository's tracked files, with the toy engine's folder and its name in the registry."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    shutil.copytree(ROOT / "tests" / "data" / "toy_engine", into / "restartbench" / "engines" / "toy")
    registry = into / "restartbench" / "engines" / "__init__.py"
    text = registry.read_text()
    assert text.count(REGISTRY_LINE) == 1, "the registry line changed: update REGISTRY_LINE and the guide"
    registry.write_text(text.replace(REGISTRY_LINE, REGISTRY_LINE.replace('"lazy")', '"lazy", "toy")')))
    return into


def run(repo: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """A command in the copy, importing the copy's restartbench (not the installed checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "RESTARTBENCH_PLAN_CACHE": "off"}
    return subprocess.run([sys.executable, *argv], cwd=repo, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory):
    return repository_with_the_toy_engine(tmp_path_factory.mktemp("toy") / "repo")


@pytest.mark.multirank
def test_a_toy_engine_runs_with_its_folder_and_one_registry_line(toy_repo, tmp_path):
    proc = run(toy_repo, "config-n-run.py", "tiny", "tp1pp1dp2", "--engine", "toy", "--dtype", "fp32", "--iters", "2",
               "--save-interval", "1", "--baseline-mib", "0", "--toy-file-prefix", "mine", "--logs",
               str(tmp_path / "logs"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = next((tmp_path / "logs").glob("tiny/*/toy/*"))
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "complete"
    assert json.loads((run_dir / "config.json").read_text())["engine"]["toy_file_prefix"] == "mine"
    results = [json.loads(line) for path in sorted((run_dir / "events").glob("restore-rank*.jsonl"))
               for line in path.read_text().splitlines() if '"restore.result"' in line]
    assert [r["exact"] for r in results] == [True, True]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step2").iterdir()) == [
        "manifest.json", "mine-rank00000.pt", "mine-rank00001.pt"]


def test_the_toy_engines_option_is_a_command_line_option_and_a_config_key(toy_repo, tmp_path):
    """Its folder's options.py is all it took: the option is generated, range-checked, saved and loaded."""
    help_text = run(toy_repo, "config-n-run.py", "--help").stdout
    assert "--toy-file-prefix" in help_text and "<prefix>-rank<N>.pt" in help_text
    assert "Checkpoint engine: none, torch, fastpersist, decoupled, datastates, torchsnapshot, dcp, dcp-async, lazy, " \
           "toy." in " ".join(help_text.split())
    code = ("import sys; from pathlib import Path; from restartbench.config import RunConfig, config_from_args\n"
            "config_from_args(['--engine', 'toy', '--toy-file-prefix', 'mine']).save(Path(sys.argv[1]))\n"
            "print(RunConfig.load(sys.argv[1]).engine.toy_file_prefix)")
    proc = run(toy_repo, "-c", code, str(tmp_path / "config.json"))
    assert proc.stdout.strip() == "mine", proc.stderr[-3000:]
    engine = json.loads((tmp_path / "config.json").read_text())["engine"]
    assert list(engine) == ["engine", "io_buffer_mb", "writer_data_parallel", "host_cache_gb", "dp_read_once",
                            "lazy_chunk_mb", "lazy_io_threads", "lazy_direct_io", "lazy_prefetch",
                            "toy_file_prefix"]
    refused = run(toy_repo, "config-n-run.py", "--engine", "toy", "--toy-file-prefix", "a/b", "--dry-run")
    assert refused.returncode == 2
    assert "--toy-file-prefix must be letters, digits, _ and - (got 'a/b')" in refused.stderr


def test_the_plan_says_why_the_toy_engine_is_not_predicted(toy_repo):
    proc = run(toy_repo, "-m", "restartbench.plan", "tiny", "tp1pp1dp2", "--engine", "toy", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"engine": "toy", "predicted": False,
                                       "reason": "the toy engine's files are not predicted (it has no predict.py)"}


def test_emulate_says_why_the_toy_engine_is_not_emulated(toy_repo, tmp_path):
    proc = run(toy_repo, "config-n-run.py", "tiny", "tp1pp1dp2", "--engine", "toy", "--emulate", "--dry-run",
               "--logs", str(tmp_path / "logs"))
    assert proc.returncode == 2
    assert "engine 'toy' is not emulated: the toy engine's I/O is not emulated (it has no emulate.py)" in proc.stdout

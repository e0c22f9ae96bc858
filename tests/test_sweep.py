"""Sweeps: file validation, and a real sweep interrupted half-way that resumes only the missing cells."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import ROOT

from restartbench.sweep import SweepError, cell_config, load_sweep


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cells_are_the_cross_product(tmp_path):
    sweep = load_sweep(write(tmp_path, {"presets": ["tiny"], "layouts": ["tp2pp2", "pp2dp2"],
                                        "engines": ["torch", "none"], "repetitions": 3, "options": {"iters": 2}}))
    assert len(sweep.cells) == 12 and sweep.options == {"iters": 2}


def test_a_cell_sets_only_the_engine_options_its_engine_reads(tmp_path):
    """lazy's option goes to lazy's cells; torch's cells keep its default, and their config.json does not say it."""
    sweep = load_sweep(write(tmp_path, {"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch", "lazy"],
                                        "options": {"lazy_chunk_mb": 8, "iters": 2}}))
    configs = {cell.engine: cell_config(sweep, cell) for cell in sweep.cells}
    assert (configs["lazy"].engine.lazy_chunk_mb, configs["torch"].engine.lazy_chunk_mb) == (8, 64)
    assert configs["lazy"].train.iters == configs["torch"].train.iters == 2


@pytest.mark.parametrize("data, message", [
    ({"presets": "tiny", "layouts": ["tp2"], "engines": ["torch"], "repetitions": "2"},
     "'repetitions' must be a whole number"),
    ({"presets": [], "layouts": ["tp2"], "engines": ["torch"]}, "'presets' must be a non-empty list"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch"], "colour": 1}, "unknown key(s) ['colour']"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch"], "options": {"iters": "four"}},
     "'iters') must be int, got 'four'"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch"], "options": {"verify": 1}},
     "'verify') must be bool, got 1"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch"], "options": {"lazy_chunk_mb": 0}},
     "option --lazy-chunk-mb must be at least 1 (got 0)"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch"], "options": {"preset": "7B"}},
     "cannot be set in a sweep"),
    ([1, 2], "expected a mapping"),
    ({"presets": ["tiny"], "layouts": ["tp2"], "engines": ["torch", "dcp"], "options": {"lazy_chunk_mb": 8}},
     "option(s) ['lazy_chunk_mb'] are read by none of the sweep's engines (torch, dcp)"),
])
def test_bad_sweep_files_get_clear_errors(tmp_path, data, message):
    escaped = message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(SweepError, match=escaped):
        load_sweep(write(tmp_path, data))


def states(logs: Path) -> dict[str, str]:
    return {str(p.parent.relative_to(logs)): json.loads(p.read_text())["status"] for p in logs.rglob("metadata.json")}


def processes_of(logs: Path) -> list[psutil.Process]:
    """Live processes whose command line names a folder under ``logs`` (torchrun and the ranks)."""
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if str(logs) in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.mark.multirank
def test_interrupted_sweep_resumes_only_missing_cells(tmp_path):
    logs = tmp_path / "logs"
    path = write(tmp_path, {"presets": ["tiny"], "layouts": ["tp1pp1dp2"], "engines": ["none", "torch"],
                            "options": {"dtype": "fp32", "iters": 2}, "logs": str(logs)})
    command = [str(ROOT / "submit-job.sh"), "--sweep", str(path)]
    sweep = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    first = logs / "tiny" / "tp1pp1dp2" / "none" / "rep1"
    second = logs / "tiny" / "tp1pp1dp2" / "torch" / "rep1"
    deadline = time.time() + 300
    while not (second / "events").exists() and time.time() < deadline:  # the second cell has started training
        time.sleep(0.5)
    os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()
    # The ranks run in sessions of their own, out of the group's reach; they die with torchrun, their parent
    # (restartbench.launchers.die_with_launcher), instead of waiting in a collective for its timeout.
    deadline = time.time() + 10
    while (left := processes_of(logs)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"processes outlived the killed sweep: {[p.info['cmdline'] for p in left]}"
    assert states(logs) == {"tiny/tp1pp1dp2/none/rep1": "complete", "tiny/tp1pp1dp2/torch/rep1": "running"}
    first_mtime = (first / "metadata.json").stat().st_mtime

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "none rep1: done, skipped" in resumed.stdout and "earlier attempt moved to rep1.attempt1" in resumed.stdout
    assert (first / "metadata.json").stat().st_mtime == first_mtime
    assert states(logs) == {"tiny/tp1pp1dp2/none/rep1": "complete", "tiny/tp1pp1dp2/torch/rep1": "complete",
                            "tiny/tp1pp1dp2/torch/rep1.attempt1": "running"}
    assert "2 done, 0 running, 0 failed, 0 pending" in resumed.stdout


def test_one_layout_written_three_ways_is_one_cell_run_once(tmp_path):
    """tp2pp2, pp2tp2 and TP2PP2dp1 name one canonical folder: one cell, the others reported, nothing clobbered."""
    from restartbench.sweep import cell_config, unique_cells

    sweep = load_sweep(write(tmp_path, {"presets": ["tiny"], "layouts": ["tp2pp2", "pp2tp2", "TP2PP2dp1", "pp2dp2"],
                                        "engines": ["torch"], "logs": str(tmp_path / "logs")}))
    kept, duplicates = unique_cells({cell: cell_config(sweep, cell) for cell in sweep.cells})
    assert [cell.layout for cell in kept] == ["tp2pp2", "pp2dp2"]
    assert {first.layout: [c.layout for c in others] for first, others in duplicates.items()} == {
        "tp2pp2": ["pp2tp2", "TP2PP2dp1"]}
    listed = subprocess.run([str(ROOT / "submit-job.sh"), "--sweep", str(write(tmp_path, {
        "presets": ["tiny"], "layouts": ["tp2pp2", "pp2tp2"], "engines": ["torch"], "logs": str(tmp_path / "logs")})),
        "--dry-run"], capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "tiny pp2tp2 torch rep1: the same cell as tiny tp2pp2 torch rep1" in listed.stdout
    assert "1 cells under" in listed.stdout

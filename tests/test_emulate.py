"""--emulate: the checkpoint I/O of a big layout with a few CPU processes, read by the analysis like any run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_study
from restartbench.config import RunConfig
from restartbench.plan import predict

ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.016"  # 70B's widths x 0.016: hidden 128, about 250 MB per checkpoint in bf16


@pytest.mark.multirank
def test_70b_tp8pp8_emulated_by_two_processes(tmp_path):
    logs = tmp_path / "logs"
    proc, run = run_study(logs, "70B", "tp8pp8", "--emulate", "--emulate-scale", SCALE, "--ranks-per-process", "32",
                          "--iters", "1", "--save-interval", "1", "--baseline-mib", "0", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run.parent.name == "torch-emulated"  # never mixed with real torch runs
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["engine"] == "torch-emulated" and meta["world_size"] == 64
    emulation = meta["emulation"]
    assert emulation["processes"] == 2 and emulation["ranks_per_process"] == 32 and emulation["scale"] == 0.016
    assert emulation["emulated_model"]["hidden"] == 128 and "no model, optimizer or training step" in emulation["what"]
    assert emulation["full_scale_checkpoint_bytes"] > 900 * 2**30

    cfg = RunConfig.load(run / "config.json")
    plan = predict(cfg, step=1, scale=cfg.emulation.emulate_scale)
    written = {f["path"]: (f["bytes"], f["rank"]) for f in json.loads((run / "inventory.json").read_text()) if f["tag"]}
    assert written == {f.path: (f.bytes, f.rank) for f in plan.files}
    assert emulation["checkpoint_bytes"] == plan.checkpoint_bytes

    events = [json.loads(line) for path in (run / "events").glob("*.jsonl") for line in path.read_text().splitlines()]
    for name, phase in (("checkpoint.save", "train"), ("checkpoint.durable", "train"), ("restore.load", "restore"),
                        ("restore.result", "restore")):
        assert sorted(e["rank"] for e in events if e["event"] == name and e["phase"] == phase) == list(range(64)), name
    assert all(e["exact"] for e in events if e["event"] == "restore.result")
    assert sum(e["bytes"] for e in events if e["event"] == "checkpoint.durable") == plan.checkpoint_bytes

    summary = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(logs), "--no-plots",
                              "--out", str(tmp_path / "summary")], capture_output=True, text=True, timeout=600)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "torch-emulated" in summary.stdout and "tp8pp8dp1" in summary.stdout
    assert "excluded" not in summary.stdout.lower() or "0 excluded" in summary.stdout.lower()


def test_dry_run_prints_the_emulation_and_writes_nothing(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "70B", "tp8pp8", "--emulate", "--emulate-scale",
                          SCALE, "--ranks-per-process", "16", "--dry-run", "--logs", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "64 ranks in 4 processes" in out.stdout and "-m restartbench.emulate " in out.stdout
    assert "--nproc-per-node 4" in out.stdout and not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (("--ranks-per-process", "3"), "do not split into processes"),
    (("--emulate-scale", "0"), "--emulate-scale must be in (0, 1]"),
    (("--engine", "dcp"), "--engine torch"),
])
def test_bad_emulation_options_are_refused(tmp_path, argv, message):
    out = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--emulate", *argv,
                          "--logs", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and message in out.stdout + out.stderr
    assert not any(tmp_path.iterdir())

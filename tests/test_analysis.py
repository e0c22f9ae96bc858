"""analysis/summarize.py over real run folders, plus failed, foreign and malformed ones."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from restartbench.analysis import collect

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.multirank


@pytest.fixture
def mixed_logs(study_logs, tmp_path):
    """The session's real runs, plus a failed run, a killed run, a malformed one and a foreign file."""
    logs = tmp_path / "logs"
    shutil.copytree(study_logs, logs)
    real = sorted(logs.glob("*/*/*/*"))[0]
    for name, status, error in (("failed", "failed", "phase train failed: rank 0: boom"), ("killed", "running", None)):
        copy = real.parent / name
        shutil.copytree(real, copy)
        meta = json.loads((copy / "metadata.json").read_text())
        meta.update(status=status, error=error)
        (copy / "metadata.json").write_text(json.dumps(meta))
    broken = real.parent / "broken"
    shutil.copytree(real, broken)
    (broken / "metadata.json").write_text("{not json")
    (logs / "notes.txt").write_text("not a run")
    return logs


def test_collect_skips_bad_runs_with_reasons(mixed_logs):
    collected = collect(mixed_logs)
    reasons = {path.name: reason for path, reason in collected.skipped}
    assert "boom" in reasons["failed"]
    assert "never finished" in reasons["killed"]
    assert "metadata.json is not valid JSON" in reasons["broken"]
    table = collected.table()
    assert set(table["layout"]) == {"tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp2"}
    assert (table[table["kind"] == "restart"]["exact"] == True).all()  # noqa: E712


def test_summarize_writes_tables_and_plots(mixed_logs, tmp_path):
    out = tmp_path / "summary"
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(mixed_logs), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" in proc.stdout and "Checkpoints" in proc.stdout and "Restarts" in proc.stdout
    for name in ("study.csv", "study.parquet", "files.csv", "checkpoint_cost.png", "checkpoint_cost.svg",
                 "restart_phases.png", "restart_phases.svg"):
        assert (out / name).stat().st_size > 0, name
    table = pd.read_parquet(out / "study.parquet")
    ckpt = table[table["kind"] == "checkpoint"]
    assert (ckpt["stall_max_s"] <= ckpt["durable_rank_max_s"]).all()
    assert (ckpt["durable_rank_max_s"] <= ckpt["committed_s"]).all()
    files = pd.read_csv(out / "files.csv")
    assert set(files["kind"]) >= {"layer", "model", "optimizer"}


def test_summarize_on_a_missing_folder_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "is not a folder" in proc.stdout

"""Shared fixtures: real tiny-preset study runs, made once per test session and read by several tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# The property tests check logic, not speed: a per-example deadline only fails them on a loaded machine.
settings.register_profile("restartbench", deadline=None)
settings.load_profile("restartbench")

# (layout, dtype, extra options): the three layouts the suite proves, one in bf16 (slow on these CPUs),
# one with activation recomputation.
STUDY_CASES = [("tp2pp2", "fp32", ()), ("pp2dp2", "bf16", ()),
               ("tp1pp1dp2", "fp32", ("--activation-checkpoint-interval", "1"))]


def run_study(logs: Path, *argv: str, timeout: int = 600, env: dict | None = None
              ) -> tuple[subprocess.CompletedProcess, Path | None]:
    """Run config-n-run.py with a fresh logs root; return the process and the run folder it made."""
    before = set(logs.glob("*/*/*/*"))
    proc = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), *argv, "--logs", str(logs)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    made = sorted(set(logs.glob("*/*/*/*")) - before)
    return proc, (made[-1] if made else None)


@pytest.fixture(scope="session")
def study_runs(tmp_path_factory):
    """{layout: (process, run folder)} for STUDY_CASES, all under one logs root."""
    logs = tmp_path_factory.mktemp("study") / "logs"
    return {layout: run_study(logs, "tiny", layout, "--dtype", dtype, "--iters", "4", "--save-interval", "2", *extra)
            for layout, dtype, extra in STUDY_CASES}


@pytest.fixture(scope="session")
def study_logs(study_runs):
    return next(iter(study_runs.values()))[1].parents[3]

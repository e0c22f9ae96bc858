"""The suite's skip policy (tests/conftest.py): a skipped test outside the GPU tests fails the run, so an extra or
a tool that did not install cannot turn a guarantee's test into a silent skip. Checked on a scratch suite that
uses this conftest."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRATCH_TESTS = '''
import pytest

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")

def test_passes():
    pass
'''
SKIPPING_TEST = '''
import pytest

def test_needs_a_tool():
    pytest.skip("the tool is not installed")
'''
MISSING_EXTRA = '''
import pytest

pytest.importorskip("a_module_that_is_not_installed")

def test_never_collected():
    pass
'''


def run_scratch_suite(tmp_path: Path, *extra_modules: str, allow_skips: bool = False) -> subprocess.CompletedProcess:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_scratch.py").write_text(SCRATCH_TESTS)
    for index, text in enumerate(extra_modules):
        (tmp_path / f"test_extra{index}.py").write_text(text)
    env = {key: value for key, value in os.environ.items() if key != "RESTARTBENCH_ALLOW_SKIPS"}
    if allow_skips:
        env["RESTARTBENCH_ALLOW_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)


def test_gpu_skips_are_allowed(tmp_path):
    proc = run_scratch_suite(tmp_path)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("module", [SKIPPING_TEST, MISSING_EXTRA], ids=["skip-in-test", "extra-not-installed"])
def test_any_other_skip_fails_the_run_and_is_named(tmp_path, module):
    proc = run_scratch_suite(tmp_path, module)
    assert proc.returncode == 1, proc.stdout
    assert "1 non-GPU skips: the run FAILS" in proc.stdout and "test_extra0.py" in proc.stdout


def test_allow_skips_lets_the_run_pass_and_still_lists_them(tmp_path):
    proc = run_scratch_suite(tmp_path, SKIPPING_TEST, allow_skips=True)
    assert proc.returncode == 0, proc.stdout
    assert "1 non-GPU skips: allowed by RESTARTBENCH_ALLOW_SKIPS" in proc.stdout
    assert "the tool is not installed" in proc.stdout

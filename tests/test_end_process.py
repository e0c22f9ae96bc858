"""A rank's exit (restartbench.launchers.end_process): it skips the interpreter's teardown only where nothing is left
that normal exit would wait for, and loses no output."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys, threading, time
from pathlib import Path
from restartbench.launchers import end_process

print("said before the exit", end="")  # no newline, no flush: end_process must flush it
sys.stderr.write("and on stderr")
if sys.argv[1] == "worker":  # a non-daemon thread still writing: normal exit joins it
    threading.Thread(target=lambda: (time.sleep(0.5), Path(sys.argv[2]).write_text("done"))).start()
if sys.argv[1] == "finalizer":  # teardown's work: done at normal exit only
    import atexit
    atexit.register(lambda: Path(sys.argv[2]).write_text("teardown ran"))
end_process(3)
"""


def run(tmp_path, case):
    marker = tmp_path / "marker"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a rank's output is buffered
    proc = subprocess.run([sys.executable, "-c", SCRIPT, case, str(marker)], capture_output=True, text=True,
                          timeout=60, env=env)
    return proc, marker


@pytest.mark.parametrize("case", ["alone", "finalizer"])
def test_a_rank_with_nothing_left_exits_with_its_code_and_its_output_without_teardown(tmp_path, case):
    proc, marker = run(tmp_path, case)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "said before the exit", "and on stderr")
    assert not marker.exists(), "the interpreter's teardown was skipped"


def test_a_rank_whose_thread_still_works_exits_normally_after_it(tmp_path):
    proc, marker = run(tmp_path, "worker")
    assert (proc.returncode, proc.stdout) == (3, "said before the exit")
    assert marker.read_text() == "done"

"""What a rank killed by a signal leaves: Python's fault handler's report, read back for the run's error."""

import subprocess
import sys
import textwrap

from restartbench import rundir
from restartbench.crashes import crash_report
from restartbench.events import Event, EventLog
from restartbench.study import error_summary

CRASH_IN_A_FUNCTION = """\
Fatal Python error: Segmentation fault

Thread 0x00007fedc22da6c0 (most recent call first):
  File "/tmp/seg.py", line 3 in background
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007fedc2e7db80 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/opt/datastates/llm/checkpointing.py", line 93 in save_background
  File "/work/restartbench/engines/deepspeed/datastates_adapter.py", line 262 in run
  File "/usr/lib/python3.11/concurrent/futures/thread.py", line 58 in run

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_the_crashed_threads_innermost_frames_are_named_with_the_signal():
    assert crash_report("W1207 torchrun warning\n" + CRASH_IN_A_FUNCTION) == (
        "Segmentation fault in string_at (__init__.py:519) < save_background (checkpointing.py:93) "
        "< run (datastates_adapter.py:262)")


def test_a_crash_in_a_thread_that_runs_no_python_says_so():
    native = CRASH_IN_A_FUNCTION.replace("Current thread 0x00007fedc2e7db80", "Thread 0x00007fedc2e7db80")
    assert crash_report(native) == ("Segmentation fault in a thread that runs no Python code "
                                    "(a compiled library's own thread)")


def test_no_report_when_nothing_crashed():
    assert crash_report("Traceback (most recent call last):\n  File \"x.py\", line 1 in <module>\nValueError\n") is None


def test_a_real_fault_handler_report_reads_back():
    """The fault handler as enable() sets it, in a process that dies of SIGSEGV in a function of its own."""
    program = textwrap.dedent("""\
        import ctypes
        from restartbench import crashes
        def write_tensor():
            ctypes.string_at(0)
        crashes.enable()
        write_tensor()
        """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode < 0
    report = crash_report(proc.stderr)
    assert report.startswith("Segmentation fault in string_at (__init__.py:")
    assert "< write_tensor (<string>:4)" in report


def _phase(run_dir, stderr: str, errors: dict[int, str | None]) -> None:
    """A train phase's records: each rank started, then recorded its error (or, for None, nothing more); its
    stderr log."""
    for rank, error in errors.items():
        log = EventLog(run_dir, "train", rank)
        log.emit(Event.PROCESS_START, start=0.0, duration_s=0.1)
        if error is not None:
            log.emit(Event.PHASE_ERROR, error=error)
    rundir.phase_log(run_dir, "train", "stderr").parent.mkdir(parents=True, exist_ok=True)
    rundir.phase_log(run_dir, "train", "stderr").write_text(stderr)


def test_a_rank_that_crashed_without_a_word_is_named_first(tmp_path):
    """The others' errors follow from its death (gloo's 'Connection closed by peer')."""
    _phase(tmp_path, CRASH_IN_A_FUNCTION, {0: "RuntimeError: Connection closed by peer", 1: None})
    assert error_summary(tmp_path, "train", 1).startswith("rank 1 crashed: Segmentation fault in string_at")


def test_an_error_recorded_before_a_crash_is_the_phases_error_with_the_crash_after_it(tmp_path):
    """A compiled library that aborts once the rank's error was raised (DataStates' host tier writing into a removed
    folder, NCCL's watchdog) does not hide the error the rank recorded."""
    aborted = CRASH_IN_A_FUNCTION.replace("Segmentation fault", "Aborted")
    _phase(tmp_path, aborted, {0: "DataStatesConfigError: the host cache is too small"})
    summary = error_summary(tmp_path, "train", 1)
    assert summary.startswith("rank 0: DataStatesConfigError: the host cache is too small; then a rank crashed: "
                              "Aborted in string_at"), summary

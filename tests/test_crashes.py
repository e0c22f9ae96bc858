"""What a rank killed by a signal leaves: Python's fault handler's report, read back for the run's error."""

import subprocess
import sys
import textwrap

from restartbench.crashes import crash_report

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

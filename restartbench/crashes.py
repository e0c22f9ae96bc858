"""A rank that dies of a signal leaves no Python error to record: a segfault in an engine's compiled code
(DataStates-LLM's threads, DeepSpeed's async_io op), an abort, a bus error. Python's fault handler, enabled in every
rank (``enable``), then prints the traceback of each of the process's threads on its stderr, which the phase's
``<phase>.stderr.log`` keeps; ``crash_report`` reads the crashed thread's innermost frames back out of it, for the
run's error in metadata.json.

Standard library only: every rank imports it before torch.
"""

from __future__ import annotations

import faulthandler
import re
from pathlib import PurePath

FATAL = "Fatal Python error: "
"""How the fault handler's report begins: 'Fatal Python error: Segmentation fault'."""
CURRENT_THREAD = "Current thread "
"""The header of the crashed thread's frames, innermost first ('Current thread 0x... (most recent call first):')."""
FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>\S+)')
FRAMES_SHOWN = 3


def enable() -> None:
    """On SIGSEGV, SIGFPE, SIGABRT, SIGBUS or SIGILL, print every thread's traceback on stderr before dying."""
    faulthandler.enable(all_threads=True)


def crash_report(stderr_text: str) -> str | None:
    """The first fault-handler report in ``stderr_text``: what killed the process and the crashed thread's innermost
    frames ('Segmentation fault in save_background (checkpointing.py:93) < run (datastates_adapter.py:262)'); None
    when no process crashed."""
    lines = stderr_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(FATAL)), None)
    if start is None:
        return None
    what = lines[start][len(FATAL):].strip()
    current = next((i for i in range(start, len(lines)) if lines[i].startswith(CURRENT_THREAD)), None)
    if current is None:  # the fault handler labels no thread 'current' when the crashed one runs no Python
        return f"{what} in a thread that runs no Python code (a compiled library's own thread)"
    frames = []
    for line in lines[current + 1:]:
        frame = FRAME.match(line)
        if frame is None:
            break
        frames.append(f"{frame['function']} ({PurePath(frame['file']).name}:{frame['line']})")
    return f"{what} in {' < '.join(frames[:FRAMES_SHOWN])}" if frames else what

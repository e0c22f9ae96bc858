"""Progress lines a person watching the terminal reads: which phase, how far along."""

from __future__ import annotations

import sys
import time

PREFIX = "[restartbench]"


def say(message: str) -> None:
    print(f"{PREFIX} {time.strftime('%H:%M:%S')} {message}", file=sys.stdout, flush=True)

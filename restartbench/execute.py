"""Run the phases of a prepared run folder: ``python -m restartbench.execute RUN_DIR``.

This is what a batch job (sbatch/PBS script) runs inside its allocation; ``config-n-run.py``
calls the same function directly for local runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from restartbench.study import execute

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m restartbench.execute RUN_DIR")
    sys.exit(execute(Path(sys.argv[1])))

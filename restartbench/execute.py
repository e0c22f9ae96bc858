"""Run the phases of a prepared run folder: ``python -m restartbench.execute RUN_DIR``.

This is what a batch job (sbatch/PBS script) runs inside its allocation; ``config-n-run.py``
calls the same function directly for local runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from restartbench.errors import StudyError
from restartbench.rundir import RunFolderError
from restartbench.study import execute


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m restartbench.execute RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    try:
        return execute(run_dir)
    except StudyError as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RunFolderError) as error:
        print(f"error: {run_dir} is not a prepared run folder this version can run: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

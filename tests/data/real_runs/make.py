"""Regenerate the stored real runs that tests/test_predict.py holds the predictor to, from fresh runs.

    .venv/bin/python tests/data/real_runs/make.py              # all of them: about 10 minutes on 2 cores
    .venv/bin/python tests/data/real_runs/make.py NAME ...     # only these (names as the folders here)

One tiny run per case (4 iterations, saves at 2 and 4): DeepSpeed's default engine in the layouts of
conftest.STUDY_CASES and each engine of conftest.ENGINE_CASES. Of each run folder only what the prediction is
compared with is kept (``test_predict.STORED_FILES``), and README.md's line of each run made says when, where and with
which versions it was made (the lines of the runs not made again are kept; the folders of cases no longer in the list
are removed). The first fastpersist run on a machine JIT-builds DeepSpeed's ops (minutes).
"""

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest and test_predict

from conftest import run_study  # noqa: E402  (after the sys.path insert that makes tests/ importable)
from test_predict import REAL_RUN_CASES, STORED_RUNS, real_run_name, stored_parts  # noqa: E402

from restartbench.plan import PLAN_CACHE  # noqa: E402


def store(run: Path, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    for name, content in stored_parts(run).items():
        (folder / name).write_text(json.dumps(content, indent=1) + "\n")


MADE = "- "
"""README.md's lines that say when and where each stored run was made start so, then its name and a colon."""


def write_readme(made: list[str]) -> None:
    """README.md: what is stored, then one line per stored run, ``made`` now, the others as the README said."""
    readme = HERE / "README.md"
    earlier = {line[len(MADE):].split(":")[0]: line for line in readme.read_text().splitlines()
               if line.startswith(MADE)} if readme.exists() else {}
    versions = ", ".join(f"{package} {version(package)}" for package in ("torch", "deepspeed", "torchsnapshot"))
    now = (f"{time.strftime('%Y-%m-%d')} on a {os.cpu_count()}-core {platform.machine()} {platform.system()} "
           f"machine, gloo ranks on its CPU, Python {platform.python_version()}, {versions}")
    lines = [f"{MADE}{name}: {now}" if name in made else earlier.get(name, f"{MADE}{name}: (not recorded)")
             for name in STORED_RUNS]
    readme.write_text(
        "# Stored real runs\n\n"
        "One tiny run per engine and layout (4 iterations, saves at 2 and 4), reduced to what "
        "`tests/test_predict.py` compares with the predictor: `config.json` and `inventory.json` as the run wrote "
        "them, the durable bytes per tag and rank from its `checkpoint.durable` events (`durable.json`), and from "
        "`plan.json` the device the run resolved and its `checkpoint_bytes_estimate`. Regenerate them all with "
        "`.venv/bin/python tests/data/real_runs/make.py` after a change of torch, DeepSpeed, TorchSnapshot or an "
        "engine's files (`make.py NAME ...` makes only those).\n\n"
        "Each run, when and where it was made:\n\n" + "\n".join(lines) + "\n")


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(STORED_RUNS))
    if unknown:
        print(f"[real_runs] not a stored run: {', '.join(unknown)}; the runs are {', '.join(STORED_RUNS)}",
              file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="restartbench-real-runs-")) / "logs"
    made = []
    for engine, layout, dtype, extra in REAL_RUN_CASES:
        name = real_run_name(engine, layout, dtype)
        if names and name not in names:
            continue
        print(f"[real_runs] {name}", file=sys.stderr)
        proc, run = run_study(logs, "tiny", layout, "--dtype", dtype, "--engine", engine, "--iters", "4",
                              "--save-interval", "2", *extra, timeout=3600,
                              env={PLAN_CACHE: "off"})  # plan.json's estimate computed by the run, not read back
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
            return 1
        store(run, HERE / name)
        made.append(name)
    for stale in sorted(p.parent for p in HERE.glob("*/config.json") if p.parent.name not in STORED_RUNS):
        shutil.rmtree(stale)
    write_readme(made)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

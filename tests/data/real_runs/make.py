"""Regenerate the stored real runs that tests/test_predict.py holds the predictor to, from fresh runs.

    .venv/bin/python tests/data/real_runs/make.py      # about 10 minutes on 2 cores

One tiny run per case (4 iterations, saves at 2 and 4): DeepSpeed's default engine in the layouts of
conftest.STUDY_CASES and each engine of test_predict.ENGINE_CASES. Of each run folder only what the prediction is
compared with is kept (``test_predict.STORED_FILES``), and README.md is rewritten to say when, where and with which
versions the runs were made. The first fastpersist run on a machine JIT-builds DeepSpeed's ops (minutes).
"""

import json
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: conftest and test_predict

from conftest import run_study  # noqa: E402  (after the sys.path insert that makes tests/ importable)
from test_predict import REAL_RUN_CASES, real_run_name, stored_parts  # noqa: E402

from restartbench.plan import PLAN_CACHE  # noqa: E402


def store(run: Path, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    for name, content in stored_parts(run).items():
        (folder / name).write_text(json.dumps(content, indent=1) + "\n")


def write_readme(names: list[str]) -> None:
    versions = ", ".join(f"{package} {version(package)}" for package in ("torch", "deepspeed", "torchsnapshot"))
    (HERE / "README.md").write_text(
        "# Stored real runs\n\n"
        "One tiny run per engine and layout (4 iterations, saves at 2 and 4), reduced to what "
        "`tests/test_predict.py` compares with the predictor: `config.json` and `inventory.json` as the run wrote "
        "them, the durable bytes per tag and rank from its `checkpoint.durable` events (`durable.json`), and from "
        "`plan.json` the device the run resolved and its `checkpoint_bytes_estimate`. Regenerate them all with "
        "`.venv/bin/python tests/data/real_runs/make.py` after a change of torch, DeepSpeed, TorchSnapshot or an "
        "engine's files.\n\n"
        f"Made {time.strftime('%Y-%m-%d')} on a {os.cpu_count()}-core {platform.machine()} {platform.system()} "
        f"machine, gloo ranks on its CPU, Python {platform.python_version()}, {versions}: {', '.join(names)}.\n")


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="restartbench-real-runs-")) / "logs"
    for engine, layout, dtype, extra in REAL_RUN_CASES:
        name = real_run_name(engine, layout, dtype)
        print(f"[real_runs] {name}", file=sys.stderr)
        proc, run = run_study(logs, "tiny", layout, "--dtype", dtype, "--engine", engine, "--iters", "4",
                              "--save-interval", "2", *extra, timeout=3600,
                              env={PLAN_CACHE: "off"})  # plan.json's estimate computed by the run, not read back
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
            return 1
        store(run, HERE / name)
    write_readme([real_run_name(*case[:3]) for case in REAL_RUN_CASES])
    return 0


if __name__ == "__main__":
    sys.exit(main())

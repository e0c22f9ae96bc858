#!/usr/bin/env python3
"""DataStates-LLM's build, timed: scripts/build-datastates.sh into an empty folder, then again into the same folder.

    python bench/datastates_build.py --python PY [--jobs N] [--arch 9.0] [--target DIR]

``PY`` is a Python with a CUDA build of torch (the script refuses a CPU torch; this checkout's .venv has one). The
first call compiles the vendored source (g++ on its five .cpp files through torch's CUDAExtension, against CUDA's
headers; nvcc is asked only its version) and runs the script's import check; the second finds the stamp and only
imports it. No CUDA call is made, so a machine without a GPU measures the compile, the link and the import. The
target (default a temporary folder, removed after) must not hold anything yet. Writes
``bench/results/YYYY-MM-DD-<machine>-datastates-build.json`` and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import ROOT, add_output_arguments, heading, run_meta, write_results

SCRIPT = ROOT / "scripts" / "build-datastates.sh"
TOOLCHAIN = """import json, shutil, subprocess, torch
def first(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return None
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "nvcc": shutil.which("nvcc"),
                  "cxx": first(["c++", "--version"])}))"""


def toolchain(python: str) -> dict:
    """The build Python's torch and CUDA, the nvcc on PATH and its release, the C++ compiler."""
    done = subprocess.run([python, "-c", TOOLCHAIN], capture_output=True, text=True, check=True)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if info["nvcc"]:
        version = subprocess.run([info["nvcc"], "--version"], capture_output=True, text=True).stdout
        info["nvcc_release"] = next((line.strip() for line in version.splitlines() if "release" in line), None)
    return info


def build(name: str, python: str, target: Path, jobs: int, arch: str) -> dict:
    env = {**os.environ, "PYTHON": python, "MAX_JOBS": str(jobs), "TORCH_CUDA_ARCH_LIST": arch}
    start = time.perf_counter()
    done = subprocess.run(["bash", str(SCRIPT), str(target)], cwd=ROOT, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    out = (done.stdout + done.stderr).splitlines()
    pip = next((re.search(r"pip install took (\d+) s", line) for line in out if "pip install took" in line), None)
    errors = [line.strip() for line in out if re.search(r"\berror\b", line) and "error: subprocess" not in line]
    print(f"{name}: exit {done.returncode} after {wall_s:.0f} s", flush=True)
    return {"name": name, "exit": done.returncode, "wall_s": wall_s, "pip_install_s": int(pip[1]) if pip else None,
            "load_average_after": os.getloadavg()[0],
            "skipped": any("not built again" in line for line in out),
            "building": next((line for line in out if line.startswith("build-datastates.sh: building")), None),
            "import_check": [line for line in out if line.startswith("import check:")],
            "first_errors": errors[:5]}


def extension(target: Path) -> dict | None:
    """The compiled engine's file and size, where the build left one."""
    found = sorted((target / "datastates" / "ckpt").glob("src*.so"))
    return {"file": found[0].name, "bytes": found[0].stat().st_size} if found else None


def markdown(result: dict) -> str:
    meta, tools = result["meta"], result["toolchain"]
    lines = [*heading("DataStates-LLM's build, timed", meta),
             f"Built with {result['python']}: torch {tools['torch']} (CUDA {tools['torch_cuda']}; a GPU visible: "
             f"{tools['cuda_available']}), nvcc {tools['nvcc']} ({tools.get('nvcc_release')}), {tools['cxx']}; "
             f"MAX_JOBS={result['jobs']}, TORCH_CUDA_ARCH_LIST={result['arch']}, the script under nice "
             f"{result['niceness']}.", "",
             "| call | exit | wall s | pip install s | built again | load average after |", "|---|---|---|---|---|---|"]
    for b in result["builds"]:
        pip = "" if b["pip_install_s"] is None else str(b["pip_install_s"])
        lines.append(f"| {b['name']} | {b['exit']} | {b['wall_s']:.0f} | {pip} | {'no' if b['skipped'] else 'yes'} "
                     f"| {b['load_average_after']:.1f} |")
    lines.append("")
    for b in result["builds"]:
        lines += [f"{b['name']}:", ""] + [f"- `{line}`" for line in [b["building"]] * bool(b["building"])
                                          + b["import_check"] + b["first_errors"]] + [""]
    so = result["extension"]
    lines += [f"Compiled engine: {so['file']}, {so['bytes']} bytes." if so else "No compiled engine was left.", "",
              "Wall s: the whole script (its stamp, the build or the check, the import check); pip install s: the "
              "script's own figure for pip's build and install. Nothing runs on a GPU here: import only.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a Python with a CUDA build of torch")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="MAX_JOBS (default: the CPUs)")
    parser.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST (default: %(default)s)")
    parser.add_argument("--target", type=Path, default=None, help="an empty or new folder (default: a temporary one)")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.target is not None and args.target.exists() and any(args.target.iterdir()):
        parser.error(f"--target {args.target} is not empty: the first call must build")
    meta = run_meta("datastates-build", argv, args.machine)
    result = {"meta": meta, "python": args.python, "jobs": args.jobs, "arch": args.arch, "niceness": os.nice(0),
              "toolchain": toolchain(args.python)}
    with tempfile.TemporaryDirectory(prefix="bench-datastates-") as scratch:
        target = args.target or Path(scratch) / "site"
        result["builds"] = [build(name, args.python, target, args.jobs, args.arch)
                            for name in ("first call (builds)", "second call (its stamp)")]
        result["extension"] = extension(target)
    write_results(args.out, result, markdown)
    return 0 if all(b["exit"] == 0 for b in result["builds"]) else 1


if __name__ == "__main__":
    sys.exit(main())

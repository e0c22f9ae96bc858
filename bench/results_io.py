"""What every benchmark under bench/ writes: the raw results as JSON and the Markdown made from that JSON.

    bench/results/YYYY-MM-DD-<machine>-<benchmark>.json   the command, machine, versions, date and every measurement
    bench/results/YYYY-MM-DD-<machine>-<benchmark>.md     ``markdown(json)`` of the benchmark's script, nothing added

The Markdown is rendered from the JSON as written (read back), so it holds nothing the JSON does not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GiB = 2**30


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers above 0 (``1000,10000``), refused in words otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers above 0, comma-separated, such as 4,32")
    return values


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the result files (default: %(default)s)")
    parser.add_argument("--machine", default=None, help="name in the result file (default: GPU model or cpuN)")


def speed_parser(description: str, gib: float, what: str) -> argparse.ArgumentParser:
    """The options of every speed benchmark (``--gib``, ``--repeats``, ``--json`` and the output's); each script adds
    its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gib", type=float, default=gib, help=f"size of {what} in GiB (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the result here only (no results file)")
    add_output_arguments(parser)
    return parser


def runtime_versions() -> dict:
    """``restartbench.runtime.runtime_info()`` (Python, torch, DeepSpeed, host, CPU, device, GPU), taken in a child
    process so that the benchmark's own process does not load torch and DeepSpeed (the soak measures its RSS)."""
    code = "import json; from restartbench.runtime import runtime_info; print(json.dumps(runtime_info()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_name(runtime: dict) -> str:
    """The GPU model (``h100``) where there is one, else ``cpu<cores>``."""
    if runtime.get("gpu"):
        return runtime["gpu"].lower().replace("nvidia", "").strip().split()[0]
    return f"cpu{os.cpu_count()}"


def git_commit() -> dict:
    """The repository's commit and whether the work tree differs from it (None where git cannot say)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    try:
        head = git("rev-parse", "HEAD")
        dirty = git("diff", "--quiet", "HEAD")
    except OSError:
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": head.stdout.strip() or None,
            "uncommitted_changes": None if head.returncode else dirty.returncode != 0}


def run_meta(benchmark: str, argv: list[str], machine: str | None = None) -> dict:
    """Date, command, machine, versions and load of this run of ``bench/<script>``, taken at its start."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    runtime = runtime_versions()
    return {"benchmark": benchmark, "date": datetime.date.today().isoformat(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": argv, "command": shlex.join(["python", str(shown), *argv]),
            "machine": machine or machine_name(runtime), "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "load_average_at_start": os.getloadavg()[0], **runtime, **git_commit()}


def machine_line(meta: dict) -> str:
    """One sentence on where and with what a result was measured."""
    commit = meta.get("commit")
    code = (f"commit {commit[:10]}" + (" with uncommitted changes" if meta.get("uncommitted_changes") else "")
            if commit else "commit unknown")
    return (f"{meta['machine']}: host {meta['host']}, {meta['cpus']} CPUs ({meta['cpu']}), "
            f"{meta['memory_bytes'] / GiB:.1f} GiB, device {meta['device']}; Python {meta['python']}, "
            f"torch {meta['torch']}, DeepSpeed {meta['deepspeed']}; {code}; "
            f"load average {meta['load_average_at_start']:.2f} at the start.")


def heading(title: str, meta: dict) -> list[str]:
    """A result's Markdown opening: the title with the machine and date, the command, ``machine_line``."""
    return [f"# {title} — {meta['machine']}, {meta['date']}", "", f"`{meta['command']}`", "", machine_line(meta), ""]


def speed_figures(seconds: dict[str, list[float]], nbytes: int) -> list[dict]:
    """Each method's timed repeats of ``nbytes``: the median and GB/s at the median, the slowest and the fastest."""
    return [{"method": name, "seconds": times, "median_s": statistics.median(times),
             "GBps": nbytes / 1e9 / statistics.median(times), "min_GBps": nbytes / 1e9 / max(times),
             "max_GBps": nbytes / 1e9 / min(times)} for name, times in seconds.items()]


def speed_table(figures: list[dict], against: str, key: str) -> list[str]:
    """``speed_figures``' Markdown table, each method's ``key`` (a speed-up) in the column named ``against``."""
    return [f"| method | median s | GB/s (median) | min–max GB/s | {against} |", "|---|---|---|---|---|",
            *[f"| {f['method']} | {f['median_s']:.2f} | {f['GBps']:.2f} | {f['min_GBps']:.2f}–{f['max_GBps']:.2f} | "
              f"{f[key]:.2f}× |" for f in figures]]


def result_stem(out: Path, meta: dict, dated: str | None = None) -> Path:
    """``out/<date>-<machine>-<benchmark>``, the path of a result without its suffix; ``dated`` replaces the date
    (``attempt_stem`` numbers a second attempt of the same date so)."""
    return out / f"{dated or meta['date']}-{meta['machine']}-{meta['benchmark']}"


def attempt_stem(results: Path, meta: dict) -> Path:
    """Where a result goes: ``<date>-<machine>-<benchmark>``, or ``<date>.N-...`` (N = 2, 3, ...) when that file
    already holds another attempt (another ``started``: a second call of the same GPU visit, a later visit or run on
    the same day). An earlier attempt's result is never overwritten (the 2026-11-27 DataStates build's failed first
    attempt was, and lived on in git only); writing the same run again rewrites its own."""
    stem, attempt = result_stem(results, meta), 1
    while _holds_another_attempt(Path(f"{stem}.json"), meta):  # not with_suffix: '.2-...' is a suffix
        attempt += 1
        stem = result_stem(results, meta, f"{meta['date']}.{attempt}")
    return stem


def _holds_another_attempt(path: Path, meta: dict) -> bool:
    return path.is_file() and json.loads(path.read_text()).get("meta", {}).get("started") != meta["started"]


def write_results(out: Path, result: dict, markdown: Callable[[dict], str], stem: Path | None = None) -> Path:
    """Write ``result`` (with its ``meta``) as JSON and ``markdown`` of it as read back; the Markdown's path.
    ``stem``: where (``result_stem`` of its meta when None)."""
    meta = result["meta"]
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or result_stem(out, meta)
    raw = json.dumps(result, indent=1, default=str) + "\n"
    Path(f"{stem}.json").write_text(raw)
    text = markdown(json.loads(raw))
    Path(f"{stem}.md").write_text(text)
    print(text)
    print(f"written: {stem}.md, {stem}.json")
    return Path(f"{stem}.md")


def write_json_or_results(json_path: Path | None, out: Path, result: dict, markdown: Callable[[dict], str]) -> None:
    """``--json FILE``: ``result`` into FILE only, its Markdown (as read back) printed; else ``write_results``."""
    if json_path is None:
        write_results(out, result, markdown)
        return
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(markdown(json.loads(json_path.read_text())))


def measure_in_scratch(meta: dict, prefix: str, measure: Callable[[Path], dict], json_path: Path | None, out: Path,
                       markdown: Callable[[dict], str], where: Path | None = None) -> None:
    """Run ``measure`` in a new scratch folder (named ``prefix``..., in ``where``, default $TMPDIR), removed after
    whatever happened, then write its result with ``meta`` as ``write_json_or_results`` does."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    try:
        result = {"meta": meta, **measure(folder)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_json_or_results(json_path, out, result, markdown)

#!/usr/bin/env python3
"""The storage's write and read limits at a checkpoint's concurrency, as the best of several methods, repeated.

    python bench/limits.py --dir DIR --jobs N --mib-per-job M --repeats R [--json FILE] [--sizes 16,64,256]

``jobs`` fio jobs at once (as many as ranks per node), each on its own file of ``mib-per-job`` MiB (a rank's share
of the checkpoint) in DIR, run every method of ``restartbench.baseline.FULL`` (a run's own baseline runs the
shorter ``QUICK`` set): buffered writes ending in fsync and O_DIRECT writes with a queue (libaio, iodepth 16-32,
1-8 MiB blocks, ending in fsync), O_DIRECT reads one block at a time and with a queue, buffered reads of evicted
files (checked empty with ``mincore``, ``restartbench.pagecache``). Every method runs ``repeats`` times, in
another order each repeat; each side's limit is the method with the highest median, and every method's min,
median and max is kept, with the load average and the disk's other traffic (``/proc/diskstats``) while it ran.

``--sizes`` adds the experiment behind the probe's size rule (``baseline.PROBE_RULE``): the same jobs at each size
per job, with a few methods, a buffered write without fsync among them (the page cache's speed: what a probe that
the cache absorbs measures).

The result's ``write`` and ``read`` hold each side's limit (``best_MBps``: the winner's median), its method and
spread; ``limits`` every method's figures. With ``--json FILE`` the result goes to FILE only (bench/gpu_session.py
runs it so on a GPU machine); without, to ``bench/results/YYYY-MM-DD-<machine>-limits.json`` and ``.md``
(bench/results_io.py). ``--render FILE.json`` writes the Markdown of an existing result again (after ``notes`` were
added to it).

Without fio (a bare GPU image), GNU dd measures instead (``baseline.DD_FULL``): buffered and O_DIRECT writes ending
in fsync, O_DIRECT reads and buffered reads of evicted files, one dd process per job, in 1 and 8 MiB blocks; the same
repeats, spreads and keys, with ``tool`` "dd". dd moves one block at a time (queue depth 1), so its limits are lower
bounds of what the device allows with a queue. Without fio and dd it says so (in FILE where given) and exits with
status 3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from results_io import ROOT, add_output_arguments, machine_line, positive_ints, run_meta, write_json_or_results

sys.path.insert(0, str(ROOT))

from restartbench import baseline, pagecache  # noqa: E402
from restartbench.baseline import DD_FULL, FULL, Method  # noqa: E402

#: The exit status where neither fio nor dd is installed.
NO_FIO = 3
#: The experiment's methods (``--sizes``): the two durable writes, the page cache's write, the old read and the
#: queued and buffered reads.
SWEEP: tuple[Method, ...] = (
    Method("write"),
    Method("write", fsync=False),
    Method("write", direct=True, ioengine="libaio", iodepth=16),
    Method("read", direct=True),
    Method("read", direct=True, ioengine="libaio", iodepth=32, block_size="8M"),
    Method("read", evict_first=True),
)
#: The experiment's methods with dd: its own, and the page cache's write.
DD_SWEEP: tuple[Method, ...] = (*DD_FULL, Method("write", ioengine="dd", fsync=False))
NO_TOOL = ("fio is not installed on this machine, nor dd (GNU coreutils), so no storage limit was measured "
           "(apt-get install fio, or copy a fio binary onto the PATH)")


def methods_for(tool: str, fio_methods: tuple[Method, ...], dd_methods: tuple[Method, ...]) -> tuple[Method, ...]:
    return fio_methods if tool == "fio" else dd_methods


def resident_fraction(paths: list[Path]) -> float:
    """What of the files is still in the page cache (``mincore``), checked after each eviction."""
    return pagecache.measure(paths).resident_fraction


def system_context(folder: Path) -> dict:
    """What decides whether a probe measures the disk or a cache: memory, the kernel's dirty-page thresholds, the
    block device's cache mode and readahead, the filesystem."""
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    meminfo = dict(line.split(":", 1) for line in (read("/proc/meminfo") or "").splitlines() if ":" in line)
    context = {"mem_total_kB": meminfo.get("MemTotal", "").strip() or None,
               "dirty_ratio_pct": read("/proc/sys/vm/dirty_ratio"),
               "dirty_background_ratio_pct": read("/proc/sys/vm/dirty_background_ratio"),
               "dirty_bytes": read("/proc/sys/vm/dirty_bytes")}
    try:
        dev = os.stat(folder).st_dev
        block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
        queue = block / "queue" if (block / "queue").exists() else block.parent / "queue"
        context |= {"block_device": block.name, "write_cache": read(str(queue / "write_cache")),
                    "read_ahead_kb": read(str(queue / "read_ahead_kb")),
                    "rotational": read(str(queue / "rotational"))}
    except OSError:
        context["block_device"] = None
    mounts = [line.split() for line in (read("/proc/mounts") or "").splitlines()]
    best = max((m for m in mounts if str(folder.resolve()).startswith(m[1])), key=lambda m: len(m[1]), default=None)
    context["filesystem"] = f"{best[2]} on {best[0]} at {best[1]}" if best else None
    return context


def fallback_meta(argv: list[str], machine: str | None, why: str) -> dict:
    """Where torch or DeepSpeed cannot be imported (a bare GPU machine): what the standard library can tell."""
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True) if shutil.which("nvidia-smi") else None
    gpu_name = gpu.stdout.strip().splitlines()[0] if gpu and gpu.returncode == 0 and gpu.stdout.strip() else None
    name = machine or (gpu_name.lower().replace("nvidia", "").strip().split()[0] if gpu_name else
                       f"cpu{os.cpu_count()}")
    return {"benchmark": "limits", "date": datetime.date.today().isoformat(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "argv": argv,
            "command": shlex.join(["python", "bench/limits.py", *argv]), "machine": name, "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "load_average_at_start": os.getloadavg()[0], "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "device": "cuda" if gpu_name else "cpu",
            "gpu": gpu_name, "python": platform.python_version(), "torch": "not importable",
            "deepspeed": "not importable", "runtime_error": why, "commit": None}


def meta_for(argv: list[str], machine: str | None) -> dict:
    try:
        return run_meta("limits", argv, machine)
    except (subprocess.CalledProcessError, OSError, ValueError) as error:
        return fallback_meta(argv, machine, f"{type(error).__name__}: {error}")


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def method_rows(figures: list[dict], winners: set[str]) -> list[str]:
    rows = []
    for f in figures:
        passes = [p for p in f["passes"] if "MBps" in p]
        other = [p["other_io_MB"] for p in passes if p.get("other_io_MB") is not None]
        loads = [p["load_average"] for p in f["passes"]]
        note = f.get("skipped") or "; ".join(f.get("errors", [])) or ("" if f["is_limit"] else "not a limit")
        rows.append(f"| {'**' + f['name'] + '**' if f['name'] in winners else f['name']} | {f['n']} | "
                    f"{fmt(f['min_MBps'])} | {fmt(f['median_MBps'])} | {fmt(f['max_MBps'])} | "
                    f"{' '.join(fmt(p['MBps']) for p in passes)} | "
                    f"{fmt(min(other)) + '–' + fmt(max(other)) if other else '—'} | "
                    f"{min(loads):.1f}–{max(loads):.1f} | {note} |" if loads else
                    f"| {f['name']} | 0 | — | — | — | — | — | — | {note} |")
    return rows


HEADER = ["| method | n | min MB/s | median MB/s | max MB/s | each pass MB/s | other disk traffic MB | load |  |",
          "|---|---|---|---|---|---|---|---|---|"]


def dd_note(result: dict) -> list[str]:
    """Where dd measured: why, and that its figures are lower bounds."""
    if result["limits"].get("tool") != "dd":
        return []
    return [f"**Measured with dd, not fio** (fio is not installed here; {result['limits'].get('tool_version')}): one "
            "dd process per job, each moving its file one block at a time (queue depth 1), so these limits are "
            "lower bounds of what the device allows with a queue (fio's libaio methods). The writes are zeros from "
            "/dev/zero; each pass is timed from the processes' start to the last one's exit, fsync included.", ""]


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Storage limits at the checkpoint's concurrency — {meta['machine']}, {meta['date']}", "",
             f"`{meta['command']}`", "", machine_line(meta) if "runtime_error" not in meta else
             f"{meta['machine']}: host {meta['host']}, {meta['cpus']} CPUs ({meta['runtime_error']}).", ""]
    if result.get("error"):
        return "\n".join([*lines, f"**Not measured: {result['error']}**", ""])
    limits = result["limits"]
    context = result["context"]
    tool = limits.get("tool", "fio")
    lines += [f"Target {limits['target']} ({context.get('filesystem')}; block device {context.get('block_device')}, "
              f"write cache '{context.get('write_cache')}', readahead {context.get('read_ahead_kb')} kB; memory "
              f"{context.get('mem_total_kB')}, dirty_background_ratio {context.get('dirty_background_ratio_pct')} %, "
              f"dirty_ratio {context.get('dirty_ratio_pct')} %). {limits['jobs']} {tool} jobs at once, each its own "
              f"file of {limits['size_bytes'] / baseline.MiB:.0f} MiB, {limits['repeats']} repeats, the methods in "
              "another order each repeat. MB = 10^6 bytes; bandwidths are the jobs' aggregate.", "",
              *dd_note(result),
              *[f"- **{side} limit: {fmt(limits[f'{side}_MBps'])} MB/s** (median; min "
                f"{fmt(limits[f'{side}_spread_MBps']['min_MBps'])}, max "
                f"{fmt(limits[f'{side}_spread_MBps']['max_MBps'])}), by `{limits[f'{side}_best']}`"
                for side in ("write", "read")],
              f"- choice: {limits['choice']}",
              f"- probe size rule: {limits['probe_rule']}" + (" — **this probe is below it**"
                                                              if limits["probe_below_rule"] else ""),
              f"- a run's own baseline: {baseline.DD_COST_BOUND if tool == 'dd' else baseline.COST_BOUND}", "",
              f"other disk traffic = bytes the block device moved during the pass beyond {tool}'s own (other processes "
              "on this machine; /proc/diskstats). load = the 1-minute load average at each pass's start. Bold: "
              "the winner of its side.", "", *HEADER,
              *method_rows(limits["methods"], {limits["write_best"], limits["read_best"]}), ""]
    if result.get("sweep"):
        lines += ["## What the probe's size does (the experiment behind the rule)", "",
                  f"{limits['jobs']} jobs at once at each size per job, {result['sweep'][0]['repeats']} repeats.", ""]
        for point in result["sweep"]:
            lines += [f"### {point['size_bytes'] / baseline.MiB:.0f} MiB per job", "", *HEADER,
                      *method_rows(point["methods"], set()), ""]
    if result.get("notes"):
        lines += ["## What varies and why", "", *[f"- {note}" for note in result["notes"]], ""]
    return "\n".join(lines)


def measure_all(args: argparse.Namespace, tool: str) -> dict:
    """The limits with ``tool`` (fio or dd), and the size experiment where asked."""
    limits = baseline.measure(args.dir, args.mib_per_job, jobs=args.jobs, repeats=args.repeats,
                              methods=methods_for(tool, FULL, DD_FULL),
                              check_evicted=resident_fraction)
    print(f"limits ({tool}): write {limits['write_MBps']:.0f} MB/s ({limits['write_best']}), read "
          f"{limits['read_MBps']:.0f} MB/s ({limits['read_best']})", flush=True)
    sweep = []
    for size in args.sizes:
        point = baseline.measure(args.dir, size, jobs=args.jobs, methods=methods_for(tool, SWEEP, DD_SWEEP),
                                 repeats=args.repeats, check_evicted=resident_fraction)
        print(f"{size} MiB per job: write {point['write_MBps']:.0f}, read {point['read_MBps']:.0f} MB/s", flush=True)
        sweep.append(point)
    sides = {side: {"best_MBps": limits[f"{side}_MBps"], "method": limits[f"{side}_best"],
                    **limits[f"{side}_spread_MBps"]} for side in ("write", "read")}
    return {"tool": tool, "tool_version": limits["tool_version"], **sides, "limits": limits, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="the folder to measure (where the checkpoints go)")
    parser.add_argument("--jobs", type=int, default=2, help="fio (or dd) jobs at once: the ranks per node (default 2)")
    parser.add_argument("--mib-per-job", type=int, default=256, help="each job's file: a rank's share (MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=positive_ints, default=[],
                        help="also the size experiment at these MiB per job (comma-separated)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here only (no results file)")
    parser.add_argument("--render", type=Path, default=None, help="write the Markdown of this result JSON again")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.render:
        args.render.with_suffix(".md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    if args.dir is None:
        parser.error("--dir is required")
    meta = {**meta_for(argv, args.machine), "dir": str(args.dir)}
    tool = baseline.available_tool()
    if tool is None:
        print(f"bench/limits.py: {NO_TOOL}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "fio": None, "tool": None, "error": NO_TOOL}, indent=1)
                                 + "\n")
        return NO_FIO
    if tool == "dd":
        print("bench/limits.py: fio is not installed: dd measures (one process per job, queue depth 1: lower "
              "bounds)", file=sys.stderr)
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
        result = {"meta": meta, "fio": shutil.which("fio"), "context": system_context(args.dir),
                  **measure_all(args, tool)}
    except (baseline.BaselineError, OSError) as error:
        print(f"bench/limits.py: not measured: {error}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "fio": shutil.which("fio"), "tool": tool,
                                             "error": str(error)}, indent=1) + "\n")
        return 1
    write_json_or_results(args.json, args.out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

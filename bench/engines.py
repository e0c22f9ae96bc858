#!/usr/bin/env python3
"""Every checkpoint engine against the machine's physical limits, in one run on one machine.

    python bench/engines.py [--preset small] [--layout tp1pp1dp2] [--dtype fp32] [--engines torch,lazy,...]

1. Measures the limits at the checkpoint's concurrency. Storage: every run measures its own before phase 1
   (``baseline.json``: fio with as many jobs as ranks write on the node, each a rank's share of the planned
   checkpoint capped at --baseline-mib, each side the best of several methods: restartbench.baseline); a
   ``baseline.json`` in the logs root (else a plain write + fsync and a read after ``posix_fadvise(DONTNEED)``,
   written there) stands in for a run without one. Host copy, after the runs: as many copies at once as ranks per
   node, each as large as the largest rank's checkpoint (CUDA: pinned device-to-host; CPU: memcpy into preallocated
   buffers).
2. Runs each engine (registered, and whose packages import here) on the same preset and layout through
   config-n-run.py, one after another.
3. Reads the run folders with restartbench.analysis.collect and prints, per engine:
   - stall ÷ copy floor, the floor being the largest bytes one rank saved ÷ the copy bandwidth (each
     rank copies its own state; 1.0 = the stall is the copy out of device memory and nothing more);
   - durable throughput (all bytes ÷ durable time) ÷ write bandwidth;
   - cold restore throughput (bytes read ÷ checkpoint load time) ÷ read bandwidth;
   each bandwidth with the method that won it and its spread (min–max over its passes), and each ratio with the
   analysis's judgement (``write_limit``, ``read_limit``): above the limit's max "defect: above the limit's max", a
   defect to investigate (the summary's findings say what to look at); a baseline without spread (an older one, or
   the plain measurement below) keeps the rule from before issue 26, "limit underestimated" above 1.05.
   For ``lazy`` the wait at the optimizer step for copies still in flight is shown too, from
   ``checkpoint.copy_wait`` events once the harness records them.
4. Writes ``bench/results/YYYY-MM-DD-<machine>-engines.json`` and ``.md`` (made from it; bench/results_io.py).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from results_io import ROOT, add_output_arguments, run_meta, write_results

sys.path.insert(0, str(ROOT))

from restartbench import engines as registry  # noqa: E402
from restartbench.analysis import BASELINE_FILE, collect, limit_note  # noqa: E402
from restartbench.events import Event, read_events  # noqa: E402

MB = 1e6
DEFAULT_ENGINES = ("torch", "lazy", "dcp", "dcp-async", "torchsnapshot", "fastpersist")
# -- limits ------------------------------------------------------------------------------------------------


def copy_bandwidth(nbytes: int, jobs: int = 1, repeats: int = 5) -> dict:
    """The host copy floor at the checkpoint's concurrency: ``jobs`` copies of ``nbytes`` at once (as many as ranks
    copy their state on a node, each its own buffers), best of ``repeats``. CUDA: pinned device-to-host on one GPU
    (each rank has its own GPU and copy engine, so one stream is a rank's figure); CPU: memcpy into preallocated
    buffers, one thread per rank (torch's copy_ releases the GIL), as the ranks' copies share the memory bus.
    ``copy_MBps`` is one copier's share: the floor of one rank's copy at that concurrency."""
    if torch.cuda.is_available():
        pairs = [(torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1),
                  torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))]

        def once():
            torch.cuda.synchronize()
            start = time.perf_counter()
            pairs[0][1].copy_(pairs[0][0], non_blocking=True)
            torch.cuda.synchronize()
            return time.perf_counter() - start
        what, jobs = "pinned device-to-host copy (torch, one stream; one GPU per rank)", 1
    else:
        pairs = [(torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)) for _ in range(jobs)]

        def once():
            with ThreadPoolExecutor(jobs) as pool:
                start = time.perf_counter()
                list(pool.map(lambda pair: pair[1].copy_(pair[0]), pairs))
                return time.perf_counter() - start
        what = f"memcpy into preallocated host buffers (torch copy_), {jobs} at once, one thread each"
    once()
    best = min(once() for _ in range(repeats))
    return {"copy_MBps": nbytes / MB / best, "copy_aggregate_MBps": jobs * nbytes / MB / best, "copy_jobs": jobs,
            "copy_method": what, "copy_probe_bytes": nbytes}


def storage_bandwidth(target: Path, nbytes: int, block: int = 64 << 20) -> dict:
    """Write ``nbytes`` in ``block`` writes ending in fsync, evict the file from the page cache, read it back."""
    path = target / f".bench-engines-probe-{os.getpid()}"
    data = os.urandom(block)
    try:
        start = time.perf_counter()
        with open(path, "wb", buffering=0) as handle:
            for _ in range(0, nbytes, block):
                handle.write(data)
            os.fsync(handle.fileno())
        write_s = time.perf_counter() - start
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            start = time.perf_counter()
            total = 0
            while chunk := os.read(fd, block):
                total += len(chunk)
            read_s = time.perf_counter() - start
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return {"tool": "plain write+fsync / read after posix_fadvise(DONTNEED) (bench/engines.py)",
            "write_MBps": total / MB / write_s, "read_MBps": total / MB / read_s, "target": str(target),
            "block_size": f"{block >> 20}M", "jobs": 1, "direct": False, "probe_bytes": total,
            "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def storage_baseline(logs: Path, target: Path, nbytes: int) -> dict:
    """The baseline.json already in the logs root (fio or other), else a plain measurement written there."""
    existing = logs / BASELINE_FILE
    if existing.is_file():
        return {**json.loads(existing.read_text()), "source": str(existing)}
    measured = storage_bandwidth(target, nbytes)
    existing.write_text(json.dumps(measured, indent=1) + "\n")
    return {**measured, "source": "measured here"}


def copy_limit(table, cap: int) -> dict:
    """The copy floor measured after the runs, when the checkpoint's concurrency is known: as many copies at once as
    ranks per node, each as large as the largest rank's checkpoint bytes of any engine (at most ``cap``)."""
    ckpts = table[table["kind"] == "checkpoint"] if not table.empty else table
    if ckpts.empty:
        return copy_bandwidth(cap)
    per_node = int((ckpts["ranks"] / ckpts["nodes"].fillna(1)).max())
    return copy_bandwidth(min(int(ckpts["bytes_per_rank_max"].max()), cap), jobs=max(per_node, 1))


# -- runs --------------------------------------------------------------------------------------------------


def runnable(name: str, device: str) -> str | None:
    """None when the engine can be run here, else why not."""
    try:
        info = registry.engine_info(name)
    except registry.UnknownEngineError:
        return "not registered"
    missing = registry.missing_requirements(name)
    if missing:
        return "; ".join(missing)
    if importlib.util.find_spec(info.module) is None:
        return f"its module {info.module} is not there"
    return registry.known_issue(name, device)  # fails as shipped there: the study's own runs record that


def run_engine(name: str, args: argparse.Namespace, logs: Path) -> dict:
    argv = [sys.executable, str(ROOT / "config-n-run.py"), args.preset, args.layout, "--dtype", args.dtype,
            "--iters", str(args.iters), "--save-interval", str(args.save_interval), "--engine", name,
            "--logs", str(logs), "--baseline-mib", str(args.probe_mb), *args.extra]
    # the run's own storage baseline: one fio job per rank of the node, each the rank's share of the checkpoint up to
    # --probe-mb (config-n-run.py's default cap of 64 MiB would fit a larger rank's share in the page cache)
    if args.checkpoint_dir:
        # the benchmark's own scratch target, one folder per engine: a rerun writes over its previous checkpoints
        argv += ["--checkpoint-dir", str(Path(args.checkpoint_dir) / name), "--reuse-checkpoint-dir"]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return {"engine": name, "exit": proc.returncode, "wall_s": time.perf_counter() - start, "tail": tail}


# -- figures -----------------------------------------------------------------------------------------------


def copy_waits(run_dir: Path) -> dict[str, float]:
    """Per tag, the max over ranks of the time the optimizer step waited for the copies (harness events)."""
    waits: dict[str, float] = {}
    for e in read_events(run_dir):
        if e["event"] == Event.CHECKPOINT_COPY_WAIT:
            waits[e["tag"]] = max(waits.get(e["tag"], 0.0), e["duration_s"])
    return waits


def engine_figures(table, limits: dict, order: list[str]) -> list[dict]:
    """Per engine, its last checkpoint and its restore against the limits: the copy floor at the checkpoint's
    concurrency (``limits``) and the storage's bandwidth from the run's own baseline.json (fio at the checkpoint's
    concurrency, measured before phase 1), else the logs root's (``limits``)."""
    rows = []
    copy_bps = limits["copy_MBps"] * MB
    for engine, frame in sorted(table.groupby("engine"), key=lambda item: order.index(item[0])
                                if item[0] in order else len(order)):
        ckpts = frame[frame.kind == "checkpoint"].sort_values("step")
        restart = frame[frame.kind == "restart"]
        if ckpts.empty:
            continue
        last, first = ckpts.iloc[-1], ckpts.iloc[0]
        run_dir = Path(last["run"])
        floor = last["bytes_per_rank_max"] / copy_bps
        waits = copy_waits(run_dir)
        write_bw, read_bw = _run_limit(last, "write", limits), _run_limit(last, "read", limits)
        row = {
            "engine": engine, "run": last["run_id"], "bytes": int(last["bytes"]),
            "bytes_per_rank_max": int(last["bytes_per_rank_max"]), "files": int(last["files"]),
            "stall_first_s": float(first["stall_max_s"]), "stall_s": float(last["stall_max_s"]),
            "copy_floor_s": floor, "stall_over_floor": float(last["stall_max_s"]) / floor,
            "durable_s": float(last["durable_rank_max_s"]), "durable_MBps": float(last["write_MBps"]),
            "write_bw_MBps": write_bw, "durable_over_write_bw": float(last["write_MBps"]) / write_bw,
            "write_note": _note(last, "write", float(last["write_MBps"]) / write_bw),
            "write_spread": _spread(last, "write"),
            "iteration_s": float(last["iteration_s"]),
            "copy_wait_first_s": waits.get(first["tag"]), "copy_wait_s": waits.get(last["tag"]),
        }
        if not restart.empty:
            r = restart.sort_values("attempt").iloc[0]
            read = r["read_MBps"]
            row.update({"restore_cache": r["cache"], "ckpt_load_s": r["restart_ckpt_load_s"],
                        "restore_MBps": read, "exact": bool(r["exact"]) if r["exact"] is not None else None,
                        "read_bw_MBps": read_bw, "read_spread": _spread(r, "read"),
                        "restore_over_read_bw": read / read_bw if read and r["cache"] == "cold" else None})
            row["read_note"] = (_note(r, "read", row["restore_over_read_bw"])
                                if row["restore_over_read_bw"] is not None else None)
        rows.append(row)
    return rows


def _run_limit(row, side: str, limits: dict) -> float:
    """The storage bandwidth a run's figures are held to: its own baseline (the analysis's baseline columns), else
    the logs root's."""
    own = row.get(f"baseline_{side}_MBps")
    return float(own) if own is not None and own == own else limits[f"{side}_MBps"]


def _present(value) -> bool:
    return value is not None and value == value


def _note(row, side: str, ratio: float) -> str | None:
    """The analysis's judgement of ``side``'s ratio where the run has a baseline (``{side}_limit``), else the rule for a
    baseline without spread applied to the logs root's."""
    if _present(row.get(f"baseline_{side}_MBps")):
        note = row.get(f"{side}_limit")
        return note if _present(note) else None
    return limit_note(100 * ratio)


def _spread(row, side: str) -> str:
    """The method that won the run's ``side`` limit and its spread, or why there is none."""
    if not _present(row.get(f"baseline_{side}_max_MBps")):
        return "no spread"
    n = int(row[f"baseline_{side}_n"])
    return (f"{row[f'baseline_{side}_min_MBps']:.0f}–{row[f'baseline_{side}_max_MBps']:.0f}, {n} pass"
            + ("es" if n != 1 else "") + f", {row[f'baseline_{side}_best']}")


def _ratio(value: float | None, note: str | None) -> str:
    """A ratio to a limit with the analysis's judgement of it, where it has one."""
    if value is None or value != value:
        return "—"
    return f"{value:.2f}" + (f" ({note})" if note else "")


def _fmt(value, spec: str) -> str:
    return "—" if value is None or value != value else format(value, spec)


def markdown(result: dict) -> str:
    meta, limits, rows, runs, skipped = (result[key] for key in ("meta", "limits", "engines", "runs", "skipped"))
    lines = [f"# Checkpoint engines vs. physical limits — {meta['machine']}, {meta['date']}", "",
             f"`python bench/engines.py {' '.join(meta['argv'])}` — {meta['preset']} {meta['layout']} "
             f"{meta['dtype']}, {meta['iters']} iterations, a checkpoint every {meta['save_interval']}; "
             f"{meta['host']} ({meta['cpus']} CPUs, {meta['device']}), torch {meta['torch']}."
             + (" Runs made earlier under the same logs root, analysed again here." if meta["analysed_only"] else ""),
             "",
             "## Limits", "",
             f"- host copy: **{limits['copy_MBps']:.0f} MB/s per rank** ({limits['copy_aggregate_MBps']:.0f} MB/s "
             f"together) — {limits['copy_method']}, {limits['copy_probe_bytes'] / MB:.1f} MB each (the largest "
             "rank's checkpoint bytes)",
             "- storage: each run's own `baseline.json`: fio before phase 1 with as many jobs as ranks write on the "
             "node, each a rank's share of the planned checkpoint (capped at --baseline-mib), each side the best of "
             "the methods it ran (one, fio O_DIRECT, in runs before 2026-11-26) (columns 'write bw', 'read bw': "
             "the winner's median, then its min–max over its passes "
             "and its name); where a run has none, the logs root's: "
             f"write **{limits['write_MBps']:.0f} MB/s**, cold read **{limits['read_MBps']:.0f} MB/s** — "
             f"{limits['tool']} on {limits['target']} ({limits['source']})", "",
             "## Engines (last checkpoint of the run; restore is the relaunch's load)", "",
             "| engine | bytes | stall s (first) | copy floor s | stall ÷ floor | durable s | durable MB/s | "
             "write bw MB/s | ÷ write bw | restore MB/s (cache) | read bw MB/s | ÷ read bw | exact | "
             "optimizer-step wait s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wait = (f"{r['copy_wait_s']:.3f} ({_fmt(r['copy_wait_first_s'], '.3f')})" if r["copy_wait_s"] is not None
                else "not recorded" if r["engine"] == "lazy" else "—")
        lines.append(
            f"| {r['engine']} | {r['bytes'] / MB:.1f} MB | {r['stall_s']:.3f} ({r['stall_first_s']:.3f}) | "
            f"{r['copy_floor_s']:.4f} | {r['stall_over_floor']:.1f} | {r['durable_s']:.3f} | {r['durable_MBps']:.0f} | "
            f"{r['write_bw_MBps']:.0f} ({r.get('write_spread', 'no spread')}) | "
            f"{_ratio(r['durable_over_write_bw'], r.get('write_note'))} | "
            f"{_fmt(r.get('restore_MBps'), '.0f')} ({r.get('restore_cache')}) | {_fmt(r.get('read_bw_MBps'), '.0f')} "
            f"({r.get('read_spread', 'no spread')}) | {_ratio(r.get('restore_over_read_bw'), r.get('read_note'))} | "
            f"{r.get('exact')} | {wait} |")
    lines += ["", "copy floor = largest bytes one rank saved ÷ host copy bandwidth. durable MB/s = all bytes ÷ "
              "(save start → last rank fsync'd). restore MB/s = bytes read ÷ checkpoint load time (cold: page cache "
              "evicted and checked empty). The limits are measured at the checkpoint's concurrency as the best of "
              "the methods it ran, so a ratio above the limit's max (its fastest pass) is a defect to investigate, "
              "marked so (the summary's findings say what to look at), never an engine beating the hardware; a "
              "limit without spread keeps the rule from before issue 26, 'limit underestimated' above 1.05. "
              "optimizer-step wait (lazy): the time the "
              "first optimizer step after the save waited for the copies still in flight (part of the stall; "
              "from the harness's checkpoint.copy_wait events, 'not recorded' where the harness does not emit them: "
              "it is at most the copy floor).", ""]
    if skipped:
        lines += ["Not run here: " + "; ".join(f"`{k}`: {v}" for k, v in skipped.items()), ""]
    failed = [r for r in runs if r["exit"] != 0]
    if failed:
        lines += ["Failed runs: " + "; ".join(f"`{r['engine']}` (exit {r['exit']}: {' / '.join(r['tail'])})"
                                                for r in failed), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--layout", default="tp1pp1dp2")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--save-interval", type=int, default=2)
    parser.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help="comma-separated engine names")
    parser.add_argument("--logs", type=Path, help="logs root (default: a fresh temporary folder, kept)")
    parser.add_argument("--checkpoint-dir", help="checkpoint target (default: each run folder)")
    parser.add_argument("--probe-mb", type=int, default=512, help="size of the storage probe, MB")
    parser.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    add_output_arguments(parser)
    parser.add_argument("--no-run", action="store_true",
                        help="run nothing: analyse the run folders already under --logs (copy bandwidth re-measured, "
                             "storage from its baseline.json)")
    parser.add_argument("extra", nargs="*", help="more config-n-run.py options, after --")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.no_run and not (args.logs and args.logs.is_dir()):
        raise SystemExit("--no-run analyses an existing logs root: give it with --logs")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="bench-engines-"))
    logs.mkdir(parents=True, exist_ok=True)
    target = Path(args.checkpoint_dir) if args.checkpoint_dir else logs
    target.mkdir(parents=True, exist_ok=True)
    meta = {**run_meta("engines", argv, args.machine), "preset": args.preset, "layout": args.layout,
            "dtype": args.dtype, "iters": args.iters, "save_interval": args.save_interval, "logs": str(logs),
            "analysed_only": args.no_run}

    if shutil.disk_usage(target).free < 3 * args.probe_mb * 10**6:
        raise SystemExit(f"{target}: less than {3 * args.probe_mb} MB free for the storage probe (--probe-mb)")
    storage = storage_baseline(logs, target, args.probe_mb * 10**6)

    skipped, runs = {}, []
    for name in [n.strip() for n in args.engines.split(",") if n.strip()]:
        reason = runnable(name, meta["device"])
        if reason:
            skipped[name] = reason
            print(f"{name}: not run ({reason})", flush=True)
            continue
        if args.no_run:
            continue
        print(f"{name}: running {args.preset} {args.layout} ...", flush=True)
        runs.append(run_engine(name, args, logs))
        print(f"{name}: exit {runs[-1]['exit']} after {runs[-1]['wall_s']:.0f} s", flush=True)

    collected = collect(logs)
    table = collected.table()
    limits = {**copy_limit(table, args.probe_mb * 10**6), **storage}
    print(f"limits: copy {limits['copy_MBps']:.0f} MB/s per rank ({limits['copy_method']}); storage: each run's "
          f"baseline.json, else write {limits['write_MBps']:.0f} MB/s, read {limits['read_MBps']:.0f} MB/s "
          f"({limits['tool']})", flush=True)
    order = [n.strip() for n in args.engines.split(",")]
    rows = engine_figures(table, limits, order)
    write_results(args.out, {"meta": meta, "limits": limits, "engines": rows, "runs": runs, "skipped": skipped},
                  markdown)
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

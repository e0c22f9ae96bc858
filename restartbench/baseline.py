"""Raw bandwidth of the checkpoint target, measured with fio before phase 1 and kept as ``baseline.json``.

The analysis sets every checkpoint's throughput against it (``restartbench.analysis`` reads
``write_MBps``/``read_MBps`` from the run folder or the nearest ancestor). Those two keys are **the limit**: the best
of several methods a careful engineer would try, each at the checkpoint's concurrency (issue 26), so an engine that
reads or writes faster than the limit is a defect to look into, not a figure to flag:

- write: a sequential buffered write whose time includes each file's final fsync (``--end_fsync=1``), and an
  O_DIRECT write with a queue (libaio), also ending in fsync: a checkpoint is only durable once fsync'd;
- read: a sequential O_DIRECT read one block at a time (psync, the study's figure before issue 26), O_DIRECT
  reads with a queue (libaio, iodepth 16-32, 1-8 MiB blocks), and a buffered read of files whose pages were dropped
  first (``posix_fadvise(DONTNEED)`` after fsync, as ``restartbench.pagecache`` evicts a checkpoint before a cold
  restore: the kernel's readahead then keeps several blocks in flight).

``jobs`` fio jobs run at once (as many as ranks write on a node), each on its own file in the target folder; a
method's bandwidth is the jobs' aggregate (fio's group report). Every method's figure is kept (``methods``), with
the disk's other traffic while it ran (``other_io_MB``: bytes the block device moved beyond fio's own, from
``/proc/diskstats``) and the load; ``write_best``/``read_best`` name the winners and ``write_method``/
``read_method`` their family. Where the filesystem refuses O_DIRECT, only the buffered methods run. A method fio
cannot run (an engine it lacks, a timeout) is recorded with its error and the others still count. fio's JSON output
is parsed; its text output never is. MB = 10^6 bytes.

A run measures at its checkpoint's concurrency (``record_for_run``): as many jobs as ranks on a node, each file one
rank's share of the checkpoint raised to ``PROBE_MIN_MIB`` and capped at ``--baseline-mib`` (``SIZING``,
``PROBE_RULE``), with the ``QUICK`` methods only. Its cost is bounded (``COST_BOUND``): ``len(QUICK)`` fio passes
of jobs × size each, each pass stopped after ``PASS_TIMEOUT_S``; at the default --baseline-mib of 64, a 2-rank run
moves 640 MiB, a few seconds here (tests/test_baseline.py prints it). ``bench/limits.py`` runs the ``FULL`` set,
repeated, with min/median/max per method.

The probe's size (``PROBE_RULE``, ``probe_mib``): bench/results/2026-11-26-cpu2-limits.md has the experiment.

Where fio is not installed (a bare GPU image) GNU ``dd`` measures instead (``DD_QUICK``, ``DD_FULL``: methods whose
``ioengine`` is ``"dd"``): one dd process per job, all started together, each moving its file one block at a time
(queue depth 1), the pass timed from their start to the last one's exit, fsync included. dd has no queue, so its
figures are a lower bound of what the device allows with one (fio's libaio methods); the writes are zeros from
/dev/zero (a compressing filesystem would make them look faster).
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from restartbench.progress import say
from restartbench.rundir import RunPlan

#: The file name restartbench.analysis looks for (its BASELINE_FILE).
BASELINE_FILE = "baseline.json"
BLOCK_SIZE = "1M"
MiB = 2**20
WRITE_METHOD = "sequential buffered write, fsync at the end (fio --end_fsync=1), fsync time included"
WRITE_DIRECT = "sequential O_DIRECT write (fio --direct=1), fsync at the end, fsync time included"
WRITE_CACHED = "sequential buffered write without fsync: the page cache's speed, an experiment's figure, not a limit"
READ_DIRECT = "sequential O_DIRECT read (fio --direct=1)"
READ_BUFFERED = ("sequential buffered read after posix_fadvise(DONTNEED) eviction (pages a filesystem cannot "
                 "evict, such as tmpfs's, may be read from memory)")
DD_ONE_BY_ONE = "dd, a single process per job, queue depth 1: a lower bound of what the device allows with a queue"
DD_WRITE_METHOD = (f"sequential buffered write of zeros, fsync at the end (conv=fsync), fsync time included; "
                   f"{DD_ONE_BY_ONE}")
DD_WRITE_DIRECT = (f"sequential O_DIRECT write of zeros (oflag=direct conv=fsync), fsync time included; "
                   f"{DD_ONE_BY_ONE}")
DD_READ_DIRECT = f"sequential O_DIRECT read (iflag=direct); {DD_ONE_BY_ONE}"
DD_READ_BUFFERED = (f"sequential buffered read after posix_fadvise(DONTNEED) eviction (the kernel's readahead may "
                    f"keep more than one block in flight); {DD_ONE_BY_ONE}")
#: Seconds one fio pass (one method, all jobs) may take before it is stopped and recorded as failed.
PASS_TIMEOUT_S = 60


class BaselineError(RuntimeError):
    """fio ran but gave no usable measurement; the message says what fio reported."""


SIZING = ("one fio job per rank of a node (every engine the study runs writes from every rank: each holds its own "
          "ZeRO-1 optimizer partition), each file a rank's even share of the checkpoint (the plan's estimate / "
          "world size, rounded up to whole MiB), raised to PROBE_MIN_MIB (the probe rule), capped at --baseline-mib")


@dataclass(frozen=True)
class Method:
    """One way of moving a file with fio, or with dd where ``ioengine`` is ``"dd"``: a write ending in fsync, or a
    sequential read."""

    rw: str  # "write" or "read"
    direct: bool = False
    ioengine: str = "psync"
    iodepth: int = 1
    block_size: str = BLOCK_SIZE
    evict_first: bool = False  # a buffered read of files whose pages were dropped first
    fsync: bool = True  # a write without it ends in the page cache: an experiment's figure, never a limit

    @property
    def name(self) -> str:
        how = "direct" if self.direct else ("buffered-evicted" if self.evict_first else "buffered")
        queue = f"-qd{self.iodepth}" if self.iodepth > 1 else ""
        return f"{self.rw}-{how}-{self.ioengine}{queue}-{self.block_size}" + ("" if self.fsync else "-nofsync")

    @property
    def is_limit(self) -> bool:
        """Whether its figure may be a limit: every read, and every write that ends in fsync."""
        return self.rw == "read" or self.fsync

    @property
    def tool(self) -> str:
        return "dd" if self.ioengine == "dd" else "fio"

    @property
    def family(self) -> str:
        if self.rw == "write" and not self.fsync:
            return WRITE_CACHED
        if self.tool == "dd":
            return {("write", False): DD_WRITE_METHOD, ("write", True): DD_WRITE_DIRECT,
                    ("read", False): DD_READ_BUFFERED, ("read", True): DD_READ_DIRECT}[self.rw, self.direct]
        if self.rw == "write":
            return WRITE_DIRECT if self.direct else WRITE_METHOD
        return READ_DIRECT if self.direct else READ_BUFFERED

    @property
    def block_bytes(self) -> int:
        return int(self.block_size.rstrip("M")) * MiB

    def fio_args(self) -> list[str]:
        args = [f"--ioengine={self.ioengine}", f"--direct={int(self.direct)}"]
        if self.iodepth > 1:
            args.append(f"--iodepth={self.iodepth}")
        if self.rw == "write" and self.fsync:
            args.append("--end_fsync=1")
        return args

    def dd_args(self, path: Path, size: int) -> list[str]:
        """dd's command for this method on one file of ``size`` bytes (a whole number of blocks)."""
        count = f"count={size // self.block_bytes}"
        if self.rw == "write":
            return ["dd", "if=/dev/zero", f"of={path}", f"bs={self.block_size}", count,
                    *(["oflag=direct"] if self.direct else []), *(["conv=fsync"] if self.fsync else [])]
        return ["dd", f"if={path}", "of=/dev/null", f"bs={self.block_size}", count,
                *(["iflag=direct"] if self.direct else [])]


#: A run's own baseline: the old figures (buffered write + fsync, O_DIRECT psync read) and the methods that won on
#: the study's machines (bench/results/*-limits.md), all in 1 MiB blocks so a file of one MiB is enough.
QUICK: tuple[Method, ...] = (
    Method("write"),
    Method("write", direct=True, ioengine="libaio", iodepth=16),
    Method("read", direct=True),
    Method("read", direct=True, ioengine="libaio", iodepth=16),
    Method("read", evict_first=True),
)
#: bench/limits.py: O_DIRECT with a queue at iodepth 16 and 32, 1 to 8 MiB blocks, both sides.
FULL: tuple[Method, ...] = (
    Method("write"),
    Method("write", block_size="8M"),
    Method("write", direct=True, ioengine="libaio", iodepth=16),
    Method("write", direct=True, ioengine="libaio", iodepth=16, block_size="4M"),
    Method("write", direct=True, ioengine="libaio", iodepth=32, block_size="8M"),
    Method("read", direct=True),
    Method("read", direct=True, ioengine="libaio", iodepth=16),
    Method("read", direct=True, ioengine="libaio", iodepth=16, block_size="4M"),
    Method("read", direct=True, ioengine="libaio", iodepth=32),
    Method("read", direct=True, ioengine="libaio", iodepth=32, block_size="8M"),
    Method("read", evict_first=True),
    Method("read", evict_first=True, block_size="8M"),
)
#: Without fio, bench/limits.py: dd's two writes and two reads, each in 1 and 8 MiB blocks (neither won everywhere
#: on this VM: a buffered dd write in 8 MiB blocks ran at half its 1 MiB speed, a buffered read the other way round).
DD_FULL: tuple[Method, ...] = tuple(
    Method(rw, direct=direct, evict_first=rw == "read" and not direct, ioengine="dd", block_size=block)
    for rw, direct in (("write", False), ("write", True), ("read", True), ("read", False)) for block in ("1M", "8M"))
#: Without fio, a run's own baseline: the 1 MiB blocks only, so a file of one MiB is enough.
DD_QUICK: tuple[Method, ...] = tuple(m for m in DD_FULL if m.block_size == BLOCK_SIZE)


def with_block(methods: Sequence[Method], block_size: str) -> tuple[Method, ...]:
    """``methods`` with ``block_size`` blocks."""
    return tuple(replace(m, block_size=block_size) for m in methods)


def cost_text(methods: Sequence[Method]) -> str:
    """What a run's own baseline with ``methods`` costs at most."""
    return (f"{len(methods)} {methods[0].tool} passes ({', '.join(m.name for m in methods)}), each of jobs x size "
            f"bytes and each stopped after {PASS_TIMEOUT_S} s: at most jobs x --baseline-mib x {len(methods)} bytes "
            f"moved and {len(methods) * PASS_TIMEOUT_S} s")


COST_BOUND = cost_text(QUICK)
DD_COST_BOUND = cost_text(DD_QUICK)
#: How big each job's file must be to measure the disk and not what sits before it (see ``probe_mib``). The experiment
#: (bench/results/2026-11-26-cpu2-limits.md, 2 jobs, 5 repeats at 8, 64, 256 and 1024 MiB per job): at 8 MiB the
#: buffered write ending in fsync read 305 MB/s (median), twice its 141-175 MB/s at 64 MiB and above, as a burst that
#: small is taken by the layers below the guest's page cache (the virtual disk, the host); from 64 MiB on, the size
#: no longer moved the medians beyond the spread that the machine's load gives at one size.
PROBE_MIN_MIB = 64
PROBE_RULE = (f"each job's file is the rank's share of the checkpoint, at least {PROBE_MIN_MIB} MiB (at 8 MiB a write "
              "ending in fsync read twice what it read from 64 MiB up: a burst that small is absorbed below the "
              "page cache), capped at --baseline-mib; a figure measured on less is marked 'probe_below_rule'")


def probe_mib(share_mib: int, cap_mib: int) -> int:
    """The probe's size per job (``PROBE_RULE``): the rank's share, raised to ``PROBE_MIN_MIB``, capped at
    ``cap_mib``."""
    return max(1, min(cap_mib, max(share_mib, PROBE_MIN_MIB)))


def concurrency(plan: RunPlan, cap_mib: int) -> tuple[int, int]:
    """(fio jobs, MiB per job) at the checkpoint's concurrency: the ranks of one node write at once, each about
    ``checkpoint_bytes_estimate / world_size`` bytes, at most ``cap_mib`` MiB (see ``SIZING``)."""
    share_mib = -(-plan.checkpoint_bytes_estimate // (plan.world_size * MiB))  # rounded up: a file at least as big
    return plan.nproc_per_node, max(1, min(cap_mib, share_mib))


def record_for_run(run_dir: Path, plan: RunPlan, cap_mib: int) -> Path | None:
    """The run's baseline at its checkpoint's concurrency (``concurrency``), each file sized by ``PROBE_RULE``, into
    ``run_dir/baseline.json``."""
    jobs, share_mib = concurrency(plan, cap_mib)
    return record_baseline(run_dir, Path(plan.checkpoint_dir), probe_mib(share_mib, cap_mib), jobs=jobs,
                           sizing=SIZING)


def record_baseline(run_dir: Path, target: Path, size_mib: int, jobs: int = 1,
                    sizing: str | None = None) -> Path | None:
    """Measure ``target`` and write ``run_dir/baseline.json`` (with ``sizing``, how the jobs and sizes were chosen,
    where given); on any problem print a note and return None.

    A missing or failing baseline never fails the run: it is context for the analysis, not a result. Without fio,
    dd measures (``DD_QUICK``: queue depth 1, a lower bound).
    """
    tool = available_tool()
    if tool is None:
        say("note: fio is not installed, nor dd, so no storage baseline is measured (install fio: apt-get install "
            "fio)")
        return None
    methods = QUICK if tool == "fio" else DD_QUICK
    if tool == "dd":
        say("note: fio is not installed, so dd measures the storage baseline (one process per job, queue depth 1: "
            "a lower bound of the storage's limits)")
    say(f"storage baseline: {jobs} {tool} job(s) at once each write and read {size_mib} MiB in {target} "
        f"({len(methods)} methods)")
    try:
        baseline = measure(Path(target), size_mib, jobs=jobs, methods=methods)
    except (BaselineError, OSError) as error:
        say(f"note: storage baseline not measured: {error}")
        return None
    if sizing:
        baseline["sizing"] = sizing
    path = Path(run_dir) / BASELINE_FILE
    path.write_text(json.dumps(baseline, indent=2) + "\n")
    say(f"storage baseline: write {baseline['write_MBps']:.0f} MB/s ({baseline['write_best']}), "
        f"read {baseline['read_MBps']:.0f} MB/s ({baseline['read_best']})")
    return path


def available_tool() -> str | None:
    """The tool that measures: fio where installed, else dd, else None."""
    return next((tool for tool in ("fio", "dd") if shutil.which(tool)), None)


def measure(target: Path, size_mib: int, block_size: str = BLOCK_SIZE, jobs: int = 1,
            methods: Sequence[Method] | None = None, repeats: int = 1,
            check_evicted: Callable[[list[Path]], float] | None = None) -> dict[str, Any]:
    """Every method of ``methods`` (default ``QUICK``; ``block_size`` replaces its block size) on ``jobs`` files of
    ``size_mib`` MiB in ``target``, ``repeats`` times; the limits and every method's figures (``summarize``). The
    test files are always removed. ``check_evicted`` (the files → the fraction still resident) is called after each
    eviction and its answer kept, where given."""
    if methods is None:
        methods = QUICK if block_size == BLOCK_SIZE else with_block(QUICK, block_size)
    _check_request(target, size_mib, jobs, repeats, methods)
    test_files = [target / f".restartbench-baseline-{os.getpid()}-{job}.fio" for job in range(jobs)]
    size = size_mib * MiB
    passes: dict[str, list[dict[str, Any]]] = {m.name: [] for m in methods}
    skipped: dict[str, str] = {m.name: f"its {m.block_size} block does not divide the {size_mib} MiB file"
                               for m in methods if size % m.block_bytes}
    try:
        if not direct_io_works(scratch(test_files[0].with_suffix(".odirect"))):
            skipped |= {m.name: "the filesystem refused O_DIRECT" for m in methods if m.direct}
        for repeat in range(repeats):
            _write_passes(test_files, methods, size, repeat, passes, skipped)
            _read_passes(test_files, methods, size, repeat, passes, skipped, check_evicted)
    finally:
        for test_file in [*test_files, test_files[0].with_suffix(".odirect")]:
            test_file.unlink(missing_ok=True)
    return _limits(target, methods, passes, skipped, size_mib, jobs, repeats)


def _check_request(target: Path, size_mib: int, jobs: int, repeats: int, methods: Sequence[Method]) -> None:
    """Refuse a baseline that cannot measure (saying what to change), and make ``target``."""
    if size_mib <= 0:
        raise BaselineError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    if jobs < 1:
        raise BaselineError(f"the baseline needs at least one fio job, got {jobs}")
    if repeats < 1:
        raise BaselineError(f"the baseline needs at least one repeat, got {repeats}")
    if len({m.tool for m in methods}) != 1:
        raise BaselineError("the baseline's methods must all use one tool (fio or dd)")
    target.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target).free
    if size_mib * MiB * jobs > free:
        raise BaselineError(f"{target} has {free / MiB:.0f} MiB free, less than the {jobs * size_mib} MiB the "
                            f"baseline writes ({jobs} job(s) of {size_mib} MiB); lower --baseline-mib (0 skips the "
                            "baseline)")
    if not any(m.rw == "write" for m in methods) or not any(m.rw == "read" for m in methods):
        raise BaselineError("the baseline needs at least one write and one read method")


def _write_passes(test_files: list[Path], methods: Sequence[Method], size: int, repeat: int,
                  passes: dict[str, list[dict[str, Any]]], skipped: dict[str, str]) -> None:
    """One pass of every write method not skipped, in this repeat's order; each makes the files anew, as a
    checkpoint does. Raises where none measured anything (the reads would have nothing to read)."""
    writes = [m for m in methods if m.rw == "write"]
    for method in rotated(writes, repeat):
        if method.name in skipped:
            continue
        for test_file in test_files:
            test_file.unlink(missing_ok=True)
        passes[method.name].append(one_pass(test_files, method, size))
    if not any("MBps" in p for m in writes for p in passes[m.name]):
        raise BaselineError(f"no write method measured {len(test_files)} file(s) of {size // MiB} MiB: "
                            + "; ".join(f"{m.name}: {skipped.get(m.name) or passes[m.name][-1].get('error')}"
                                        for m in writes))


def _read_passes(test_files: list[Path], methods: Sequence[Method], size: int, repeat: int,
                 passes: dict[str, list[dict[str, Any]]], skipped: dict[str, str],
                 check_evicted: Callable[[list[Path]], float] | None) -> None:
    """One pass of every read method not skipped, in this repeat's order, on whole files (the last write may be one
    fio could not run), evicted first where the method reads a cold cache."""
    for test_file in test_files:
        if not test_file.exists() or test_file.stat().st_size != size:
            scratch(test_file, size)
    for method in rotated([m for m in methods if m.rw == "read"], repeat):
        if method.name in skipped:
            continue
        resident = None
        if method.evict_first:
            for test_file in test_files:
                evict(test_file)
            resident = check_evicted(test_files) if check_evicted else None
        passes[method.name].append(one_pass(test_files, method, size) | (
            {"resident_fraction_before": resident} if resident is not None else {}))


def _limits(target: Path, methods: Sequence[Method], passes: dict[str, list[dict[str, Any]]],
            skipped: dict[str, str], size_mib: int, jobs: int, repeats: int) -> dict[str, Any]:
    """The baseline's record: each side's limit (the best method's median) and every method's figures."""
    figures = summarize(methods, passes, skipped)
    write, read = best(figures, "write"), best(figures, "read")
    common = {m["block_size"] for m in figures if m.get("median_MBps") is not None}
    tool, version = methods[0].tool, tool_version(passes)
    return {
        "tool": tool, "tool_version": version, "write_MBps": write["median_MBps"], "read_MBps": read["median_MBps"],
        "write_best": write["name"], "read_best": read["name"],
        "write_spread_MBps": spread_of(write), "read_spread_MBps": spread_of(read),
        "target": str(target.resolve()), "size_bytes": size_mib * MiB, "jobs": jobs, "repeats": repeats,
        "block_size": common.pop() if len(common) == 1 else "per method (see methods)",
        "write_method": write["family"], "read_method": read["family"],
        **({"fio_version": version} if tool == "fio" else {}),
        "choice": "each side's limit is the method with the highest median over the repeats (write_best, "
                  "read_best); every method's figures are in methods",
        "cost_bound": {QUICK: COST_BOUND, DD_QUICK: DD_COST_BOUND}.get(tuple(methods)),
        "probe_rule": PROBE_RULE, "probe_below_rule": size_mib < PROBE_MIN_MIB,
        "methods": figures,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def scratch(path: Path, size: int = MiB) -> Path:
    """``path`` written with ``size`` bytes (untimed, fsync'd): the O_DIRECT probe, or files for the reads."""
    block = os.urandom(MiB)
    with open(path, "wb") as handle:
        for offset in range(0, size, MiB):
            handle.write(block[:min(MiB, size - offset)])
        handle.flush()
        os.fsync(handle.fileno())
    return path


def rotated(methods: list[Method], repeat: int) -> list[Method]:
    """The methods in another order each repeat, so that no method always runs first (after the write, or in a
    quiet moment)."""
    shift = repeat % len(methods)
    return methods[shift:] + methods[:shift]


def one_pass(paths: list[Path], method: Method, size: int) -> dict[str, Any]:
    """One pass of ``method`` over ``paths`` (fio, or dd): its figure, or the error that stopped it; with the load
    and the device's other traffic while it ran."""
    device = device_counters(paths[0].parent)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        report = run_dd(paths, method, size) if method.tool == "dd" else run_fio(
            paths, method.rw, size, method.block_size, *method.fio_args(), ioengine=None)
    except BaselineError as error:
        return {"error": str(error), "load_average": load}
    wall_s = time.perf_counter() - start
    if report["io_bytes"] != size * len(paths):  # the group report must cover every job, all of its bytes
        raise BaselineError(f"{method.tool}'s {method.rw} report covers {report['io_bytes']} bytes, not the "
                            f"{len(paths)} × {size} bytes its jobs moved")
    after = device_counters(paths[0].parent)
    other = None
    if device is not None and after is not None:
        moved = sum(after) - sum(device)
        other = max(0, moved - report["io_bytes"]) / 1e6
    return {"MBps": report["MBps"], "io_bytes": report["io_bytes"], "wall_s": round(wall_s, 3),
            "version": report["version"], "load_average": load, "other_io_MB": other}


def summarize(methods: Sequence[Method], passes: dict[str, list[dict[str, Any]]],
              skipped: dict[str, str]) -> list[dict[str, Any]]:
    """Per method: its description, every pass and the min/median/max of the passes that measured."""
    figures = []
    for method in methods:
        done = [p["MBps"] for p in passes.get(method.name, []) if "MBps" in p]
        errors = [p["error"] for p in passes.get(method.name, []) if "error" in p]
        figures.append({
            "name": method.name, "rw": method.rw, "family": method.family, "direct": method.direct, "tool": method.tool,
            "ioengine": method.ioengine, "iodepth": method.iodepth, "block_size": method.block_size,
            "evict_first": method.evict_first, "fsync": method.fsync, "is_limit": method.is_limit, **spread(done),
            "passes": passes.get(method.name, []),
            **({"skipped": skipped[method.name]} if method.name in skipped else {}),
            **({"errors": sorted(set(errors))} if errors else {}),
        })
    return figures


def spread(values: Sequence[float]) -> dict[str, Any]:
    """min, median and max of ``values`` (None where there are none) and how many there are."""
    if not values:
        return {"n": 0, "min_MBps": None, "median_MBps": None, "max_MBps": None}
    return {"n": len(values), "min_MBps": min(values), "median_MBps": statistics.median(values),
            "max_MBps": max(values)}


def spread_of(figure: dict[str, Any]) -> dict[str, Any]:
    return {key: figure[key] for key in ("n", "min_MBps", "median_MBps", "max_MBps")}


def best(figures: list[dict[str, Any]], rw: str) -> dict[str, Any]:
    """The ``rw`` method with the highest median (the first listed on a tie); BaselineError naming every method's
    error where none measured."""
    measured = [f for f in figures if f["rw"] == rw and f["is_limit"] and f["median_MBps"] is not None]
    if not measured:
        why = "; ".join(f"{f['name']}: {f.get('skipped') or '; '.join(f.get('errors', [])) or 'not run'}"
                        for f in figures if f["rw"] == rw)
        raise BaselineError(f"no {rw} method measured: {why}")
    return max(measured, key=lambda f: f["median_MBps"])  # max keeps the first of equals


def tool_version(passes: dict[str, list[dict[str, Any]]]) -> str | None:
    return next((p["version"] for runs in passes.values() for p in runs if p.get("version")), None)


def run_fio(paths: Path | list[Path], rw: str, size: int, block_size: str, *extra: str,
            ioengine: str | None = "psync", timeout_s: float = PASS_TIMEOUT_S) -> dict[str, Any]:
    """One sequential fio job per file of ``paths``, all at once; returns their aggregate bandwidth (MB/s) and
    fio's version. ``ioengine`` None leaves it to ``extra``."""
    paths = [paths] if isinstance(paths, Path) else paths
    command = ["fio", "--output-format=json", "--group_reporting"]
    engine = [f"--ioengine={ioengine}"] if ioengine else []
    for index, path in enumerate(paths):  # one job section per file: each job writes or reads its own file
        command += [f"--name=restartbench-{rw}-{index}", f"--filename={fio_filename(path)}", f"--rw={rw}",
                    f"--bs={block_size}", f"--size={size}", *engine, *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BaselineError(f"fio {rw} on {paths[0].parent} stopped after {timeout_s:.0f} s") from None
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise BaselineError(f"fio {rw} on {paths[0].parent} exited with {done.returncode}: "
                            f"{reason[-1] if reason else 'no message'}")
    return parse_fio(done.stdout, rw)


def run_dd(paths: list[Path], method: Method, size: int, timeout_s: float = PASS_TIMEOUT_S) -> dict[str, Any]:
    """One dd process per file of ``paths``, all started at once; their aggregate bandwidth (MB/s: every byte over
    the time from the start to the last one's exit, fsync included) and dd's version."""
    env = {**os.environ, "LC_ALL": "C"}  # dd's summary in English, for dd_bytes
    start = time.perf_counter()
    running = [subprocess.Popen(method.dd_args(path, size), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env) for path in paths]
    try:
        outputs = [process.communicate(timeout=max(0.0, start + timeout_s - time.perf_counter()))[1]
                   for process in running]
    except subprocess.TimeoutExpired:
        stop(running)
        raise BaselineError(f"dd {method.rw} on {paths[0].parent} stopped after {timeout_s:.0f} s") from None
    wall_s = time.perf_counter() - start
    for process, output in zip(running, outputs):
        if process.returncode != 0:
            reason = output.strip().splitlines()
            raise BaselineError(f"dd {method.rw} on {paths[0].parent} exited with {process.returncode}: "
                                f"{reason[-1] if reason else 'no message'}")
    moved = sum(dd_bytes(output) for output in outputs)
    return {"MBps": moved / wall_s / 1e6, "io_bytes": moved, "version": dd_version()}


def stop(processes: list[subprocess.Popen]) -> None:
    """Kill and reap the processes still running (a pass past its timeout)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def dd_bytes(summary: str) -> int:
    """The bytes dd copied, from its last line ("8388608 bytes (8.4 MB, 8.0 MiB) copied, ...")."""
    last = next((line for line in reversed(summary.splitlines()) if " bytes" in line), "")
    try:
        return int(last.split()[0])
    except (IndexError, ValueError):
        raise BaselineError(f"dd printed no byte count: {summary.strip()[-200:]!r}") from None


@functools.cache
def dd_version() -> str | None:
    """The first line of ``dd --version`` (None where it prints none)."""
    done = subprocess.run(["dd", "--version"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    return (done.stdout.strip().splitlines() or [None])[0]


def parse_fio(output: str, rw: str) -> dict[str, Any]:
    """Bandwidth of the ``rw`` ("read"/"write") side of fio's ``--output-format=json`` report, in MB/s.

    fio may print notes before the JSON document; the document starts at the first line that is "{".
    """
    lines = output.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.strip() == "{"), None)
    if start is None:
        raise BaselineError(f"fio printed no JSON report (was --output-format=json honoured?): {output[:200]!r}")
    try:
        report, _end = json.JSONDecoder().raw_decode("".join(lines[start:]))
        job = report["jobs"][0]
        side = job[rw]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise BaselineError(f"fio's JSON report lacks jobs[0].{rw} ({error!r})") from None
    if job.get("error"):
        raise BaselineError(f"fio {rw} job failed with error code {job['error']}")
    if not side.get("io_bytes") or not side.get("bw_bytes"):
        raise BaselineError(f"fio {rw} job moved no data (io_bytes={side.get('io_bytes')})")
    return {"MBps": side["bw_bytes"] / 1e6, "io_bytes": side["io_bytes"], "version": report.get("fio version")}


def fio_filename(path: Path) -> str:
    """fio splits --filename at ':' (a list of files); a literal colon is written '\\:'."""
    return str(path).replace(":", "\\:")


def device_counters(folder: Path) -> tuple[int, int] | None:
    """(bytes read, bytes written) so far by the block device holding ``folder``, from /proc/diskstats (sectors
    of 512 bytes); None where it cannot be told (no such file, a filesystem with no block device, e.g. tmpfs)."""
    try:
        dev = os.stat(folder).st_dev
        wanted = f"{os.major(dev)} {os.minor(dev)} "
        with open("/proc/diskstats") as stats:
            for line in stats:
                fields = line.split()
                if f"{fields[0]} {fields[1]} " == wanted:
                    return int(fields[5]) * 512, int(fields[9]) * 512
    except (OSError, ValueError, IndexError):
        return None
    return None


def direct_io_works(path: Path) -> bool:
    """Whether one aligned O_DIRECT read of ``path`` succeeds (opening alone proves little on some filesystems)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, MiB) as buffer:  # page-aligned, as O_DIRECT needs
            os.preadv(fd, [buffer], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache so a buffered read goes to the storage (where it can): fsync, then
    ``posix_fadvise(DONTNEED)``, which drops clean pages only (``restartbench.pagecache.evict`` calls it before a
    cold restore)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

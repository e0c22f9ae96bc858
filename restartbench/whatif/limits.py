"""This machine's limits for a cluster file: storage write and read at the checkpoint's concurrency, host copy.

Each limit is the best of the methods tried, repeated, with min, median and max kept:

- write: fio, one job per rank of the node at once, sequential 1 MiB buffered writes ending in fsync
  (``restartbench.baseline.measure``); the file per job is sized well above what the page cache absorbs
  quickly, so the fsync measures the disk;
- read: fio's O_DIRECT sequential read of the same files, and a buffered read of the files after
  ``posix_fadvise(DONTNEED)`` (readahead, as ``torch.load`` reads), one thread per job; the faster method wins and
  is named;
- host copy: memcpy into preallocated buffers, one per rank at once (on a CPU machine the state is already in host
  memory: this is the copy a staging engine makes);
- shared storage (``shared_storage_limits``, calibration under Slurm): the threaded write and read above run on each
  of several Slurm nodes at once (``srun``, one task per node, phases started together by a TCP barrier that the
  calling process serves), and on the first node alone: the file system's aggregate over the nodes and one client's
  figure. Each task reports its node's boot id, so nodes that are one host (``scripts/slurm-local.sh``) are told
  apart from a real shared file system (``one_host``).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from restartbench.baseline import BaselineError, evict, measure

MB = 1e6
MiB = 2**20


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def spread_text(figures: dict[str, float]) -> str:
    """A ``_spread`` of MB/s figures as a cluster file's source says it: 'median of MIN-MAX MB/s'."""
    return f"median of {figures['min']:.0f}-{figures['max']:.0f} MB/s"


def read_files(paths: list[Path], block: int = 8 * MiB) -> int:
    """Read every file at once (one thread each); the bytes read."""
    def read(path: Path) -> int:
        total = 0
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(block):
                total += len(chunk)
        return total
    with ThreadPoolExecutor(len(paths)) as pool:
        return sum(pool.map(read, paths))


def buffered_read_MBps(paths: list[Path], block: int = 8 * MiB) -> float:
    """Read every file at once (one thread each) after evicting it from the page cache; aggregate MB/s."""
    for path in paths:
        evict(path)
    start = time.perf_counter()
    total = read_files(paths, block)
    return total / MB / (time.perf_counter() - start)


def write_files(paths: list[Path], size: int, block: int = 8 * MiB) -> float:
    """Write ``size`` bytes of random data to each path at once (one thread each), fsync'd; aggregate MB/s."""
    data = os.urandom(block)

    def write(path: Path) -> None:
        with open(path, "wb", buffering=0) as handle:
            for _ in range(0, size, block):
                handle.write(data)
            os.fsync(handle.fileno())
    start = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(write, paths))
    return len(paths) * size / MB / (time.perf_counter() - start)


def storage_limits(target: Path, jobs: int, size_mib: int, repeats: int) -> dict[str, Any]:
    """Write and read limits of ``target`` at ``jobs`` at once, each method ``repeats`` times."""
    target.mkdir(parents=True, exist_ok=True)
    fio_write, fio_read, plain_write, plain_read = [], [], [], []
    paths = [target / f".whatif-probe-{os.getpid()}-{job}" for job in range(jobs)]
    for _ in range(repeats):
        try:
            fio = measure(target, size_mib, jobs=jobs)
            fio_write.append(fio["write_MBps"])
            fio_read.append(fio["read_MBps"])
        except (BaselineError, OSError, FileNotFoundError):
            pass
        try:
            plain_write.append(write_files(paths, size_mib * MiB))
            plain_read.append(buffered_read_MBps(paths))
        finally:
            for path in paths:
                path.unlink(missing_ok=True)
    methods = {"write": {"fio buffered write + fsync (1 MiB)": fio_write,
                         "threads, 8 MiB writes + fsync": plain_write},
               "read": {"fio O_DIRECT read (1 MiB, psync)": fio_read,
                        "threads, buffered 8 MiB reads after DONTNEED": plain_read}}
    result: dict[str, Any] = {"target": str(target), "jobs": jobs, "size_mib_per_job": size_mib, "repeats": repeats}
    for side, tried in methods.items():
        spreads = {name: _spread(values) for name, values in tried.items() if values}
        best = max(spreads, key=lambda name: spreads[name]["median"])
        result[side] = {"best": best, "MBps": spreads[best], "methods": spreads}
    return result


def host_copy_MBps(nbytes: int, jobs: int, repeats: int = 5) -> dict[str, Any]:
    """memcpy of ``nbytes`` per job into preallocated buffers, ``jobs`` at once: one copier's MB/s."""
    import numpy as np

    pairs = [(np.ones(nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)) for _ in range(jobs)]
    rates = []
    for _ in range(repeats):
        with ThreadPoolExecutor(jobs) as pool:
            start = time.perf_counter()
            list(pool.map(lambda pair: np.copyto(pair[1], pair[0]), pairs))
            rates.append(nbytes / MB / (time.perf_counter() - start))
    return {"bytes": nbytes, "jobs": jobs, "MBps": _spread(rates), "method": "numpy copyto, one thread per job"}


class ProbeError(ValueError):
    """A probe that could not measure what it measures; the message says why."""


def d2h_probe(nbytes: int = 2**30, repeats: int = 3) -> dict[str, Any]:
    """One GPU's device-to-host copy into pinned and into pageable memory (best of ``repeats`` after a warm-up, the
    device synchronized around each) and the rate of pinning fresh host memory (cudaHostRegister), GB/s. The method
    of bench/gpu_probe.py (FACTS.md's H100 probe)."""
    import torch

    def best(copy: Callable[[], object]) -> float:
        copy()
        seconds = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        return nbytes / 1e9 / min(seconds)

    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    figures = {"d2h_pinned_GBps": best(lambda: pinned.copy_(device, non_blocking=True)),
               "d2h_pageable_GBps": best(lambda: pageable.copy_(device))}
    cudart, pin_s = torch.cuda.cudart(), []
    for _ in range(min(repeats, 3)):
        buffer = torch.ones(nbytes, dtype=torch.uint8)  # touched: the pages exist before they are pinned
        start = time.perf_counter()
        status = cudart.cudaHostRegister(buffer.data_ptr(), nbytes, 0)
        pin_s.append(time.perf_counter() - start)
        if int(status) != 0:
            raise ProbeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {int(status)}")
        cudart.cudaHostUnregister(buffer.data_ptr())
        del buffer
    return {**figures, "pin_GBps": nbytes / 1e9 / min(pin_s), "bytes": nbytes, "repeats": repeats,
            "gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
            "method": "one torch copy_ on the current stream, synchronized before and after, best of the repeats "
                      "after a warm-up; pinning: cudaHostRegister of a touched buffer, best of up to 3"}


# -- shared storage: the same probe on several Slurm nodes at once ------------------------------------------------

#: The line prefix of a node task's report on srun's standard output.
REPORT = "WHATIF-SHARED-PROBE "
#: The task srun starts on each node (``node_task_main``).
TASK_PROGRAM = ("import sys; from restartbench.whatif.limits import node_task_main; "
                "sys.exit(node_task_main(sys.argv[1:]))")


def boot_id() -> str:
    """This host's boot id ('' where the kernel does not say): the same on every Slurm node of one machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def tcp_barrier(address: tuple[str, int], who: str, timeout: float) -> Callable[[str], None]:
    """A barrier served by ``BarrierServer`` at ``address``: ``wait(phase)`` returns once every party has called it
    with that phase."""
    def wait(phase: str) -> None:
        with socket.create_connection(address, timeout=timeout) as conn:
            conn.sendall(f"{who} {phase}\n".encode())
            conn.settimeout(timeout)
            reply = conn.makefile().readline().strip()
        if reply != "go":
            raise ProbeError(f"barrier {phase}: the calling process answered {reply!r}, not 'go'")
    return wait


class BarrierServer:
    """Releases each phase's connections once ``parties`` have arrived (a thread of the calling process, on all
    interfaces, a free port): the node tasks start each write and read together."""

    def __init__(self, parties: int, timeout: float = 600.0):
        self.parties, self.timeout = parties, timeout
        self.sock = socket.create_server(("", 0))
        self.sock.settimeout(1.0)
        self.port = self.sock.getsockname()[1]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> BarrierServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        waiting: dict[str, list[socket.socket]] = {}
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(self.timeout)
            try:
                phase = conn.makefile().readline().split(" ", 1)[-1].strip()
            except OSError:
                conn.close()
                continue
            waiting.setdefault(phase, []).append(conn)
            if len(waiting[phase]) == self.parties:
                for member in waiting.pop(phase):
                    with member:
                        member.sendall(b"go\n")


def node_task(target: Path, jobs: int, size_mib: int, repeats: int, barrier: Callable[[str], None],
              rank: int) -> dict[str, Any]:
    """One node's part of the shared probe: per repeat, the first node (rank 0) alone writes then reads ``jobs``
    files of ``size_mib`` MiB, then every node at once; each phase started by ``barrier``, timed in wall-clock time
    (``time.time``: the nodes' phases are set side by side)."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    target.mkdir(parents=True, exist_ok=True)
    paths = [target / f".whatif-shared-{node}-{os.getpid()}-{job}" for job in range(jobs)]
    size = size_mib * MiB
    phases = []
    try:
        for repeat in range(repeats):
            for together in (False, True):
                mine = together or rank == 0
                for side in ("write", "read"):
                    if side == "read" and mine:
                        for path in paths:
                            evict(path)
                    barrier(f"{repeat}-{'together' if together else 'alone'}-{side}")
                    if not mine:
                        continue
                    start = time.time()
                    if side == "write":
                        write_files(paths, size)
                        nbytes = sum(path.stat().st_size for path in paths)  # whole 8 MiB blocks
                    else:
                        nbytes = read_files(paths)
                    phases.append({"repeat": repeat, "together": together, "side": side, "start": start,
                                   "end": time.time(), "bytes": nbytes})
        barrier("done")
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return {"node": node, "host": socket.gethostname(), "boot_id": boot_id(), "rank": rank, "phases": phases}


def node_task_main(argv: list[str]) -> int:
    """srun's task: TARGET JOBS SIZE_MIB REPEATS HOST PORT; prints its report as one ``REPORT`` line."""
    target, jobs, size_mib, repeats, host, port = argv
    host = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or host
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    barrier = tcp_barrier((host, int(port)), f"task{rank}", timeout=600.0)
    report = node_task(Path(target), int(jobs), int(size_mib), int(repeats), barrier, rank)
    print(REPORT + json.dumps(report), flush=True)
    return 0


def one_host(reports: list[dict[str, Any]]) -> bool:
    """Whether the nodes' tasks ran on one machine: one boot id among them (hostnames where no boot id is known)."""
    if all(r.get("boot_id") for r in reports):
        return len({r["boot_id"] for r in reports}) == 1
    return len({r.get("host") for r in reports}) == 1


def shared_figures(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The nodes' reports as figures, per side (write, read), min/median/max over the repeats, MB/s:
    ``aggregate``: every node's bytes over the first start to the last end of a repeat's phase together;
    ``per_node``: each node's own bytes over its own time in those phases (each node's share);
    ``alone``: the first node's bytes over its time with the others idle (one client's figure)."""
    if len(reports) < 2:
        raise ProbeError(f"the shared probe needs reports from 2 nodes or more, got {len(reports)}")
    out: dict[str, Any] = {"nodes": sorted(r["node"] for r in reports), "hosts": sorted({r["host"] for r in reports}),
                           "one_host": one_host(reports)}
    for side in ("write", "read"):
        together: dict[int, list[dict]] = {}
        alone, per_node = [], []
        for report in reports:
            for phase in report["phases"]:
                if phase["side"] != side:
                    continue
                rate = phase["bytes"] / MB / (phase["end"] - phase["start"])
                if phase["together"]:
                    together.setdefault(phase["repeat"], []).append(phase)
                    per_node.append(rate)
                else:
                    alone.append(rate)
        incomplete = [repeat for repeat, phases in together.items() if len(phases) != len(reports)]
        if not together or incomplete or not alone:
            raise ProbeError(f"the shared probe's {side} phases are incomplete: repeats {sorted(together)} together "
                             f"(incomplete: {incomplete}), {len(alone)} alone, over {len(reports)} nodes")
        aggregate = [sum(p["bytes"] for p in phases) / MB / (max(p["end"] for p in phases)
                                                            - min(p["start"] for p in phases))
                     for phases in together.values()]
        out[side] = {"aggregate_MBps": _spread(aggregate), "per_node_MBps": _spread(per_node),
                     "alone_MBps": _spread(alone)}
    return out


def srun_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an srun that makes its own allocation: the calling job's SLURM_* variables (inside an
    allocation) dropped, SLURM_CONF kept."""
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def shared_storage_limits(target: Path, nodes: int, jobs: int, size_mib: int, repeats: int,
                          timeout: float = 600.0) -> dict[str, Any]:
    """``node_task`` on ``nodes`` Slurm nodes at once (``srun --nodes N --ntasks-per-node 1``) against ``target``
    (a folder every node sees), barriers served here; ``shared_figures`` of their reports, with how it ran."""
    target.mkdir(parents=True, exist_ok=True)
    with BarrierServer(nodes, timeout) as server:
        argv = ["srun", "--nodes", str(nodes), "--ntasks-per-node", "1", "--ntasks", str(nodes),
                "--job-name", "whatif-shared-probe", sys.executable, "-c", TASK_PROGRAM, str(target), str(jobs),
                str(size_mib), str(repeats), socket.gethostname(), str(server.port)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=srun_environment())
        except subprocess.TimeoutExpired as error:
            raise ProbeError(f"the shared probe (srun) did not finish in {timeout:.0f} s") from error
        except FileNotFoundError as error:
            raise ProbeError("the shared probe needs srun on PATH") from error
    reports = [json.loads(line[len(REPORT):]) for line in proc.stdout.splitlines() if line.startswith(REPORT)]
    if proc.returncode != 0 or len(reports) != nodes:
        raise ProbeError(f"the shared probe (srun on {nodes} nodes) exited {proc.returncode} with {len(reports)} "
                         f"report(s): {(proc.stderr or proc.stdout).strip()[-600:]}")
    return {**shared_figures(reports), "target": str(target), "jobs_per_node": jobs, "size_mib_per_job": size_mib,
            "repeats": repeats, "method": f"srun --nodes {nodes} --ntasks-per-node 1: per node {jobs} thread(s), "
                                          "8 MiB writes + fsync, then buffered 8 MiB reads after DONTNEED, each phase "
                                          "started together by a barrier; the first node alone, then all at once",
            "reports": reports}

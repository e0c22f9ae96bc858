"""Raw bandwidth of the checkpoint target, measured with fio before phase 1 and kept as ``baseline.json``.

The analysis sets every checkpoint's throughput against it (``restartbench.analysis`` reads
``write_MBps``/``read_MBps`` from the run folder or the nearest ancestor). The checkpoint's concurrency is kept:
``jobs`` fio jobs at once (as many as ranks write on a node), each on its own file in the target folder, first a
sequential buffered write whose time includes each file's final fsync (``--end_fsync=1``), as a checkpoint is only
durable once fsync'd, then a sequential read with O_DIRECT so the page cache does not answer it. Where the
filesystem refuses O_DIRECT, the files are evicted with ``posix_fadvise(DONTNEED)`` and read buffered, and
``read_method`` says so. The bandwidth is the jobs' aggregate (fio's group report). fio's JSON output is parsed;
its text output never is. MB = 10^6 bytes.

A run measures at its checkpoint's concurrency (``record_for_run``): as many jobs as ranks on a node, each file
one rank's share of the checkpoint, capped at ``--baseline-mib`` (``SIZING``, kept in ``baseline.json``). One job
of a fixed size can reach less than the ranks reach together, and a limit set too low shows as an engine "faster
than the storage" (issue 18).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from restartbench.progress import say
from restartbench.rundir import RunPlan

#: The file name restartbench.analysis looks for (its BASELINE_FILE).
BASELINE_FILE = "baseline.json"
BLOCK_SIZE = "1M"
MiB = 2**20
WRITE_METHOD = "sequential buffered write, fsync at the end (fio --end_fsync=1), fsync time included"
READ_DIRECT = "sequential O_DIRECT read (fio --direct=1)"
READ_BUFFERED = ("sequential buffered read after posix_fadvise(DONTNEED) eviction: the filesystem refused "
                 "O_DIRECT, so pages it cannot evict (tmpfs) may be read from memory")


class BaselineError(RuntimeError):
    """fio ran but gave no usable measurement; the message says what fio reported."""


SIZING = ("one fio job per rank of a node (every engine the study runs writes from every rank: each holds its own "
          "ZeRO-1 optimizer partition), each file a rank's even share of the checkpoint (the plan's estimate / "
          "world size, rounded up to whole MiB), capped at --baseline-mib")


def concurrency(plan: RunPlan, cap_mib: int) -> tuple[int, int]:
    """(fio jobs, MiB per job) at the checkpoint's concurrency: the ranks of one node write at once, each about
    ``checkpoint_bytes_estimate / world_size`` bytes, at most ``cap_mib`` MiB (see ``SIZING``)."""
    share_mib = -(-plan.checkpoint_bytes_estimate // (plan.world_size * MiB))  # rounded up: a file at least as big
    return plan.nproc_per_node, max(1, min(cap_mib, share_mib))


def record_for_run(run_dir: Path, plan: RunPlan, cap_mib: int) -> Path | None:
    """The run's baseline at its checkpoint's concurrency (``concurrency``), into ``run_dir/baseline.json``."""
    jobs, size_mib = concurrency(plan, cap_mib)
    return record_baseline(run_dir, Path(plan.checkpoint_dir), size_mib, jobs=jobs, sizing=SIZING)


def record_baseline(run_dir: Path, target: Path, size_mib: int, jobs: int = 1,
                    sizing: str | None = None) -> Path | None:
    """Measure ``target`` and write ``run_dir/baseline.json`` (with ``sizing``, how the jobs and sizes were chosen,
    where given); on any problem print a note and return None.

    A missing or failing baseline never fails the run: it is context for the analysis, not a result.
    """
    if shutil.which("fio") is None:
        say("note: fio is not installed, so no storage baseline is measured (install it: apt-get install fio)")
        return None
    say(f"storage baseline: {jobs} fio job(s) at once each write and read {size_mib} MiB in {target}")
    try:
        baseline = measure(Path(target), size_mib, jobs=jobs)
    except (BaselineError, OSError) as error:
        say(f"note: storage baseline not measured: {error}")
        return None
    if sizing:
        baseline["sizing"] = sizing
    path = Path(run_dir) / BASELINE_FILE
    path.write_text(json.dumps(baseline, indent=2) + "\n")
    say(f"storage baseline: write {baseline['write_MBps']:.0f} MB/s, read {baseline['read_MBps']:.0f} MB/s "
        f"({'O_DIRECT' if baseline['read_method'] == READ_DIRECT else 'buffered, O_DIRECT refused'})")
    return path


def measure(target: Path, size_mib: int, block_size: str = BLOCK_SIZE, jobs: int = 1) -> dict[str, Any]:
    """fio write (with fsync) then read of ``size_mib`` MiB per job, ``jobs`` jobs at once, in ``target``; the
    test files are always removed."""
    if size_mib <= 0:
        raise BaselineError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    if jobs < 1:
        raise BaselineError(f"the baseline needs at least one fio job, got {jobs}")
    target.mkdir(parents=True, exist_ok=True)
    test_files = [target / f".restartbench-baseline-{os.getpid()}-{job}.fio" for job in range(jobs)]
    size = size_mib * MiB
    free = shutil.disk_usage(target).free
    if size * jobs > free:
        raise BaselineError(f"{target} has {free / MiB:.0f} MiB free, less than the {jobs * size_mib} MiB the "
                            f"baseline writes ({jobs} job(s) of {size_mib} MiB); lower --baseline-mib (0 skips the "
                            "baseline)")
    try:
        write = run_fio(test_files, "write", size, block_size, "--end_fsync=1")
        if direct_io_works(test_files[0]):
            read_method, read = READ_DIRECT, run_fio(test_files, "read", size, block_size, "--direct=1")
        else:
            for test_file in test_files:
                evict(test_file)
            read_method, read = READ_BUFFERED, run_fio(test_files, "read", size, block_size, "--direct=0")
    finally:
        for test_file in test_files:
            test_file.unlink(missing_ok=True)
    for side, report in (("write", write), ("read", read)):
        if report["io_bytes"] != size * jobs:  # the group report must cover every job, all of its bytes
            raise BaselineError(f"fio's {side} report covers {report['io_bytes']} bytes, not the {jobs} × {size} "
                                "bytes its jobs moved")
    return {
        "tool": "fio", "write_MBps": write["MBps"], "read_MBps": read["MBps"],
        "target": str(target.resolve()), "size_bytes": size, "jobs": jobs, "block_size": block_size,
        "write_method": WRITE_METHOD, "read_method": read_method, "fio_version": write["version"],
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_fio(paths: Path | list[Path], rw: str, size: int, block_size: str, *extra: str) -> dict[str, Any]:
    """One sequential fio job per file of ``paths``, all at once; returns their aggregate bandwidth (MB/s) and
    fio's version."""
    paths = [paths] if isinstance(paths, Path) else paths
    command = ["fio", "--output-format=json", "--group_reporting"]
    for index, path in enumerate(paths):  # one job section per file: each job writes or reads its own file
        command += [f"--name=restartbench-{rw}-{index}", f"--filename={fio_filename(path)}", f"--rw={rw}",
                    f"--bs={block_size}", f"--size={size}", "--ioengine=psync", *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise BaselineError(f"fio {rw} on {paths[0].parent} exited with {done.returncode}: "
                            f"{reason[-1] if reason else 'no message'}")
    return parse_fio(done.stdout, rw)


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
    """Drop ``path``'s pages from the page cache so a buffered read goes to the storage (where it can)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


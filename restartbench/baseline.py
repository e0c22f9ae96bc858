"""Raw bandwidth of the checkpoint target, measured with fio before phase 1 and kept as ``baseline.json``.

The analysis sets every checkpoint's throughput against it (``restartbench.analysis`` reads
``write_MBps``/``read_MBps`` from the run folder or the nearest ancestor). Two fio jobs on one
file in the target folder: a sequential buffered write whose time includes the final fsync
(``--end_fsync=1``), as a checkpoint is only durable once fsync'd, then a sequential read with
O_DIRECT so the page cache does not answer it. Where the filesystem refuses O_DIRECT, the file
is evicted with ``posix_fadvise(DONTNEED)`` and read buffered, and ``read_method`` says so.
fio's JSON output is parsed; its text output never is. MB = 10^6 bytes.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from restartbench.progress import say

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


def record_baseline(run_dir: Path, target: Path, size_mib: int) -> Path | None:
    """Measure ``target`` and write ``run_dir/baseline.json``; on any problem print a note and return None.

    A missing or failing baseline never fails the run: it is context for the analysis, not a result.
    """
    if shutil.which("fio") is None:
        say("note: fio is not installed, so no storage baseline is measured (install it: apt-get install fio)")
        return None
    say(f"storage baseline: fio writes and reads {size_mib} MiB in {target}")
    try:
        baseline = measure(Path(target), size_mib)
    except (BaselineError, OSError) as error:
        say(f"note: storage baseline not measured: {error}")
        return None
    path = Path(run_dir) / BASELINE_FILE
    path.write_text(json.dumps(baseline, indent=2) + "\n")
    say(f"storage baseline: write {baseline['write_MBps']:.0f} MB/s, read {baseline['read_MBps']:.0f} MB/s "
        f"({'O_DIRECT' if baseline['read_method'] == READ_DIRECT else 'buffered, O_DIRECT refused'})")
    return path


def measure(target: Path, size_mib: int, block_size: str = BLOCK_SIZE) -> dict[str, Any]:
    """fio write (with fsync) then read of ``size_mib`` MiB in ``target``; the test file is always removed."""
    if size_mib <= 0:
        raise BaselineError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    target.mkdir(parents=True, exist_ok=True)
    test_file = target / f".restartbench-baseline-{os.getpid()}.fio"
    size = size_mib * MiB
    free = shutil.disk_usage(target).free
    if size > free:
        raise BaselineError(f"{target} has {free / MiB:.0f} MiB free, less than the {size_mib} MiB the baseline "
                            "writes; lower --baseline-mib (0 skips the baseline)")
    try:
        write = run_fio(test_file, "write", size, block_size, "--end_fsync=1")
        if direct_io_works(test_file):
            read_method, read = READ_DIRECT, run_fio(test_file, "read", size, block_size, "--direct=1")
        else:
            evict(test_file)
            read_method, read = READ_BUFFERED, run_fio(test_file, "read", size, block_size, "--direct=0")
    finally:
        test_file.unlink(missing_ok=True)
    return {
        "tool": "fio", "write_MBps": write["MBps"], "read_MBps": read["MBps"],
        "target": str(target.resolve()), "size_bytes": size, "block_size": block_size,
        "write_method": WRITE_METHOD, "read_method": read_method, "fio_version": write["version"],
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_fio(path: Path, rw: str, size: int, block_size: str, *extra: str) -> dict[str, Any]:
    """One sequential fio job on ``path``; returns its bandwidth (MB/s) and fio's version."""
    command = ["fio", f"--name=restartbench-{rw}", f"--filename={fio_filename(path)}", f"--rw={rw}",
               f"--bs={block_size}", f"--size={size}", "--ioengine=psync", "--numjobs=1",
               "--output-format=json", *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise BaselineError(f"fio {rw} on {path.parent} exited with {done.returncode}: "
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


# -- S3 (not wired into the study yet) ------------------------------------------------------------

S3_PART_SIZE = 8 * MiB


def measure_s3(uri: str, size_mib: int, *, region: str = "us-east-1", endpoint: str | None = None,
               part_size: int = S3_PART_SIZE, path_style: bool | None = None) -> dict[str, Any]:
    """Upload then download one object of ``size_mib`` MiB under ``uri`` (s3://bucket/prefix) with s3torchconnector.

    The same client a checkpoint engine writing to S3 uses: its CRT client uploads in parts of
    ``part_size`` (multipart) and downloads with concurrent ranged GETs. The write time ends when the
    multipart upload is completed (the object is then durable); the object is always deleted.
    Credentials come from the usual AWS variables; ``endpoint`` points at a non-AWS store, which is
    addressed path-style (``endpoint/bucket/key``) unless ``path_style`` says otherwise.
    """
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client  # the public S3Checkpoint wraps it, but cannot delete

    if size_mib <= 0:
        raise BaselineError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    bucket, prefix = split_s3_uri(uri)
    key = f"{prefix.rstrip('/') + '/' if prefix else ''}.restartbench-baseline-{os.getpid()}"
    client = S3Client(region, endpoint=endpoint,
                      s3client_config=S3ClientConfig(part_size=part_size, force_path_style=(
                          endpoint is not None if path_style is None else path_style)))
    size = size_mib * MiB
    try:
        write_s = _timed_upload(client, bucket, key, size, part_size)
        read_s = _timed_download(client, bucket, key, size, part_size)
    finally:
        _delete_quietly(client, bucket, key)
    return {
        "tool": "s3torchconnector", "write_MBps": size / write_s / 1e6, "read_MBps": size / read_s / 1e6,
        "target": f"s3://{bucket}/{key}", "endpoint": endpoint, "size_bytes": size, "block_size": part_size,
        "write_method": f"multipart upload in parts of {part_size} B, time until the upload is completed",
        "read_method": "streamed GET (concurrent ranged requests) of the whole object",
        "s3torchconnector_version": _version("s3torchconnector"),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def split_s3_uri(uri: str) -> tuple[str, str]:
    """("bucket", "prefix") of s3://bucket/prefix; a clear error for anything else."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise BaselineError(f"{uri!r} is not an S3 location: write it as s3://BUCKET[/PREFIX]")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix


def _timed_upload(client: Any, bucket: str, key: str, size: int, part_size: int) -> float:
    """Seconds to write ``size`` random bytes (one random part repeated: stores do not compress)."""
    part = os.urandom(part_size)
    start = time.perf_counter()
    writer = client.put_object(bucket, key)
    for offset in range(0, size, part_size):
        writer.write(part[:min(part_size, size - offset)])
    writer.close()
    return time.perf_counter() - start


def _timed_download(client: Any, bucket: str, key: str, size: int, part_size: int) -> float:
    """Seconds to read the whole object into one reused buffer; a short read is an error."""
    buffer = bytearray(part_size)
    start = time.perf_counter()
    reader = client.get_object(bucket, key)
    got = 0
    while count := reader.readinto(buffer):
        got += count
    elapsed = time.perf_counter() - start
    if got != size:
        raise BaselineError(f"s3://{bucket}/{key}: read back {got} bytes of the {size} written")
    return elapsed


def _delete_quietly(client: Any, bucket: str, key: str) -> None:
    try:
        client.delete_object(bucket, key)
    except Exception as error:  # noqa: BLE001 - the measurement stands; a leftover object is only reported
        say(f"note: could not delete the baseline object s3://{bucket}/{key}: {error}")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None

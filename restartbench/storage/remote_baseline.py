"""The object-store baseline: a plain upload and download of the same size as context for a run's checkpoint
figures, through the client the checkpoints go through and, for S3, through the other one too
(``baseline.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from restartbench import baseline
from restartbench.progress import say
from restartbench.storage.explain import redact
from restartbench.storage.locations import PART_SIZE, S3_CLIENTS, S3Settings, StorageError
from restartbench.storage.stores import STORES, ObjectStore, open_store


def record_remote_baseline(run_dir: Path, location: str, remote: dict[str, Any], size_mib: int) -> Path | None:
    """Measure the location with plain transfers and write ``run_dir/baseline.json``; on a problem print a
    note and return None (a baseline is context for the analysis, never a reason to fail the run).

    The top-level figures are those of the client the checkpoints go through; ``other_clients`` holds the same
    transfer through the other route to S3 (s3torchconnector or s3fs), for comparison."""
    store = open_store(location, remote)
    say(f"storage baseline: a {size_mib} MiB object uploaded and downloaded in {store.location} through {store.tool}")
    try:
        result = measure_store(store, size_mib)
    except Exception as error:  # noqa: BLE001 - StorageError, the clients' errors: reported, the run goes on
        say(f"note: storage baseline not measured: {redact(str(error))}")
        return None
    result["other_clients"] = {other.tool: _measured_or_reason(other, size_mib) for other in _other_routes(store)}
    path = Path(run_dir) / baseline.BASELINE_FILE
    path.write_text(json.dumps(result, indent=2) + "\n")
    others = "; ".join(f"{tool} " + (f"write {r['write_MBps']:.0f} MB/s, read {r['read_MBps']:.0f} MB/s"
                                      if "write_MBps" in r else f"not measured ({r['error']})")
                       for tool, r in result["other_clients"].items())
    say(f"storage baseline: {store.tool} write {result['write_MBps']:.0f} MB/s, read {result['read_MBps']:.0f} MB/s"
        + (f"; {others}" if others else ""))
    return path


def _other_routes(store: ObjectStore) -> list[ObjectStore]:
    """The same S3 location through the other client (none for GCS: fsspec is its only route here)."""
    if not isinstance(store.settings, S3Settings):
        return []
    other = next(c for c in S3_CLIENTS if c != store.settings.client)
    return [STORES[other](store.where, store.settings.with_client(other))]


def _measured_or_reason(store: ObjectStore, size_mib: int) -> dict[str, Any]:
    try:
        return measure_store(store, size_mib)
    except ImportError as missing:
        return {"tool": store.tool, "error": f"{missing.name} is not installed"}
    except Exception as error:  # noqa: BLE001
        return {"tool": store.tool, "error": redact(f"{type(error).__name__}: {error}")}


def measure_store(store: ObjectStore, size_mib: int) -> dict[str, Any]:
    """Upload then download one object of ``size_mib`` MiB through the store's client, as a checkpoint file goes:
    written in parts of PART_SIZE (multipart), the time ending when the upload is complete (the object is then
    durable); read back whole into one reused buffer. The object is always deleted."""
    if size_mib <= 0:
        raise StorageError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    name = f".restartbench-baseline-{store.tool}-{os.getpid()}"
    url, size, part = store.url_of(name), size_mib * 2**20, os.urandom(PART_SIZE)
    try:
        start = time.perf_counter()
        with store.writer(url) as writer:
            for offset in range(0, size, PART_SIZE):
                writer.write(part[:min(PART_SIZE, size - offset)])
        write_s, start = time.perf_counter() - start, time.perf_counter()
        got, buffer = 0, bytearray(PART_SIZE)
        with store.reader(url) as reader:
            while count := reader.readinto(buffer):
                got += count
        read_s = time.perf_counter() - start
    finally:
        with contextlib.suppress(Exception):
            store.delete(name)
    if got != size:
        raise StorageError(f"{url}: {store.tool} read back {got} bytes of the {size} written")
    return {"tool": store.tool, "version": store.version(), "write_MBps": size / write_s / 1e6,
            "read_MBps": size / read_s / 1e6, "target": url, "endpoint": store.settings.endpoint,
            "size_bytes": size, "block_size": PART_SIZE,
            "write_method": f"{store.tool}: one object written in parts of {PART_SIZE} B (multipart), time until the "
                            "upload is complete",
            "read_method": f"{store.tool}: the whole object read in blocks of {PART_SIZE} B into one buffer",
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

"""Checkpoints in Google Cloud Storage through fsspec (gcsfs), against a GCS emulator on loopback
(gcp-storage-emulator, which speaks GCS's JSON API; it does not check credentials, so refused credentials are
tested against S3 only): the store, the probe's errors, DCP's fsspec writer, and a run that restores exactly."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import gcsfs  # noqa: F401  (the test extra; a missing one is an error, not a skip)
import pytest
from conftest import run_study
from s3server import free_ports

from restartbench import storage
from restartbench.events import read_events

TINY = ("tiny", "tp1pp1dp2", "--dtype", "fp32")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's endpoint, with bucket 'ckpt'; stopped (its own process only) afterwards."""
    emulator = Path(sys.executable).parent / "gcp-storage-emulator"
    if not emulator.exists():
        pytest.skip("gcp-storage-emulator is not installed (pip install -c constraints.txt -e '.[test]')")
    port = free_ports(1)[0]
    data = tmp_path_factory.mktemp("gcs")
    process = subprocess.Popen([str(emulator), "-d", str(data), "start", "--host", "127.0.0.1", "--port", str(port),
                                "--default-bucket", "ckpt", "-q"], stdout=subprocess.DEVNULL,
                               stderr=(data / "emulator.log").open("w"))
    try:
        _wait_for_port(port, process, data / "emulator.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_for_port(port, process, log, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"gcp-storage-emulator exited: {log.read_text()[-1000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    pytest.skip(f"gcp-storage-emulator did not listen on {port} within {timeout_s} s")


@pytest.fixture
def gcs_env(gcs, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return gcs


def test_store_probe_and_files(gcs_env):
    store = storage.open_store("gs://ckpt/store")
    assert type(store).__name__ == "FsspecStore" and store.tool == "gcsfs" and store.settings.anonymous
    storage.probe(store)
    store.write_durably("step2/manifest.json", '{"files": []}')
    store.write_durably("latest", "step2")
    assert store.read_text("latest") == "step2" and store.size("latest") == 5 and store.size("nothing") is None
    assert store.glob("*/manifest.json") == ["step2/manifest.json"]
    store.remove_tree("step2")
    assert store.files() == {"latest": 5}


def test_probe_says_what_is_wrong_quickly(gcs_env):
    with pytest.raises(storage.StorageError, match="bucket 'no-such-bucket' does not exist"):
        storage.probe(storage.open_store("gs://no-such-bucket/run"))
    dead = storage.GCSSettings.resolve(endpoint=f"http://127.0.0.1:{free_ports(1)[0]}")
    start = time.monotonic()
    with pytest.raises(storage.StorageError, match="endpoint cannot be reached"):
        storage.probe(storage.open_store("gs://ckpt/run", storage.settings_to_plan(dead)))
    assert time.monotonic() - start < 10, "gcsfs's own retries (about a minute) are not waited for"


def test_dcp_fsspec_writer_round_trip(gcs_env):
    import torch
    import torch.distributed.checkpoint as dcp

    from restartbench.engines.dcp.engine import METADATA, FsspecPrefix, files_of_rank

    store = storage.open_store("gs://ckpt/dcp")
    target, folder = FsspecPrefix(store), store.url_of("step1")
    state = {"w": torch.randn(3 * 2**20, generator=torch.Generator().manual_seed(2)), "b": torch.arange(7)}
    dcp.save(state, storage_writer=target.writer(folder))
    sizes = target.sizes(folder)
    assert files_of_rank(list(sizes), 0) == [METADATA, "__0_0.distcp"] and sizes["__0_0.distcp"] > 12 * 2**20
    loaded = {"w": torch.zeros_like(state["w"]), "b": torch.zeros_like(state["b"])}
    dcp.load(loaded, storage_reader=target.reader(folder))
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])


@pytest.mark.multirank
def test_run_to_gcs_restores_exactly(gcs, tmp_path):
    env = {"STORAGE_EMULATOR_HOST": gcs}
    proc, run = run_study(tmp_path / "logs", *TINY, "--iters", "4", "--save-interval", "2",
                          "--checkpoint-dir", "gs://ckpt/run-exact", "--baseline-mib", "16", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((run / "metadata.json").read_text())["status"] == "complete"
    events = read_events(run)
    assert [e["exact"] for e in events if e["event"] == "restore.result"] == [True, True]
    assert {e["cache"] for e in events if e["event"] == "restore.load"} == {"remote"}
    store = storage.open_store("gs://ckpt/run-exact", json.loads((run / "plan.json").read_text())["remote"])
    assert store.read_text("latest") == "step4"
    manifest = json.loads(store.read_text("step4/manifest.json"))
    objects = store.files("step4")
    assert manifest["files"] and all(objects[f["path"]] == f["bytes"] for f in manifest["files"])
    baseline = json.loads((run / "baseline.json").read_text())
    assert baseline["tool"] == "gcsfs" and baseline["write_MBps"] > 0 and baseline["other_clients"] == {}

"""Checkpoints in S3, against a real S3 server on loopback (SeaweedFS, tests/s3server.py), through both clients
(s3torchconnector and fsspec's s3fs): the target is probed before anything is written, each bad target is said in
words, the store keeps the manifest and ``latest``, objects above the multipart threshold round-trip exactly, and
runs restore exactly from S3."""

import hashlib
import io
import json
import os
import time

import pytest
import s3torchconnector  # noqa: F401  (the test extra; a missing one is an error, not a skip)
from conftest import chunked_sha256, run_study
from s3server import SeaweedS3, SeaweedUnavailable, free_ports

from restartbench import engines, storage, study
from restartbench.config import config_from_args
from restartbench.engines.deepspeed.engine import ObjectFileEngine, object_paths_from_listing
from restartbench.events import read_events
from restartbench.storage import filehash

TINY = ("tiny", "tp1pp1dp2", "--dtype", "fp32")
CLIENTS = storage.S3_CLIENTS


def s3_store(url, client, settings=None):
    settings = (settings or storage.S3Settings.resolve()).with_client(client)
    return storage.open_store(url, storage.settings_to_plan(settings))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        with SeaweedS3(tmp_path_factory.mktemp("seaweed"), buckets=("ckpt", "doomed")) as running:
            yield running
    except SeaweedUnavailable as why:
        pytest.skip(str(why))


@pytest.fixture
def s3_env(server, monkeypatch):
    """This process talks to the server as a user would: through the AWS variables."""
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server


def _keys(server, bucket="ckpt", prefix=""):
    listing = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o for o in listing.get("Contents", [])}


# --- locations and settings (no server) ---------------------------------------------------------


def test_s3_location_parse_and_refusals():
    where = storage.ObjectLocation.parse("s3://bucket/runs/a/")
    assert (where.bucket, where.prefix, where.url) == ("bucket", "runs/a", "s3://bucket/runs/a")
    assert where.url_of("step2/x.pt") == "s3://bucket/runs/a/step2/x.pt"
    assert where.relative("s3://bucket/runs/a/step2/x.pt") == "step2/x.pt"
    assert where.path("step2/x.pt") == "bucket/runs/a/step2/x.pt" and where.path() == "bucket/runs/a"
    assert storage.ObjectLocation.parse("s3://bucket").key("latest") == "latest"
    assert storage.ObjectLocation.parse("gs://b/p").url_of("latest") == "gs://b/p/latest"
    for bad in ("s3://", "s3:///key", "/tmp/x", "s3://b/a//c", "hdfs://b/p"):
        with pytest.raises(storage.StorageError, match="s3://BUCKET"):
            storage.ObjectLocation.parse(bad)


def test_settings_from_options_before_environment_and_no_secret_values():
    env = {"AWS_ENDPOINT_URL": "http://env:9000", "AWS_REGION": "eu-west-3", "AWS_ACCESS_KEY_ID": "AKIAXX",
           "AWS_SECRET_ACCESS_KEY": "very-secret"}
    from_env = storage.S3Settings.resolve(environ=env)
    assert (from_env.endpoint, from_env.region, from_env.force_path_style) == ("http://env:9000", "eu-west-3", True)
    given = storage.S3Settings.resolve("http://opt:1", "us-west-2", False, environ=env)
    assert (given.endpoint, given.region, given.force_path_style) == ("http://opt:1", "us-west-2", False)
    aws = storage.S3Settings.resolve(environ={})
    assert (aws.endpoint, aws.region, aws.force_path_style) == (None, "us-east-1", False)
    recorded = json.dumps(storage.settings_to_plan(from_env))
    assert "AWS_ACCESS_KEY_ID" in recorded and "AKIAXX" not in recorded and "very-secret" not in recorded
    assert storage.settings_from_plan(json.loads(recorded)) == from_env
    fsspec = storage.S3Settings.resolve(environ=env, client="fsspec")
    assert storage.settings_from_plan(storage.settings_to_plan(fsspec)).client == "fsspec"
    gcs = storage.GCSSettings.resolve(environ={"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})
    assert gcs.anonymous and storage.settings_from_plan(storage.settings_to_plan(gcs)) == gcs
    assert not storage.GCSSettings.resolve(environ={"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}).anonymous


def test_engines_that_write_local_files_are_refused_for_s3():
    with pytest.raises(storage.StorageError, match="engine 'lazy' writes local files only.*--engine none, torch, dcp"):
        engines.refuse_unless_object_store("lazy", "s3://b/p")
    for able in ("torch", "dcp", "dcp-async", "none"):
        engines.refuse_unless_object_store(able, "s3://b/p")
    assert storage.check_remote_location("s3://b/p", "fsspec").bucket == "b"
    with pytest.raises(storage.StorageError, match="gs:// checkpoints go through fsspec"):
        storage.check_remote_location("gs://b/p", "s3torchconnector")


def test_listing_answers_glob_and_exists_for_s3_paths_only(tmp_path):
    (tmp_path / "local.pt").write_bytes(b"x")
    objects = {"s3://b/p/step2/layer_00-model_00-model_states.pt": 10, "s3://b/p/step2/mp_rank_00_model_states.pt": 5,
               "s3://b/p/step2/sub/layer_00-x-model_states.pt": 1}
    with object_paths_from_listing(objects, "s3://"):
        import glob

        assert glob.glob("s3://b/p/step2/layer_00-*model_states.pt") == ["s3://b/p/step2/layer_00-model_00-model_states.pt"]
        assert os.path.exists("s3://b/p/step2/mp_rank_00_model_states.pt") and os.path.exists("s3://b/p/step2")
        assert not os.path.exists("s3://b/p/step4/mp_rank_00_model_states.pt")
        assert glob.glob(str(tmp_path / "*.pt")) == [str(tmp_path / "local.pt")] and os.path.exists(tmp_path)
    assert not os.path.exists("s3://b/p/step2/mp_rank_00_model_states.pt"), "the real functions are back"


# --- against the server -------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_probe_says_what_is_wrong_for_each_bad_target_quickly(s3_env, monkeypatch, client):
    storage.probe(s3_store("s3://ckpt/probe", client))
    assert _keys(s3_env, prefix="probe") == {}, "the probe object is deleted"
    closed_port = free_ports(1)[0]
    cases = [
        ("s3://no-such-bucket/run", None, "bucket 'no-such-bucket' does not exist"),
        ("s3://ckpt/run", storage.S3Settings.resolve(endpoint=f"http://127.0.0.1:{closed_port}"),
         "endpoint cannot be reached"),
    ]
    for url, settings, words in cases:
        start = time.monotonic()
        with pytest.raises(storage.StorageError, match=words):
            storage.probe(s3_store(url, client, settings))
        assert time.monotonic() - start < 10
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(storage.StorageError, match="credentials were refused") as refused:
        storage.probe(s3_store("s3://ckpt/run", client))
    assert "not-the-secret" not in str(refused.value) and s3_env.secret_key not in str(refused.value)


@pytest.mark.parametrize("case", ["missing bucket", "bad credentials", "unreachable endpoint"])
def test_study_refuses_a_bad_s3_target_before_writing_anything(s3_env, monkeypatch, tmp_path, case):
    target, extra = "s3://ckpt/run", []
    if case == "missing bucket":
        target = "s3://no-such-bucket/run"
    elif case == "bad credentials":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    else:
        extra = ["--s3-endpoint", f"http://127.0.0.1:{free_ports(1)[0]}"]
    cfg = config_from_args([*TINY, "--logs", str(tmp_path / "logs"), "--checkpoint-dir", target, *extra])
    words = {"missing bucket": "does not exist", "bad credentials": "credentials were refused",
             "unreachable endpoint": "cannot be reached"}[case]
    with pytest.raises(study.StudyError, match=words):
        study.run_study(cfg)
    assert not (tmp_path / "logs").exists(), "no run folder: nothing was launched, nothing claimed durable"


def test_s3_options_without_an_s3_target_are_refused(tmp_path):
    cfg = config_from_args([*TINY, "--logs", str(tmp_path), "--s3-endpoint", "http://127.0.0.1:9"])
    with pytest.raises(study.StudyError, match="--s3-endpoint do not apply .* for an s3:// --checkpoint-dir"):
        study.plan_run(cfg)
    cfg = config_from_args([*TINY, "--logs", str(tmp_path), "--checkpoint-dir", "s3://b/p", "--gcs-endpoint", "x"])
    with pytest.raises(study.StudyError, match="--gcs-endpoint do not apply"):
        study.plan_run(cfg)


@pytest.mark.parametrize("client", CLIENTS)
def test_store_keeps_manifest_and_latest(s3_env, client):
    store = s3_store(f"s3://ckpt/store-{client}", client)
    assert store.remote and store.free_bytes() is None and not store.exists("latest")
    with pytest.raises(FileNotFoundError):
        store.read_text("latest")
    store.write_durably("step2/manifest.json", '{"files": []}')
    store.write_durably("step2/a.pt", "payload")
    store.write_durably("latest", "step2")
    assert store.read_text("latest") == "step2" and store.size("step2/a.pt") == 7
    assert store.glob("*/manifest.json") == ["step2/manifest.json"]
    assert store.file_hash("step2/a.pt", filehash.WHOLE) == hashlib.sha256(b"payload").hexdigest()
    assert store.file_hash("step2/a.pt") == chunked_sha256(b"payload")
    store.remove_tree("step2")
    assert store.files() == {"latest": 5}


@pytest.mark.parametrize("client", CLIENTS)
def test_object_above_the_multipart_threshold_round_trips_exactly(s3_env, client):
    """The file engine DeepSpeed's save and load go through: a 12 MiB state dict is a multipart upload
    (its ETag has a part count) and loads back bit for bit; its SHA-256 in the store is that of the bytes."""
    import torch

    store = s3_store("s3://ckpt/multipart", client)
    inner = type("DeepSpeedTorchEngine", (), {"zipfile_serialization": True})()
    files = ObjectFileEngine(inner, store)
    state = {"w": torch.randn(3 * 2**20, generator=torch.Generator().manual_seed(0)), "step": 7}
    url = store.url_of("step1/big.pt")
    files.save(state, url)
    [record] = files.saved
    head = s3_env.client().head_object(Bucket="ckpt", Key="multipart/step1/big.pt")
    assert record.bytes == head["ContentLength"] > 8 * 2**20
    assert "-" in head["ETag"], f"not a multipart upload: ETag {head['ETag']}"
    files.sizes = {url: record.bytes}
    loaded = files.load(url)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
    body = s3_env.client().get_object(Bucket="ckpt", Key="multipart/step1/big.pt")["Body"].read()
    assert store.file_hash("step1/big.pt", filehash.WHOLE) == hashlib.sha256(body).hexdigest()
    assert store.file_hash("step1/big.pt") == chunked_sha256(body)
    assert torch.equal(torch.load(io.BytesIO(body))["w"], state["w"])


@pytest.mark.parametrize("client", CLIENTS)
def test_dcp_writer_and_reader_on_s3_round_trip_through_the_runs_client(s3_env, client):
    """The DCP writer and reader of each client (s3torchconnector's, given the harness's client since their
    constructors take no endpoint; torch's fsspec ones on the store's s3fs): one process saves a state with a
    tensor above the multipart threshold and loads it back exactly; the sizes the engine records are the objects'."""
    import torch
    import torch.distributed.checkpoint as dcp

    from restartbench.engines.dcp.engine import METADATA, OBJECT_PREFIXES, files_of_rank

    store = s3_store(f"s3://ckpt/dcp-{client}", client)
    target, folder = OBJECT_PREFIXES[type(store).__name__](store), store.url_of("step1")
    state = {"w": torch.randn(3 * 2**20, generator=torch.Generator().manual_seed(1)), "b": torch.arange(5)}
    dcp.save(state, storage_writer=target.writer(folder))
    sizes = target.sizes(folder)
    assert files_of_rank(list(sizes), 0) == [METADATA, "__0_0.distcp"]
    keys = _keys(s3_env, prefix=f"dcp-{client}/step1/")
    assert {k.rsplit("/", 1)[1]: o["Size"] for k, o in keys.items()} == sizes
    assert sizes["__0_0.distcp"] > 12 * 2**20 and "-" in keys[f"dcp-{client}/step1/__0_0.distcp"]["ETag"], "multipart"
    loaded = {"w": torch.zeros_like(state["w"]), "b": torch.zeros_like(state["b"])}
    dcp.load(loaded, storage_reader=target.reader(folder))
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert target.durable([], 12.5) == 12.5, "durable when the uploads completed, inside the write"


@pytest.mark.parametrize("client, tool, other", [("s3torchconnector", "s3torchconnector", "s3fs"),
                                                ("fsspec", "s3fs", "s3torchconnector")])
def test_s3_baseline_writes_both_routes_and_leaves_nothing(s3_env, tmp_path, client, tool, other):
    """The client the checkpoints go through is the baseline; the other route is measured beside it."""
    settings = storage.settings_to_plan(storage.S3Settings.resolve(client=client))
    path = storage.record_remote_baseline(tmp_path, "s3://ckpt/baseline", settings, 16)
    data = json.loads(path.read_text())
    assert path == tmp_path / "baseline.json" and data["tool"] == tool
    assert data["write_MBps"] > 0 and data["read_MBps"] > 0 and data["size_bytes"] == 16 * 2**20
    assert data["block_size"] < data["size_bytes"], "a multipart upload"
    beside = data["other_clients"][other]
    assert beside["tool"] == other and beside["write_MBps"] > 0 and beside["read_MBps"] > 0
    assert _keys(s3_env, prefix="baseline") == {}
    assert s3_env.secret_key not in path.read_text()


# --- whole runs (2 ranks) --------------------------------------------------------------------------


@pytest.mark.multirank
def test_run_to_s3_restores_exactly_and_keeps_secrets_out(server, tmp_path):
    proc, run = run_study(tmp_path / "logs", *TINY, "--iters", "4", "--save-interval", "2",
                          "--checkpoint-dir", "s3://ckpt/run-exact", "--baseline-mib", "16", env=server.env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "complete"
    events = read_events(run)
    results = [e for e in events if e["event"] == "restore.result"]
    assert len(results) == 2 and all(e["exact"] for e in results)
    loads = [e for e in events if e["event"] == "restore.load"]
    assert {e["cache"] for e in loads} == {"remote"} and all(e["bytes"] > 0 for e in loads)
    keys = _keys(server, prefix="run-exact/")
    assert server.client().get_object(Bucket="ckpt", Key="run-exact/latest")["Body"].read() == b"step4"
    manifest = json.loads(server.client().get_object(Bucket="ckpt", Key="run-exact/step4/manifest.json")["Body"].read())
    assert manifest["files"] and all(keys[f"run-exact/{f['path']}"]["Size"] == f["bytes"] for f in manifest["files"])
    assert "run-exact/zero_to_fp32.py" in keys
    plan = json.loads((run / "plan.json").read_text())
    assert plan["checkpoint_dir"] == "s3://ckpt/run-exact" and plan["remote"]["endpoint"] == server.endpoint
    assert json.loads((run / "baseline.json").read_text())["tool"] == "s3torchconnector"
    assert not (run / "checkpoints").exists()
    for path in run.rglob("*"):
        if path.is_file():
            assert server.secret_key.encode() not in path.read_bytes(), f"secret in {path}"
    assert server.secret_key not in proc.stdout + proc.stderr


@pytest.mark.multirank
def test_bucket_gone_after_the_probe_fails_the_run_with_nothing_committed(server, s3_env, tmp_path, monkeypatch):
    """The batch-job case: the target was fine when the run was prepared and is gone when it runs."""
    prepared = []
    real_execute = study.execute
    monkeypatch.setattr(study, "execute", lambda run_dir: prepared.append(run_dir) or 0)
    cfg = config_from_args([*TINY, "--iters", "2", "--save-interval", "1", "--baseline-mib", "0",
                            "--logs", str(tmp_path / "logs"), "--checkpoint-dir", "s3://doomed/run"])
    assert study.run_study(cfg) == 0 and len(prepared) == 1
    server.client().delete_bucket(Bucket="doomed")
    assert real_execute(prepared[0]) == 1
    meta = json.loads((prepared[0] / "metadata.json").read_text())
    assert meta["status"] == "failed" and "committed no checkpoint" in meta["error"]
    assert [c["tag"] for c in meta["failed_checkpoints"]] == ["step1", "step2"]
    assert all("bucket 'doomed' does not exist" in c["error"] for c in meta["failed_checkpoints"])
    events = read_events(prepared[0])
    assert not [e for e in events if e["event"] in ("checkpoint.commit", "checkpoint.durable")]


@pytest.mark.multirank
@pytest.mark.parametrize("client", CLIENTS)
def test_async_dcp_run_to_s3_restores_exactly(server, tmp_path, client):
    """DCP's async_save through each client's DCP writer (s3torchconnector's S3StorageWriter as in seeds 000/001;
    torch's FsspecWriter on s3fs), restored through its reader."""
    proc, run = run_study(tmp_path / "logs", *TINY, "--iters", "4", "--save-interval", "2", "--engine", "dcp-async",
                          "--checkpoint-dir", f"s3://ckpt/run-dcp-{client}", "--object-client", client,
                          "--baseline-mib", "0", env=server.env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((run / "metadata.json").read_text())["status"] == "complete"
    events = read_events(run)
    assert [e["exact"] for e in events if e["event"] == "restore.result"] == [True, True]
    assert {e["cache"] for e in events if e["event"] == "restore.load"} == {"remote"}
    keys = _keys(server, prefix=f"run-dcp-{client}/")
    manifest = json.loads(
        server.client().get_object(Bucket="ckpt", Key=f"run-dcp-{client}/step4/manifest.json")["Body"].read())
    names = sorted(f["path"] for f in manifest["files"])
    assert names == ["step4/.metadata", "step4/__0_0.distcp", "step4/__1_0.distcp"]
    assert all(keys[f"run-dcp-{client}/{f['path']}"]["Size"] == f["bytes"] for f in manifest["files"])
    durable = [e for e in events if e["event"] == "checkpoint.durable"]
    assert durable and all(e["bytes"] > 0 for e in durable)

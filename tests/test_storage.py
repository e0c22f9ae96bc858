"""Storage baseline: fio's JSON report parsed, baseline.json written and picked up by the analysis (object stores:
tests/test_storage_s3.py)."""

import json
import shutil
import subprocess

import pytest
from conftest import run_study

from restartbench import baseline
from restartbench.baseline import BaselineError, MiB, parse_fio, record_baseline, run_fio
from restartbench.rundir import RunPlan

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")


@pytest.fixture(scope="module")
def fio_write_report(tmp_path_factory):
    """stdout of one real fio write job of 8 MiB."""
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (apt-get install fio)")
    path = tmp_path_factory.mktemp("fio") / "file"
    command = ["fio", "--name=w", f"--filename={path}", "--rw=write", "--bs=1M", f"--size={8 * MiB}",
               "--end_fsync=1", "--output-format=json"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_parse_fio_reads_bandwidth_of_the_asked_side(fio_write_report):
    report = json.loads(fio_write_report)["jobs"][0]["write"]
    parsed = parse_fio(fio_write_report, "write")
    assert parsed["io_bytes"] == 8 * MiB
    assert parsed["MBps"] == pytest.approx(report["bw_bytes"] / 1e6) and parsed["MBps"] > 0
    assert parsed["version"].startswith("fio-")
    with pytest.raises(BaselineError, match="moved no data"):
        parse_fio(fio_write_report, "read")


def test_parse_fio_skips_notes_before_the_json(fio_write_report):
    noisy = "note: both iodepth >= 1 and synchronous I/O engine are selected\n" + fio_write_report
    assert parse_fio(noisy, "write") == parse_fio(fio_write_report, "write")
    with pytest.raises(BaselineError, match="no JSON report"):
        parse_fio("fio: some failure\n", "write")


@needs_fio
def test_run_fio_names_the_failure(tmp_path):
    (tmp_path / "a-file").touch()
    with pytest.raises(BaselineError, match="fio read .* exited with 1: .*Not a directory"):
        run_fio(tmp_path / "a-file" / "file", "read", 8 * MiB, "1M", "--direct=1")
    assert record_baseline(tmp_path, tmp_path / "a-file", 8) is None
    assert not (tmp_path / "baseline.json").exists()


@needs_fio
def test_baseline_json_has_positive_numbers_and_fields(tmp_path):
    target = tmp_path / "ckpt:with-colon"
    path = record_baseline(tmp_path, target, 8)
    data = json.loads(path.read_text())
    assert path == tmp_path / "baseline.json" and data["tool"] == "fio"
    assert data["write_MBps"] > 0 and data["read_MBps"] > 0
    assert data["size_bytes"] == 8 * MiB and data["block_size"] == "1M" and data["target"] == str(target)
    assert data["read_method"] in (baseline.READ_DIRECT, baseline.READ_BUFFERED)
    assert data["write_method"] and data["fio_version"].startswith("fio-") and data["measured"].endswith("Z")
    assert list(target.iterdir()) == [], "fio's test file must be removed"


@needs_fio
def test_baseline_larger_than_the_free_space_is_refused(tmp_path, capsys):
    """A 7 MiB tmpfs cannot take 64 MiB: no fio run that would fill the disk the checkpoints need."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        assert record_baseline(tmp_path, small, 64) is None
        assert "less than the 64 MiB the baseline writes" in capsys.readouterr().out
        assert not (tmp_path / "baseline.json").exists() and list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(small)])


@needs_fio
def test_buffered_read_where_o_direct_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(baseline, "direct_io_works", lambda path: False)
    data = baseline.measure(tmp_path, 8)
    assert data["read_method"] == baseline.READ_BUFFERED and data["read_MBps"] > 0


def test_no_fio_means_no_baseline_and_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert record_baseline(tmp_path, tmp_path / "ckpt", 8) is None
    assert not (tmp_path / "baseline.json").exists()
    assert "fio is not installed" in capsys.readouterr().out


@needs_fio
@pytest.mark.multirank
def test_study_run_measures_baseline_and_analysis_reads_it(tmp_path):
    from restartbench.analysis import collect

    logs = tmp_path / "logs"
    proc, run_dir = run_study(logs, "tiny", "tp1pp1dp2", "--dtype", "fp32", "--iters", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "storage baseline: write" in proc.stdout
    jobs, size_mib = baseline.concurrency(RunPlan.load(run_dir), 64)  # one job per rank, each a rank's share
    measured = json.loads((run_dir / "baseline.json").read_text())  # raised to the probe rule's minimum (issue 26)
    assert (measured["jobs"], measured["size_bytes"]) == (jobs, baseline.probe_mib(size_mib, 64) * MiB) == (2, 64 * MiB)
    table = collect(logs).table()
    assert (table["baseline_write_MBps"] > 0).all() and (table["baseline_read_MBps"] > 0).all()


def test_baseline_runs_at_the_checkpoints_concurrency(tmp_path, monkeypatch):
    """Two jobs at once, each on its own file: the report is their aggregate, all bytes of both; nothing is left."""
    commands = []
    real_run = baseline.subprocess.run

    def recording_run(command, **kwargs):
        commands.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr(baseline.subprocess, "run", recording_run)
    data = baseline.measure(tmp_path, 4, jobs=2)
    assert data["jobs"] == 2 and data["size_bytes"] == 4 * MiB and data["write_MBps"] > 0 and data["read_MBps"] > 0
    for command in commands:
        files = [arg.split("=", 1)[1] for arg in command if arg.startswith("--filename=")]
        assert len(files) == len(set(files)) == 2 and "--group_reporting" in command
    assert list(tmp_path.iterdir()) == []


def test_a_report_missing_a_jobs_bytes_is_refused(tmp_path, monkeypatch):
    """fio's group report must count every job: one job's bytes alone would overstate nothing but hide the others'."""
    real_parse = baseline.parse_fio
    monkeypatch.setattr(baseline, "parse_fio", lambda output, rw: real_parse(output, rw) | {"io_bytes": 4 * MiB})
    with pytest.raises(BaselineError, match=r"covers 4194304 bytes, not the 2 × 4194304"):
        baseline.measure(tmp_path, 4, jobs=2)


@pytest.mark.parametrize("error, cause", [
    (ConnectionError("cannot connect to 127.0.0.1:40113: [Errno 111] Connection refused"), "cannot be reached"),
    (OSError("cannot connect to 127.0.0.1:40313: [Errno 111] Connection refused"), "cannot be reached"),
    (OSError("HTTP 403: Forbidden"), "credentials were refused"),
    (OSError("response_status: 401"), "credentials were refused"),
])
def test_an_object_store_error_is_explained_by_its_cause_not_by_digits_in_a_port(error, cause):
    """A port such as 40113 holds '401': it must not read as a refused credential."""
    from restartbench import storage

    where = storage.ObjectLocation.parse("gs://ckpt/run")
    settings = storage.GCSSettings.resolve(endpoint="http://127.0.0.1:40113")
    assert cause in str(storage.explain_error(error, where, settings, "looking up the bucket"))

"""Without fio (the bare GPU image of the first H100 visit), bench/limits.py and a run's own baseline measure with GNU
dd: real dd on small files, no mocks of the measurement."""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from restartbench import baseline
from restartbench.baseline import DD_FULL, DD_QUICK, BaselineError, MiB

BENCH = Path(__file__).resolve().parent.parent / "bench"
ONE_BY_ONE = "dd, a single process per job, queue depth 1"
pytestmark = pytest.mark.skipif(shutil.which("dd") is None, reason="dd is not installed")


def _load(name: str):
    sys.path.insert(0, str(BENCH))  # the scripts import results_io from their folder
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


limits_bench = _load("limits")


@pytest.fixture
def only_dd(tmp_path, monkeypatch):
    """PATH holds dd and nothing else: fio is hidden."""
    folder = tmp_path / "only-dd"
    folder.mkdir()
    (folder / "dd").symlink_to(shutil.which("dd"))
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(limits_bench, "run_meta", lambda *args: (_ for _ in ()).throw(OSError("skip torch import")))
    return folder


def run_limits(tmp_path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "limits.json"
    code = limits_bench.main(["--dir", str(tmp_path / "d"), *args, "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_dd_limits_json_has_the_fio_paths_shape(tmp_path, only_dd):
    """2 jobs x 8 MiB, 2 repeats: every dd method measured twice on all the bytes, each side's limit the highest
    median, the keys bench/gpu_results.py reads, the tool and its version named, the lower bound said."""
    code, data = run_limits(tmp_path, "--jobs", "2", "--mib-per-job", "8", "--repeats", "2")
    assert code == 0
    limits = data["limits"]
    assert data["tool"] == limits["tool"] == "dd" and data["fio"] is None
    assert data["tool_version"] == limits["tool_version"] and data["tool_version"].startswith("dd (")
    assert [m["name"] for m in limits["methods"]] == [m.name for m in DD_FULL]
    for method in limits["methods"]:
        assert method["n"] == 2 and method["tool"] == "dd" and ONE_BY_ONE in method["family"]
        assert all(p["MBps"] > 0 and p["io_bytes"] == 2 * 8 * MiB for p in method["passes"])
        assert method["min_MBps"] <= method["median_MBps"] <= method["max_MBps"]
    for side in ("write", "read"):
        medians = {m["name"]: m["median_MBps"] for m in limits["methods"] if m["rw"] == side}
        assert data[side]["method"] == limits[f"{side}_best"] == max(medians, key=medians.get)
        assert data[side]["best_MBps"] == limits[f"{side}_MBps"] == max(medians.values()) > 0
        assert {"n", "min_MBps", "median_MBps", "max_MBps"} <= set(data[side])
    evicted = next(m for m in limits["methods"] if m["evict_first"])
    assert [p["resident_fraction_before"] for p in evicted["passes"]] == [0.0, 0.0]  # mincore: evicted on ext4
    assert list((tmp_path / "d").iterdir()) == []
    text = limits_bench.markdown(data)
    assert "Measured with dd, not fio" in text and "lower bounds" in text and "2 dd jobs at once" in text
    assert baseline.DD_COST_BOUND in text


def test_gpu_session_reads_the_dd_result(tmp_path, only_dd):
    """bench/gpu_results.py's probe reader takes dd's JSON unchanged."""
    code, data = run_limits(tmp_path, "--jobs", "1", "--mib-per-job", "1", "--repeats", "1")
    assert code == 0
    gpu_results = importlib.import_module("gpu_results")  # bench/ is on sys.path (_load)
    copies = {"d2h_pinned": {"best_GBps": 20.0}, "pin": {"best_s_per_GiB": 0.1}}
    read = gpu_results.limits_of({"copies.json": copies, "limits.json": data})
    assert (read["write_MBps"], read["read_MBps"]) == (data["write"]["best_MBps"], data["read"]["best_MBps"])


def test_without_fio_the_script_chooses_dd(tmp_path, only_dd, capsys):
    """fio hidden from PATH: dd measures and says so; its 8 MiB blocks, which do not divide a 3 MiB file, are
    skipped with why."""
    code, data = run_limits(tmp_path, "--jobs", "1", "--mib-per-job", "3", "--repeats", "1")
    assert code == 0 and data["tool"] == "dd"
    measured = [m["name"] for m in data["limits"]["methods"] if m["n"] == 1]
    assert measured == [m.name for m in DD_QUICK]
    assert all("does not divide" in m["skipped"] for m in data["limits"]["methods"] if m["block_size"] == "8M")
    assert "fio is not installed: dd measures" in capsys.readouterr().err


def test_fio_is_chosen_where_both_are_on_the_path(tmp_path, only_dd, monkeypatch):
    assert baseline.available_tool() == "dd"
    fio = only_dd / "fio"
    fio.write_text("#!/bin/sh\n")
    fio.chmod(0o755)
    assert baseline.available_tool() == "fio"


def test_without_fio_and_dd_it_exits_3_naming_both(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(limits_bench, "run_meta", lambda *args: (_ for _ in ()).throw(OSError("skip torch import")))
    code, data = run_limits(tmp_path, "--jobs", "1", "--mib-per-job", "1", "--repeats", "1")
    assert code == limits_bench.NO_FIO == 3
    assert data["tool"] is None and "fio is not installed" in data["error"] and "nor dd" in data["error"]
    assert "nor dd" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_runs_own_baseline_falls_back_to_dd(tmp_path, only_dd):
    """No fio: the run's baseline.json is dd's quick set, named as dd's, with its cost bound."""
    path = baseline.record_baseline(tmp_path, tmp_path / "ckpt", 2, jobs=2)
    data = json.loads(path.read_text())
    assert data["tool"] == "dd" and "fio_version" not in data and data["cost_bound"] == baseline.DD_COST_BOUND
    assert [m["name"] for m in data["methods"]] == [m.name for m in DD_QUICK]
    assert data["write_MBps"] > 0 and data["read_MBps"] > 0 and ONE_BY_ONE in data["write_method"]
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_dd_names_its_failure(tmp_path):
    with pytest.raises(BaselineError, match="dd write on .* exited with 1: .*No such file or directory"):
        baseline.run_dd([tmp_path / "missing" / "file"], DD_QUICK[0], MiB)


def test_dd_byte_count_is_read_from_its_summary():
    summary = "2+0 records in\n2+0 records out\n16777216 bytes (17 MB, 16 MiB) copied, 0.05 s, 336 MB/s\n"
    assert baseline.dd_bytes(summary) == 16 * MiB
    with pytest.raises(BaselineError, match="no byte count"):
        baseline.dd_bytes("dd: something odd\n")


def test_direct_refused_leaves_the_buffered_methods(tmp_path, only_dd, monkeypatch):
    """Where the filesystem refuses O_DIRECT, only the buffered dd methods run (as with fio)."""
    monkeypatch.setattr(baseline, "direct_io_works", lambda path: False)
    data = baseline.measure(tmp_path / "d", 1, methods=DD_QUICK)
    ran = {m["name"] for m in data["methods"] if m["n"]}
    assert ran == {m.name for m in DD_QUICK if not m.direct}
    assert all("refused O_DIRECT" in m["skipped"] for m in data["methods"] if m["name"] not in ran)
    assert os.listdir(tmp_path / "d") == []

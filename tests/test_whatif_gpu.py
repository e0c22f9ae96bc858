"""bench/whatif_gpu.py without predicting anything: the machine it builds from the GPU probe, the runs it takes from
the stored engine blocks, and what it reads as each run's measured parts."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from restartbench.whatif.cluster import cluster_from_mapping, load_cluster

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load():
    sys.path.insert(0, str(BENCH))  # the script imports results_io from its folder
    spec = importlib.util.spec_from_file_location("bench_whatif_gpu", BENCH / "whatif_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_the_machine_is_the_probe_with_fio_and_the_pinning_the_code_used():
    probe = bench.latest_probe()
    assert probe["limits"]["storage_tool"] == "fio"  # the 2026-11-26 probe had no fio: not taken
    for huge, s_per_gib in ((True, probe["limits"]["engine_pin_huge_s_per_GiB"]),
                            (False, probe["limits"]["engine_pin_s_per_GiB"])):
        cluster = cluster_from_mapping(bench.cluster_fields(probe, *bench.pinning(probe, huge)), "h100-local")
        assert cluster.pin_GBps == pytest.approx(2**30 / 1e9 / s_per_gib)
        assert (cluster.device, cluster.nodes, cluster.gpus_per_node, cluster.storage) == ("cuda", 1, 1, "local")
        assert cluster.local_write_GBps == pytest.approx(probe["limits"]["write_MBps"] / 1e3)
        assert cluster.local_read_GBps == pytest.approx(probe["limits"]["read_MBps"] / 1e3)
        assert cluster.d2h_pinned_GBps == pytest.approx(probe["limits"]["d2h_pinned_GBps"])


def test_only_complete_runs_are_compared_and_each_names_its_block():
    runs = bench.stored_runs()
    assert runs and all(r["status"] == "complete" for r in runs)
    assert {"torch", "dcp", "lazy-direct"} <= {r["label"] for r in runs}
    assert "datastates" not in {r["label"] for r in runs}  # its run stopped at its first save
    direct = next(r for r in runs if r["label"] == "lazy-direct")
    assert direct["engine"] == "lazy" and direct["commit"].startswith("dd0987e")


def test_a_runs_measured_parts_are_the_models_names_without_the_checks():
    run = next(r for r in bench.stored_runs() if r["label"] == "dcp")
    parts = bench.measured(run)
    assert set(parts) == set(bench.PARTS)  # convert (None on its own layout) is no part
    assert parts["ckpt load"] == run["restart_parts_s"]["ckpt_load"]
    assert parts["restart total"] == run["restart_less_checks_s"] < run["restart_s"]
    assert parts["whole cost"] == run["cost_s"]


def test_the_shipped_h100_local_cluster_is_what_the_bench_writes_from_the_latest_probe():
    probe = bench.latest_probe()
    shipped = yaml.safe_load(bench.WRITTEN.read_text())
    assert shipped == bench.cluster_fields(probe, *bench.pinning(probe, huge=True))
    assert load_cluster(bench.WRITTEN).calibration == "cpu2-fit.json"  # beside it in clusters/

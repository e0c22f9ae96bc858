"""The CPU share factor of the what-if model: with P processes on a node of C cores each gets min(1, C/P) of a core, so
the stall's host-side line and the CPU-bound start-up parts take max(1, P/C) times their time with a core each. Each
term against a hand-computed figure, the fit recovering a known factor from a synthetic table, the cluster field's
refusal where an old file lacks it, and the fit file's stated default where an old one lacks its core count."""

import json
from dataclasses import replace

import pandas as pd
import pytest
import yaml
from whatif_cases import JOB, ROOT, h100_cluster, h100_raw

from restartbench.whatif import terms
from restartbench.whatif.cluster import ClusterError, cluster_from_mapping
from restartbench.whatif.fit import Fit, Limits, fit_table, read_fit, to_json, write_fit
from restartbench.whatif.predict import restart_parts
from restartbench.whatif.terms import GB, Line
from restartbench.whatif.validation import nodes_on_one_host

# -- the factor and the terms -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("processes", "cores", "factor"), [(4, 2, 2.0), (2, 2, 1.0), (1, 2, 1.0), (3, 2, 1.5),
                                                            (8, 112, 1.0), (8, 1, 8.0)])
def test_the_factor_is_processes_over_cores_never_below_one(processes, cores, factor):
    assert terms.cpu_share_factor(processes, cores) == factor


def test_the_jobs_factor_is_its_nodes_processes_over_the_clusters_cores():
    assert terms.job_cpu_factor(JOB, h100_cluster(cpu_cores_per_node=2)) == 4.0
    assert terms.job_cpu_factor(JOB, h100_cluster()) == 1.0  # 8 ranks on the H100 node's 112 cores


def test_the_stall_scales_its_host_line_not_the_d2h_copy():
    line = Line(0.5, {"files": 0.1, "bytes": 1 / (0.8 * GB)})
    host = 0.5 + 0.3 + 2 / 0.8  # 3.55 s with a core per process
    # cpu, 8 processes on 2 cores: 4 × the host line
    on_cpu = h100_cluster(device="cpu", cpu_cores_per_node=2)
    assert terms.stall_s(line, "torch", JOB, on_cpu) == pytest.approx(4 * host)
    # cuda, 8 processes on 4 cores: the pageable D2H (2 GB at 11 GB/s) as it is, 2 × the host line
    assert terms.stall_s(line, "torch", JOB, h100_cluster(cpu_cores_per_node=4)) == pytest.approx(2 / 11 + 2 * host)
    assert terms.stall_s(line, "torch", JOB, h100_cluster()) == pytest.approx(2 / 11 + host)  # 112 cores: 1


def test_dist_init_scales_the_measured_line_not_the_cited_rendezvous():
    cluster = h100_cluster(cpu_cores_per_node=4, dist_init_anchor_ranks=100_000, dist_init_anchor_s=100.0)
    line = Line(1.0, {"ranks": 0.5})
    assert terms.dist_init_s(line, replace(JOB, ranks=4), cluster, 4) == 2 * 3.0
    beyond = terms.dist_init_s(line, replace(JOB, ranks=16_384), cluster, 4)
    assert beyond == pytest.approx(2 * 3.0 + (16_384 - 4) * 1e-3)


def test_engine_setup_scales_the_fitted_constant_not_the_pinning():
    # lazy on cuda, 8 processes on 2 cores: 4 × 0.3 s, plus 2 GB pinned at 2 GB/s
    assert terms.engine_setup_s(Line(0.3), "lazy", JOB, h100_cluster(pin_GBps=2.0, cpu_cores_per_node=2)) \
        == pytest.approx(4 * 0.3 + 1.0)


def _fit() -> Fit:
    startup = {"launch": Line(2.0), "imports": Line(3.0), "dist init": Line(0.1, {"ranks": 0.05}),
               "model build": Line(1.0, {"params": 1e-9}), "ds init": Line(0.5, {"params": 2e-9}),
               "1st iter ratio": Line(1.5), "gaps": Line(0.4)}
    engine = {"stall": Line(0.1), "durable": Line(0.2), "load": Line(0.7), "engine setup": Line(0.05)}
    return Fit(Limits(1.0, 2.0, "synthetic"), calibrated_ranks=64, engines={"torch": engine}, startup=startup)


def test_every_cpu_bound_restart_part_takes_the_factor_and_launch_and_the_load_do_not():
    job = replace(JOB, ranks=4, nodes=1, concurrency=4)  # 4 processes on 2 cores: factor 2
    parts = restart_parts("torch", job, _fit(), h100_cluster(device="cpu", storage="local", cpu_cores_per_node=2), 1.0)
    expected = {"launch": 2.0, "imports": 2 * 3.0, "dist init": 2 * (0.1 + 0.05 * 4), "model build": 2 * (1.0 + 1.0),
                "ds init": 2 * (0.5 + 2.0), "engine setup": 2 * 0.05, "ckpt load": 0.7, "1st iter": 1.5,
                "gaps": 2 * 0.4}
    assert {name: parts[name]["s"] for name in expected} == pytest.approx(expected)
    assert parts["total"]["s"] == pytest.approx(sum(expected.values()))
    assert set(terms.CPU_BOUND) == {"imports", "dist init", "model build", "ds init", "engine setup", "gaps"}


def test_slurm_nodes_on_one_host_share_its_cores():
    cluster = h100_cluster(device="cpu", storage="local", cpu_cores_per_node=2)
    assert nodes_on_one_host(cluster, 2).cpu_cores_per_node == 1
    assert nodes_on_one_host(h100_cluster(storage="local", cpu_cores_per_node=3), 2).cpu_cores_per_node == 1
    assert nodes_on_one_host(cluster, 1).cpu_cores_per_node == 2


# -- the fit -----------------------------------------------------------------------------------------------------

LIMITS = Limits(write_GBps=1.0, read_GBps=2.0, source="synthetic")
CORES = 2
STALL = (0.05, 0.002, 1 / (0.8 * GB))  # a, f, s with a core per process


def _table(cores: int = CORES) -> pd.DataFrame:
    """Runs of 2 and 4 ranks on one node of ``cores`` cores whose CPU-bound times are the known constants × the
    factor max(1, ranks / cores)."""
    rows = []
    for i in range(4):
        bytes_rank, files_rank, ranks = (i + 1) * 1e8, 2 + 3 * (i % 2), 2 + 2 * (i // 2)
        factor = max(1.0, ranks / cores)
        a, f, s = STALL
        common = {"run_id": f"r{i}", "engine": "torch", "preset": "tiny" if i % 2 else "small", "layout": "x",
                  "tp": 1, "pp": 1, "ranks": ranks, "nodes": 1, "iteration_s": factor * 0.5,
                  "restore_layout": None}
        rows.append({**common, "kind": "checkpoint", "bytes_per_rank_max": bytes_rank,
                     "files_per_rank_max": files_rank, "bytes": bytes_rank * ranks, "files": files_rank * ranks,
                     "stall_max_s": factor * (a + f * files_rank + s * bytes_rank),
                     "durable_rank_max_s": 0.1 + 0.003 * files_rank + 2.5 * bytes_rank * ranks / GB,
                     "background_seen": False})
        rows.append({**common, "kind": "restart", "restart_ckpt_load_s": 0.2 + 0.004 * files_rank
                     + 1.5 * bytes_rank * ranks / (2 * GB), "restart_launch_s": 2.0,
                     "restart_imports_s": factor * 3.0, "restart_dist_init_s": factor * (0.1 + 0.05 * ranks),
                     "restart_model_build_s": factor * 1.2, "restart_ds_init_s": factor * 0.8,
                     "restart_engine_setup_s": factor * 0.01, "restart_1st_iter_s": factor * 0.75,
                     "path_gaps_s": factor * 0.4})
    return pd.DataFrame(rows)


def test_the_fit_recovers_the_constants_with_a_core_each_from_runs_of_two_factors():
    fit = fit_table(_table(), LIMITS, cores_per_node=CORES)
    assert fit.cores_per_node == CORES
    for part, value in {"imports": 3.0, "gaps": 0.4}.items():
        line = fit.startup[part]
        assert line.intercept == pytest.approx(value) and (line.low, line.high) == pytest.approx((0, 0)), part
    for part, value in {"model build": 1.2, "ds init": 0.8}.items():  # params differ: a line through a constant
        line = fit.startup[part]
        assert line(params=1e8) == pytest.approx(value) and (line.low, line.high) == pytest.approx((0, 0), abs=1e-9)
    assert fit.startup["dist init"].intercept == pytest.approx(0.1)
    assert fit.startup["dist init"].coefficients["ranks"] == pytest.approx(0.05)
    assert fit.startup["launch"].intercept == pytest.approx(2.0)  # not CPU-bound: as measured
    assert fit.startup["1st iter ratio"].intercept == pytest.approx(1.5)  # a ratio within one run: as measured
    stall = fit.engines["torch"]["stall"]
    assert stall.intercept == pytest.approx(STALL[0], rel=1e-6)
    assert stall.coefficients["files"] == pytest.approx(STALL[1], rel=1e-6)
    assert stall.coefficients["bytes"] == pytest.approx(STALL[2], rel=1e-6)
    assert fit.engines["torch"]["engine setup"].intercept == pytest.approx(0.01)
    assert fit.engines["torch"]["load"].coefficients["at_limit"] == pytest.approx(1.5, rel=1e-6)  # not divided


def test_without_the_cores_the_fit_keeps_the_times_as_measured_and_cannot_fit_the_two_factors():
    fit = fit_table(_table(), LIMITS)
    assert fit.cores_per_node is None
    imports = fit.startup["imports"]
    assert (imports.low, imports.high) != pytest.approx((0, 0))  # 3 s and 6 s: one constant cannot hold both
    # runs that each had a core per process give the same constants either way
    assert fit_table(_table(cores=4), LIMITS).startup["imports"].intercept == pytest.approx(3.0)
    assert fit_table(_table(cores=4), LIMITS, cores_per_node=4).startup["imports"].intercept == pytest.approx(3.0)


def test_the_fit_file_keeps_the_core_count_and_an_old_one_reads_as_not_divided(tmp_path):
    fit = fit_table(_table(), LIMITS, cores_per_node=CORES)
    path = tmp_path / "fit.json"
    write_fit(fit, path)
    assert read_fit(path).cores_per_node == CORES
    old = to_json(fit)
    del old["cores_per_node"]
    path.write_text(json.dumps(old))
    assert read_fit(path).cores_per_node is None


# -- the cluster file ------------------------------------------------------------------------------------------------


def test_an_old_cluster_file_without_the_core_count_is_refused_saying_how_to_give_it():
    raw = h100_raw()
    del raw["cpu_cores_per_node"]
    with pytest.raises(ClusterError, match=r"field 'cpu_cores_per_node' is missing.*os\.cpu_count\(\).*datasheet"):
        cluster_from_mapping(raw)
    with pytest.raises(ClusterError, match="'cpu_cores_per_node' must be above 0"):
        h100_cluster(cpu_cores_per_node=0)
    with pytest.raises(ClusterError, match="'cpu_cores_per_node' must be an integer"):
        h100_cluster(cpu_cores_per_node=1.5)


def test_the_example_clusters_state_their_cores_and_where_they_come_from():
    h100 = h100_cluster()
    assert h100.cpu_cores_per_node == 112 and h100.assumed("cpu_cores_per_node")
    assert "DGX H100" in h100.sources["cpu_cores_per_node"][1]
    cpu2 = cluster_from_mapping(yaml.safe_load((ROOT / "clusters" / "cpu2.yaml").read_text()))
    assert cpu2.cpu_cores_per_node == 2 and cpu2.sources["cpu_cores_per_node"][0] == "probe"
    assert "os.cpu_count()" in cpu2.sources["cpu_cores_per_node"][1]

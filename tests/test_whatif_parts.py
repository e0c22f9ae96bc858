"""restartbench.whatif.predict part by part: each checkpoint and restart part's value, range, bound and "assumed" mark
against docs/whatif.md's forms with hand-computed figures; the split of a plan's files into module and optimizer
shares; the goodput, the sweep against scale and the whole prediction's fields; the refusals' messages."""

from dataclasses import replace

import pytest
from whatif_cases import JOB, h100_raw

from restartbench import goodput
from restartbench.layout import Layout
from restartbench.plan import CheckpointPlan, doc_config, predict
from restartbench.presets import get_preset
from restartbench.sizes import PlannedFile
from restartbench.whatif import predict as whatif_predict
from restartbench.whatif import tensors
from restartbench.whatif.cluster import NUMBER_FIELDS, Cluster, cluster_from_mapping
from restartbench.whatif.fit import Fit, Limits
from restartbench.whatif.predict import (
    COLLECTIVE_PLAN_DP,
    RESTART_PARTS,
    Shape,
    WhatIfError,
    assumed_fields,
    check_fits,
    checkpoint_parts,
    cited_numbers,
    device_note,
    goodput_at,
    iteration_s_for,
    job_for,
    mark_cited,
    part,
    plan_for,
    planned_at,
    predict_engine,
    ranks_at,
    restart_parts,
    scale_sweep,
    shape_of,
    shapes_for,
    whatif,
)
from restartbench.whatif.terms import GB, Line

# -- a fit and clusters with known figures ---------------------------------------------------------------------

STARTUP = {"launch": Line(2.0, low=-0.1, high=0.2), "imports": Line(3.0, low=-0.2, high=0.1),
           "dist init": Line(0.1, {"ranks": 0.05}, low=-0.3, high=0.4),
           "model build": Line(1.0, {"params": 1e-9}, low=-0.15, high=0.25),
           "ds init": Line(0.5, {"params": 2e-9}, low=-0.05, high=0.35),
           "1st iter ratio": Line(1.5, low=-0.25, high=0.3), "gaps": Line(0.4, low=-0.4, high=0.45)}
#: σ as a calibration measured it (runs named): a line with a spread.
SIGMA = Line(0.3, low=-0.5, high=0.5, runs=("r1", "r2"))


def _lines(**changes: Line | None) -> dict[str, Line]:
    """An engine's lines: stall a + f·files + bytes/r (r = 1 GB/s), durable and load with η = 0.5 and 2/3."""
    lines = {"stall": Line(0.1, {"files": 0.01, "bytes": 1 / GB}, low=-0.2, high=0.3),
             "durable": Line(0.2, {"files": 0.02, "at_limit": 2.0}, low=-0.1, high=0.5),
             "load": Line(0.7, {"files": 0.03, "at_limit": 1.5}, low=-0.35, high=0.15),
             "engine setup": Line(0.05, low=-0.5, high=0.6), "slowdown": SIGMA, **changes}
    return {name: line for name, line in lines.items() if line is not None}


def _fit(device: str = "cuda", calibrated_ranks: int = 64, engines: dict | None = None,
         **startup: Line) -> Fit:
    engines = engines or {"torch": _lines(), "lazy": _lines(), "dcp-async": _lines()}
    return Fit(Limits(1.0, 2.0, "synthetic"), calibrated_ranks, engines=engines, startup={**STARTUP, **startup},
               device=device)


def _cluster(cited: tuple[str, ...] = (), measured: tuple[str, ...] = (), **values) -> Cluster:
    """clusters/h100-pfs.yaml (cuda, 8 GPUs and 112 cores a node, shared storage with every shared figure cited,
    σ 0.067 cited), with values changed and fields' bases set to cited or measured (probe)."""
    raw = h100_raw()
    for name, value in values.items():
        raw[name]["value"] = value
    for name in cited:
        raw[name]["basis"] = "cited"
    for name in measured:
        raw[name]["basis"] = "probe"
    return cluster_from_mapping(raw, "test.yaml")


#: The H100 node's own disk (1.4 GB/s write, 2.0 GB/s read, measured); the shared file system's cited figures stay
#: in the file but do not enter.
LOCAL = _cluster(storage="local")
SHARED_FIELDS = ("shared_write_GBps", "shared_read_GBps", "shared_per_client_GBps", "nic_GBps")

# JOB (tests/whatif_cases.py): 16 ranks on 2 nodes, 8 writing at once, 2 GB and 3 files a rank, 10 GB and 24 files
# the busiest node, 1e9 parameters a rank; 8 processes on 112 cores: the CPU share factor is 1.
PAGEABLE_D2H = 2 / 11  # 2 GB at the pageable 11 GB/s
PINNED_D2H = 2 / 53.5  # 2 GB at the pinned 53.5 GB/s
HOST = 0.1 + 0.01 * 3 + 2.0  # the stall's host line: a + f·files_rank + bytes_rank / (1 GB/s)
DURABLE_LOCAL = 0.2 + 0.02 * 24 / 8 + 2.0 * 10 / 1.4  # a + f·files_node/concurrency + bytes_node/(η·L), L = 1.4
SIGMA_CITED = 0.067


def _range(part_: dict) -> tuple[float, float]:
    return part_["low_s"], part_["high_s"]


# -- part: a figure's range ------------------------------------------------------------------------------------


def test_a_figure_s_range_is_its_line_s_spread_and_a_fixed_share_has_none():
    line = Line(1.0, low=-0.2, high=0.5)
    assert part(10.0, line, "x") == {"s": 10.0, "low_s": pytest.approx(8.0), "high_s": pytest.approx(15.0),
                                     "bound": "x", "assumed": False, "cited": ()}
    # 4 s of the 10 are a measured copy: the spread applies to the other 6 s only
    assert _range(part(10.0, line, "x", fixed=4.0)) == pytest.approx((4.0 + 6 * 0.8, 4.0 + 6 * 1.5))
    # a figure without a line has no range, with or without a fixed share
    assert _range(part(10.0, None, "x", fixed=4.0)) == (10.0, 10.0)


# -- the checkpoint's parts --------------------------------------------------------------------------------------


def test_torch_on_cuda_stalls_for_the_pageable_copy_and_its_host_line_and_has_no_slowdown():
    parts = checkpoint_parts("torch", JOB, _fit(), LOCAL)
    stall, durable, slowdown, cost = parts["stall"], parts["durable"], parts["slowdown"], parts["cost"]
    assert stall["s"] == pytest.approx(PAGEABLE_D2H + HOST)
    # the copy is measured (no spread); the host line has the stall line's spread
    assert _range(stall) == pytest.approx((PAGEABLE_D2H + 0.8 * HOST, PAGEABLE_D2H + 1.3 * HOST))
    assert stall["bound"] == "host CPU (the engine's blocking path)" and stall["assumed"] is False
    assert durable["s"] == pytest.approx(PAGEABLE_D2H + DURABLE_LOCAL)
    assert _range(durable) == pytest.approx((PAGEABLE_D2H + 0.9 * DURABLE_LOCAL, PAGEABLE_D2H + 1.5 * DURABLE_LOCAL))
    assert durable["bound"] == "node disk" and durable["assumed"] is False
    # synchronous: training waits, nothing slows down, whatever σ the cluster cites
    assert slowdown == {"s": 0.0, "low_s": 0.0, "high_s": 0.0, "bound": "interference with training",
                        "assumed": False, "cited": []}
    assert cost == {"s": pytest.approx(stall["s"]), "low_s": pytest.approx(stall["low_s"]),
                    "high_s": pytest.approx(stall["high_s"]), "bound": "host CPU (the engine's blocking path)",
                    "assumed": False, "cited": []}


def test_a_stall_that_is_mostly_the_copy_out_of_the_gpu_is_bound_by_d2h():
    fit = _fit(engines={"torch": _lines(stall=Line(0.05))})  # 0.05 s of host work against a 0.18 s copy
    parts = checkpoint_parts("torch", JOB, fit, LOCAL)
    assert parts["stall"]["s"] == pytest.approx(PAGEABLE_D2H + 0.05)
    assert parts["stall"]["bound"] == "D2H" and parts["cost"]["bound"] == "D2H"


def test_the_lazy_engine_on_cuda_blocks_for_its_fixed_costs_and_its_copy_is_slowdown_at_the_cited_sigma():
    parts = checkpoint_parts("lazy", JOB, _fit(), LOCAL)  # the fit measured σ = 0.3, but not on a GPU
    stall, slowdown, cost = parts["stall"], parts["slowdown"], parts["cost"]
    fixed = 0.1 + 0.01 * 3  # a + f·files_rank: its bytes go by the side stream
    assert stall["s"] == pytest.approx(fixed)
    assert _range(stall) == pytest.approx((0.8 * fixed, 1.3 * fixed))
    assert stall["bound"] == "host CPU (the engine's blocking path)"
    durable = PINNED_D2H + DURABLE_LOCAL
    assert parts["durable"]["s"] == pytest.approx(durable)
    # D2H + σ · (durable − stall − D2H), σ the cluster's cited figure: no spread, assumed
    expected = PINNED_D2H + SIGMA_CITED * (durable - fixed - PINNED_D2H)
    assert slowdown == {"s": pytest.approx(expected), "low_s": pytest.approx(expected),
                        "high_s": pytest.approx(expected), "bound": "D2H beside training (side stream)",
                        "assumed": True, "cited": ["async_slowdown_fraction"]}
    assert cost["s"] == pytest.approx(fixed + expected)
    assert _range(cost) == pytest.approx((0.8 * fixed + expected, 1.3 * fixed + expected))
    assert cost["bound"] == "D2H beside training (side stream)" and cost["cited"] == ["async_slowdown_fraction"]


def test_an_asynchronous_engine_without_a_side_stream_slows_training_by_sigma_of_its_background_time():
    parts = checkpoint_parts("dcp-async", JOB, _fit(), LOCAL)  # its stager's pageable copy, in the stall
    stall = PAGEABLE_D2H + HOST
    durable = PAGEABLE_D2H + DURABLE_LOCAL
    assert parts["stall"]["s"] == pytest.approx(stall)
    assert parts["slowdown"]["s"] == pytest.approx(SIGMA_CITED * (durable - stall))
    assert parts["slowdown"]["bound"] == "interference with training" and parts["slowdown"]["assumed"] is True


#: A collective save's coordinator: 1e6 items planned at 50 µs an item (the CPU share factor is 1).
PLANNING = 50.0


@pytest.mark.parametrize("engine", ["dcp", "dcp-async", "torch"])
def test_a_collective_engines_coordinator_is_in_its_durable_time_and_a_synchronous_ones_stall(engine):
    fit = replace(_fit(engines={name: _lines() for name in ("dcp", "dcp-async", "torch")}),
                  collective_plan_s_per_item=PLANNING / 1e6)
    parts = checkpoint_parts(engine, replace(JOB, items_planned=1e6), fit, LOCAL)
    stall = PAGEABLE_D2H + HOST + (PLANNING if engine == "dcp" else 0.0)
    durable = PAGEABLE_D2H + DURABLE_LOCAL + (PLANNING if engine != "torch" else 0.0)
    assert parts["stall"]["s"] == pytest.approx(stall) and parts["durable"]["s"] == pytest.approx(durable)
    # measured, as the copy out is: the spread is the lines' alone
    assert _range(parts["stall"]) == pytest.approx((stall - 0.2 * HOST, stall + 0.3 * HOST))
    assert _range(parts["durable"]) == pytest.approx((durable - 0.1 * DURABLE_LOCAL, durable + 0.5 * DURABLE_LOCAL))
    planned = "the coordinator's planning (one process's CPU)"
    assert (parts["stall"]["bound"] == planned) is (engine == "dcp")
    assert (parts["durable"]["bound"] == planned) is (engine != "torch")
    if engine == "dcp-async":  # planned on its save's thread, beside training
        assert parts["slowdown"]["s"] == pytest.approx(SIGMA_CITED * (durable - stall))


@pytest.mark.parametrize(("engine", "planning"), [("dcp", 20.0), ("dcp-async", 20.0), ("torch", 0.0)])
def test_a_collective_engines_load_waits_for_its_coordinator(engine, planning):
    fit = replace(_fit(engines={name: _lines() for name in ("dcp", "dcp-async", "torch")}),
                  collective_load_plan_s_per_item=20.0 / 1e6)
    without = restart_parts(engine, JOB, fit, LOCAL, iteration_s=1.0)["ckpt load"]
    load = restart_parts(engine, replace(JOB, items_planned=1e6), fit, LOCAL, iteration_s=1.0)["ckpt load"]
    assert load["s"] == pytest.approx(without["s"] + planning)
    assert _range(load) == pytest.approx((without["low_s"] + planning, without["high_s"] + planning))
    assert load["bound"] == ("the coordinator's planning (one process's CPU)" if planning else without["bound"])


def test_a_fit_without_the_coordinators_rate_leaves_it_out():
    fit = _fit(engines={"dcp": _lines()})
    assert fit.collective_plan_s_per_item is None
    parts = checkpoint_parts("dcp", replace(JOB, items_planned=1e6), fit, LOCAL)
    assert parts["stall"]["s"] == pytest.approx(PAGEABLE_D2H + HOST)


def test_on_cpu_the_slowdown_is_the_calibrations_sigma_with_its_spread():
    cpu = _cluster(storage="local", device="cpu")
    parts = checkpoint_parts("lazy", JOB, _fit(device="cpu"), cpu)
    assert parts["stall"]["s"] == pytest.approx(HOST)  # no D2H on cpu: the staging copy is the host line's bytes
    expected = 0.3 * (DURABLE_LOCAL - HOST)
    slowdown = parts["slowdown"]
    assert slowdown["s"] == pytest.approx(expected)
    assert _range(slowdown) == pytest.approx((0.5 * expected, 1.5 * expected))
    assert slowdown["bound"] == "interference with training" and slowdown["assumed"] is False
    assert parts["cost"]["assumed"] is False


@pytest.mark.parametrize("sigma", [Line(0.3), None], ids=["measured-by-no-run", "not-fitted"])
def test_without_a_measured_sigma_the_cluster_s_cited_one_is_taken_and_marked(sigma):
    cpu = _cluster(storage="local", device="cpu")
    parts = checkpoint_parts("lazy", JOB, _fit(device="cpu", engines={"lazy": _lines(slowdown=sigma)}), cpu)
    expected = SIGMA_CITED * (DURABLE_LOCAL - HOST)
    assert parts["slowdown"]["s"] == pytest.approx(expected)
    assert _range(parts["slowdown"]) == pytest.approx((expected, expected))
    assert parts["slowdown"]["assumed"] is True and parts["cost"]["assumed"] is True


# -- what marks the storage's figures assumed ----------------------------------------------------------------------


def _storage_parts(cluster: Cluster) -> tuple[dict, dict]:
    fit = _fit(device="cpu")
    return (checkpoint_parts("torch", JOB, fit, cluster)["durable"],
            restart_parts("torch", JOB, fit, cluster, 1.0)["ckpt load"])


def test_a_cited_aggregate_write_figure_that_bounds_the_write_marks_the_durable_time():
    # 6 GB/s over 2 nodes = 3 GB/s a node, below the 40 GB/s per-client cap and the 50 GB/s NIC: 10 GB in 6.7 s
    cluster = _cluster(cited=("shared_write_GBps",), measured=SHARED_FIELDS[1:], device="cpu",
                       shared_write_GBps=6.0, shared_per_client_GBps=40.0)
    durable, load = _storage_parts(cluster)
    assert durable["s"] == pytest.approx(0.2 + 0.02 * 3 + 2.0 * 10 / 3)
    assert durable["bound"] == "shared file system (aggregate share)" and durable["cited"] == ["shared_write_GBps"]
    assert load["assumed"] is False  # a read: the write's figure does not enter it


def test_a_durable_time_that_is_the_stall_is_not_marked_by_the_storage_it_did_not_wait_for():
    # a synchronous save is durable no sooner than its stall: 30 GB/s a node writes 10 GB in 0.93 s, the stall is
    # 2.13 s, so the cited aggregate figure moves nothing
    cluster = _cluster(cited=("shared_write_GBps",), measured=SHARED_FIELDS[1:], device="cpu",
                       shared_write_GBps=60.0, shared_per_client_GBps=40.0)
    durable, _ = _storage_parts(cluster)
    assert durable["s"] == pytest.approx(HOST) and durable["assumed"] is False
    # the stall's figure, range and bound: the storage does not bound it
    stall = checkpoint_parts("torch", JOB, _fit(device="cpu"), cluster)["stall"]
    assert _range(durable) == _range(stall)
    assert durable["bound"] == "host CPU (the engine's blocking path), durable as the save returns"


def test_a_cited_aggregate_read_figure_that_bounds_the_read_marks_the_load():
    cluster = _cluster(cited=("shared_read_GBps",), measured=("shared_write_GBps", *SHARED_FIELDS[2:]),
                       device="cpu", shared_read_GBps=60.0, shared_per_client_GBps=40.0)
    _, load = _storage_parts(cluster)
    assert load["bound"] == "shared file system (aggregate share)" and load["assumed"] is True


def test_a_cited_per_client_cap_that_bounds_both_marks_the_durable_time_and_the_load():
    cluster = _cluster(cited=("shared_per_client_GBps",), measured=(*SHARED_FIELDS[:2], "nic_GBps"), device="cpu",
                       shared_per_client_GBps=2.0)
    durable, load = _storage_parts(cluster)
    assert durable["bound"] == load["bound"] == "shared file system (per-client cap)"
    assert durable["cited"] == load["cited"] == ["shared_per_client_GBps"]


@pytest.mark.parametrize("storage", ["local", "shared"])
def test_a_cited_limit_that_binds_marks_the_durable_time_and_the_load_whichever_it_is(storage):
    # the node's own disk, or a NIC slower than the shared file system's share and cap: cited, they mark both
    name, resource = ("local_write_GBps", "node disk") if storage == "local" else ("nic_GBps", "network (NIC)")
    cited = ("local_write_GBps", "local_read_GBps") if storage == "local" else ("nic_GBps",)
    measured = tuple(f for f in (*SHARED_FIELDS, "local_write_GBps", "local_read_GBps") if f not in cited)
    cluster = _cluster(cited=cited, measured=measured, device="cpu", storage=storage, nic_GBps=1.0)
    durable, load = _storage_parts(cluster)
    assert durable["bound"] == load["bound"] == resource
    assert durable["cited"] == [name] and load["cited"] == [cited[-1]]


def test_a_measured_shared_file_system_marks_nothing():
    durable, load = _storage_parts(_cluster(measured=SHARED_FIELDS, device="cpu"))
    assert durable["assumed"] is False and load["assumed"] is False


def test_a_write_bound_by_a_measured_nic_is_not_marked_by_the_file_system_s_cited_figures():
    cluster = _cluster(measured=("nic_GBps",), device="cpu", nic_GBps=10.0)  # the file system's figures cited
    durable, _ = _storage_parts(cluster)
    assert durable["bound"] == "network (NIC)" and durable["assumed"] is False


def test_the_node_s_own_disk_is_not_marked_by_the_shared_file_system_s_cited_figures():
    durable, load = _storage_parts(_cluster(storage="local", device="cpu"))
    assert durable["bound"] == load["bound"] == "node disk"
    assert durable["assumed"] is False and load["assumed"] is False


def test_a_cited_read_figure_does_not_mark_the_durable_time():
    # fixed: the durable time was marked by any of the shared file system's cited figures, the read's included
    cluster = _cluster(cited=("shared_read_GBps",), measured=("shared_write_GBps", *SHARED_FIELDS[2:]),
                       device="cpu", shared_write_GBps=6.0, shared_read_GBps=6.0)
    durable, load = _storage_parts(cluster)
    assert durable["bound"] == "shared file system (aggregate share)" and durable["assumed"] is False
    assert load["cited"] == ["shared_read_GBps"]


# -- what else a cited constant marks: every figure it enters, and only those -----------------------------------


def _all_measured(**values) -> Cluster:
    """clusters/h100-pfs.yaml on the node's disk with every number field measured but those ``cited=`` names."""
    cited = values.pop("cited", ())
    measured = tuple(name for name, (basis, _) in _cluster().sources.items()
                     if basis == "cited" and name not in cited and name in NUMBER_FIELDS)
    return _cluster(cited=cited, measured=measured, **{"storage": "local", **values})


def _marked(result: dict) -> dict[str, list[str]]:
    """Every figure of an engine's prediction that is marked: 'section/part' → the cited constants named."""
    figures = {f"checkpoint/{k}": v for k, v in result["checkpoint"].items()}
    figures |= {f"restart/{k}": v for k, v in result["restart"].items()} | {"goodput": result["goodput"]}
    return {name: f["cited"] for name, f in figures.items() if f["assumed"]}


def test_a_cluster_without_a_cited_constant_marks_nothing():
    assert _marked(predict_engine("lazy", JOB, _fit(), _all_measured(), ITERATION, 1e-5)) == {}


@pytest.mark.parametrize("engine,marked", [
    ("torch", {"checkpoint/stall", "checkpoint/durable", "checkpoint/cost", "goodput"}),  # pageable, in the stall
    ("lazy", {"checkpoint/durable", "checkpoint/slowdown", "checkpoint/cost", "goodput"}),  # pinned, beside
])
def test_a_cited_d2h_rate_marks_the_figures_the_copy_enters(engine, marked):
    rate = "d2h_pageable_GBps" if engine == "torch" else "d2h_pinned_GBps"
    result = predict_engine(engine, JOB, _fit(), _all_measured(cited=(rate,)), ITERATION, 1e-5)
    assert _marked(result) == {name: [rate] for name in marked}
    # on cpu the state is in host memory: no copy out of a GPU, nothing marked
    on_cpu = predict_engine(engine, JOB, _fit(device="cpu"), _all_measured(cited=(rate,), device="cpu"), ITERATION,
                            1e-5)
    assert _marked(on_cpu) == {}


def test_a_cited_pinning_rate_marks_the_lazy_engine_s_set_up_or_its_prefetched_read():
    cluster = _all_measured(cited=("pin_GBps",))
    assert _marked(predict_engine("lazy", JOB, _fit(), cluster, ITERATION, 1e-5)) == {
        "restart/engine setup": ["pin_GBps"], "restart/total": ["pin_GBps"], "goodput": ["pin_GBps"]}
    assert _marked(predict_engine("torch", JOB, _fit(), cluster, ITERATION, 1e-5)) == {}  # torch pins nothing
    # prefetched, the pinning moves onto the read's thread: a read the start-up hides does not wait for it
    early = predict_engine("lazy", JOB, _fit(engines={"lazy": _lines(load=Line(30.0))}), cluster, ITERATION, 1e-5,
                           prefetch=True)
    assert "restart/engine setup" not in _marked(early) and _marked(early)["restart/ckpt load"] == ["pin_GBps"]


def test_a_cited_core_count_marks_the_cpu_work_only_where_processes_outnumber_cores():
    crowded = predict_engine("torch", JOB, _fit(), _all_measured(cited=("cpu_cores_per_node",),
                                                                cpu_cores_per_node=4), ITERATION, 1e-5)
    # 8 processes on 4 cores: the stall's host line and the CPU-bound start-up parts are scaled by 8/4 (the durable
    # time, the disk's 14.5 s, is longer than the stall's 4.4 s either way)
    assert set(_marked(crowded)) == {"checkpoint/stall", "checkpoint/cost", "restart/imports",
                                     "restart/dist init", "restart/model build", "restart/ds init",
                                     "restart/engine setup", "restart/gaps", "restart/total", "goodput"}
    roomy = predict_engine("torch", JOB, _fit(), _all_measured(cited=("cpu_cores_per_node",)), ITERATION, 1e-5)
    assert _marked(roomy) == {}  # 112 cores: each process has one, the count enters nothing


def test_a_cited_write_limit_marks_the_slowdown_its_durable_time_enters():
    # fixed: the slowdown, σ·(durable − stall), was not marked where a cited figure entered the durable time
    result = predict_engine("lazy", JOB, _fit(), _all_measured(cited=("local_write_GBps",)), ITERATION, 1e-5)
    assert _marked(result) == {name: ["local_write_GBps"] for name in ("checkpoint/durable", "checkpoint/slowdown",
                                                                          "checkpoint/cost", "goodput")}


@pytest.mark.parametrize("iteration,marked", [(None, True), (0.5, False)], ids=["estimated", "given"])
def test_a_cited_peak_and_mfu_mark_the_first_iteration_and_the_goodput_where_they_estimate_the_iteration(
        iteration, marked):
    cluster = _all_measured(cited=("gpu_peak_tflops", "mfu"))
    result = whatif("tiny", "tp2pp2dp2", ["torch"], cluster, _fit(), iteration_s=iteration)
    expected = {"restart/1st iter", "restart/total", "goodput"} if marked else set()
    assert set(_marked(result["engines"][0])) == expected
    assert all(r["assumed"] is marked for r in result["scale"])
    assert all(r["cited"] == (["gpu_peak_tflops", "mfu"] if marked else []) for r in result["scale"])


def test_a_fit_of_another_device_marks_every_figure_and_says_so_beside_the_cited_constants():
    result = predict_engine("torch", JOB, _fit(device="cpu"), _all_measured(cited=("d2h_pageable_GBps",)),
                            ITERATION, 1e-5)
    assert result["checkpoint"]["stall"]["cited"] == ["d2h_pageable_GBps", "calibration"]
    assert result["restart"]["launch"]["cited"] == ["calibration"]
    assert len(_marked(result)) == 4 + len(RESTART_PARTS) + 1 + 1


def test_mark_cited_names_what_moves_a_figure_through_a_tie_and_a_zero():
    cluster = _all_measured(cited=("shared_write_GBps", "async_slowdown_fraction", "mfu"), async_slowdown_fraction=0.0,
                            shared_write_GBps=5.0, shared_read_GBps=5.0)

    def figures(on: Cluster) -> dict:
        return {"nested": {"tie": {"s": min(on.shared_write_GBps, on.shared_read_GBps), "assumed": False}},
                "larger": {"s": max(on.shared_write_GBps, on.shared_read_GBps), "assumed": False},
                "not near": {"s": max(on.mfu, 0.5), "assumed": False},
                "zero": {"s": on.async_slowdown_fraction * 10.0, "bound": "σ", "assumed": False},
                "unused": {"s": 1.0, "assumed": True}, "mfu": on.mfu}
    result = mark_cited(figures, cluster)
    assert result["nested"]["tie"] == {"s": 5.0, "assumed": True, "cited": ["shared_write_GBps"]}  # binds going down
    assert result["larger"]["cited"] == ["shared_write_GBps"]  # and going up
    assert result["not near"]["assumed"] is False  # an MFU of 0.38 moved by a millionth does not reach 0.5
    assert result["zero"]["cited"] == ["async_slowdown_fraction"]  # a cited 0 moved up to NUDGE
    assert result["unused"] == {"s": 1.0, "assumed": False, "cited": []}  # the mark is mark_cited's alone
    assert result["mfu"] == cluster.mfu  # a number outside a figure is left as it is
    assert cited_numbers(cluster) == ["shared_write_GBps", "mfu", "async_slowdown_fraction"]  # the file's order


# -- the restart's parts -----------------------------------------------------------------------------------------

ITERATION = 0.8
#: Every restart part of torch for JOB on the H100 node's disk, by docs/whatif.md's forms: (s, low, high, bound).
RESTART = {
    "launch": (2.0, 1.8, 2.4, "start-up"),
    "imports": (3.0, 2.4, 3.3, "start-up"),
    "dist init": (0.1 + 0.05 * 16, 0.9 * 0.7, 0.9 * 1.4, "start-up (rendezvous)"),
    "model build": (1.0 + 1.0, 2.0 * 0.85, 2.0 * 1.25, "start-up (host CPU)"),
    "ds init": (0.5 + 2.0, 2.5 * 0.95, 2.5 * 1.35, "start-up (host CPU)"),
    "engine setup": (0.05, 0.025, 0.08, "start-up"),
    # a + f·files_rank + 2 GB × 8 ranks at the 2 GB/s disk, η = 2/3
    "ckpt load": (0.7 + 0.09 + 1.5 * 8, 12.79 * 0.65, 12.79 * 1.15, "node disk"),
    "1st iter": (1.5 * ITERATION, 1.2 * 0.75, 1.2 * 1.3, "compute"),
    "gaps": (0.4, 0.4 * 0.6, 0.4 * 1.45, "start-up"),
}


def test_every_restart_part_has_its_form_s_value_its_line_s_range_and_its_bound():
    parts = restart_parts("torch", JOB, _fit(), LOCAL, ITERATION)
    for name, (s, low, high, bound) in RESTART.items():
        assert (parts[name]["s"], *_range(parts[name])) == pytest.approx((s, low, high)), name
        assert parts[name]["bound"] == bound and parts[name]["assumed"] is False, name
    total = parts["total"]
    assert (total["s"], *_range(total)) == pytest.approx(tuple(sum(v[i] for v in RESTART.values()) for i in range(3)))
    assert total["bound"] == "ckpt load (node disk)" and total["assumed"] is False


def test_the_rendezvous_beyond_the_calibrated_world_is_marked_and_so_is_the_total():
    parts = restart_parts("torch", JOB, _fit(calibrated_ranks=4), LOCAL, ITERATION)
    assert parts["dist init"]["assumed"] is True and parts["total"]["assumed"] is True


def test_the_total_is_bound_by_its_largest_part():
    parts = restart_parts("torch", JOB, _fit(launch=Line(40.0)), LOCAL, ITERATION)
    assert parts["total"]["bound"] == "launch (start-up)"


def test_the_lazy_engine_on_cuda_pins_its_buffer_at_set_up_unless_its_restart_is_prefetched():
    pin = 2 / 21.95  # 2 GB at the cluster's pinning rate
    plain = restart_parts("lazy", JOB, _fit(), LOCAL, ITERATION)  # not prefetched unless asked
    assert plain["engine setup"]["s"] == pytest.approx(0.05 + pin)
    assert plain["engine setup"]["bound"] == "pinning" and "prefetched" not in plain["ckpt load"]
    early = restart_parts("lazy", JOB, _fit(), LOCAL, ITERATION, prefetch=True)
    assert early["engine setup"]["s"] == pytest.approx(0.05) and early["engine setup"]["bound"] == "start-up"
    assert early["ckpt load"]["prefetched"] is True


def test_an_engine_calibrated_without_a_set_up_line_sets_up_in_no_time():
    parts = restart_parts("torch", JOB, _fit(engines={"torch": _lines(**{"engine setup": None})}), LOCAL, 1.0)
    assert (parts["engine setup"]["s"], *_range(parts["engine setup"])) == (0.0, 0.0, 0.0)


# -- a prefetched load -----------------------------------------------------------------------------------------

START_UP = 2.0 + 2.5 + 0.05  # model build, ds init and the engine set-up (without its pinning) the read runs beside
PIN, COPY = 2 / 21.95, 2 / 53.5


def _prefetched(load: Line, cluster: Cluster = LOCAL, job=JOB, **startup: Line) -> dict:
    fit = _fit(engines={"lazy": _lines(load=load)}, **startup)
    return restart_parts("lazy", job, fit, cluster, ITERATION, prefetch=True)["ckpt load"]


def test_a_read_longer_than_the_start_up_leaves_its_rest_and_the_copy_out():
    load = _prefetched(Line(5.0, low=-0.2, high=0.2))
    # max(0, pin + load − copy − S) + copy: about half a second of the read is left
    assert load["s"] == pytest.approx(PIN + 5.0 - START_UP)
    assert load["low_s"] == pytest.approx(COPY)  # at the line's low end (4 s) the read is hidden
    assert load["high_s"] == pytest.approx(PIN + 6.0 - START_UP)
    assert load["bound"] == "node disk (read beside the start-up)"
    assert load["prefetched"] is True and load["assumed"] is False


@pytest.mark.parametrize("scale", [1.0, 5e4], ids=["a-copy-of-ms", "a-copy-of-a-day"])
def test_a_read_hidden_by_the_start_up_leaves_the_copy_out_of_the_host_buffer(scale):
    # scaled: bytes (so the copy), the load and the start-up all × scale (on cpu: no pinning)
    job = replace(JOB, bytes_rank=JOB.bytes_rank * scale)
    cluster = _cluster(storage="local", device="cpu", d2h_pinned_GBps=1.0)
    load = _prefetched(Line(3.0 * scale), cluster, job, **{"model build": Line(5.0 * scale)})
    assert load["s"] == pytest.approx(2.0 * scale)  # the copy out, 2 GB × scale at 1 GB/s
    assert load["bound"] == "copy out of the host buffer (the read ran beside the start-up)"


def test_a_prefetched_load_from_cited_shared_storage_stays_assumed():
    # the read's bytes at the cited aggregate share (60 GB/s over 2 nodes, below the per-client cap and the NIC)
    load = _prefetched(Line(5.0, {"at_limit": 20.0}), _cluster(shared_read_GBps=60.0))
    assert load["prefetched"] is True and load["cited"] == ["shared_read_GBps"]


def test_a_prefetched_load_that_reads_no_bytes_at_the_limit_is_not_marked_by_it():
    # a load line without a byte term (fitted constant): the cited storage enters neither the read nor the copy out
    load = _prefetched(Line(5.0), _cluster())
    assert load["prefetched"] is True and load["assumed"] is False


# -- the plan's files as module and optimizer shares --------------------------------------------------------------


def _plan(layout: str, files: list[tuple[int, str, int]], engine: str = "torch") -> CheckpointPlan:
    """A plan of tiny on ``layout`` with (rank, kind, bytes) files."""
    planned = [PlannedFile(f"step1/f{i}", rank, kind, size, size) for i, (rank, kind, size) in enumerate(files)]
    world = max(rank for rank, _, _ in files) + 1
    return CheckpointPlan("tiny", layout, "bf16", engine, "step1", world, planned)


def _per_rank(plan: CheckpointPlan) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for f in plan.files:
        b, n = out.get(f.rank, (0, 0))
        out[f.rank] = (b + f.bytes, n + 1)
    return out


#: The engines the plan predicts, by how they write the stage module: DeepSpeed's files and the lazy engine from
#: data-parallel rank 0, torchsnapshot from every replica, DCP spread over them.
SPLIT_ENGINES = ("torch", "fastpersist", "lazy", "torchsnapshot", "dcp")
#: Bytes a file may differ by from its prediction at another dp: the lazy engine pads each file to 4 KiB (O_DIRECT),
#: the others' framing changes by a few bytes (the pickled shapes' digits, DCP's .metadata per item).
PER_FILE_SLACK = 4096


def _busiest(plan: CheckpointPlan, per_node: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(bytes, files) of the plan's busiest rank (the first of the most bytes) and node (ranks in order)."""
    per_rank = _per_rank(plan)
    rank = max(range(plan.world_size), key=lambda r: per_rank.get(r, (0, 0))[0])
    nodes = [tuple(map(sum, zip(*(per_rank.get(r, (0, 0)) for r in range(n, n + per_node)))))
             for n in range(0, plan.world_size, per_node)]
    return per_rank[rank], max(nodes)


@pytest.mark.parametrize("engine", SPLIT_ENGINES)
def test_at_the_plans_own_dp_the_job_has_the_plans_busiest_rank_and_node(engine):
    layout = Layout(2, 2, 2)  # every rank is data-parallel rank 0 or 1
    plan = plan_for("tiny", layout.name, engine)
    job = job_for(shape_of(plan, layout, params=1000), layout.dp, per_node=4)
    (rank_bytes, rank_files), (node_bytes, node_files) = _busiest(plan, 4)
    assert (job.bytes_rank, job.files_rank) == (pytest.approx(rank_bytes, rel=1e-12), rank_files)
    assert (job.bytes_node, job.files_node) == (pytest.approx(node_bytes, rel=1e-12), node_files)


def test_every_dcp_rank_at_the_plans_own_dp_writes_the_plans_bytes_whichever_replica_wins_a_tie():
    """small tp4pp1dp4: tp rank 1's replicas are ranks 1, 5, 9 and 13, which DCP's set of plan indices iterates 1,
    13, 5, 9: the tensors that tie go to 13 before 5."""
    plan = plan_for("small", "tp4pp1dp4", "dcp")
    job_ranks, _ = ranks_at(shape_of(plan, Layout(4, 1, 4), params=1000), 4)
    per_rank = _per_rank(plan)
    assert [rank.bytes for rank in job_ranks] == [per_rank[number][0] for number in range(16)]


@pytest.mark.parametrize("engine", SPLIT_ENGINES)
@pytest.mark.parametrize("preset, tp, pp", [("tiny", 2, 1), ("small", 1, 2)])
def test_a_larger_dp_writes_what_the_plan_at_that_dp_writes(engine, preset, tp, pp):
    """From the plan at dp 2, the busiest rank and node at dp 8 are the plan's at dp 8: the optimizer's tensors a
    quarter, the module where the engine puts it (before, DCP's was rank 0's bytes beyond rank 1's and shrank with
    dp, and torchsnapshot's every replica's module did too: tiny tp2 at dp 8 predicted 85 % and 80 % of the plan)."""
    shape = shape_of(plan_for(preset, f"tp{tp}pp{pp}dp2", engine), Layout(tp, pp, 2), params=1000)
    job = job_for(shape, 8, per_node=4)
    (rank_bytes, rank_files), (node_bytes, node_files) = _busiest(plan_for(preset, f"tp{tp}pp{pp}dp8", engine), 4)
    assert job.bytes_rank == pytest.approx(rank_bytes, abs=PER_FILE_SLACK * rank_files)
    assert job.bytes_node == pytest.approx(node_bytes, abs=PER_FILE_SLACK * node_files)
    assert job.files_node == node_files


def test_dcp_from_one_replica_gives_the_plan_at_sixteen_to_the_byte_but_for_the_index():
    """At dp 1 the one rank's files are its module, its optimizer and .metadata; at dp 16 DCP spreads the module,
    each optimizer share is a sixteenth, and the index grows with the ranks' items."""
    job = job_for(shape_of(plan_for("small", "tp1pp1dp1", "dcp"), Layout(1, 1, 1), params=1000), 16, per_node=16)
    plan = plan_for("small", "tp1pp1dp16", "dcp")
    (rank_bytes, _), (node_bytes, node_files) = _busiest(plan, 16)
    assert job.bytes_rank == pytest.approx(rank_bytes, abs=64)
    assert (job.bytes_node, job.files_node) == (pytest.approx(node_bytes, rel=1e-3), node_files)


def test_a_dcp_rank_reads_what_it_holds_and_the_index_the_others_what_their_busiest_wrote():
    """At a load a DCP rank reads its whole stage module (its replicas wrote it in shares), its optimizer share and
    the whole .metadata: at dp 1 what the one rank wrote; at dp 8 the dp-1 checkpoint less seven eighths of the
    optimizer tensors, with the dp-8 index. DeepSpeed's engines and torchsnapshot: what the busiest wrote."""
    one = plan_for("small", "tp1pp1dp1", "dcp")
    shape = shape_of(one, Layout(1, 1, 1), params=1000)
    alone = job_for(shape, 1, per_node=8)
    assert alone.held_rank == pytest.approx(alone.bytes_rank, rel=1e-12) == one.checkpoint_bytes
    optimizer = one.payload_bytes - sum(t.raw for t in tensors.stage_module("small", "tp1pp1dp1")[0, 0])
    eight = plan_for("small", "tp1pp1dp8", "dcp")
    index_one, index_eight = (sum(f.bytes for f in plan.files if f.kind == "metadata") for plan in (one, eight))
    expected = one.checkpoint_bytes - optimizer * 7 / 8 - index_one + index_eight
    job = job_for(shape, 8, per_node=8)
    assert job.held_rank == pytest.approx(expected, rel=1e-4) and job.held_rank > 1.7 * job.bytes_rank  # 111 MB, 62
    for engine in ("torch", "torchsnapshot"):
        job = job_for(shape_of(plan_for("small", "tp1pp1dp2", engine), Layout(1, 1, 2), params=1000), 8, per_node=8)
        assert job.held_rank == pytest.approx(job.bytes_rank, rel=1e-12)


def test_a_layout_of_one_replica_is_planned_at_two_so_the_other_replicas_write_their_own_files():
    """tiny tp1pp1dp1 with torch: at dp 8 ranks 1 to 7 write their optimizer file, not rank 0's layer files."""
    (shape,) = shapes_for("tiny", Layout(1, 1, 1), ["torch"]).values()
    assert shape.layout == Layout(1, 1, 2)
    assert shapes_for("tiny", Layout(1, 1, 4), ["torch"])["torch"].layout == Layout(1, 1, 4)  # its own where dp > 1
    plan = plan_for("tiny", "tp1pp1dp8", "torch")
    job = job_for(shape, 8, per_node=8)
    assert job.files_node == len(plan.files) and job.files_rank == len(plan.rank_files(0))
    assert job_for(shape, 1, per_node=8).bytes_rank == pytest.approx(plan_for("tiny", "tp1pp1dp1", "torch")
                                                                       .checkpoint_bytes, abs=PER_FILE_SLACK * 9)


@pytest.mark.parametrize("engine", ["torch", "fastpersist", "lazy", "torchsnapshot"])
def test_an_engine_whose_ranks_plan_alone_is_planned_at_the_layouts_own_dp_for_two_replicas_a_stage(engine):
    """small tp2pp2dp4: ranks 0, 1, 2, 3 (stage 0's replicas 0 and 1) and 8 to 11 (stage 1's), each with the files
    the whole plan gives it; the shape is the whole plan's."""
    layout = Layout(2, 2, 4)
    assert planned_at(layout, engine) == (layout, frozenset({0, 1, 2, 3, 8, 9, 10, 11}))
    part = plan_for("small", layout.name, engine, ranks=planned_at(layout, engine)[1])
    whole = plan_for("small", layout.name, engine)
    assert part.files == [f for f in whole.files if f.rank in {0, 1, 2, 3, 8, 9, 10, 11}]
    assert shapes_for("small", layout, [engine])[engine] == shape_of(whole, layout, get_preset("small").param_count())


def test_a_shape_is_made_from_the_plan_of_the_ranks_planned_at_names(monkeypatch):
    """The plans behind a prediction are of two replicas a stage, not of every rank (bench/whatif_speed.py: 70B
    tp8pp8dp256 in 30 s where every rank took 498 s); the shapes are the same either way."""
    asked = []

    def plan(*args, **kwargs):
        asked.append(kwargs.get("ranks"))
        return plan_for(*args, **kwargs)

    monkeypatch.setattr(whatif_predict, "plan_for", plan)
    shapes_for("tiny", Layout(1, 2, 4), ["torch", "dcp"])
    assert asked == [planned_at(Layout(1, 2, 4), "torch")[1], None] and asked[0] == frozenset({0, 1, 4, 5})


def test_a_collective_engine_is_planned_whole_at_most_at_its_plan_dp():
    """DCP's global plan takes every rank: planned at dp 8 at most, a larger dp scaled from it; refused in part."""
    assert planned_at(Layout(2, 1, 64), "dcp") == (Layout(2, 1, COLLECTIVE_PLAN_DP), None)
    assert planned_at(Layout(2, 1, 4), "dcp-async") == (Layout(2, 1, 4), None)
    assert planned_at(Layout(2, 1, 1), "dcp") == (Layout(2, 1, 2), None)
    with pytest.raises(WhatIfError, match="plans every rank's files together"):
        plan_for("tiny", "tp1pp1dp2", "dcp", ranks=frozenset({0}))


def test_an_emulated_runs_plan_is_split_at_its_own_width():
    """An emulated run's plan is of its preset scaled (--emulate-scale): its module's tensors are the scaled ones,
    so from the plan at dp 2 the plan at dp 8 of the same width."""
    shape = shape_of(plan_for("small", "tp1pp1dp2", "dcp", scale=0.25), Layout(1, 1, 2), params=1000)
    job = job_for(shape, 8, per_node=8)
    (rank_bytes, rank_files), (node_bytes, _) = _busiest(plan_for("small", "tp1pp1dp8", "dcp", scale=0.25), 8)
    assert job.bytes_rank == pytest.approx(rank_bytes, abs=PER_FILE_SLACK * rank_files)
    assert job.bytes_node == pytest.approx(node_bytes, rel=1e-3)


def test_the_split_of_a_plan_optimizer_tensors_module_share_and_the_rest():
    plan = plan_for("tiny", "tp1pp2dp2", "torch")
    shape = shape_of(plan, Layout(1, 2, 2), params=1000)
    for stage in range(2):
        replica = plan.rank_files(stage * 2 + 1)  # data-parallel rank 1: its optimizer files only
        assert shape.optimizer[stage, 0] == sum(f.payload_bytes for f in replica)
        assert shape.other[stage, 0] == (sum(f.bytes - f.payload_bytes for f in replica), len(replica))
        first = plan.rank_files(stage * 2)
        module = sum(t.raw for t in tensors.stage_module("tiny", "tp1pp2dp2")[stage, 0])
        assert shape.first[stage, 0] == (sum(f.bytes for f in first) - shape.optimizer[stage, 0] - module, len(first))
    assert shape.index == (0, 0, 0)
    dcp = plan_for("tiny", "tp1pp2dp2", "dcp")
    index = [f.bytes for f in dcp.files if f.kind == "metadata"]
    assert shape_of(dcp, Layout(1, 2, 2), params=1000).index == (
        sum(index), 1, tensors.index_items(tensors.stage_tensors("tiny", "tp1pp2dp2"), 2)) and len(index) == 1


def test_the_shape_carries_the_plan_s_engine_and_its_tensors():
    shape = shape_of(plan_for("tiny", "tp1pp2dp2", "dcp"), Layout(1, 2, 2), params=1000)
    assert shape.engine == "dcp" and shape.tensors == tensors.stage_tensors("tiny", "tp1pp2dp2")
    assert shape.module == tensors.stage_module("tiny", "tp1pp2dp2")
    job = job_for(shape, dp=2, per_node=8)
    assert (job.tensors_rank, job.tensors_written) == tensors.busiest(shape.tensors, shape.module, Layout(1, 2, 2),
                                                                      "dcp")
    assert job.tensors_written < job.tensors_rank


def test_a_process_handling_all_of_a_node_s_ranks_writes_alone_and_in_turn():
    plan = _plan("tp1pp1dp2", [(0, "optimizer", 10), (1, "optimizer", 10)])
    shape = shape_of(plan, Layout(1, 1, 2), params=1000)
    job = job_for(shape, dp=8, per_node=4, per_process=4)
    assert (job.nodes, job.concurrency, job.sequential) == (2, 1, 4)
    assert job_for(shape, dp=8, per_node=4, per_process=2).concurrency == 2
    assert job_for(shape, dp=8, per_node=4, per_process=3).concurrency == 1  # whole processes: 4 // 3


# -- the plan the prediction starts from ---------------------------------------------------------------------------


def test_the_plan_is_bf16_unless_said_and_at_the_scale_asked():
    plan = plan_for("tiny", "tp1pp1dp2", "torch")
    assert plan.dtype == "bf16"
    assert plan.checkpoint_bytes == plan_for("tiny", "tp1pp1dp2", "torch", "bf16").checkpoint_bytes
    assert plan.checkpoint_bytes < plan_for("tiny", "tp1pp1dp2", "torch", "fp32").checkpoint_bytes
    assert plan_for("tiny", "tp1pp1dp2", "torch", scale=0.5).scale == 0.5


def test_dcp_s_plan_is_docs_plan_md_s_wherever_the_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # DCP pickles the checkpoint folder's path into its metadata
    reference = predict(doc_config("tiny", "tp1pp1dp2", "bf16", "dcp")).files
    assert plan_for("tiny", "tp1pp1dp2", "dcp").files == reference


def test_a_plan_that_cannot_be_made_is_refused_naming_the_layout_or_the_engine():
    with pytest.raises(WhatIfError, match=r"^tiny tp3pp1dp1: "):
        plan_for("tiny", "tp3pp1dp1", "torch")
    with pytest.raises(WhatIfError, match=r"^engine 'nope': .*unknown engine"):
        plan_for("tiny", "tp1pp1dp2", "nope")


# -- layouts, the iteration, goodput ----------------------------------------------------------------------------


def test_a_layout_that_fills_the_cluster_and_a_tp_of_a_whole_node_fit():
    cluster = _cluster(nodes=2, gpus_per_node=2)
    assert check_fits("tiny", "tp2pp1dp2", cluster) == Layout(2, 1, 2)  # 4 GPUs of 2 × 2, tp 2 of 2 a node
    with pytest.raises(WhatIfError, match="needs 8 GPUs"):
        check_fits("tiny", "tp2pp2dp2", cluster)


def test_the_iteration_is_as_given_or_estimated_from_the_study_s_default_batch():
    model, layout, cluster = get_preset("tiny"), Layout(1, 2, 3), _cluster()
    assert iteration_s_for("tiny", layout, cluster, 0.7) == (0.7, "given (--iteration-s)")
    for micro_batch in (1, 3):
        args = (micro_batch,) if micro_batch != 1 else ()
        tokens = model.seq_len * micro_batch * 2 * 3  # micro-batch × pp micro-batches × dp
        seconds, how = iteration_s_for("tiny", layout, cluster, None, *args)
        peak = cluster.gpu_peak_tflops * 1e12
        assert seconds == pytest.approx(6 * model.param_count() * tokens / (6 * peak * cluster.mfu))
        assert (f"{tokens} tokens per iteration (sequence {model.seq_len} × micro-batch {micro_batch} × 2 "
                f"micro-batches × dp 3)") in how and how.endswith("MFU 0.38 (assumed)")
    # the peak and MFU are marked as the file gives them: cited ones assumed, a measured one not
    assert how.endswith("peak 989 TFLOP/s (assumed), MFU 0.38 (assumed)")
    _, how = iteration_s_for("tiny", layout, _cluster(measured=("mfu",)), None)
    assert how.endswith("peak 989 TFLOP/s (assumed), MFU 0.38")


@pytest.mark.parametrize("given", [0.0, -1.0])
def test_an_iteration_that_is_not_above_0_is_refused(given):
    with pytest.raises(WhatIfError, match=rf"^--iteration-s must be above 0, got {given}$"):
        iteration_s_for("tiny", Layout(1, 1, 2), _cluster(), given)


def test_goodput_at_a_scale_is_daly_s_interval_and_says_it_in_iterations():
    rate, gpus, iteration = 2e-5, 1024, 2.0
    result = goodput_at(10.0, 300.0, gpus, rate, iteration)
    mtbf = 3600 / (rate * gpus)
    budget = goodput.at_optimum(10.0, 300.0, mtbf, iteration)
    assert result == {"gpus": gpus, "failures_per_gpu_hour": rate, "mtbf_s": pytest.approx(mtbf),
                      "interval_s": pytest.approx(budget.interval_s),
                      "interval_iterations": pytest.approx(budget.interval_s / iteration),
                      "goodput_pct": pytest.approx(100 * budget.goodput)}


# -- one engine's prediction and the whole command's --------------------------------------------------------------


def test_an_engine_s_prediction_reports_the_job_it_was_made_for():
    job = replace(JOB, tensors_rank=44, tensors_written=24)
    result = predict_engine("torch", job, _fit(), LOCAL, ITERATION, 1e-5)
    assert {k: result[k] for k in ("engine", "ranks", "nodes", "bytes_per_rank", "bytes_held_per_rank",
                                   "files_per_rank", "bytes_per_node", "files_per_node", "tensors_per_rank",
                                   "tensors_written_per_rank")} == {
        "engine": "torch", "ranks": 16, "nodes": 2, "bytes_per_rank": 2 * GB, "bytes_held_per_rank": 2 * GB,
        "files_per_rank": 3, "bytes_per_node": 10 * GB, "files_per_node": 24, "tensors_per_rank": 44,
        "tensors_written_per_rank": 24}


def test_the_device_note_says_what_the_fit_rests_on_and_how_to_get_measured_lines():
    note = device_note(_fit(device="cpu"), LOCAL)
    assert note.startswith("the fit's runs were on cpu, this cluster is cuda: every line is the calibration "
                           "machine's, so every figure is marked assumed")
    assert "bench/whatif_gpu.py sets a CPU fit against real H100 runs" in note
    assert note.endswith("calibrate on the target for measured lines (python -m restartbench.whatif --calibrate)")


def test_the_assumed_list_is_the_cluster_s_cited_numbers_and_the_calibration_where_its_device_differs():
    cluster = _cluster(storage="local")
    cited = {name for name, (basis, _) in cluster.sources.items() if basis == "cited"}
    listed = assumed_fields(cluster)
    assert set(listed) == cited - {"name", "device", "storage", "calibration"}
    assert "d2h_pinned_GBps" not in listed and listed["mfu"] == cluster.sources["mfu"][1]
    assert assumed_fields(cluster, _fit(device="cuda")) == listed
    assert assumed_fields(cluster, _fit(device="cpu"))["calibration"] == device_note(_fit(device="cpu"), cluster)


def _busiest_bytes(dtype: str) -> int:
    return max(plan_for("tiny", "tp2pp2dp2", "torch", dtype).per_rank_bytes().values())


def test_the_prediction_names_what_it_is_for_and_plans_bf16_unless_asked():
    result = whatif("tiny", "tp2pp2dp2", ["torch"], LOCAL, _fit(), failures_per_gpu_hour=3e-5, iteration_s=0.5)
    assert {k: result[k] for k in ("preset", "layout", "cluster", "cluster_file", "device", "storage", "dtype",
                                   "iteration_s", "iteration_basis", "failures_per_gpu_hour")} == {
        "preset": "tiny", "layout": "tp2pp2dp2", "cluster": LOCAL.name, "cluster_file": "test.yaml",
        "device": "cuda", "storage": "local", "dtype": "bf16", "iteration_s": 0.5,
        "iteration_basis": "given (--iteration-s)", "failures_per_gpu_hour": 3e-5}
    assert result["engines"][0]["bytes_per_rank"] == _busiest_bytes("bf16")
    fp32 = whatif("tiny", "tp2pp2dp2", ["torch"], LOCAL, _fit(), iteration_s=0.5, dtype="fp32")
    assert fp32["dtype"] == "fp32" and fp32["engines"][0]["bytes_per_rank"] == _busiest_bytes("fp32")


@pytest.mark.parametrize("rate", [0.0, -1e-5])
def test_a_failure_rate_that_is_not_above_0_is_refused(rate):
    with pytest.raises(WhatIfError, match=rf"^--failures-per-gpu-hour must be above 0, got {rate}$"):
        whatif("tiny", "tp2pp2dp2", ["torch"], LOCAL, _fit(), failures_per_gpu_hour=rate)


GOODPUT_KEYS = ("goodput_pct", "goodput_pct_low", "goodput_pct_high", "interval_s")


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_sweep_s_row_at_the_layout_s_own_gpus_is_the_engine_s_prediction(prefetch):
    cluster = _cluster(storage="local", measured=("async_slowdown_fraction",))  # no cited constant enters
    result = whatif("tiny", "tp2pp2dp2", ["lazy"], cluster, _fit(), iteration_s=0.5, prefetch=prefetch)
    engine = result["engines"][0]
    assert engine["prefetched"] is prefetch
    row = result["scale"][0]
    assert row == {"gpus": 8, "layout": "tp2pp2dp2", "engine": "lazy", "cost_s": engine["checkpoint"]["cost"]["s"],
                   "restart_s": engine["restart"]["total"]["s"], **{k: engine["goodput"][k] for k in GOODPUT_KEYS},
                   "assumed": False, "cited": []}
    assert [(r["gpus"], r["layout"]) for r in result["scale"][:3]] == [(8, "tp2pp2dp2"), (16, "tp2pp2dp4"),
                                                                       (32, "tp2pp2dp8")]


def test_a_row_whose_cost_a_cited_sigma_entered_is_assumed():
    # fixed: a row was marked for its restart, its durable time or its estimated iteration, not for its cost
    cluster = _cluster(storage="local", cited=("async_slowdown_fraction",))
    result = whatif("tiny", "tp2pp2dp2", ["lazy"], cluster, _fit(), iteration_s=0.5)
    assert result["engines"][0]["checkpoint"]["cost"]["assumed"] is True  # σ on cuda: the cluster's, cited
    assert all(r["assumed"] for r in result["scale"])


def test_a_whatif_is_not_prefetched_unless_asked():
    result = whatif("tiny", "tp2pp2dp2", ["lazy"], LOCAL, _fit(), iteration_s=0.5)
    assert result["engines"][0]["prefetched"] is False


def test_a_row_is_assumed_where_the_rendezvous_is_cited_or_the_iteration_estimated():
    given = whatif("tiny", "tp2pp2dp2", ["torch"], LOCAL, _fit(calibrated_ranks=64), iteration_s=0.5)["scale"]
    assert [r["assumed"] for r in given if r["gpus"] <= 64] == [False] * 4
    assert all(r["assumed"] for r in given if r["gpus"] > 64)  # the cited TCPStore figure beyond 64 ranks
    estimated = whatif("tiny", "tp2pp2dp2", ["torch"], LOCAL, _fit(calibrated_ranks=64))["scale"]
    assert all(r["assumed"] for r in estimated)  # the cited peak and MFU


def _synthetic_shape(layout: Layout):
    files = [(r, "optimizer", 1000) for r in range(layout.world_size)] + [(0, "layer", 400)]
    return shape_of(_plan(layout.name, files), layout, params=10**9)


def test_the_sweep_starts_where_the_layout_s_tp_and_pp_fit_and_keeps_them():
    layout = Layout(8, 2, 1)  # 16 GPUs: none at 8
    cells = [(stage, tp) for stage in range(2) for tp in range(8)]
    shape = Shape(layout, first={c: (400, 3) for c in cells}, other={c: (0, 1) for c in cells},
                  optimizer={c: 1000 for c in cells}, params=10**9)
    rows = scale_sweep("tiny", layout, {"torch": shape}, LOCAL, _fit(), 1e-5, 0.5)
    assert [r["gpus"] for r in rows] == [2**k for k in range(4, 15)]
    assert [r["layout"] for r in rows[:2]] == ["tp8pp2dp1", "tp8pp2dp2"]


def test_the_sweep_is_not_prefetched_unless_asked():
    shapes = {"lazy": _synthetic_shape(Layout(2, 2, 2))}
    rows = scale_sweep("tiny", Layout(2, 2, 2), shapes, LOCAL, _fit(), 1e-5, 0.5)
    plain = predict_engine("lazy", job_for(shapes["lazy"], 2, 8), _fit(), LOCAL, 0.5, 1e-5)
    assert rows[0]["restart_s"] == plain["restart"]["total"]["s"]

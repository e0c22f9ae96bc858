"""The what-if fit (restartbench/whatif/fit.py) and terms (terms.py) held to what their docstrings and docs/whatif.md
say: which runs and rows enter which term, the relative non-negative least squares and its spread, the per-file
cost's leave-one-out choice, the refusals and their messages, each row's regressors, an emulated checkpoint's own
times, and a fit file that reads back what was written. Synthetic inputs with known constants, no run launched."""

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from whatif_cases import JOB, h100_cluster

from restartbench.layout import Layout
from restartbench.presets import get_preset
from restartbench.whatif import tensors, terms
from restartbench.whatif.fit import (
    HINTS,
    Fit,
    FitError,
    Limits,
    emulated_own_times,
    fit_constant,
    fit_line,
    fit_table,
    from_json,
    leave_one_out_error,
    per_core,
    read_fit,
    run_rows,
    to_json,
    with_own_times,
    write_fit,
)
from restartbench.whatif.terms import GB, Line

TINY, SMALL = get_preset("tiny").param_count(), get_preset("small").param_count()

# -- terms ------------------------------------------------------------------------------------------------------


def test_read_limit_is_the_least_of_the_aggregate_share_the_client_cap_and_the_nic():
    cluster = h100_cluster(shared_read_GBps=60.0, shared_per_client_GBps=40.0, nic_GBps=50.0)
    assert terms.node_read_limit(cluster, nodes=2) == terms.Bound(30.0, "shared file system (aggregate share)")
    assert terms.node_read_limit(cluster, nodes=1) == terms.Bound(40.0, "shared file system (per-client cap)")
    assert terms.node_read_limit(h100_cluster(nic_GBps=10.0), nodes=1) == terms.Bound(10.0, "network (NIC)")
    local = h100_cluster(storage="local", local_read_GBps=3.0)
    assert terms.node_read_limit(local, nodes=64) == terms.Bound(3.0, "node disk")


def test_on_cuda_a_side_stream_engines_stall_has_no_bytes_term_whatever_its_slope():
    line = Line(0.5, {"files": 0.1, "bytes": 0.3})  # 8 processes on 112 cores: a CPU share factor of 1
    assert terms.stall_s(line, "lazy", JOB, h100_cluster(storage="local")) == pytest.approx(0.5 + 0.1 * 3)


def test_the_d2h_copy_is_at_the_pinned_rate_for_an_engine_that_stages_into_pinned_memory():
    cuda = h100_cluster(d2h_pinned_GBps=50.0, d2h_pageable_GBps=10.0)  # JOB: 2 GB per rank
    assert terms.d2h_s("lazy", JOB, cuda) == pytest.approx(2 / 50)
    assert terms.d2h_s("torch", JOB, cuda) == pytest.approx(2 / 10)
    assert terms.d2h_s("lazy", JOB, h100_cluster(device="cpu")) == 0.0


def test_the_slowdown_is_sigma_of_a_background_time_below_a_second_and_nothing_without_one():
    assert terms.slowdown_s(0.1, "lazy", 1.0, 1.5) == pytest.approx(0.05)
    assert terms.slowdown_s(0.1, "dcp-async", 2.0, 1.5) == 0.0


def test_the_range_of_a_figure_below_a_second_and_never_below_zero():
    assert Line(0.1, low=-0.2, high=0.5).range(0.1) == pytest.approx((0.08, 0.15))
    assert Line(0.1, low=-1.5, high=-1.2).range(0.1) == (0.0, 0.0)


def test_the_iteration_estimate_takes_the_peak_in_tflops():
    # 6 · 1e9 parameters · 1e6 tokens = 6e15 FLOPs over 8 GPUs at 1000 TFLOP/s × 0.5 MFU (4e15 FLOP/s): exactly 1.5 s
    assert terms.iteration_estimate_s(1e9, 1e6, 8, h100_cluster(gpu_peak_tflops=1000.0, mfu=0.5)) == 1.5


def test_a_per_rank_intercept_is_paid_once_where_the_ranks_in_turn_are_not_given():
    line = Line(0.2, {"files": 0.01}, intercept_per="in_turn")
    assert line(files=10) == pytest.approx(0.3)
    assert line(files=10, in_turn=4) == pytest.approx(0.9)


# -- one line -------------------------------------------------------------------------------------------------


def test_only_runs_that_measured_the_term_and_every_regressor_enter_its_line():
    rows = [{"run_id": f"r{i}", "bytes": float(b), "y": 1.0 + 2.0 * b} for i, b in enumerate((1, 2, 3, 4))] + [
        {"run_id": "nan", "bytes": 5.0, "y": math.nan}, {"run_id": "zero", "bytes": 6.0, "y": 0.0},
        {"run_id": "none", "bytes": 7.0, "y": None}, {"run_id": "unsized", "bytes": math.nan, "y": 30.0},
        {"run_id": "flag", "bytes": True, "y": 30.0}, {"run_id": "missing", "y": 30.0}]
    line = fit_line("t", rows, ("bytes",), "y")
    assert line.runs == ("r0", "r1", "r2", "r3")
    assert line.intercept == pytest.approx(1.0) and line.coefficients == {"bytes": pytest.approx(2.0)}
    assert (line.low, line.high) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_a_term_no_run_measured_is_refused_naming_it_and_the_runs_for_each_regressor():
    with pytest.raises(FitError) as error:
        fit_line("torch stall", [{"run_id": "r0", "files": 1.0, "bytes": 2.0, "y": math.nan}], ("files", "bytes"), "y")
    assert str(error.value) == ("term 'torch stall': no calibration run measured it; runs that would fit it: "
                                f"{HINTS['files']}; {HINTS['bytes']}")
    with pytest.raises(FitError) as error:
        fit_line("t", [], (), "y")
    assert str(error.value) == ("term 't': no calibration run measured it; runs that would fit it: any complete run "
                                "that records it")


def test_a_term_whose_regressors_never_vary_is_refused_naming_its_runs():
    rows = [{"run_id": run, "files": 3.0, "bytes": 1e8, "y": y} for run, y in (("b", 1.0), ("a", 1.2))]
    with pytest.raises(FitError) as error:
        fit_line("t", rows, ("files", "bytes"), "y")
    assert str(error.value) == ("term 't': 2 calibration run(s) (a, b) all have the same files, bytes; runs that "
                                f"would fit it: {HINTS['files']}; {HINTS['bytes']}")


def test_each_regressor_left_out_has_its_note_with_its_value():
    rows = [{"run_id": f"r{i}", "files": 3.0, "bytes": 7.0, "at_limit": 0.1 * i, "y": 1.0 + 0.1 * i}
            for i in range(1, 4)]
    line = fit_line("t", rows, ("files", "bytes", "at_limit"), "y")
    assert line.note == (f"files not fitted (the same in every calibration run: 3); runs that would fit it: "
                         f"{HINTS['files']}; bytes not fitted (the same in every calibration run: 7); runs that "
                         f"would fit it: {HINTS['bytes']}")
    assert line.coefficients == {"at_limit": pytest.approx(1.0)}


def test_tensors_that_follow_the_bytes_are_left_out_with_a_note_naming_the_runs_that_would_fit_them():
    rows = [{"run_id": f"r{i}", "bytes": b, "tensors": 10 * b, "y": 0.1 + 0.02 * b}
            for i, b in enumerate((1.0, 2.0, 1.0, 2.0))]
    line = fit_line("t", rows, ("bytes", "tensors"), "y")
    assert line.note == ("tensors not fitted (over these runs the tensors per rank follow the other regressors: "
                         "fewer distinct configurations than coefficients); runs that would fit it: "
                         f"{HINTS['tensors']}")
    assert line.coefficients == {"bytes": pytest.approx(0.02)}


def test_a_per_file_cost_that_predicts_the_runs_worse_left_out_in_turn_is_left_out_saying_why():
    rows = [{"run_id": f"r{i}", "bytes": float(i), "files": 10.0 if i == 4 else 1.0,
             "y": 1 + 2 * i + (0.5 if i == 4 else 0.0)} for i in range(1, 5)]
    line = fit_line("t", rows, ("files", "bytes"), "y")
    assert line.note == ("files left out: without it the calibration predicts its own runs better, each left out in "
                         "turn")


def test_a_per_file_cost_that_is_the_only_varying_regressor_is_kept():
    """A line is never left without a regressor: the intercept alone predicts these runs better (each left out in
    turn), yet files, the one regressor that varies, stays."""
    rows = [{"run_id": f"r{i}", "files": float(f), "bytes": 5.0, "y": y}
            for i, (f, y) in enumerate(((1, 1.0), (2, 1.3), (3, 0.9), (4, 1.2)))]
    assert leave_one_out_error(rows, [], "y") < leave_one_out_error(rows, ["files"], "y")
    line = fit_line("t", rows, ("files", "bytes"), "y")
    assert set(line.coefficients) == {"files"} and "files left out" not in line.note


def test_where_leaving_runs_out_cannot_judge_the_per_file_cost_it_is_kept():
    # three runs: leaving one out leaves two for three coefficients, or the bytes the same (1, 1)
    rows = [{"run_id": f"r{i}", "files": float(f), "bytes": float(b), "y": 1 + 0.5 * f + 2 * b}
            for i, (f, b) in enumerate(((1, 1), (2, 1), (3, 2)))]
    line = fit_line("t", rows, ("files", "bytes"), "y")
    assert line.intercept == pytest.approx(1.0)
    assert line.coefficients == {"files": pytest.approx(0.5), "bytes": pytest.approx(2.0)}


def test_the_leave_one_out_error_is_the_mean_error_of_each_run_predicted_from_the_others():
    rows = [{"run_id": f"r{i}", "x": float(x), "y": y} for i, (x, y) in enumerate(((1, 2.0), (2, 3.0), (3, 3.5)))]
    # any two runs set the line exactly: r1, r2 give 2.5 at x = 1; r0, r2 give 2.75 at 2; r0, r1 give 4 at 3
    assert leave_one_out_error(rows, ["x"], "y") == pytest.approx((0.5 / 2 + 0.25 / 3 + 0.5 / 3.5) / 3)


def test_the_leave_one_out_error_is_infinite_where_the_other_runs_cannot_fit_the_line():
    rows = [{"run_id": f"r{i}", "files": float(f), "bytes": float(b), "y": 1 + 0.5 * f + 2 * b}
            for i, (f, b) in enumerate(((1, 1), (2, 3), (3, 2)))]  # any two vary both, but are two for three
    assert leave_one_out_error(rows, ["files", "bytes"], "y") == math.inf
    assert leave_one_out_error(rows, ["bytes"], "y") < math.inf


#: Runs of k ranks per process: (k, files, seconds at the limit); y = 0.2·k + 0.01·files + 1.5·at_limit.
IN_TURN = ((1, 17, 0.3), (1, 17, 1.1), (4, 71, 0.3), (4, 71, 2.2), (2, 20, 0.8), (32, 400, 0.6))


def _in_turn_rows() -> list[dict]:
    return [{"run_id": f"r{i}", "in_turn": k, "files": float(f), "at_limit": b, "y": 0.2 * k + 0.01 * f + 1.5 * b}
            for i, (k, f, b) in enumerate(IN_TURN)]


def test_each_run_left_out_is_predicted_with_the_intercept_paid_per_rank_in_turn():
    assert leave_one_out_error(_in_turn_rows(), ["files", "at_limit"], "y", "in_turn") == pytest.approx(0.0, abs=1e-9)


def test_the_spread_of_a_per_rank_intercept_line_takes_each_runs_ranks_in_turn():
    line = fit_line("t", _in_turn_rows(), ("files", "at_limit"), "y", intercept_per="in_turn")
    assert (line.low, line.high) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_the_per_file_cost_is_judged_with_the_intercept_paid_per_rank_in_turn():
    """Files say nothing beyond the ranks in turn and the bytes (y within 3 % of 0.2·k + 1.5·at_limit): left out.
    Judged with the intercept paid once, the ranks in turn (1 to 8) would seem to need the files."""
    spec = ((1, 17, 0.3), (1, 12, 1.1), (4, 71, 0.3), (4, 40, 2.2), (2, 20, 0.8), (8, 90, 0.6), (2, 33, 1.7))
    noise = (1.03, 0.98, 1.01, 0.97, 1.02, 0.99, 1.0)
    rows = [{"run_id": f"r{i}", "in_turn": k, "files": float(f), "at_limit": b, "y": (0.2 * k + 1.5 * b) * n}
            for i, ((k, f, b), n) in enumerate(zip(spec, noise))]
    line = fit_line("t", rows, ("files", "at_limit"), "y", intercept_per="in_turn")
    assert set(line.coefficients) == {"at_limit"} and line.note.startswith("files left out")
    assert line.intercept == pytest.approx(0.2, rel=0.05)
    assert line.coefficients["at_limit"] == pytest.approx(1.5, rel=0.05)


def test_the_spread_is_the_smallest_and_largest_relative_residual_of_the_runs_fitted():
    rows = [{"run_id": f"r{i}", "bytes": b, "y": y} for i, (b, y) in enumerate(((1.0, 0.12), (2.0, 0.21),
                                                                                 (3.0, 0.35), (4.0, 0.38)))]
    line = fit_line("t", rows, ("bytes",), "y")
    residuals = [r["y"] / line(bytes=r["bytes"]) - 1 for r in rows]
    assert (line.low, line.high) == pytest.approx((min(residuals), max(residuals)))
    assert line.low < 0 < line.high


def test_the_line_is_the_non_negative_least_squares_optimum_of_the_relative_residuals():
    """y = 3 + 2·x2 − 0.3·x1: x1 lowers y, so its coefficient is held at 0 and the others are the best left."""
    rows = [{"run_id": f"r{i}", "x1": a, "x2": float(b), "y": 3 + 2 * b - 0.3 * a}
            for i, (a, b) in enumerate(zip((5.0, 4.5, 3.0, 2.2, 1.0), (1, 2, 3, 4, 5)))]
    line = fit_line("t", rows, ("x1", "x2"), "y")
    y = np.array([r["y"] for r in rows])
    design = np.array([[1.0, r["x1"], r["x2"]] for r in rows]) / y[:, None]
    c = np.array([line.intercept, line.coefficients["x1"], line.coefficients["x2"]])
    gradient = design.T @ (design @ c - 1)  # Karush-Kuhn-Tucker: 0 where free, not negative where held at 0
    assert (c >= 0).all() and c[1] == 0.0
    for coefficient, slope in zip(c, gradient):
        assert abs(slope) < 1e-9 if coefficient > 0 else slope > -1e-9


# -- constants -------------------------------------------------------------------------------------------------


def test_a_constant_is_the_median_of_the_runs_that_measured_it_its_range_their_min_and_max():
    rows = [{"run_id": "a", "y": 2.0}, {"run_id": "b", "y": 1.0}, {"run_id": "c", "y": 4.0},
            {"run_id": "d", "y": math.nan}, {"run_id": "e", "y": None}, {"run_id": "f"}]
    line = fit_constant("t", rows, "y")
    assert (line.intercept, line.low, line.high) == pytest.approx((2.0, -0.5, 1.0))
    assert line.runs == ("a", "b", "c")


def test_a_constant_whose_median_is_zero_has_the_range_zero_instead_of_dividing_by_it():
    line = fit_constant("t", [{"run_id": r, "y": y} for r, y in (("a", 0.0), ("b", 0.0), ("c", 0.3))], "y")
    assert (line.intercept, line.low, line.high) == (0.0, 0.0, 0.0)


def test_a_constant_no_run_measured_is_refused_naming_it():
    with pytest.raises(FitError) as error:
        fit_constant("launch", [{"run_id": "a", "y": math.nan}], "y")
    assert str(error.value) == ("term 'launch': no calibration run measured it; runs that would fit it: any complete "
                                "real run (tiny tp1pp1dp2)")


def test_per_core_divides_each_measured_time_by_its_runs_cpu_share_factor():
    rows = [{"run_id": "a", "t": 3.0, "cpu_factor": 2.0}, {"run_id": "b", "t": 3.0},
            {"run_id": "c", "t": math.nan, "cpu_factor": 2.0}, {"run_id": "d", "cpu_factor": 2.0}]
    out = per_core(rows, "t")
    assert [r.get("t") for r in out[:2]] == [1.5, 3.0]  # a row without a factor: a core per process
    assert math.isnan(out[2]["t"]) and "t" not in out[3]
    assert rows[0]["t"] == 3.0  # the rows given are not changed


# -- the whole fit: synthetic run tables -------------------------------------------------------------------------

LIMITS = Limits(write_GBps=1.0, read_GBps=2.0, source="synthetic")
STALL, DURABLE, LOAD = (0.05, 0.002, 1 / (0.8 * GB)), (0.1, 0.003, 2.5), (0.2, 0.004, 1.5)


def _rows(engine: str = "torch", prefix: str = "r", ranks: tuple[int, ...] = (2, 2, 4, 4)) -> list[dict]:
    """Per run a checkpoint and a restart row whose times follow known constants: bytes and files per rank vary
    apart, tiny at the smallest world size and small above it; model build and ds init lines in the parameters."""
    rows = []
    for i, world in enumerate(ranks):
        bytes_rank, files_rank = (i + 1) * 1e8, 2 + 3 * (i % 2)
        preset = "tiny" if world == min(ranks) else "small"
        params = TINY if preset == "tiny" else SMALL
        common = {"run_id": f"{prefix}{i}", "engine": engine, "preset": preset, "layout": f"tp1pp1dp{world}",
                  "tp": 1, "pp": 1, "dp": world, "ranks": world, "nodes": 1, "iteration_s": 0.5,
                  "restore_layout": None}
        stall = STALL[0] + STALL[1] * files_rank + STALL[2] * bytes_rank
        durable = DURABLE[0] + DURABLE[1] * files_rank + DURABLE[2] * bytes_rank * world / GB
        rows.append({**common, "kind": "checkpoint", "bytes_per_rank_max": bytes_rank,
                     "files_per_rank_max": files_rank, "bytes": bytes_rank * world, "files": files_rank * world,
                     "stall_max_s": stall, "durable_rank_max_s": durable, "slowdown_s": 0.25 * (durable - stall),
                     "background_seen": True})
        rows.append({**common, "kind": "restart",
                     "restart_ckpt_load_s": LOAD[0] + LOAD[1] * files_rank + LOAD[2] * bytes_rank * world / (2 * GB),
                     "restart_launch_s": 0.1, "restart_imports_s": 5.0, "restart_dist_init_s": 0.5 + 0.25 * world,
                     "restart_model_build_s": 0.5 + 2e-8 * params, "restart_ds_init_s": 1.0 + 1e-8 * params,
                     "restart_engine_setup_s": 0.01, "restart_1st_iter_s": 1.5, "path_gaps_s": 0.05})
    return rows


def _set(rows: list[dict], run_id: str, kind: str, **values) -> None:
    for row in rows:
        if row["run_id"] == run_id and row["kind"] == kind:
            row.update(values)


def test_an_empty_calibration_is_refused_saying_which_runs_would_fit_the_model():
    with pytest.raises(FitError) as error:
        fit_table(pd.DataFrame(), LIMITS)
    assert str(error.value) == ("the calibration has no complete runs; runs that would fit the model: real runs of "
                                "tiny and small tp1pp1dp2 per engine, and emulated big checkpoints "
                                "(bench/whatif_validation.py)")


def test_the_start_up_and_the_world_size_come_from_the_real_runs_and_an_emulated_engine_has_no_setup():
    emulated = _rows("torch-emulated", "e", ranks=(8, 8, 16, 16))
    for row in emulated:
        row.update(restart_launch_s=9.0, restart_imports_s=0.5, path_gaps_s=0.9)  # no model, no DeepSpeed
    fit = fit_table(pd.DataFrame(_rows() + emulated), LIMITS)
    real = ("r0", "r1", "r2", "r3")
    assert fit.calibrated_ranks == 4
    assert fit.runs == ["e0", "e1", "e2", "e3", *real]
    for part in ("launch", "imports", "gaps", "dist init", "model build"):
        assert fit.startup[part].runs == real, part
    assert (fit.startup["launch"].intercept, fit.startup["gaps"].intercept) == (0.1, 0.05)
    assert set(fit.engines) == {"torch", "torch-emulated"} and fit.real_engines() == ["torch"]
    assert "engine setup" in fit.engines["torch"] and "engine setup" not in fit.engines["torch-emulated"]


def test_a_calibration_of_emulated_runs_only_is_refused_naming_the_launch():
    with pytest.raises(FitError, match=r"^term 'launch': no calibration run measured it"):
        fit_table(pd.DataFrame(_rows("torch-emulated")), LIMITS)


def test_the_fit_says_the_devices_of_its_runs_joined():
    table = pd.DataFrame(_rows())
    fit = fit_table(table.assign(device=["cuda" if r.endswith(("0", "1")) else "cpu" for r in table["run_id"]]),
                    LIMITS)
    assert fit.device == "cpu+cuda"


def test_asking_for_an_engine_the_calibration_never_ran_names_the_ones_it_has():
    fit = fit_table(pd.DataFrame(_rows("torch") + _rows("lazy", "l")), LIMITS)
    with pytest.raises(FitError) as error:
        fit.engine("dcp")
    assert str(error.value) == ("the calibration has no runs of engine 'dcp' (it has lazy, torch); runs that would fit "
                                "it: real runs of dcp on two presets (tiny and small tp1pp1dp2)")


def test_model_build_and_ds_init_are_lines_in_the_parameters_per_rank():
    fit = fit_table(pd.DataFrame(_rows()), LIMITS)
    for part, (a, b) in {"model build": (0.5, 2e-8), "ds init": (1.0, 1e-8)}.items():
        assert fit.startup[part].intercept == pytest.approx(a, rel=1e-6), part
        assert fit.startup[part].coefficients == {"params": pytest.approx(b, rel=1e-6)}, part


def test_a_start_up_part_whose_regressor_never_varies_is_its_median_with_a_note_of_the_runs_that_would_fit_it():
    rows = _rows(ranks=(2, 2, 2, 2))
    for run, seconds in zip(("r0", "r1", "r2", "r3"), (1.0, 1.2, 0.8, 1.1)):
        _set(rows, run, "restart", restart_dist_init_s=seconds)
    line = fit_table(pd.DataFrame(rows), LIMITS).startup["dist init"]
    assert line.intercept == pytest.approx(1.05) and line.coefficients == {}
    assert (line.low, line.high) == pytest.approx((0.8 / 1.05 - 1, 1.2 / 1.05 - 1))
    assert line.runs == ("r0", "r1", "r2", "r3") and line.intercept_per == ""
    assert line.note == ("ranks not fitted (the same in every calibration run); runs that would fit it: real runs at "
                         "two world sizes (2 and 4 ranks)")


def test_a_run_without_a_clean_iteration_time_is_left_out_of_the_first_iteration_ratio():
    rows = _rows()
    for run, seconds in zip(("r0", "r1", "r2", "r3"), (0.5, 0.0, math.nan, 0.25)):
        _set(rows, run, "restart", iteration_s=seconds)
    line = fit_table(pd.DataFrame(rows), LIMITS).startup["1st iter ratio"]
    assert line.intercept == pytest.approx((1.5 / 0.5 + 1.5 / 0.25) / 2) and line.runs == ("r0", "r3")


@pytest.mark.parametrize(("part", "column"), [
    ("launch", "restart_launch_s"), ("imports", "restart_imports_s"), ("dist init", "restart_dist_init_s"),
    ("model build", "restart_model_build_s"), ("ds init", "restart_ds_init_s"),
    ("1st iter ratio", "restart_1st_iter_s"), ("gaps", "path_gaps_s")])
def test_a_start_up_part_no_run_measured_is_refused_naming_it(part, column):
    with pytest.raises(FitError) as error:
        fit_table(pd.DataFrame(_rows()).assign(**{column: math.nan}), LIMITS)
    assert str(error.value) == (f"term '{part}': no calibration run measured it; runs that would fit it: any complete "
                                "real run (tiny tp1pp1dp2)")


@pytest.mark.parametrize(("term", "column", "hint"), [
    ("durable", "durable_rank_max_s", f"{HINTS['files']}; {HINTS['at_limit']}"),
    ("ckpt load", "restart_ckpt_load_s", f"{HINTS['files']}; {HINTS['at_limit']}"),
    ("engine setup", "restart_engine_setup_s", "any complete real run (tiny tp1pp1dp2)")])
def test_an_engine_whose_term_no_run_measured_is_unfitted_naming_the_term(term, column, hint):
    lazy = pd.DataFrame(_rows("lazy", "l"))
    lazy = lazy.drop(columns=column) if term == "engine setup" else lazy.assign(**{column: math.nan})
    fit = fit_table(pd.concat([pd.DataFrame(_rows()), lazy]), LIMITS)
    message = f"term 'lazy {term}': no calibration run measured it; runs that would fit it: {hint}"
    assert fit.unfitted == {"lazy": message} and "torch" in fit.engines
    with pytest.raises(FitError) as error:
        fit.engine("lazy")
    assert str(error.value) == f"engine 'lazy' was not fitted: {message}"


def test_sigma_is_the_median_over_the_checkpoints_whose_background_work_training_saw_to_its_end():
    rows = _rows("lazy", ranks=(2, 2, 4, 4, 6, 6))
    fractions = {"r0": 0.1, "r1": 0.2, "r2": 0.4, "r3": 0.9, "r4": 0.9, "r5": 0.9}
    for row in (r for r in rows if r["kind"] == "checkpoint"):
        row["slowdown_s"] = fractions[row["run_id"]] * (row["durable_rank_max_s"] - row["stall_max_s"])
    _set(rows, "r3", "checkpoint", background_seen=False)  # training ended before the background work
    _set(rows, "r4", "checkpoint", slowdown_s=math.nan)
    r5 = next(r for r in rows if r["run_id"] == "r5" and r["kind"] == "checkpoint")
    r5["durable_rank_max_s"] = r5["stall_max_s"]  # nothing left to the background
    line = fit_table(pd.DataFrame(rows), LIMITS).engines["lazy"]["slowdown"]
    assert (line.intercept, line.low, line.high) == pytest.approx((0.2, -0.5, 1.0))
    assert line.runs == ("r0", "r1", "r2")


def test_sigma_is_zero_with_a_note_where_no_background_work_was_seen():
    rows = _rows("lazy")
    for row in rows:
        row["background_seen"] = False
    assert fit_table(pd.DataFrame(rows), LIMITS).engines["lazy"]["slowdown"] == Line(
        0.0, note="lazy: no checkpoint's background work was seen to its end during training; runs that would fit "
                  "it: real runs with more than one save interval (--iters 4 --save-interval 2)")


#: Runs of ``k`` ranks per process: (ranks, nodes, k, files on the node, bytes on the node); the node's processes
#: (ranks / nodes / k) share its files.
PER_PROCESS = ((8, 1, 1, 24, 1e9), (8, 1, 2, 24, 2e9), (8, 2, 2, 24, 3e9), (4, 1, 4, 16, 1.5e9), (4, 1, 1, 16, 0.5e9),
               (16, 2, 4, 60, 4e9))


def test_the_durable_line_takes_the_files_per_writer_and_the_ranks_each_process_handles_in_turn():
    rows, per_process = [], {}
    for i, (world, nodes, k, files, size) in enumerate(PER_PROCESS):
        writers = world // nodes // k
        bytes_rank, files_rank = size / nodes / writers / k, 2 + i
        per_process[f"r{i}"] = k
        common = {"run_id": f"r{i}", "engine": "torch", "preset": "tiny" if i % 2 else "small", "layout": "x",
                  "tp": 1, "pp": 1, "ranks": world, "nodes": nodes, "iteration_s": 0.5, "restore_layout": None}
        rows.append({**common, "kind": "checkpoint", "bytes_per_rank_max": bytes_rank, "files_per_rank_max": files_rank,
                     "bytes": size, "files": files,
                     "stall_max_s": STALL[0] + STALL[1] * files_rank + STALL[2] * bytes_rank,
                     "durable_rank_max_s": 0.2 * k + 0.01 * files / nodes / writers + 1.5 * size / nodes / GB})
        rows.append({**common, "kind": "restart", "restart_ckpt_load_s": 0.1 + 2 * bytes_rank * writers / (2 * GB),
                     "restart_launch_s": 0.1, "restart_imports_s": 5.0, "restart_dist_init_s": 0.5 + 0.01 * world,
                     "restart_model_build_s": 0.2, "restart_ds_init_s": 1.0, "restart_engine_setup_s": 0.01,
                     "restart_1st_iter_s": 1.5, "path_gaps_s": 0.05})
    durable = fit_table(pd.DataFrame(rows), LIMITS, per_process).engines["torch"]["durable"]
    assert durable.intercept_per == "in_turn" and durable.intercept == pytest.approx(0.2, rel=1e-6)
    assert durable.coefficients == {"files": pytest.approx(0.01, rel=1e-6), "at_limit": pytest.approx(1.5, rel=1e-6)}
    assert (durable.low, durable.high) == pytest.approx((0.0, 0.0), abs=1e-9)


#: DCP runs: (preset, layout, dp, ranks, ranks per process, bytes per rank, tensors written at that dp, held), the
#: counts as restartbench.whatif.tensors gives them (tests/test_whatif_tensors.py holds them to the decoder's
#: arithmetic and to DCP's deduplication): tiny 39 module tensors on one stage, 19 and 20 on two; small 75, and 37
#: and 38; 4 optimizer tensors. At dp 2 the busiest replica writes 25 of tiny's 39, 45 of small's 75, 27 of 38.
DCP = (("tiny", "tp1pp1dp2", 2, 2, 1, 1e8, 29, 43), ("tiny", "tp1pp2dp1", 1, 2, 2, 2e8, 24, 24),
       ("small", "tp1pp1dp2", 2, 2, 1, 3e8, 49, 79), ("small", "tp1pp2dp1", 1, 2, 2, 1.5e8, 42, 42),
       ("small", "tp1pp2dp2", 2, 4, 4, 2.5e8, 31, 42), ("tiny", "tp1pp1dp2", 2, 2, 2, 0.7e8, 29, 43))


def test_dcps_durable_line_pays_the_tensors_written_once_for_each_rank_a_process_handles_in_turn():
    rows, per_process = _dcp_rows()
    durable = fit_table(pd.DataFrame(rows), LIMITS, per_process).engines["dcp"]["durable"]
    assert durable.intercept == pytest.approx(0.1, rel=1e-6)
    assert durable.coefficients == {"at_limit": pytest.approx(1.1, rel=1e-6),
                                    "tensors": pytest.approx(0.0015, rel=1e-6)}
    # the fit hands each run's width on: small tp1pp1dp2 weighed at 0.1, its busiest replica writes 53 tensors, not 49
    rescaled = fit_table(pd.DataFrame(rows), LIMITS, per_process, scales={"d2": 0.1}).engines["dcp"]["durable"]
    assert rescaled.coefficients["tensors"] != pytest.approx(0.0015, rel=1e-3)


def _dcp_rows() -> tuple[list[dict], dict[str, int]]:
    rows, per_process = [], {}
    for i, (preset, layout, dp, world, k, bytes_rank, written, held) in enumerate(DCP):
        writers = world // k
        per_process[f"d{i}"] = k
        common = {"run_id": f"d{i}", "engine": "dcp", "preset": preset, "layout": layout, "dtype": "bf16", "tp": 1,
                  "pp": 2 if "pp2" in layout else 1, "dp": dp, "ranks": world, "nodes": 1, "iteration_s": 0.5,
                  "restore_layout": None}
        rows.append({**common, "kind": "checkpoint", "bytes_per_rank_max": bytes_rank, "files_per_rank_max": 2,
                     "bytes": bytes_rank * world, "files": 2 * writers,
                     "stall_max_s": 0.02 + 4e-9 * bytes_rank + 0.0017 * written,
                     "durable_rank_max_s": 0.1 * k + 1.1 * bytes_rank * world / GB + 0.0015 * written * k})
        rows.append({**common, "kind": "restart",
                     "restart_ckpt_load_s": 0.05 + 3.0 * bytes_rank * writers / (2 * GB) + 0.0025 * held,
                     "restart_launch_s": 0.1, "restart_imports_s": 5.0, "restart_dist_init_s": 0.5 + 0.01 * world,
                     "restart_model_build_s": 0.2, "restart_ds_init_s": 1.0, "restart_engine_setup_s": 0.01,
                     "restart_1st_iter_s": 1.5, "path_gaps_s": 0.05})
    return rows, per_process


def test_an_emulated_dcp_runs_tensors_written_are_weighed_at_its_width():
    """3B tp1pp1dp2: at full width DCP's busiest replica writes 179 module tensors, at --emulate-scale 0.08 (the
    embedding a smaller share of a stage's bytes) 161; held is the same."""
    row = {"run_id": "e", "engine": "dcp-emulated", "preset": "3B", "layout": "tp1pp1dp2", "dtype": "bf16", "tp": 1,
           "pp": 1, "dp": 2, "ranks": 2, "nodes": 1, "kind": "checkpoint", "bytes_per_rank_max": 1e8,
           "files_per_rank_max": 1, "bytes": 2e8, "files": 3, "restart_ckpt_load_s": None}
    full, _ = run_rows(pd.DataFrame([row]), LIMITS, {})
    scaled, _ = run_rows(pd.DataFrame([row]), LIMITS, {}, scales={"e": 0.08})
    assert (full[0]["tensors_rank"], full[0]["tensors_written"]) == (259, 179 + 4)
    assert (scaled[0]["tensors_rank"], scaled[0]["tensors_written"]) == (259, 161 + 4)


def test_a_dcp_rows_held_bytes_are_its_dtypes():
    """What a DCP run's busiest rank read at its load: what it wrote, and its replica's module share, whose bytes
    are the run's dtype's (bf16 where the table has none)."""
    row = {"run_id": "d", "engine": "dcp", "preset": "tiny", "layout": "tp1pp1dp2", "tp": 1, "pp": 1, "dp": 2,
           "ranks": 2, "nodes": 1, "kind": "checkpoint", "bytes_per_rank_max": 1e6, "files_per_rank_max": 1,
           "bytes": 2e6, "files": 3, "restart_ckpt_load_s": None}
    held = {dtype: run_rows(pd.DataFrame([{**row, **({"dtype": dtype} if dtype else {})}]), LIMITS, {})[0][0][
        "held_rank"] for dtype in (None, "bf16", "fp32")}
    module = {dtype: tensors.stage_module("tiny", "tp1pp1dp2", dtype) for dtype in ("bf16", "fp32")}
    beyond = {dtype: tensors.read_beyond_written(module[dtype], Layout(1, 1, 2), "dcp") for dtype in module}
    assert held == {None: 1e6 + beyond["bf16"], "bf16": 1e6 + beyond["bf16"], "fp32": 1e6 + beyond["fp32"]}
    assert beyond["fp32"] > beyond["bf16"] > 0


# -- the rows' regressors ------------------------------------------------------------------------------------------


def _checkpoint_and_restart(run_id: str, **columns) -> list[dict]:
    common = {"run_id": run_id, "engine": "torch", "restore_layout": None, **columns}
    return [{**common, "kind": "checkpoint"}, {**common, "kind": "restart", "restart_ckpt_load_s": 1.0}]


def test_each_rows_regressors_from_its_nodes_processes_layout_and_the_machines_limits_and_cores():
    table = pd.DataFrame(
        _checkpoint_and_restart("a", preset="small", layout="tp2pp2dp2", tp=2, pp=2, ranks=8, nodes=2,
                                bytes_per_rank_max=3e8, files_per_rank_max=5, bytes=1.6e9, files=24)
        + _checkpoint_and_restart("b", preset="tiny", layout="tp1pp1dp2", tp=1, pp=1, ranks=2, nodes=1,
                                  bytes_per_rank_max=1e8, files_per_rank_max=2, bytes=2e8, files=4))
    checkpoints, restarts = run_rows(table, Limits(write_GBps=1.0, read_GBps=2.0, source="s"), {"a": 2, "b": 2},
                                     cores_per_node=1)
    a, b = checkpoints
    # a: 8 ranks on 2 nodes, 2 per process: 2 processes a node; b: 2 ranks, one process
    assert (a["concurrency"], a["in_turn"], a["cpu_factor"]) == (2, 2, 2.0)
    assert (b["concurrency"], b["in_turn"], b["cpu_factor"]) == (1, 2, 1.0)
    assert (a["files_node"], a["at_limit"]) == pytest.approx((24 / 2 / 2, 1.6e9 / 2 / 1e9))
    assert (b["files_node"], b["at_limit"]) == pytest.approx((4, 0.2))
    assert (a["params_rank"], b["params_rank"]) == pytest.approx((SMALL / 4, TINY))
    assert (a["bytes"], a["files"], a["bytes_rank"], a["files_rank"]) == (3e8, 5, 3e8, 5)
    assert all(r["tensors_rank"] == r["tensors_written"] == 0.0 for r in checkpoints)  # torch: not counted
    for restart, checkpoint in zip(restarts, checkpoints):
        for key in ("concurrency", "bytes_rank", "files_rank", "params_rank", "tensors_rank", "cpu_factor"):
            assert restart[key] == checkpoint[key], key
    assert [r["read_at_limit"] for r in restarts] == pytest.approx([3e8 * 2 / 2e9, 1e8 / 2e9])


def test_only_restarts_that_read_their_own_checkpoint_on_its_layout_enter_the_fit():
    rows = []
    for run in ("kept", "unnamed", "prefetched", "not-prefetched", "unsaid", "unknown", "resharded", "no-load"):
        rows += _checkpoint_and_restart(run, preset="tiny", layout="tp1pp1dp2", tp=1, pp=1, ranks=2, nodes=1,
                                        bytes_per_rank_max=1e8, files_per_rank_max=2, bytes=2e8, files=4)
        _set(rows, run, "restart", restore_layout="tp1pp1dp2")  # the analysis names the layout of every restart
    _set(rows, "prefetched", "restart", prefetched=True)  # its load read beside the start-up
    _set(rows, "not-prefetched", "restart", prefetched=False)
    _set(rows, "unsaid", "restart", prefetched=None)  # and "unknown" has no value at all: NaN
    _set(rows, "resharded", "restart", restore_layout="tp1pp2dp1")
    _set(rows, "unnamed", "restart", restore_layout=None)  # a column of texts: NaN under pandas 3
    _set(rows, "no-load", "restart", restart_ckpt_load_s=math.nan)
    rows.append({**rows[1], "run_id": "no-checkpoint"})  # a restart of a run whose checkpoint is not in the table
    checkpoints, restarts = run_rows(pd.DataFrame(rows), LIMITS, {})
    assert len(checkpoints) == 8
    assert [(r["run_id"], r["kind"]) for r in restarts] == [
        (run, "restart") for run in ("kept", "unnamed", "not-prefetched", "unsaid", "unknown")]


# -- an emulated checkpoint's own times ---------------------------------------------------------------------------


def _write_events(folder, records: dict[int, list[dict]]) -> None:
    (folder / "events").mkdir(parents=True)
    for rank, events in records.items():
        (folder / "events" / f"train-rank{rank:05d}.jsonl").write_text(
            "".join(json.dumps({"phase": "train", "rank": rank, "time": 0.0, **e}) + "\n" for e in events))


def _started(**fields) -> dict:
    return {"event": "process.start", "start": -1.0, "duration_s": 1.0, **fields}


def _save(tag: str, start: float, seconds: float) -> dict:
    return {"event": "checkpoint.save", "tag": tag, "step": 1, "start": start, "time": start + seconds,
            "duration_s": seconds}


def _durable(tag: str, since_start: float) -> dict:
    return {"event": "checkpoint.durable", "tag": tag, "since_save_start_s": since_start, "bytes": 1, "n_files": 1}


def _wait(tag: str, seconds: float) -> dict:
    return {"event": "checkpoint.copy_wait", "tag": tag, "duration_s": seconds}


def test_a_rank_whose_files_never_became_durable_is_left_out_and_a_tag_without_any_is_skipped(tmp_path):
    _write_events(tmp_path, {
        0: [_started(pid=1001), _save("step1", 10.0, 0.1), _save("step2", 20.0, 0.1), _durable("step2", 0.3),
            _save("step3", 30.0, 0.1), _durable("step3", 0.3)],
        1: [_started(pid=1002), _save("step1", 10.0, 0.2), _save("step2", 20.0, 0.2), _save("step3", 30.0, 0.2),
            _durable("step3", 0.4)]})
    assert emulated_own_times(tmp_path, "torch-emulated") == {"step2": pytest.approx({"stall": 0.1, "durable": 0.3}),
                                                              "step3": pytest.approx({"stall": 0.2, "durable": 0.4})}


def test_a_saves_copy_waits_are_summed_into_its_stall(tmp_path):
    _write_events(tmp_path, {0: [_started(pid=1001), _save("step1", 10.0, 0.1), _wait("step1", 0.05),
                                 _wait("step1", 0.02), _durable("step1", 0.5)]})
    assert emulated_own_times(tmp_path, "lazy-emulated")["step1"] == pytest.approx({"stall": 0.17, "durable": 0.5})


def test_a_collective_saves_stall_holds_each_ranks_copy_wait(tmp_path):
    # DCP: rank 0 arrives 1.2 s before rank 1; both end at 13.9; rank 1 then waits 0.3 s for its copies
    _write_events(tmp_path, {0: [_started(pid=1001), _save("step1", 10.0, 3.9), _durable("step1", 3.91)],
                             1: [_started(pid=1002), _save("step1", 11.2, 2.7), _wait("step1", 0.3),
                                 _durable("step1", 2.71)]})
    assert emulated_own_times(tmp_path, "dcp-emulated")["step1"] == pytest.approx({"stall": 3.0, "durable": 3.0})


@pytest.mark.parametrize(("started", "durable"), [
    ({}, 0.3),  # no process.start: each rank its own process
    ({0: {}, 1: {}}, 0.3),  # a process.start without its pid: the same
    ({0: {"pid": 1001}, 1: {"pid": 1001}}, 0.5)])  # one process: its ranks in turn
def test_a_rank_without_a_recorded_process_counts_as_its_own(tmp_path, started, durable):
    records = {0: [_save("step1", 10.0, 0.1), _durable("step1", 0.3)],
               1: [_save("step1", 11.0, 0.1), _durable("step1", 0.2)]}
    for rank, fields in started.items():
        records[rank].insert(0, _started(**fields))
    _write_events(tmp_path, records)
    assert emulated_own_times(tmp_path, "torch-emulated")["step1"]["durable"] == pytest.approx(durable)


def test_the_table_takes_an_emulated_checkpoints_own_stall_and_durable_time(tmp_path):
    _write_events(tmp_path, {0: [_started(pid=1001), _save("step1", 10.0, 0.1), _durable("step1", 0.3)],
                             1: [_started(pid=1001), _save("step1", 11.0, 0.15), _durable("step1", 0.3)]})
    table = pd.DataFrame([{"run": str(tmp_path), "kind": "checkpoint", "engine": "torch-emulated", "tag": "step1",
                           "stall_max_s": 1.15, "durable_rank_max_s": 1.3}])
    out = with_own_times(table)
    assert (out.at[0, "stall_max_s"], out.at[0, "durable_rank_max_s"]) == pytest.approx((0.15, 0.6))
    assert out.at[0, "durable_clock_s"] == 1.3


# -- the fit file ----------------------------------------------------------------------------------------------

FIT = Fit(Limits(1.5, 2.5, "fio at 2 writers"), calibrated_ranks=4,
          engines={"torch": {"durable": Line(0.1, {"files": 0.01, "at_limit": 2.0}, -0.1, 0.2, ("r0", "r1"),
                                             "tensors not fitted", "in_turn"),
                             "stall": Line(0.05, {"bytes": 1e-9}, -0.05, 0.05, ("r0", "r1"))}},
          startup={"launch": Line(2.0, {}, -0.05, 0.1, ("r0",), "")}, runs=["r0", "r1", "r2"],
          unfitted={"lazy": "term 'lazy stall': no calibration run measured it"}, cores_per_node=2, device="cpu+cuda")


def test_a_fit_file_reads_back_every_field_it_was_written_with(tmp_path):
    path = tmp_path / "fit.json"
    write_fit(FIT, path)
    assert read_fit(path) == FIT


def test_a_fit_file_of_before_the_per_rank_intercept_and_the_unfitted_engines_reads_as_paid_once_and_none():
    old = to_json(FIT)
    del old["unfitted"]
    for line in (*old["startup"].values(), *(v for terms_ in old["engines"].values() for v in terms_.values())):
        del line["intercept_per"]
    fit = from_json(json.loads(json.dumps(old)))
    durable = FIT.engines["torch"]["durable"]
    assert fit.engines["torch"]["durable"] == replace(durable, intercept_per="") and fit.unfitted == {}
    assert fit.engines["torch"]["durable"](files=10, at_limit=1.0, in_turn=4) == pytest.approx(0.1 + 0.1 + 2.0)


def test_a_file_that_is_not_a_fit_is_refused_naming_the_error(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text("{}")
    with pytest.raises(FitError) as error:
        read_fit(path)
    assert str(error.value) == (f"{path}: not a what-if fit file (KeyError: 'limits'); write one with python "
                                "bench/whatif_validation.py")

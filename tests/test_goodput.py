"""The checkpoint interval and goodput that the measured costs imply, against figures worked by hand."""

import math

import pytest

from restartbench import goodput


def test_the_default_failure_rate_is_llama3s():
    """419 interruptions in 54 days on 16,384 GPUs."""
    assert goodput.LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(1.9733e-5, rel=1e-4)
    assert goodput.mtbf_s(goodput.LLAMA3_FAILURES_PER_GPU_HOUR, 16_384) == pytest.approx(54 * 24 * 3600 / 419)


def test_mtbf_of_a_job():
    assert goodput.mtbf_s(0.001, 1000) == 3600.0  # one failure per hour over the job
    with pytest.raises(ValueError, match="GPUs at least 1"):
        goodput.mtbf_s(0.001, 0)
    with pytest.raises(ValueError, match="failure rate must be above 0"):
        goodput.mtbf_s(0.0, 8)


def test_daly_optimum_by_hand():
    """C = 18 s, M = 3600 s: √(2CM) = 360; C/2M = 0.0025, √ = 0.05; 360 × (1 + 0.05/3 + 0.0025/9) − 18."""
    assert goodput.optimal_interval_s(18, 3600) == pytest.approx(360 * (1 + 0.05 / 3 + 0.0025 / 9) - 18)
    assert goodput.optimal_interval_s(18, 3600) == pytest.approx(348.1)  # 348.10: Young's 360 less about C
    assert goodput.optimal_interval_s(8000, 3600) == 3600  # C ≥ 2M: Daly's fallback, τ = M
    assert goodput.optimal_interval_s(0, 3600) == 0


def test_the_optimum_minimises_the_loss():
    cost, restart, mtbf = 18.0, 120.0, 3600.0
    best = goodput.optimal_interval_s(cost, mtbf)
    loss = [goodput.at_interval(t, cost, restart, mtbf).lost_share for t in (best * 0.8, best, best * 1.25)]
    assert loss[1] < loss[0] and loss[1] < loss[2]


def test_shares_at_an_interval_by_hand():
    """τ = 342 s, C = 18 s, R = 120 s, M = 3600 s: period 360 s; checkpoints 18/360 = 5 %, re-done work 360/7200 =
    5 %, restarts 120/3600 = 3.33 %; goodput 86.67 %."""
    budget = goodput.at_interval(342, 18, 120, 3600)
    assert (budget.checkpoint_share, budget.rework_share) == (pytest.approx(0.05), pytest.approx(0.05))
    assert budget.restart_share == pytest.approx(1 / 30)
    assert budget.goodput == pytest.approx(1 - 0.1 - 1 / 30)


def test_goodput_never_negative():
    assert goodput.at_interval(10, 1000, 5000, 3600).goodput == 0.0


def test_a_free_checkpoint_is_taken_every_iteration():
    budget = goodput.at_optimum(0.0, 60.0, 3600.0, iteration_s=2.5)
    assert budget.interval_s == 2.5 and budget.checkpoint_share == 0.0
    assert budget.rework_share == pytest.approx(2.5 / 7200)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="interval must be above 0 s"):
        goodput.at_interval(0, 1, 1, 3600)
    with pytest.raises(ValueError, match="cost must be at least 0 s"):
        goodput.optimal_interval_s(-1, 3600)
    assert math.isfinite(goodput.at_optimum(5, 30, 3600, 1).goodput)


def test_the_bounds_of_the_inputs_are_where_the_docstrings_put_them():
    """One GPU is a job; a restart of 0 s and an interval or MTBF under a second are valid; an MTBF of 0 and a
    negative restart are not; at C = 2M exactly Daly's fallback τ = M applies (his formula gives 8M/9 there)."""
    assert goodput.mtbf_s(1.0, 1) == 3600.0
    assert goodput.optimal_interval_s(0.5, 0.5) == pytest.approx(math.sqrt(0.5) * (1 + math.sqrt(0.5) / 3 + 0.5 / 9)
                                                                - 0.5)
    assert goodput.optimal_interval_s(7200, 3600) == 3600
    with pytest.raises(ValueError, match="MTBF above 0"):
        goodput.optimal_interval_s(18, 0)
    budget = goodput.at_interval(0.5, 0.5, 0.0, 3600)
    assert (budget.interval_s, budget.mtbf_s, budget.checkpoint_share, budget.restart_share) == (0.5, 3600, 0.5, 0.0)
    assert goodput.at_interval(342, 18, 0.5, 3600).restart_share == pytest.approx(0.5 / 3600)
    with pytest.raises(ValueError, match="restart at least 0 s"):
        goodput.at_interval(342, 18, -1, 3600)

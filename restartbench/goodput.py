"""What a checkpoint's measured cost and a restart's measured time imply at scale: the checkpoint interval and
the goodput (Young 1974, Daly 2006).

The model, first order, with its assumptions:

- failures arrive independently at a constant rate: ``failures_per_gpu_hour × gpus`` for the whole job, so the
  mean time between failures is ``M = 1 / rate``;
- training checkpoints every ``τ`` seconds of work; each checkpoint costs training ``C`` seconds (its stall plus
  the slowdown of the iterations its background work overlapped: the whole cost, not the stall alone);
- a failure loses, on average, half a checkpoint period of work (``(τ + C) / 2``), plus the restart ``R`` (relaunch,
  restore, until the first iteration is done again);
- failures during a checkpoint or a restart are not counted separately, which holds while ``τ + C + R ≪ M``.

Shares of wall time: checkpoints ``C / (τ + C)``; re-done work ``(τ + C) / (2M)``; restarts ``R / M``. The goodput is
what is left. The interval that minimises the loss is Daly's higher-order estimate
``τ* = √(2CM) · (1 + ⅓·√(C/2M) + ⅑·C/2M) − C`` for ``C < 2M`` (else ``M``); Young's ``√(2CM)`` is its first term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16_384)
"""The default failure rate: 419 unexpected interruptions in 54 days of Llama 3 405B pre-training on 16,384 H100s
(Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4): about 1.97e-5 per GPU-hour."""


@dataclass(frozen=True)
class Goodput:
    """The expected time budget of a long job at one checkpoint interval."""

    interval_s: float
    """Seconds of training between two checkpoints (τ)."""
    mtbf_s: float
    """Mean time between failures of the whole job (M)."""
    checkpoint_share: float
    """Share of wall time spent in checkpoints' cost to training."""
    rework_share: float
    """Share of wall time re-doing the work lost at failures."""
    restart_share: float
    """Share of wall time restarting after failures."""

    @property
    def lost_share(self) -> float:
        return self.checkpoint_share + self.rework_share + self.restart_share

    @property
    def goodput(self) -> float:
        """Share of wall time that is training progress kept (0 when the losses reach the whole time)."""
        return max(0.0, 1.0 - self.lost_share)


def mtbf_s(failures_per_gpu_hour: float, gpus: int) -> float:
    """Mean time between failures of a job on ``gpus`` GPUs, in seconds."""
    if failures_per_gpu_hour <= 0 or gpus < 1:
        raise ValueError(f"the failure rate must be above 0 and the GPUs at least 1 "
                         f"(got {failures_per_gpu_hour} per GPU-hour on {gpus} GPUs)")
    return 3600.0 / (failures_per_gpu_hour * gpus)


def optimal_interval_s(cost_s: float, mtbf: float) -> float:
    """Daly's higher-order optimum of the checkpoint interval for a checkpoint costing ``cost_s`` (C) and a mean
    time between failures ``mtbf`` (M)."""
    if cost_s < 0 or mtbf <= 0:
        raise ValueError(f"a checkpoint's cost must be at least 0 s and the MTBF above 0 (got {cost_s}, {mtbf})")
    if cost_s >= 2 * mtbf:
        return mtbf
    ratio = cost_s / (2 * mtbf)
    return math.sqrt(2 * cost_s * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


def at_interval(interval_s: float, cost_s: float, restart_s: float, mtbf: float) -> Goodput:
    """The time budget at checkpoint interval ``interval_s``."""
    if interval_s <= 0 or restart_s < 0:
        raise ValueError(f"the interval must be above 0 s and the restart at least 0 s "
                         f"(got {interval_s}, {restart_s})")
    period = interval_s + cost_s
    return Goodput(interval_s=interval_s, mtbf_s=mtbf, checkpoint_share=cost_s / period,
                   rework_share=period / (2 * mtbf), restart_share=restart_s / mtbf)


def at_optimum(cost_s: float, restart_s: float, mtbf: float, iteration_s: float) -> Goodput:
    """The time budget at Daly's optimal interval, but never below one iteration (``iteration_s``): a checkpoint
    is taken between iterations, so a nearly free one is taken after every iteration."""
    return at_interval(max(optimal_interval_s(cost_s, mtbf), iteration_s), cost_s, restart_s, mtbf)

"""Goodput: per configuration the checkpoint interval and the share of wall time kept that the measured checkpoint
cost C and restart R imply under a failure rate (``goodput_table``, by ``restartbench.goodput``'s Young/Daly model),
the model's assumptions in one line, and the start-up floor (engine none's restart)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from restartbench import goodput
from restartbench.analysis.checkpoints import checkpoint_summary
from restartbench.analysis.grouping import group_keys, sort_rows
from restartbench.analysis.restarts import restart_summary

#: Columns of ``goodput_table`` (after the grouping keys) and what each holds.
GOODPUT_COLUMNS: dict[str, str] = {
    "runs": "runs measured",
    "cost_s": "C: a checkpoint's whole cost to training, the stall (max over ranks) plus the slowdown of the "
              "iterations its background work overlapped (an asynchronous engine's copy and write; 0 for a "
              "synchronous engine), each the median over checkpoints and runs (checkpoint_summary's cost_s)",
    "cost_basis": "what C is made of (checkpoint_cost): stall + slowdown",
    "restart_s": "R: the restart, max over ranks of launch -> end of the first resumed iteration (median over runs), "
                 "as measured on this machine",
    "iteration_s": "the clean median: median phase-1 iteration time (max over ranks) over the iterations that "
                   "overlapped no checkpoint's background work",
    "failures_per_gpu_hour": "F: failures per GPU-hour (--failures-per-gpu-hour; default Llama 3's)",
    "gpus": "G: GPUs of the job the failure rate applies to (--gpus, else the run's own world size)",
    "mtbf_s": "M = 3600 / (F · G): mean time between failures of the job, seconds",
    "interval_s": "τ*: Daly's optimal training time between checkpoints (never below one iteration), seconds",
    "interval_iterations": "τ* in iterations: interval_s / iteration_s",
    "checkpoint_pct": "share of wall time spent in checkpoints at τ*: C / (τ* + C), percent",
    "rework_pct": "share of wall time re-doing work lost at failures at τ*: (τ* + C) / 2M, percent",
    "restart_pct": "share of wall time restarting after failures: R / M, percent",
    "goodput_pct": "share of wall time that is training progress kept: 100 minus the three shares, percent",
}


def checkpoint_cost(summary: pd.DataFrame) -> tuple[pd.Series, str]:
    """C, each configuration's checkpoint cost to training, from ``checkpoint_summary``, and what it is made of: the
    whole cost, stall + slowdown of the iterations a save's background work overlapped (``results.interference``).
    Where no slowdown could be measured (no clean iteration to compare with) C is unknown, not the stall alone."""
    return summary["cost_s"], "stall + slowdown"


def goodput_assumptions(failures_per_gpu_hour: float, gpus: int | None) -> str:
    """The goodput model's assumptions in one line, for every figure and table that shows it."""
    source = " (Llama 3: 419 interruptions in 54 days on 16,384 H100s)" \
        if failures_per_gpu_hour == goodput.LLAMA3_FAILURES_PER_GPU_HOUR else ""
    where = f"{gpus} GPUs" if gpus else "each run's own world size in GPUs"
    return (f"Young/Daly model: failures at a constant {failures_per_gpu_hour:.3g} per GPU-hour{source} on {where}; "
            "C = the whole cost of a checkpoint: its stall plus the slowdown of the iterations its background work "
            "overlapped; R = the restart as measured on this machine")


def goodput_table(table: pd.DataFrame, failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
                  gpus: int | None = None) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: the checkpoint interval and goodput that the measured cost C
    (``checkpoint_cost``) and restart R imply at ``failures_per_gpu_hour`` on ``gpus`` GPUs (None: each
    configuration's own world size), by ``restartbench.goodput`` (``GOODPUT_COLUMNS``). Configurations without a
    checkpoint (engine none), a restart total or an iteration time (emulated runs) have none and are left out."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    ckpt, rest = checkpoint_summary(table), restart_summary(table)
    if ckpt.empty or rest.empty:
        return pd.DataFrame(columns=[*keys, *GOODPUT_COLUMNS])
    cost, basis = checkpoint_cost(ckpt)
    merged = ckpt[[*keys, "runs", "ranks", "iteration_s"]].assign(cost_s=cost, cost_basis=basis).merge(
        rest[[*keys, "restart_s"]], on=keys, how="inner").dropna(subset=["cost_s", "restart_s", "iteration_s"])
    rows = [{**row, **_goodput_row(row, failures_per_gpu_hour, gpus)} for row in merged.to_dict("records")]
    return sort_rows(pd.DataFrame(rows).reindex(columns=[*keys, *GOODPUT_COLUMNS]), keys)


def _goodput_row(row: dict[str, Any], failures_per_gpu_hour: float, gpus: int | None) -> dict[str, Any]:
    count = int(gpus or row["ranks"])
    mtbf = goodput.mtbf_s(failures_per_gpu_hour, count)
    budget = goodput.at_optimum(row["cost_s"], row["restart_s"], mtbf, row["iteration_s"])
    return {"failures_per_gpu_hour": failures_per_gpu_hour, "gpus": count, "mtbf_s": mtbf,
            "interval_s": budget.interval_s, "interval_iterations": budget.interval_s / row["iteration_s"],
            "checkpoint_pct": 100 * budget.checkpoint_share, "rework_pct": 100 * budget.rework_share,
            "restart_pct": 100 * budget.restart_share, "goodput_pct": 100 * budget.goodput}


def start_up_floor(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset and layout (and varying setup): the median restart of engine none (nothing restored)."""
    restarts = table[(table["kind"] == "restart") & (table["restores_checkpoint"] == False)] \
        if not table.empty and "restores_checkpoint" in table.columns else table.iloc[0:0]  # noqa: E712
    keys = [k for k in group_keys(table) if k != "engine"] if not table.empty else ["preset", "layout"]
    if restarts.empty:
        return pd.DataFrame(columns=[*keys, "floor_s"])
    return restarts.groupby(keys, dropna=False)["restart_s"].median().rename("floor_s").reset_index()

"""Engines side by side: one row per engine of a preset and layout (``engine_comparison``), and every run's per-rank
spread of each figure (``rank_spread``)."""

from __future__ import annotations

import pandas as pd

from restartbench.analysis.checkpoints import checkpoint_summary
from restartbench.analysis.grouping import group_keys, select, sort_rows
from restartbench.analysis.restarts import restart_summary


def rank_spread(rank_table: pd.DataFrame) -> pd.DataFrame:
    """Per run and checkpoint tag (and per restart): the per-rank min, median and max of each figure, and the
    slowest rank (``<figure>_slowest_rank``)."""
    keys = ["preset", "layout", "engine", "run_id", "kind", "tag"]
    if rank_table.empty:
        return pd.DataFrame(columns=keys)
    metrics = [m for m in ("stall_s", "durable_s", "bytes", "files", "restart_s", "bytes_read") if m in rank_table]
    grouped = rank_table.groupby(keys, dropna=False, sort=False)
    spread = grouped[metrics].agg(["min", "median", "max"])
    spread.columns = [f"{metric}_{stat}" for metric, stat in spread.columns]
    spread = spread.dropna(axis=1, how="all").reset_index()
    for metric in ("stall_s", "durable_s", "restart_s"):
        if metric not in rank_table:
            continue
        slowest = (rank_table.dropna(subset=[metric]).sort_values(metric, ascending=False, kind="stable")
                   .drop_duplicates(keys)[[*keys, "rank"]].rename(columns={"rank": f"{metric}_slowest_rank"}))
        spread = spread.merge(slowest, on=keys, how="left")
        spread[f"{metric}_slowest_rank"] = spread[f"{metric}_slowest_rank"].astype("Int64")
    return spread


def engine_comparison(table: pd.DataFrame, preset: str | None = None, layout: str | None = None) -> pd.DataFrame:
    """One row per engine for a preset and layout: stall, slowdown and whole cost, durable, committed, throughput,
    restart and its load part, and each engine's stall relative to the least-stalling engine."""
    selected = select(table, preset, layout)
    ckpt = checkpoint_summary(selected)
    rest = restart_summary(selected)
    keys = [k for k in group_keys(selected) if k in ckpt.columns and k in rest.columns] if not selected.empty \
        else ["engine"]
    keep_c = [*keys, "runs", "checkpoints", "stall_s", "slowdown_s", "cost_s", "stall_rank_spread_s", "durable_s",
              "committed_s",
              "stall_overhead_pct", "bytes", "files", "write_MBps", "write_pct_of_storage", "write_limit"]
    keep_r = [*keys, "restart_s", "restart_ckpt_load_s", "read_MBps", "read_pct_of_storage", "read_limit", "cache",
              "exact"]
    merged = pd.merge(ckpt.reindex(columns=keep_c).drop(columns="runs"), rest.reindex(columns=keep_r),
                      on=keys, how="outer")
    if not selected.empty:
        runs = selected.groupby(keys, dropna=False)["run_id"].nunique().rename("runs").reset_index()
        merged = runs.merge(merged, on=keys, how="right")
    if "stall_s" in merged and merged["stall_s"].notna().any():
        best = merged.groupby([k for k in keys if k != "engine"], dropna=False)["stall_s"].transform("min")
        merged["stall_vs_best"] = merged["stall_s"] / best
    return sort_rows(merged, keys)

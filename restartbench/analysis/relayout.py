"""Restarts on another layout (``--restore-layout``) set beside the same layout's: per configuration and layout
restarted on, the attempts, their verdicts and the medians of the conversion and the load (``relayout_summary``)."""

from __future__ import annotations

import pandas as pd

from restartbench.analysis.grouping import group_keys, sort_rows
from restartbench.analysis.restarts import verdict_counts

#: The columns of ``relayout_summary``, each a median over the attempts that restarted (max over ranks).
RELAYOUT_COLUMNS = ("restart_s", "restart_convert_s", "restart_ckpt_load_s", "convert_bytes_read",
                    "convert_bytes_written", "convert_files_written", "bytes_read", "process_bytes_read", "loss_diff")


def relayout_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (the one saved on), engine and the layout restarted on (the run's own included, for
    comparison): attempts, verdicts (skipped ones with their reason) and the medians of ``RELAYOUT_COLUMNS``: a
    conversion plus load set against a restart on the same layout, or a direct reshard at load."""
    keys = [*(group_keys(table) if not table.empty else ["preset", "layout", "engine"]), "restore_layout"]
    if table.empty or table["restore_layout"].isna().all():  # no restart row (every restart row names one)
        return pd.DataFrame(columns=[*keys, "attempts", "verdicts", *RELAYOUT_COLUMNS])
    restarts = table[table["kind"] == "restart"]
    if "skip_reason" not in restarts:  # no attempt was skipped
        restarts = restarts.assign(skip_reason=None)
    counted = restarts.groupby(keys, dropna=False).agg(
        attempts=("run_id", "size"), verdicts=("verdict", verdict_counts),
        skip_reason=("skip_reason", lambda s: next(iter(s.dropna()), None))).reset_index()
    timed = restarts[restarts["restart_s"].notna()]
    medians = timed.groupby(keys, dropna=False).agg(
        **{column: (column, "median") for column in RELAYOUT_COLUMNS if column in timed}).reset_index()
    summary = counted.merge(medians, on=keys, how="left")
    return sort_rows(summary[[*summary.columns.drop("skip_reason"), "skip_reason"]], keys)

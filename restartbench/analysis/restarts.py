"""Restart summaries: per configuration the medians of the restart and its parts over runs and their restore
attempts on the run's own layout (``restart_summary``), the attempt a figure of one restart draws
(``typical_restarts``), ``deepspeed.initialize``'s stages (``ds_init_summary``) and one attempt's host memory as the
max over ranks (``max_over_ranks``)."""

from __future__ import annotations

import pandas as pd

from restartbench.analysis.baselines import flagged
from restartbench.analysis.columns import PATH_COLUMNS, RESTART_PART_COLUMNS
from restartbench.analysis.grouping import group_keys, sort_rows


def restart_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: medians over runs and their restore attempts of the restart
    and each part (max over ranks). Attempts that restored nothing (refused, failed) are counted in ``attempts`` and
    ``verdicts`` but have no times in the medians: their start-up was cut short. Restarts on another layout are left
    out (``relayout_summary``)."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = same_layout_restarts(table)
    if table.empty:
        return pd.DataFrame(columns=[*keys, "runs", "attempts", "ranks", "restart_s"])
    verdicts = restarts.groupby(keys, dropna=False).agg(attempts=("run_id", "size"),
                                                        verdicts=("verdict", verdict_counts)).reset_index()
    timed = restarts[restarts["restart_s"].notna()]
    timed = timed.assign(rank_spread_s=timed["restart_s"] - timed["restart_min_s"])
    grouped = timed.groupby(keys, dropna=False)
    summary = grouped.agg(
        runs=("run_id", "nunique"), ranks=("ranks", "max"), restart_s=("restart_s", "median"),
        **({"restart_less_checks_s": ("restart_less_checks_s", "median")} if "restart_less_checks_s" in timed else {}),
        restart_min_s=("restart_s", "min"), restart_max_s=("restart_s", "max"),
        rank_spread_s=("rank_spread_s", "median"),
        **{column: (column, "median") for column, _ in RESTART_PART_COLUMNS},
        **{column: (column, "median") for column, _ in PATH_COLUMNS if column in restarts},
        bytes_read=("bytes_read", "median"), files_read=("files_read", "median"), read_MBps=("read_MBps", "median"),
        read_pct_of_storage=("read_pct_of_storage", "median"), read_limit=("read_limit", flagged),
        restores_checkpoint=("restores_checkpoint", "any"),
        cache=("cache", lambda s: ", ".join(sorted({str(v) for v in s.dropna()})) or None),
        exact=("exact", lambda s: None if s.isna().all() else bool(s.dropna().astype(bool).all())),
        baseline_read_MBps=("baseline_read_MBps", "median"),
        **({"prefetched": ("prefetched", lambda s: bool(s.eq(True).all())),
            "prefetch_read_s": ("prefetch_read_s", "median"), "prefetch_wait_s": ("prefetch_wait_s", "median")}
           if "prefetched" in timed else {}),
        restore_peak_rss_bytes=("restore_peak_rss_bytes", "median"), resume_spike=("resume_spike", "median"),
    ).reset_index()
    summary = verdicts.merge(summary, on=keys, how="left")
    return sort_rows(summary[[*keys, "runs", "attempts", "verdicts", *summary.columns.drop([*keys, "runs",
                                                                                            "attempts", "verdicts"])]],
                     keys)


def same_layout_restarts(table: pd.DataFrame) -> pd.DataFrame:
    """The restart rows of restarts on the run's own layout."""
    if table.empty:
        return table
    restarts = table[table["kind"] == "restart"]
    if "restore_layout" not in restarts.columns:
        return restarts
    return restarts[restarts["restore_layout"].isna() | (restarts["restore_layout"] == restarts["layout"])]


def typical_restarts(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: the one timed restore attempt whose restart is nearest its
    configuration's median (the first in the table on a tie): the restart a figure of one restart draws."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = same_layout_restarts(table)
    timed = restarts[restarts["restart_s"].notna()] if not restarts.empty else restarts
    if timed.empty:
        return timed
    distance = (timed["restart_s"] - timed.groupby(keys, dropna=False)["restart_s"].transform("median")).abs()
    nearest = timed.assign(_distance=distance).sort_values("_distance", kind="stable")
    return sort_rows(nearest.groupby(keys, dropna=False, sort=False).head(1).drop(columns="_distance"), keys)


def verdict_counts(verdicts: pd.Series) -> str:
    """'3 exact, 1 refused': each verdict of the attempts with its count, most frequent first."""
    counts = verdicts.astype(object).fillna("unknown").value_counts()
    return ", ".join(f"{count} {verdict}" for verdict, count in counts.items())


def ds_init_summary(table: pd.DataFrame, top: int = 5, column: str = "ds_init_parts") -> pd.DataFrame:
    """Per preset, layout (, varying setup) and engine: ``deepspeed.initialize``'s stages as medians over runs and
    restore attempts: the ``top`` slowest stages by name, the rest as ``other stages``, then ``collective wait`` and
    ``other``, and ``parts_sum_s``, their sum. From ``ds_init_parts`` (the default) each stage is its max over ranks,
    so the sum can exceed any one rank's call; from ``path_ds_init_parts`` the stages are the critical rank's, those
    of the restart figure's ds init bar. Empty where no restart timed the stages."""
    keys = group_keys(table) if not table.empty else ["preset", "layout", "engine"]
    restarts = table[(table["kind"] == "restart") & table[column].notna()] \
        if not table.empty and column in table.columns else table.iloc[0:0]
    if restarts.empty:
        return pd.DataFrame(columns=[*keys, "parts_sum_s"])
    parts = pd.DataFrame(restarts[column].tolist(), index=restarts.index).fillna(0.0)
    medians = parts.join(restarts[keys]).groupby(keys, dropna=False).median().reset_index()
    fixed = [c for c in ("collective wait", "other") if c in medians]
    stages = [c for c in medians.columns if c not in (*keys, *fixed)]
    ranked = sorted(stages, key=lambda c: -medians[c].max())
    summary = medians[[*keys, *ranked[:top]]].assign(**{"other stages": medians[ranked[top:]].sum(axis=1)})
    summary = summary.join(medians[fixed])
    return summary.assign(parts_sum_s=summary.drop(columns=keys).sum(axis=1))


def max_over_ranks(samples: pd.DataFrame) -> pd.DataFrame:
    """One restore attempt's ``memory_table`` rows as one line, ``t_s`` and ``rss_bytes``: at each rank's sample time
    the largest RSS of any rank, each rank holding its last sample until its next (ranks sample at their own times);
    a rank counts from its first sample to its last."""
    if samples.empty:
        return pd.DataFrame(columns=["t_s", "rss_bytes"])
    wide = samples.pivot_table(index="t_s", columns="rank", values="rss_bytes", aggfunc="max").sort_index()
    held = wide.ffill().where(wide.bfill().notna())
    return held.max(axis=1).rename("rss_bytes").rename_axis("t_s").reset_index()

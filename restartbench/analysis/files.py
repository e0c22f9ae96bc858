"""Checkpoint files: one run's files (``inventory.json``, or without one the ``checkpoint.durable`` events), and the
tables of them: per checkpoint and kind, per writing rank, per configuration, and the predicted size against the
measured one (``size_check``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench import rundir
from restartbench.analysis.columns import FILE_KINDS
from restartbench.analysis.grouping import sort_rows
from restartbench.analysis.reading import read_json
from restartbench.estimate import OPTIMIZER_BYTES_PER_PARAM, weight_bytes
from restartbench.events import Event
from restartbench.presets import get_preset
from restartbench.results import file_kind
from restartbench.rundir import RunFolderError


def run_files(run_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checkpoint files (with a tag) from inventory.json, or from the durable events where there is none."""
    path = run_dir / rundir.INVENTORY
    if path.exists():
        entries = read_json(path, list)
        try:
            return [{"tag": e["tag"], "path": e["path"], "bytes": e["bytes"],
                     "kind": e.get("kind") or file_kind(e["path"]), "rank": e.get("rank")}
                    for e in entries if e.get("tag") is not None]
        except (KeyError, TypeError) as error:
            raise RunFolderError(f"{path}: an entry lacks {error} (expected tag, path, bytes, kind, rank)") from None
    return [{"tag": e["tag"], "path": f["path"], "bytes": f["bytes"], "kind": file_kind(f["path"]), "rank": e["rank"]}
            for e in events if e["event"] == Event.CHECKPOINT_DURABLE for f in e.get("files", [])]


def file_statistics(files: pd.DataFrame) -> pd.DataFrame:
    """Per run, checkpoint tag and file kind: count and size distribution (min / median / max bytes)."""
    if files.empty:
        return pd.DataFrame(columns=["preset", "layout", "engine", "run_id", "tag", "kind", "files", "total_bytes",
                                     "min_bytes", "median_bytes", "max_bytes"])
    checkpoint_files = files[files["tag"].notna()]
    grouped = checkpoint_files.groupby(["preset", "layout", "engine", "run_id", "tag", "kind"])["bytes"]
    return grouped.agg(files="count", total_bytes="sum", min_bytes="min", median_bytes="median",
                       max_bytes="max").reset_index()


def files_per_rank(files: pd.DataFrame) -> pd.DataFrame:
    """Per run, checkpoint tag and writing rank: files and bytes in total and per kind."""
    columns = ["preset", "layout", "engine", "run_id", "tag", "rank", "files", "bytes",
               *[f"{k}_bytes" for k in FILE_KINDS]]
    if files.empty:
        return pd.DataFrame(columns=columns)
    data = files[files["tag"].notna()].assign(rank=lambda f: f["rank"].astype("Int64"))
    keys = ["preset", "layout", "engine", "run_id", "tag", "rank"]
    totals = data.groupby(keys, dropna=False)["bytes"].agg(files="count", bytes="sum")
    by_kind = data.pivot_table(index=keys, columns="kind", values="bytes", aggfunc="sum", fill_value=0, dropna=False)
    by_kind = by_kind.reindex(columns=list(FILE_KINDS), fill_value=0).add_suffix("_bytes")
    return totals.join(by_kind).reset_index().reindex(columns=columns).fillna(
        {f"{k}_bytes": 0 for k in FILE_KINDS})


def file_summary(files: pd.DataFrame) -> pd.DataFrame:
    """Per preset, layout, engine and file kind: files per checkpoint, per rank, and the size distribution."""
    columns = ["preset", "layout", "engine", "kind", "files_per_checkpoint", "files_per_rank_max", "min_bytes",
               "median_bytes", "max_bytes", "bytes_per_checkpoint"]
    if files.empty:
        return pd.DataFrame(columns=columns)
    data = files[files["tag"].notna()]
    keys = ["preset", "layout", "engine"]
    per_ckpt = data.groupby([*keys, "run_id", "tag", "kind"])["bytes"].agg(n="count", total="sum").reset_index()
    per_rank = data.groupby([*keys, "run_id", "tag", "kind", "rank"], dropna=False).size().rename("n").reset_index()
    sizes = data.groupby([*keys, "kind"])["bytes"].agg(min_bytes="min", median_bytes="median", max_bytes="max")
    summary = (per_ckpt.groupby([*keys, "kind"]).agg(files_per_checkpoint=("n", "median"),
                                                     bytes_per_checkpoint=("total", "median"))
               .join(per_rank.groupby([*keys, "kind"])["n"].max().rename("files_per_rank_max"))
               .join(sizes).reset_index())
    total = (per_ckpt.groupby([*keys, "run_id", "tag"]).agg(n=("n", "sum"), total=("total", "sum")).reset_index()
             .groupby(keys).agg(files_per_checkpoint=("n", "median"), bytes_per_checkpoint=("total", "median")))
    all_rank = data.groupby([*keys, "run_id", "tag", "rank"], dropna=False).size().groupby(keys).max()
    total = total.join(all_rank.rename("files_per_rank_max")).join(
        data.groupby(keys)["bytes"].agg(min_bytes="min", median_bytes="median", max_bytes="max")).reset_index()
    summary = pd.concat([summary, total.assign(kind="all")], ignore_index=True)
    kind_order = {k: i for i, k in enumerate((*FILE_KINDS, "all"))}
    summary = summary.assign(_k=summary["kind"].map(lambda k: kind_order.get(k, len(kind_order))))
    return sort_rows(summary.sort_values("_k", kind="stable").drop(columns="_k"), ["preset", "layout", "engine"]) \
        .reindex(columns=columns)


def size_check(table: pd.DataFrame, files: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted checkpoint size (restartbench.plan's total for the run's engine, via estimate.checkpoint_bytes)
    against the measured one, per preset, layout, dtype and engine; with the files, weights (layer + model files)
    and optimizer files against the rough rule P·w and P·12 bytes (the plan's exact per-kind bytes are in
    ``python -m restartbench.plan``)."""
    ckpt = table[table["kind"] == "checkpoint"] if not table.empty else table
    keys = ["preset", "layout", "dtype", "engine"]
    if ckpt.empty:
        return pd.DataFrame(columns=[*keys, "predicted_bytes", "measured_bytes", "measured_vs_predicted"])
    summary = ckpt.groupby(keys, dropna=False).agg(
        runs=("run_id", "nunique"), checkpoints=("tag", "size"), predicted_bytes=("predicted_bytes", "first"),
        measured_bytes=("bytes", "median"), measured_min=("bytes", "min"), measured_max=("bytes", "max"),
    ).reset_index()
    summary["measured_vs_predicted"] = summary["measured_bytes"] / summary["predicted_bytes"]

    def params(preset: str) -> float:
        try:
            return float(get_preset(preset).param_count())
        except Exception:  # noqa: BLE001
            return math.nan

    summary["params"] = summary["preset"].map(params)
    summary["predicted_weights_bytes"] = summary["params"] * summary["dtype"].map(
        lambda d: weight_bytes(d) if isinstance(d, str) else math.nan)
    summary["predicted_optimizer_bytes"] = summary["params"] * OPTIMIZER_BYTES_PER_PARAM
    if files is not None and not files.empty:
        parts = {"layer": "weights", "model": "weights", "optimizer": "optimizer"}
        data = files[files["tag"].notna()].assign(part=lambda f: f["kind"].map(parts).fillna("other"))
        per_ckpt = data.groupby(["run_id", "tag", "part"])["bytes"].sum().unstack("part", fill_value=0)
        per_ckpt = per_ckpt.reindex(columns=["weights", "optimizer", "other"], fill_value=0).reset_index()
        meta = ckpt[["run_id", "tag", *keys]].drop_duplicates()
        parts = meta.merge(per_ckpt, on=["run_id", "tag"], how="inner")
        medians = parts.groupby(keys, dropna=False)[["weights", "optimizer", "other"]].median() \
            .add_prefix("measured_").add_suffix("_bytes").reset_index()
        summary = summary.merge(medians, on=keys, how="left")
    return sort_rows(summary, ["preset", "layout", "dtype", "engine"])

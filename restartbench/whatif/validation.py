"""Predictions set against measured runs: each part's error (``bench/whatif_validation.py``).

``measured_parts`` takes a run's figures from the analysis's tidy table (medians over its checkpoints; its restart);
``predicted_parts`` predicts the same run from its preset, layout, engine (and emulation) alone; ``errors`` sets them
side by side, relative error = (predicted − measured) / measured.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from restartbench.analysis.columns import RESTART_PART_COLUMNS
from restartbench.engines import base_engine, listed_as
from restartbench.layout import validate_layout
from restartbench.presets import get_preset
from restartbench.whatif import terms
from restartbench.whatif.cluster import Cluster
from restartbench.whatif.fit import Fit, FitError, with_own_times
from restartbench.whatif.predict import (
    WhatIfError,
    checkpoint_parts,
    job_for,
    plan_for,
    restart_parts,
    shape_of,
)
from restartbench.whatif.terms import Job

#: A held-out run's restart parts compared (real runs; emulated runs restore but start nothing up).
REAL_PARTS = ("stall", "durable", "launch", "imports", "dist init", "model build", "ds init", "engine setup",
              "ckpt load", "1st iter", "restart total")
EMULATED_PARTS = ("stall", "durable", "ckpt load")
TARGET_MEDIAN = 0.15
TARGET_MAX = 0.35


@dataclass(frozen=True)
class RunSpec:
    """A run as the model sees it: what it was asked to do, nothing it measured (but its iteration time, an input
    of the first iteration's term)."""

    run_id: str
    preset: str
    layout: str
    engine: str
    dtype: str
    scale: float | None
    ranks_per_process: int
    iteration_s: float | None
    nodes: int = 1
    """Nodes the run spanned (--nnodes: Slurm nodes; here all on one host)."""
    prefetch: bool = False
    """The restart read the checkpoint beside the start-up (the lazy engine's --lazy-prefetch)."""

    @property
    def listed_engine(self) -> str:
        """The engine the run is listed under (``engines.listed_as``): the fit's name for it."""
        return listed_as(self.engine, emulated=self.scale is not None)


def spec_from_rows(rows: pd.DataFrame, config: dict[str, Any]) -> RunSpec:
    first = rows.iloc[0]
    emulation = config.get("emulation") or {}
    emulated = bool(emulation.get("emulate"))
    iteration = first.get("iteration_s")
    return RunSpec(str(first["run_id"]), str(first["preset"]), str(first["layout"]),
                   base_engine(str(first["engine"])), str(first["dtype"]),
                   float(emulation["emulate_scale"]) if emulated else None,
                   int(emulation.get("ranks_per_process") or 1) if emulated else 1,
                   float(iteration) if pd.notna(iteration) else None,
                   int((config.get("layout") or {}).get("nnodes") or 1),
                   bool((config.get("engine") or {}).get("lazy_prefetch")))


def measured_parts(rows: pd.DataFrame) -> dict[str, float]:
    """Medians over the run's checkpoints (stall, durable; an emulated run's without its staging:
    ``fit.with_own_times``) and restore attempts (each restart part; the total less the harness's own checks, which
    a production restart does not run: ``restart_less_checks_s``, less the manifest check, the page-cache eviction
    and the exactness proof, whose time the fit's gaps no longer hold; a table without it, less verify)."""
    rows = with_own_times(rows)
    ckpt, rest = rows[rows["kind"] == "checkpoint"], rows[(rows["kind"] == "restart") & rows["restart_ckpt_load_s"]
                                                          .notna()]
    out = {"stall": ckpt["stall_max_s"].median(), "durable": ckpt["durable_rank_max_s"].median()}
    for column, name in RESTART_PART_COLUMNS:
        if name == "convert":  # not a part the model predicts: a restore on another layout only
            continue
        if column in rest and rest[column].notna().any():
            out[name] = rest[column].median()
    if "restart_less_checks_s" in rest and rest["restart_less_checks_s"].notna().any():
        out["restart total"] = rest["restart_less_checks_s"].median()
    elif "restart_s" in rest and rest["restart_s"].notna().any():
        verify = rest["path_verify_s"].fillna(0.0) if "path_verify_s" in rest else 0.0
        out["restart total"] = (rest["restart_s"] - verify).median()
    return {k: float(v) for k, v in out.items() if pd.notna(v)}


def job_of(spec: RunSpec, cluster: Cluster) -> Job:
    """What the terms scale with for the run: its ranks split over ``spec.nodes`` nodes in rank order (Slurm's
    block distribution; an emulated run's processes, each ``ranks_per_process`` ranks, as torchrun places them)."""
    layout = validate_layout(spec.layout, get_preset(spec.preset))
    plan = plan_for(spec.preset, layout.name, spec.engine, spec.dtype, spec.scale or 1.0)
    shape = shape_of(plan, layout, get_preset(spec.preset).param_count())
    return job_for(shape, layout.dp, -(-layout.world_size // spec.nodes), spec.ranks_per_process)


def nodes_on_one_host(cluster: Cluster, nodes: int) -> Cluster:
    """``cluster`` (one host) as ``nodes`` nodes that share its disk: Slurm nodes brought up on one host
    (scripts/slurm-local.sh) are separate nodes to the launcher and the rendezvous, but write to one disk. The disk
    is then storage the nodes share: its write and read limits the aggregate, each node's share the aggregate over
    the nodes (``terms.node_write_limit``); no network stands between a node and the disk (the per-client cap and
    the NIC set to the disk's own limit, never below the share). The nodes share the host's cores as well: each has
    its share of them (at least one)."""
    if nodes <= 1:
        return cluster
    disk = max(cluster.local_write_GBps, cluster.local_read_GBps)
    return replace(cluster, nodes=nodes, storage="shared", shared_write_GBps=cluster.local_write_GBps,
                   shared_read_GBps=cluster.local_read_GBps, shared_per_client_GBps=disk, nic_GBps=disk,
                   cpu_cores_per_node=max(1, cluster.cpu_cores_per_node // nodes))


def predicted_parts(spec: RunSpec, fit: Fit, cluster: Cluster) -> dict[str, float]:
    """The run predicted on ``cluster`` (this machine: one host holding every rank, as one node or as
    ``spec.nodes`` Slurm nodes sharing its disk) from the fit alone; the whole cost too (stall + slowdown), which
    only a run measured with it is compared on (``errors`` takes the parts both sides have)."""
    job = job_of(spec, cluster)
    one_node = replace(nodes_on_one_host(cluster, job.nodes),
                       gpus_per_node=max(cluster.gpus_per_node, -(-job.ranks // job.nodes)))
    label = spec.listed_engine
    checkpoint = checkpoint_parts(label, job, fit, one_node)
    out = {"stall": checkpoint["stall"]["s"], "durable": checkpoint["durable"]["s"],
           "whole cost": checkpoint["cost"]["s"]}
    if spec.scale is not None:
        out["ckpt load"] = terms.load_s(fit.engine(label)["load"], job, one_node)
        return out
    parts = restart_parts(label, job, fit, one_node, spec.iteration_s or 0.0, spec.prefetch)
    out.update({name: parts[name]["s"] for name in REAL_PARTS if name in parts})
    out["restart total"] = parts["total"]["s"]
    return out


def errors(predicted: dict[str, float], measured: dict[str, float]) -> list[dict[str, Any]]:
    return [{"part": name, "predicted_s": predicted[name], "measured_s": measured[name],
             "error": terms.relative_error(predicted[name], measured[name])}
            for name in predicted if name in measured]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and largest absolute error, and the parts beyond ``TARGET_MAX``."""
    absolute = [abs(r["error"]) for r in rows]
    return {"parts": len(rows), "median_abs_error": statistics.median(absolute) if absolute else None,
            "max_abs_error": max(absolute, default=None),
            "meets_target": bool(absolute) and statistics.median(absolute) <= TARGET_MEDIAN
            and max(absolute) <= TARGET_MAX,
            "misses": [r for r in rows if abs(r["error"]) > TARGET_MAX]}


def beside_measured(table: pd.DataFrame, cluster: Cluster, fit: Fit) -> pd.DataFrame:
    """Per complete run of ``table`` and part: what it measured and what the model predicts for its configuration on
    ``cluster`` (``analysis/summarize.py --what-if``). A run the model cannot predict (an engine the calibration
    never ran) has one row saying why."""
    rows = []
    for run_id, group in table.groupby("run_id", sort=True):
        config = json.loads((Path(group.iloc[0]["run"]) / "config.json").read_text())
        spec = spec_from_rows(group, config)
        ident = {"run_id": run_id, "preset": spec.preset, "layout": spec.layout,
                 "engine": spec.listed_engine}
        try:
            predicted = predicted_parts(spec, fit, cluster)
        except (FitError, WhatIfError, ValueError) as error:
            rows.append({**ident, "part": None, "note": f"not predicted: {error}"})
            continue
        rows.extend({**ident, **entry, "note": None} for entry in errors(predicted, measured_parts(group)))
    return pd.DataFrame(rows, columns=["run_id", "preset", "layout", "engine", "part", "measured_s", "predicted_s",
                                       "error", "note"])

"""A prediction: every part of a checkpoint and a restart of one preset, layout and engine on one cluster.

``job_for`` derives what the terms scale with from the checkpoint plan (``restartbench.plan``: every file and its
writing rank), the layout and the cluster: the busiest rank's and node's bytes and files. ``predict_engine`` applies
the fitted terms (``restartbench.whatif.terms``) and gives each part its value, its range (the calibration's spread),
the resource that bounds it and the cited constants that entered it ("assumed", ``mark_cited``); then the
checkpoint interval and the goodput at that scale (``restartbench.goodput``). ``scale_sweep`` repeats it from 8 to
16,384 GPUs, the layout's tp and pp kept and dp grown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from restartbench import goodput
from restartbench.engines import base_engine, cost_traits, engine_info
from restartbench.layout import Layout, LayoutError, validate_layout
from restartbench.plan import CheckpointPlan, config_named, predict
from restartbench.presets import get_preset
from restartbench.shards import two_replicas
from restartbench.whatif import tensors, terms
from restartbench.whatif.cluster import NUMBER_FIELDS, Cluster
from restartbench.whatif.fit import Fit
from restartbench.whatif.terms import Job, Line

SCALES = tuple(2**k for k in range(3, 15))  # 8 ... 16,384 GPUs
RESTART_PARTS = ("launch", "imports", "dist init", "model build", "ds init", "engine setup", "ckpt load", "1st iter",
                 "gaps")
#: How far ``mark_cited`` moves a cited constant, relative to its value, down and up.
NUDGE = 1e-6
Iteration = Callable[[Cluster], float]
"""The iteration's seconds on a cluster (``iteration_s_for``: given, or estimated from the cluster's peak and MFU)."""


class WhatIfError(ValueError):
    """A configuration that cannot be predicted (the message says why and what would do)."""


# -- what the terms scale with ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One checkpoint's bytes and files per (pipeline stage, tensor rank), from the plan at data-parallel ``dp``,
    split into what changes with dp and what does not: each rank's ZeRO-1 optimizer tensors (∝ 1/dp), its share of
    the stage module (``tensors.module_shares``: the engine's choice of replicas) and the rest (the files' framing,
    the harness's skeleton, DCP's ``.metadata``)."""

    layout: Layout
    first: dict[tuple[int, int], tuple[int, int]]
    """(stage, tp rank) → (bytes, files) of data-parallel rank 0 there beside its optimizer tensors and module share."""
    other: dict[tuple[int, int], tuple[int, int]]
    """(stage, tp rank) → (bytes, files) of each other data-parallel rank there, the same way (rank 1's)."""
    optimizer: dict[tuple[int, int], int]
    """(stage, tp rank) → one rank's optimizer tensor bytes at ``layout.dp``."""
    params: int
    tensors: tensors.StageTensors = field(default_factory=dict)
    """(stage, tp rank) → (module tensors, optimizer tensors) of one rank (``restartbench.whatif.tensors``)."""
    module: tensors.StageModule = field(default_factory=dict)
    """(stage, tp rank) → the stage module's tensors (``tensors.stage_module``)."""
    engine: str = ""
    """The plan's engine (what its ranks write of the tensors they hold)."""
    index: tuple[int, int, int] = (0, 0, 0)
    """DCP's ``.metadata``, which rank 0 writes: (its bytes, files, the items it indexes) at ``layout.dp`` (``first``
    leaves it out); it grows with the items (``tensors.index_items``), about 225 bytes each. Zeros: no such file."""


def plan_for(preset: str, layout: str, engine: str, dtype: str = "bf16", scale: float = 1.0,
             ranks: frozenset[int] | None = None) -> CheckpointPlan:
    """The checkpoint plan (``restartbench.plan.predict``) of one configuration, of ``ranks`` only where given."""
    try:
        return predict(config_named(preset, layout, engine, dtype), scale=scale, ranks=ranks)
    except LayoutError as error:
        raise WhatIfError(f"{preset} {layout}: {error}") from error
    except ValueError as error:
        raise WhatIfError(f"engine {engine!r}: {error}") from error


def shape_of(plan: CheckpointPlan, layout: Layout, params: int) -> Shape:
    """The plan's files split as ``Shape`` says. Data-parallel rank 1 gives the optimizer's tensor bytes: its files'
    tensor bytes less its module share's; each rank's rest is its bytes less those two (and rank 0's less DCP's
    ``.metadata``). So at the plan's own dp ranks 0 and 1 have the plan's bytes exactly. At dp 1 rank 0 stands for
    rank 1: every replica is then taken to write what rank 0 writes beside its module share and the index (one plan
    cannot tell)."""
    per_rank: dict[int, list[int]] = {}  # rank -> [bytes, files, tensor bytes]
    for f in plan.files:
        entry = per_rank.setdefault(f.rank, [0, 0, 0])
        entry[0] += f.bytes
        entry[1] += 1
        entry[2] += f.payload_bytes
    module = tensors.stage_module(plan.preset, layout.name, plan.dtype, plan.scale)
    counts = tensors.stage_tensors(plan.preset, layout.name, plan.dtype)
    index = (0, 0, 0)
    if tensors.spreads_module(plan.engine):
        files = [f.bytes for f in plan.files if f.kind == "metadata"]
        index = (sum(files), len(files), tensors.index_items(counts, layout.dp))
    rank0 = per_rank[0]
    rank0[0], rank0[1] = rank0[0] - index[0], rank0[1] - index[1]
    stage_shares = tensors.stage_shares(module, layout, plan.engine)
    first, other, optimizer = {}, {}, {}
    for stage in range(layout.pp):
        for tp in range(layout.tp):
            shares = stage_shares[stage, tp]
            replica = min(1, layout.dp - 1)
            size, files, payload = per_rank[_rank(layout, stage, replica, tp)]
            optimizer[stage, tp] = payload - shares[replica].raw
            first_size, first_files, _ = per_rank[_rank(layout, stage, 0, tp)]
            first[stage, tp] = (first_size - optimizer[stage, tp] - shares[0].written, first_files)
            other[stage, tp] = (size - optimizer[stage, tp] - shares[replica].written, files)
    return Shape(layout, first, other, optimizer, params, counts, module, plan.engine, index)


def _rank(layout: Layout, stage: int, data: int, tp: int) -> int:
    """DeepSpeed's PipeModelDataParallelTopology: axes pipe, data, model (tp fastest)."""
    return (stage * layout.dp + data) * layout.tp + tp


class RankCheckpoint(NamedTuple):
    """One rank's checkpoint at a data-parallel size (``ranks_at``)."""

    bytes: float
    """Written at a save, its module share included."""
    files: int
    own: float
    """Of ``bytes``, all but its module share and DCP's index: its optimizer tensors and its files' rest."""
    module: float
    """The stage module's bytes it reads at a load (all of it, whoever wrote it)."""


def ranks_at(shape: Shape, dp: int) -> tuple[list[RankCheckpoint], float]:
    """Every rank's checkpoint at data-parallel ``dp``, in rank order, and DCP's index there (0 without one)."""
    layout = Layout(shape.layout.tp, shape.layout.pp, dp)
    ratio = shape.layout.dp / dp
    shares = tensors.stage_shares(shape.module, layout, shape.engine)
    held = {key: tensors.module_held(module, shape.engine) for key, module in shape.module.items()}
    index = shape.index[0] * tensors.index_items(shape.tensors, dp) / shape.index[2] if shape.index[2] else 0.0
    out = []
    for rank in range(layout.world_size):
        stage, rest = divmod(rank, dp * layout.tp)
        data, tp = divmod(rest, layout.tp)
        rest_bytes, files = (shape.first if data == 0 else shape.other)[stage, tp]
        own = rest_bytes + shape.optimizer[stage, tp] * ratio
        share = shares[stage, tp][data].written if shares else 0
        index_here, index_files = (index, shape.index[1]) if rank == 0 else (0.0, 0)
        out.append(RankCheckpoint(own + share + index_here, files + index_files, own, held.get((stage, tp), share)))
    return out, index


#: The largest data-parallel size at which a collective engine's checkpoint is planned: its global plan takes every
#: rank (DCP's, of 70B on 16,384 ranks, minutes), and its files at a larger dp scale from there (``ranks_at``: one
#: file a rank whatever dp, and bytes that hold to the plan at that dp but for the index, tests/test_whatif_parts.py).
COLLECTIVE_PLAN_DP = 8


def planned_at(layout: Layout, engine: str) -> tuple[Layout, frozenset[int] | None]:
    """The layout at which ``engine``'s checkpoint of ``layout`` is planned for a ``Shape``, and its ranks planned:
    dp 2 where its dp is 1, so that a prediction at another dp (the scale sweep's) knows what a replica other than
    rank 0 writes; a collective engine's every rank, at most at ``COLLECTIVE_PLAN_DP``; the others' data-parallel
    ranks 0 and 1 of each stage and tp rank only, at the layout's own dp (its files there as the engine plans them:
    torchsnapshot chunks and batches its tensors by their size, which the optimizer's share sets)."""
    dp = max(2, layout.dp)
    if cost_traits(engine).collective:
        return Layout(layout.tp, layout.pp, min(dp, COLLECTIVE_PLAN_DP)), None
    planned = Layout(layout.tp, layout.pp, dp)
    return planned, two_replicas(planned)


def shapes_for(preset: str, layout: Layout, engines: list[str], dtype: str = "bf16") -> dict[str, Shape]:
    """Each engine's ``Shape`` of ``layout``, from its plan at ``planned_at``."""
    params = get_preset(preset).param_count()
    shapes = {}
    for engine in engines:
        planned, ranks = planned_at(layout, engine)
        shapes[engine] = shape_of(plan_for(preset, planned.name, engine, dtype, ranks=ranks), planned, params)
    return shapes


def job_for(shape: Shape, dp: int, per_node: int, per_process: int = 1) -> Job:
    """The terms' regressors at data-parallel ``dp`` (the optimizer tensors scaled from the plan's dp, the module
    shared out as the engine does at ``dp``), ranks placed ``per_node`` to a node in rank order, ``per_process`` ranks
    per process; the tensors a rank holds and writes at ``dp`` (``restartbench.whatif.tensors.busiest``), and the
    bytes it reads at a load: all it holds (its optimizer share, its stage module wherever it was written, DCP's
    index)."""
    layout = Layout(shape.layout.tp, shape.layout.pp, dp)
    ranks, index = ranks_at(shape, dp)
    nodes = max(1, math.ceil(len(ranks) / per_node))
    node_bytes, node_files = [0.0] * nodes, [0] * nodes
    for number, rank in enumerate(ranks):
        node_bytes[number // per_node] += rank.bytes
        node_files[number // per_node] += rank.files
    busiest = max(range(len(ranks)), key=lambda number: ranks[number].bytes)
    node = max(range(nodes), key=node_bytes.__getitem__)
    concurrency = max(1, min(len(ranks), per_node) // per_process)
    held, written = tensors.busiest(shape.tensors, shape.module, layout, shape.engine)
    return Job(ranks=len(ranks), nodes=nodes, concurrency=concurrency, bytes_rank=ranks[busiest].bytes,
               files_rank=ranks[busiest].files, bytes_node=node_bytes[node], files_node=node_files[node],
               params_rank=shape.params / (layout.tp * layout.pp), sequential=per_process, tensors_rank=held,
               tensors_written=written, items_planned=tensors.planned_items(shape.tensors, dp, shape.engine),
               bytes_held=max(rank.own + rank.module for rank in ranks) + index)


def check_fits(preset: str, layout: str, cluster: Cluster) -> Layout:
    """The layout, resolved; refused where it does not fit the preset or the cluster."""
    try:
        resolved = validate_layout(layout, get_preset(preset))
    except (LayoutError, ValueError) as error:
        raise WhatIfError(f"{preset} {layout}: {error}") from error
    if resolved.world_size > cluster.nodes * cluster.gpus_per_node:
        raise WhatIfError(f"{resolved.name} needs {resolved.world_size} GPUs; cluster {cluster.name!r} has "
                          f"{cluster.nodes} nodes × {cluster.gpus_per_node} = {cluster.nodes * cluster.gpus_per_node}")
    if resolved.tp > cluster.gpus_per_node:
        raise WhatIfError(f"{resolved.name}: tp {resolved.tp} spans nodes of {cluster.gpus_per_node} GPUs; tensor "
                          f"parallelism is kept within a node: use tp ≤ {cluster.gpus_per_node}")
    return resolved


# -- one engine ------------------------------------------------------------------------------------------------


def part(value: float, line: Line | None, bound: str, fixed: float = 0.0) -> dict[str, Any]:
    """A predicted figure: ``value`` (s), its range from ``line``'s spread (``fixed``: a share without spread, such
    as a measured D2H copy), what bounds it; not yet marked (``mark_cited`` says which cited constants entered it)."""
    spread = line.range(value - fixed) if line is not None else (value - fixed, value - fixed)
    return {"s": value, "low_s": min(value, spread[0] + fixed), "high_s": max(value, spread[1] + fixed),
            "bound": bound, **UNMARKED}


UNMARKED = {"assumed": False, "cited": ()}
"""A figure's marks before ``mark_cited``: the key ``assumed`` is what makes a dict a figure there."""


# -- "assumed": which cited constants entered a figure -------------------------------------------------------------


def mark_cited(figures: Callable[[Cluster], dict[str, Any]], cluster: Cluster) -> dict[str, Any]:
    """``figures(cluster)`` with every figure in it (a dict with an ``assumed`` key, at any depth) marked with the
    cited constants it depends on: ``cited``, the cluster's cited number fields whose move by ``NUDGE`` of their value
    (down, then up; a zero moved up by ``NUDGE``) changes one of the figure's numbers, and ``assumed`` = any.

    Depending on is what entering means: a limit that does not bind (the NIC under a slower file system), a rate
    that is not used (the D2H on cpu, the cited rendezvous within the calibrated ranks, the core count where each
    process has a core) moves nothing and marks nothing; at a tie between two limits the cited one binds one way
    and marks it."""
    result = figures(cluster)
    base = dict(_figures_in(result))
    cited: dict[tuple, set[str]] = {path: set() for path in base}
    for name in cited_numbers(cluster):
        value = getattr(cluster, name)
        for moved in ((value * (1 - NUDGE), value * (1 + NUDGE)) if value else (NUDGE,)):
            for path, figure in _figures_in(figures(replace(cluster, **{name: moved}))):
                if _numbers(figure) != _numbers(base[path]):
                    cited[path].add(name)
    for path, figure in base.items():
        figure["cited"], figure["assumed"] = sorted(cited[path]), bool(cited[path])
    return result


def cited_numbers(cluster: Cluster) -> list[str]:
    """The cluster's number fields whose basis is ``cited``."""
    return [name for name in NUMBER_FIELDS if cluster.assumed(name)]


def _figures_in(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict[str, Any]]]:
    if isinstance(tree, dict) and "assumed" in tree:
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _figures_in(value, (*path, key))


def _numbers(figure: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in figure.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def checkpoint_parts(engine: str, job: Job, fit: Fit, cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The save's stall, durable time, slowdown and whole cost, each marked with the cited constants it depends on."""
    return mark_cited(lambda on: _checkpoint_figures(engine, job, fit, on), cluster)


def _checkpoint_figures(engine: str, job: Job, fit: Fit, cluster: Cluster) -> dict[str, dict[str, Any]]:
    lines = fit.engine(engine)
    d2h = terms.d2h_s(engine, job, cluster)
    planning = terms.coordinator_s(fit.collective_plan_s_per_item, engine, job, cluster)
    planning_waited = 0.0 if cost_traits(engine).asynchronous else planning
    stall = terms.stall_s(lines["stall"], engine, job, cluster) + planning_waited
    written = terms.durable_s(lines["durable"], engine, job, cluster) + planning
    durable = max(stall, written)
    fraction, sigma_line = _slowdown_fraction(engine, lines, cluster)
    beside = terms.side_stream(engine, cluster)
    slowdown = terms.slowdown_s(fraction, engine, stall, durable, copies=d2h if beside else 0.0)
    limit = terms.node_write_limit(cluster, job.nodes)
    in_stall = 0.0 if beside else d2h
    stall_bound = _stall_bound(stall, in_stall, planning_waited)
    slowdown_bound = "D2H beside training (side stream)" if beside else "interference with training"
    parts = {"stall": part(stall, lines["stall"], stall_bound, fixed=in_stall + planning_waited),
             "durable": part(durable, lines["durable"], limit.resource if planning < written - planning
                             else COORDINATOR, fixed=d2h + planning),
             "slowdown": part(slowdown, sigma_line, slowdown_bound, fixed=d2h if beside else 0.0)}
    if written < stall:  # durable no sooner than the save returns: the stall's figure, range and bound
        parts["durable"] = {**parts["stall"], "bound": f"{stall_bound}, durable as the save returns"}
    spread = {k: parts["stall"][k] + parts["slowdown"][k] for k in ("low_s", "high_s")}
    parts["cost"] = {"s": stall + slowdown, **spread,
                     "bound": stall_bound if stall >= slowdown else slowdown_bound, **UNMARKED}
    return parts


COORDINATOR = "the coordinator's planning (one process's CPU)"


def _stall_bound(stall: float, d2h: float, planning: float) -> str:
    """What bounds a stall of ``stall`` s, of which ``d2h`` the copy out of the GPU and ``planning`` a collective
    engine's coordinator: the largest of those two and the engine's host-side path."""
    shares = {"host CPU (the engine's blocking path)": stall - d2h - planning, "D2H": d2h, COORDINATOR: planning}
    return max(shares, key=shares.__getitem__)


def _slowdown_fraction(engine: str, lines: dict[str, Line], cluster: Cluster) -> tuple[float, Line | None]:
    """σ: the calibration's where it measured one (on the cluster's device), else the cluster's figure."""
    if not cost_traits(engine).asynchronous:
        return 0.0, None
    fitted = lines.get("slowdown")
    if cluster.device == "cuda" or fitted is None or not fitted.runs:
        return cluster.async_slowdown_fraction, None
    return fitted.intercept, fitted


def restart_parts(engine: str, job: Job, fit: Fit, cluster: Cluster, iteration_s: float,
                  prefetch: bool = False) -> dict[str, dict]:
    """Every restart part, each marked with the cited constants it depends on; ``prefetch``: the engine reads the
    checkpoint beside the start-up (``terms.prefetched_load_s``; only where the engine has a prefetcher,
    ``can_prefetch``: the others as without)."""
    return mark_cited(lambda on: _restart_figures(engine, job, fit, on, iteration_s, prefetch), cluster)


def _restart_figures(engine: str, job: Job, fit: Fit, cluster: Cluster, iteration_s: float,
                     prefetch: bool) -> dict[str, dict]:
    prefetch = prefetch and can_prefetch(engine)
    s, lines = fit.startup, fit.engine(engine)
    dist = terms.dist_init_s(s["dist init"], job, cluster, fit.calibrated_ranks)
    setup_line = lines.get("engine setup") or Line(0.0)
    first = s["1st iter ratio"].intercept * iteration_s
    parts = {
        "launch": part(s["launch"](), s["launch"], "start-up"),
        "imports": part(terms.startup_s(s["imports"], job, cluster), s["imports"], "start-up"),
        "dist init": part(dist, s["dist init"], "start-up (rendezvous)"),
        "model build": part(terms.startup_s(s["model build"], job, cluster, params=job.params_rank), s["model build"],
                            "start-up (host CPU)"),
        "ds init": part(terms.startup_s(s["ds init"], job, cluster, params=job.params_rank), s["ds init"],
                        "start-up (host CPU)"),
        "engine setup": part(terms.engine_setup_s(setup_line, engine, job, cluster, prefetch), setup_line,
                             "pinning" if terms.pin_s(engine, job, cluster) and not prefetch else "start-up"),
        "ckpt load": _load_part(lines["load"], engine, job, fit, cluster),
        "1st iter": part(first, s["1st iter ratio"], "compute"),
        "gaps": part(terms.startup_s(s["gaps"], job, cluster), s["gaps"], "start-up"),
    }
    if prefetch:
        parts["ckpt load"] = _prefetched(parts, lines["load"], engine, job, cluster)
    parts["total"] = {"s": sum(p["s"] for p in parts.values()), "low_s": sum(p["low_s"] for p in parts.values()),
                      "high_s": sum(p["high_s"] for p in parts.values()), "bound": _largest(parts), **UNMARKED}
    return parts


def _load_part(line: Line, engine: str, job: Job, fit: Fit, cluster: Cluster) -> dict[str, Any]:
    """The checkpoint load: the load line and a collective engine's coordinator (measured: no spread), bound by the
    node's read limit or by the coordinator where it is the larger share."""
    planning = terms.coordinator_s(fit.collective_load_plan_s_per_item, engine, job, cluster)
    read = terms.load_s(line, job, cluster)
    bound = COORDINATOR if planning > read else terms.node_read_limit(cluster, job.nodes).resource
    return part(read + planning, line, bound, fixed=planning)


def _prefetched(parts: dict[str, dict], line: Line, engine: str, job: Job, cluster: Cluster) -> dict[str, Any]:
    """The load of a prefetched restart: what is left of the read after the start-up it ran beside, and the copy out
    (``terms.prefetched_load_s``); its range: the load line's, with the start-up's middle figure."""
    start_up = sum(parts[name]["s"] for name in ("model build", "ds init", "engine setup"))
    pin = terms.pin_s(engine, job, cluster)
    figures = {key: terms.prefetched_load_s(parts["ckpt load"][key], start_up, pin, job, cluster)
               for key in ("s", "low_s", "high_s")}
    left = figures["s"] > terms.copy_out_s(job, cluster) + 1e-12
    bound = f"{parts['ckpt load']['bound']} (read beside the start-up)" if left else \
        "copy out of the host buffer (the read ran beside the start-up)"
    return {**figures, "bound": bound, **UNMARKED, "prefetched": True}


def can_prefetch(engine: str) -> bool:
    """Whether the engine reads a relaunch's checkpoint beside the start-up when asked (``EngineInfo.prefetcher``)."""
    return engine_info(base_engine(engine)).prefetcher is not None


def _largest(parts: dict[str, dict]) -> str:
    name = max(parts, key=lambda k: parts[k]["s"])
    return f"{name} ({parts[name]['bound']})"


def goodput_at(cost: float, restart: float, gpus: int, failures_per_gpu_hour: float,
               iteration_s: float) -> dict[str, float]:
    mtbf = goodput.mtbf_s(failures_per_gpu_hour, gpus)
    budget = goodput.at_optimum(cost, restart, mtbf, iteration_s)
    return {"gpus": gpus, "failures_per_gpu_hour": failures_per_gpu_hour, "mtbf_s": mtbf,
            "interval_s": budget.interval_s, "interval_iterations": budget.interval_s / iteration_s,
            "goodput_pct": 100 * budget.goodput}


def device_note(fit: Fit, cluster: Cluster) -> str | None:
    """Why a prediction's figures are assumed where the fit's runs held their state on another device than the
    cluster's (None where they match)."""
    if fit.device == cluster.device:
        return None
    return (f"the fit's runs were on {fit.device}, this cluster is {cluster.device}: every line is the calibration "
            "machine's, so every figure is marked assumed (where the model is built, initialised and copied out "
            "differs with the device: bench/whatif_gpu.py sets a CPU fit against real H100 runs); calibrate on the "
            "target for measured lines (python -m restartbench.whatif --calibrate)")


def predict_engine(engine: str, job: Job, fit: Fit, cluster: Cluster, iteration_s: float | Iteration,
                   failures_per_gpu_hour: float, prefetch: bool = False) -> dict[str, Any]:
    """One engine's checkpoint, restart and goodput, every figure marked with the cited constants it depends on
    (``mark_cited``), and all of them where the fit's device is not the cluster's (``device_note``);
    ``iteration_s``: seconds, or how the cluster gives them (an estimate from its peak and MFU); ``prefetch``: its
    restart prefetched where it can be."""
    iteration = iteration_s if callable(iteration_s) else lambda _: iteration_s
    result = mark_cited(lambda on: _engine_figures(engine, job, fit, on, iteration(on), failures_per_gpu_hour,
                                                   prefetch), cluster)
    if device_note(fit, cluster):
        for _, figure in _figures_in(result):
            figure["assumed"], figure["cited"] = True, [*figure["cited"], "calibration"]
    return result


def _engine_figures(engine: str, job: Job, fit: Fit, cluster: Cluster, iteration_s: float,
                    failures_per_gpu_hour: float, prefetch: bool) -> dict[str, Any]:
    checkpoint = _checkpoint_figures(engine, job, fit, cluster)
    restart = _restart_figures(engine, job, fit, cluster, iteration_s, prefetch)
    rates = {key: goodput_at(checkpoint["cost"][key], restart["total"][key], job.ranks, failures_per_gpu_hour,
                             iteration_s) for key in ("s", "low_s", "high_s")}
    return {"engine": engine, "prefetched": restart["ckpt load"].get("prefetched", False), "ranks": job.ranks,
            "nodes": job.nodes,
            "bytes_per_rank": job.bytes_rank, "bytes_held_per_rank": job.held_rank,
            "files_per_rank": job.files_rank, "bytes_per_node": job.bytes_node, "files_per_node": job.files_node,
            "tensors_per_rank": job.tensors_rank, "tensors_written_per_rank": job.tensors_written,
            "checkpoint": checkpoint, "restart": restart,
            "goodput": {**rates["s"], "goodput_pct_low": rates["high_s"]["goodput_pct"],
                        "goodput_pct_high": rates["low_s"]["goodput_pct"], **UNMARKED}}


# -- the command's whole prediction --------------------------------------------------------------------------------


def iteration_s_for(preset: str, layout: Layout, cluster: Cluster, given: float | None,
                    micro_batch: int = 1) -> tuple[float, str]:
    """The target's iteration time: as given, else 6·P·tokens / (GPUs · peak · MFU) with the study's default batch
    (micro-batch 1, pp micro-batches per rank, dp ranks)."""
    if given is not None:
        if given <= 0:
            raise WhatIfError(f"--iteration-s must be above 0, got {given}")
        return given, "given (--iteration-s)"
    model = get_preset(preset)
    tokens = model.seq_len * micro_batch * layout.pp * layout.dp
    estimate = terms.iteration_estimate_s(model.param_count(), tokens, layout.world_size, cluster)
    return estimate, (f"estimated: 6·P·tokens/(GPUs·peak·MFU), {tokens} tokens per iteration (sequence "
                      f"{model.seq_len} × micro-batch {micro_batch} × {layout.pp} micro-batches × dp {layout.dp}), "
                      f"peak {cluster.gpu_peak_tflops:g} TFLOP/s{_cited_mark(cluster, 'gpu_peak_tflops')}, "
                      f"MFU {cluster.mfu:g}{_cited_mark(cluster, 'mfu')}")


def _cited_mark(cluster: Cluster, name: str) -> str:
    return " (assumed)" if cluster.assumed(name) else ""


def whatif(preset: str, layout: str, engines: list[str], cluster: Cluster, fit: Fit,
           failures_per_gpu_hour: float = goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
           iteration_s: float | None = None, dtype: str = "bf16", prefetch: bool = False) -> dict[str, Any]:
    """Every engine's prediction, and goodput against scale; ``prefetch``: the restarts of the engines that can
    read the checkpoint beside the start-up do (``can_prefetch``)."""
    if failures_per_gpu_hour <= 0:
        raise WhatIfError(f"--failures-per-gpu-hour must be above 0, got {failures_per_gpu_hour}")
    resolved = check_fits(preset, layout, cluster)
    for engine in engines:
        fit.engine(engine)  # refuses an engine the calibration never ran, before any work
    iteration, how = iteration_s_for(preset, resolved, cluster, iteration_s)
    shapes = shapes_for(preset, resolved, engines, dtype)
    per_node = cluster.gpus_per_node
    results = [predict_engine(e, job_for(shapes[e], resolved.dp, per_node), fit, cluster,
                              _iteration(preset, resolved, iteration_s), failures_per_gpu_hour, prefetch)
               for e in engines]
    return {"preset": preset, "layout": resolved.name, "cluster": cluster.name, "cluster_file": cluster.path,
            "device": cluster.device, "storage": cluster.storage, "dtype": dtype,
            "iteration_s": iteration, "iteration_basis": how, "failures_per_gpu_hour": failures_per_gpu_hour,
            "assumed": assumed_fields(cluster, fit), "left_out": left_out(engines, fit), "engines": results,
            "scale": scale_sweep(preset, resolved, shapes, cluster, fit, failures_per_gpu_hour, iteration_s,
                                 prefetch)}


def scale_sweep(preset: str, layout: Layout, shapes: dict[str, Shape], cluster: Cluster, fit: Fit,
                failures_per_gpu_hour: float, iteration_s: float | None,
                prefetch: bool = False) -> list[dict[str, Any]]:
    """Goodput from 8 to 16,384 GPUs: the layout's tp and pp, dp = GPUs / (tp·pp) where it divides, on a cluster
    with as many nodes as needed."""
    rows = []
    for gpus in SCALES:
        if gpus % (layout.tp * layout.pp):
            continue
        at = Layout(layout.tp, layout.pp, gpus // (layout.tp * layout.pp))
        big = replace(cluster, nodes=max(cluster.nodes, math.ceil(gpus / cluster.gpus_per_node)))
        for engine, shape in shapes.items():
            result = predict_engine(engine, job_for(shape, at.dp, cluster.gpus_per_node), fit, big,
                                    _iteration(preset, at, iteration_s), failures_per_gpu_hour, prefetch)
            figures = (result["checkpoint"]["cost"], result["restart"]["total"], result["goodput"])
            rows.append({"gpus": gpus, "layout": at.name, "engine": engine,
                         "cost_s": result["checkpoint"]["cost"]["s"], "restart_s": result["restart"]["total"]["s"],
                         **{k: result["goodput"][k] for k in ("goodput_pct", "goodput_pct_low", "goodput_pct_high",
                                                              "interval_s")},
                         "assumed": any(f["assumed"] for f in figures),
                         "cited": sorted({name for f in figures for name in f["cited"]})})
    return rows


def _iteration(preset: str, layout: Layout, given: float | None) -> Iteration:
    return lambda on: iteration_s_for(preset, layout, on, given)[0]


def left_out(engines: list[str], fit: Fit) -> list[str]:
    """What the prediction of ``engines`` leaves out for want of a measurement in ``fit``."""
    measured = fit.collective_plan_s_per_item is not None and fit.collective_load_plan_s_per_item is not None
    if not measured and any(cost_traits(engine).collective for engine in engines):
        return ["a collective engine's coordinator at each save and load (dcp's stall, the durable time and the "
                "checkpoint load of dcp and dcp-async): the fit has no 'collective planner' probe; calibrate again "
                "with dcp among --engines (python -m restartbench.whatif --calibrate)"]
    return []


def assumed_fields(cluster: Cluster, fit: Fit | None = None) -> dict[str, str]:
    """The cluster's cited constants, each with its source; and the calibration, where its device is not the
    cluster's (``device_note``)."""
    cited = {name: cluster.sources[name][1] for name in cited_numbers(cluster)}
    note = device_note(fit, cluster) if fit is not None else None
    return {**cited, "calibration": note} if note else cited

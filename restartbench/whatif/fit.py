"""The model's constants fitted from the study's own run folders, through the analysis's tidy table.

``fit_table(table, limits, per_process)`` fits every term of ``restartbench.whatif.terms`` on the runs of the table
(``restartbench.analysis.collect(root).table()``; an emulated checkpoint's times its own, ``with_own_times``): per
engine the stall, durable and load lines and the slowdown fraction, and the start-up parts from the real runs. Each
line is a non-negative least-squares fit of relative residuals; a regressor that
does not vary over the calibration runs cannot be told from the intercept and is left out with a note naming the
runs that would fit it; a term with too few runs is refused (``FitError``), naming the term and the runs that would
fit it. ``limits`` are the calibration machine's measured storage limits (the durable and load lines are fitted
against the time the bytes take at those limits, so their slope is 1/η, the fraction of the limit the engine
reaches, which carries to another machine's limits). ``cores_per_node`` is the calibrating machine's CPU cores per
node: the stall and the CPU-bound start-up parts (``terms.CPU_BOUND``) of each run are divided by the run's CPU share
factor (``terms.cpu_share_factor``: its processes per node over those cores), so their constants are a process's
time with a core of its own, which a prediction multiplies by its target's factor.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from restartbench.analysis.columns import RESTART_PART_COLUMNS
from restartbench.engines import cost_traits, is_emulated
from restartbench.events import Event, read_events
from restartbench.layout import validate_layout
from restartbench.presets import get_preset
from restartbench.whatif import tensors
from restartbench.whatif.terms import CPU_BOUND, GB, Line, cpu_share_factor

#: Per term, the regressors it is fitted on and which calibration runs would make each one fittable.
HINTS = {
    "bytes": "runs of the engine whose busiest rank writes different bytes (tiny and small, or an emulated preset at "
             "two --emulate-scale values)",
    "files": "runs of the engine with different files per rank (another pp, or an emulated wide layout such as "
             "33B tp2pp4)",
    "at_limit": "runs of the engine whose node writes (reads) different bytes (two presets, or two --emulate-scale "
                "values)",
    "ranks": "real runs at two world sizes (2 and 4 ranks)",
    "params": "real runs of two presets (tiny and small)",
    "tensors": "runs of the engine whose tensors per rank do not follow their bytes: another depth per stage at "
               "similar bytes (an emulated 33B tp1pp2 beside 3B tp1pp2; for real runs, small on tp1pp2 beside "
               "tp1pp1)",
}


class FitError(ValueError):
    """Too few calibration runs for a term; the message names the term and the runs that would fit it."""


@dataclass(frozen=True)
class Limits:
    """The calibration machine's storage limits the I/O lines were fitted against (one node, at the runs'
    concurrency)."""

    write_GBps: float
    read_GBps: float
    source: str


@dataclass
class Fit:
    """Every fitted term: ``engines[engine][term]`` (stall, durable, load, slowdown) and ``startup[part]``."""

    limits: Limits
    calibrated_ranks: int
    """The largest world size among the calibration's real runs (dist init is cited beyond it)."""
    engines: dict[str, dict[str, Line]] = field(default_factory=dict)
    startup: dict[str, Line] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    unfitted: dict[str, str] = field(default_factory=dict)
    """Engines the calibration ran but could not fit, each with the FitError that says which term and which runs."""
    cores_per_node: int | None = None
    """The calibrating machine's CPU cores per node, by which each run's CPU share factor was taken (the stall and the
    CPU-bound start-up parts divided by it); None: not divided (a fit file written before 2026-11-26, or a fit given
    no core count), its constants as measured, as if every calibration process had had a core of its own."""
    device: str = "cpu"
    """Where the calibration runs held their state: ``cpu`` or ``cuda`` (``+``-joined where they differ). A fit file
    without it was written before 2026-11-27 by bench/whatif_validation.py on the CPU machine, the only calibration
    until then: ``cpu``. A prediction for a cluster of another device says its figures rest on this one's
    (``restartbench.whatif.predict.device_note``)."""
    collective_plan_s_per_item: float | None = None
    """Seconds a collective engine's coordinator (DCP's rank 0) spends at each save per item every rank planned:
    gathering the plans, deduplicating them, building and pickling the index (``restartbench.engines.dcp.coordinator``,
    the calibration's ``collective planner`` probe). None: not measured (a fit file written before 2026-12-08, or a
    calibration without a collective engine): the prediction leaves the coordinator out, and says so
    (``restartbench.whatif.predict.left_out``)."""
    collective_load_plan_s_per_item: float | None = None
    """The same at a load (``dcp.load``): the coordinator gathers every rank's load plan and scatters it back, seconds
    per item planned (a rank plans a read of each tensor it holds). None as above."""

    def real_engines(self) -> list[str]:
        """The engines fitted on real runs (not their ``-emulated`` lines): those a prediction can be made for."""
        return [name for name in self.engines if not is_emulated(name)]

    def engine(self, name: str) -> dict[str, Line]:
        if name in self.unfitted:
            raise FitError(f"engine {name!r} was not fitted: {self.unfitted[name]}")
        if name not in self.engines:
            raise FitError(f"the calibration has no runs of engine {name!r} (it has {', '.join(self.engines)}); "
                           f"runs that would fit it: real runs of {name} on two presets (tiny and small tp1pp1dp2)")
        return self.engines[name]


# -- one line ------------------------------------------------------------------------------------------------


def fit_line(term: str, rows: list[dict[str, Any]], regressors: tuple[str, ...], target: str,
             intercept_per: str = "") -> Line:
    """Non-negative least squares of ``target`` on an intercept and ``regressors`` over ``rows`` (each with
    ``run_id``), in relative terms: the sum of squared (predicted − measured) / measured is minimised, the measure
    the model is judged by (an absolute fit lets the runs of seconds set every constant and leaves a run of tens of
    milliseconds to the intercept: the lazy engine's emulated stall, 0.03 s at 70B tp8pp8, was predicted 0.24 s, the
    intercept the 3B runs' half seconds set). A regressor constant over the rows is left out, with a note (so a
    kept one has at least two rows that differ); a term none of whose regressors varies is refused."""
    rows = [r for r in rows if _finite(r.get(target)) and r[target] > 0 and all(_finite(r.get(x)) for x in regressors)]
    runs = tuple(sorted({r["run_id"] for r in rows}))
    if not rows:
        raise FitError(f"term {term!r}: no calibration run measured it; runs that would fit it: "
                       f"{'; '.join(HINTS[x] for x in regressors) or 'any complete run that records it'}")
    kept = [x for x in regressors if len({round(r[x], 12) for r in rows}) > 1]
    dropped = [x for x in regressors if x not in kept]
    if regressors and not kept:
        raise FitError(f"term {term!r}: {len(runs)} calibration run(s) ({', '.join(runs)}) all have the same "
                       f"{', '.join(regressors)}; runs that would fit it: {'; '.join(HINTS[x] for x in regressors)}")
    notes = [f"{k} not fitted (the same in every calibration run: {rows[0][k]:.4g}); runs that would fit it: "
             f"{HINTS[k]}" for k in dropped]
    if "tensors" in kept and not _separable(rows, kept):
        kept.remove("tensors")
        notes.append("tensors not fitted (over these runs the tensors per rank follow the other regressors: fewer "
                     f"distinct configurations than coefficients); runs that would fit it: {HINTS['tensors']}")
    without_files = [k for k in kept if k != "files"]
    if "files" in kept and len(kept) > 1 and leave_one_out_error(rows, without_files, target, intercept_per) \
            < leave_one_out_error(rows, kept, target, intercept_per):
        kept.remove("files")
        notes.append("files left out: without it the calibration predicts its own runs better, each left out in "
                     "turn")
    coefficients = _relative_nnls(rows, kept, target, intercept_per)
    line = Line(float(coefficients[0]), {k: float(c) for k, c in zip(kept, coefficients[1:])}, runs=runs,
                note="; ".join(notes), intercept_per=intercept_per)
    return _with_spread(line, rows, target)


def _separable(rows: list[dict[str, Any]], kept: list[str]) -> bool:
    """Whether the runs' distinct configurations determine an intercept and a coefficient for each of ``kept``
    (the design over them, each column scaled to its largest value, has full column rank)."""
    distinct = np.array(sorted({(1.0, *(round(r[k], 12) for k in kept)) for r in rows}), dtype=float)
    scaled = distinct / np.maximum(np.abs(distinct).max(axis=0), 1e-300)
    return int(np.linalg.matrix_rank(scaled)) == len(kept) + 1


def _relative_nnls(rows: list[dict[str, Any]], kept: list[str], target: str, intercept_per: str = "") -> np.ndarray:
    """The non-negative coefficients minimising Σ ((x·c − y) / y)² over ``rows``."""
    y = np.array([r[target] for r in rows], dtype=float)
    return _nnls(_design(rows, kept, intercept_per) / y[:, None], np.ones_like(y))


def _design(rows: list[dict[str, Any]], kept: list[str], intercept_per: str = "") -> np.ndarray:
    return np.array([[r[intercept_per] if intercept_per else 1.0, *(r[k] for k in kept)] for r in rows], dtype=float)


def leave_one_out_error(rows: list[dict[str, Any]], kept: list[str], target: str, intercept_per: str = "") -> float:
    """Mean absolute relative error of each calibration run predicted by the line fitted on the other runs (inf
    where the others leave a regressor constant or too few to fit the line)."""
    runs = sorted({r["run_id"] for r in rows})
    errors = []
    for left in runs:
        train = [r for r in rows if r["run_id"] != left]
        if len({tuple(round(r[k], 12) for k in kept) for r in train}) < len(kept) + 1 \
                or any(len({round(r[k], 12) for r in train}) < 2 for k in kept):
            return math.inf
        c = _relative_nnls(train, kept, target, intercept_per)
        errors += [abs(float(_design([r], kept, intercept_per)[0] @ c) / r[target] - 1) for r in rows
                   if r["run_id"] == left]
    return statistics.fmean(errors) if errors else math.inf


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares solution with every coefficient at least 0: the best over the subsets of free
    coefficients (at most a few here) whose unconstrained solution is non-negative."""
    best, best_error = np.zeros(x.shape[1]), float(np.sum(y**2))
    for size in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(range(x.shape[1]), size):
            solution, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
            if (solution < 0).any():
                continue
            error = float(np.sum((x[:, subset] @ solution - y) ** 2))
            if error < best_error - 1e-15:
                best = np.zeros(x.shape[1])
                best[list(subset)] = solution
                best_error = error
    return best


def _with_spread(line: Line, rows: list[dict[str, Any]], target: str) -> Line:
    names = [*line.coefficients, *([line.intercept_per] if line.intercept_per else [])]
    ratios = [r[target] / p - 1 for r in rows if (p := line(**{k: r[k] for k in names})) > 0]
    return Line(line.intercept, line.coefficients, min(ratios, default=0.0), max(ratios, default=0.0), line.runs,
                line.note, line.intercept_per)


def fit_constant(term: str, rows: list[dict[str, Any]], target: str) -> Line:
    """A term that does not scale: the median, its range the calibration's min and max."""
    values = [r[target] for r in rows if _finite(r.get(target))]
    if not values:
        raise FitError(f"term {term!r}: no calibration run measured it; runs that would fit it: any complete real "
                       "run (tiny tp1pp1dp2)")
    middle = statistics.median(values)
    spread = (min(values) / middle - 1, max(values) / middle - 1) if middle else (0.0, 0.0)
    return Line(middle, {}, *spread, tuple(sorted({r["run_id"] for r in rows if _finite(r.get(target))})))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- an emulated checkpoint's own times ----------------------------------------------------------------------


def emulated_own_times(run_dir: Path, engine: str) -> dict[str, dict[str, float]]:
    """Per checkpoint tag of an emulated run, its stall and durable time without the emulator's staging.

    An emulated process makes each of its ranks' state (random data, as training would have left it in memory)
    just before that rank's save, inside the checkpoint's clock (``durable_rank_max_s`` runs from the first rank's
    save start of any process); so the clock holds the staging of every rank but the first of each process, and the
    processes' skew (a process still staging while the other saves). Neither is part of a checkpoint: at a real
    save the state is in memory. Here:

    - ``durable``: per process, the sum over its ranks (done one after another) of each rank's save start →
      its files durable; the largest process's;
    - ``stall``: each rank's save plus its copy wait, the largest (as the analysis's ``stall_max_s``);
    - for a collective save (``CostTraits.collective``: every rank of the group takes part at once, one rank per
      process), the rank that arrived first waits in the collective for the last: both are counted from the last
      rank's save start.
    """
    saves, waits, durable, process = _save_records(read_events(run_dir, record="train"))
    out: dict[str, dict[str, float]] = {}
    for tag in sorted({t for t, _ in saves}):
        ranks = [r for t, r in saves if t == tag and (t, r) in durable]
        if not ranks:
            continue
        if cost_traits(engine).collective:
            arrival = max(saves[tag, r][0] for r in ranks)
            stall = max(saves[tag, r][1] - arrival + waits.get((tag, r), 0.0) for r in ranks)
            done = max(saves[tag, r][0] + durable[tag, r] - arrival for r in ranks)
        else:
            stall = max(saves[tag, r][1] - saves[tag, r][0] + waits.get((tag, r), 0.0) for r in ranks)
            busy: dict[Any, float] = {}
            for r in ranks:
                busy[process.get(r, r)] = busy.get(process.get(r, r), 0.0) + durable[tag, r]
            done = max(busy.values())
        out[tag] = {"stall": stall, "durable": max(stall, done)}
    return out


def _save_records(events: list[dict[str, Any]]) -> tuple[dict, dict, dict, dict]:
    """From a run's training events: (tag, rank) -> (save start, save end); (tag, rank) -> copy wait summed;
    (tag, rank) -> its durable time since its save start; rank -> its process (pid)."""
    saves, waits, durable, process = {}, {}, {}, {}
    for e in events:
        if e["event"] == Event.PROCESS_START:
            process[e["rank"]] = e.get("pid", e["rank"])
        elif e["event"] == Event.CHECKPOINT_SAVE:
            saves[e["tag"], e["rank"]] = (e["start"], e["time"])
        elif e["event"] == Event.CHECKPOINT_COPY_WAIT:
            waits[e["tag"], e["rank"]] = waits.get((e["tag"], e["rank"]), 0.0) + e["duration_s"]
        elif e["event"] == Event.CHECKPOINT_DURABLE:
            durable[e["tag"], e["rank"]] = e["since_save_start_s"]
    return saves, waits, durable, process


def with_own_times(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each emulated checkpoint's ``stall_max_s`` and ``durable_rank_max_s`` replaced by its own
    times (``emulated_own_times``); the checkpoint's clock kept in ``durable_clock_s``. Real runs unchanged."""
    if not {"run", "tag", "kind", "engine"} <= set(table.columns):
        return table
    table = table.copy()
    table["durable_clock_s"] = table.get("durable_rank_max_s")
    rows = (table["kind"] == "checkpoint") & table["engine"].astype(str).map(is_emulated)
    for run, engine in table.loc[rows, ["run", "engine"]].drop_duplicates().itertuples(index=False):
        own = emulated_own_times(Path(run), engine)
        for index in table.index[rows & (table["run"] == run)]:
            times = own.get(table.at[index, "tag"])
            if times:
                table.at[index, "stall_max_s"] = times["stall"]
                table.at[index, "durable_rank_max_s"] = times["durable"]
    return table


# -- the table's rows as the terms' regressors -----------------------------------------------------------------


def run_rows(table: pd.DataFrame, limits: Limits, per_process: dict[str, int],
             cores_per_node: int | None = None,
             scales: dict[str, float] | None = None) -> tuple[list[dict], list[dict]]:
    """(checkpoint rows, restart rows) with the regressors of every term and the run's CPU share factor
    (``cpu_factor``: its processes per node over ``cores_per_node``; 1 where None). ``per_process``: run_id → ranks
    each process handles (emulated runs' --ranks-per-process; 1 where absent); ``scales``: run_id → an emulated
    run's --emulate-scale (1 where absent)."""
    checkpoints = table[table["kind"] == "checkpoint"].to_dict("records")
    sizes = {}
    for row in checkpoints:
        run = row["run_id"]
        _regressors(row, limits, per_process.get(run, 1), cores_per_node, (scales or {}).get(run, 1.0))
        sizes[run] = row
    restarts = []
    for row in table[(table["kind"] == "restart") & table["restart_ckpt_load_s"].notna()].to_dict("records"):
        # a prefetched load (--lazy-prefetch) read beside the start-up: its span is no read, so it fits no load term
        if row["run_id"] in sizes and _same_layout(row) and not _is_true(row.get("prefetched")):
            size = sizes[row["run_id"]]
            restarts.append({**row, **{k: size[k] for k in ("concurrency", "bytes_rank", "files_rank",
                                                            "params_rank", "tensors_rank", "cpu_factor")},
                             "read_at_limit": size["held_rank"] * size["concurrency"] / (limits.read_GBps * GB)})
    return checkpoints, restarts


def _same_layout(row: dict[str, Any]) -> bool:
    """A restart on the layout it saved on: its ``restore_layout`` is that layout, or missing (None, or NaN where a
    column of texts has one: pandas 3)."""
    layout = row.get("restore_layout")
    return layout is None or layout != layout or layout == row["layout"]  # NaN != NaN


def _is_true(value: Any) -> bool:
    """A table cell that says yes (a missing column, None or NaN says no)."""
    return value is not None and value == value and bool(value)  # NaN != NaN


def _regressors(row: dict[str, Any], limits: Limits, per_process: int, cores_per_node: int | None,
                scale: float) -> None:
    nodes = int(row.get("nodes") or 1)
    ranks = int(row["ranks"])
    concurrency = max(1, ranks // nodes // per_process)  # the node's processes (as terms.job_cpu_factor takes them)
    preset = get_preset(row["preset"])
    row.update(concurrency=concurrency, in_turn=per_process,
               cpu_factor=cpu_share_factor(concurrency, cores_per_node) if cores_per_node else 1.0,
               bytes=row["bytes_per_rank_max"],
               files=row["files_per_rank_max"],
               bytes_rank=row["bytes_per_rank_max"], files_rank=row["files_per_rank_max"],
               files_node=row["files"] / nodes / concurrency,
               at_limit=row["bytes"] / nodes / (limits.write_GBps * GB),
               params_rank=preset.param_count() / (int(row["tp"] or 1) * int(row["pp"] or 1)),
               tensors_rank=0.0, tensors_written=0.0, held_rank=row["bytes_per_rank_max"])
    if cost_traits(row["engine"]).per_tensor:  # counted from the run's preset and layout, as for a prediction
        dtype = row.get("dtype") or "bf16"  # an emulated run's tensors at its width: DCP weighs them by their bytes
        module = tensors.stage_module(row["preset"], row["layout"], dtype, scale)
        layout = validate_layout(row["layout"], preset)
        held, written = tensors.busiest(tensors.stage_tensors(row["preset"], row["layout"], dtype), module, layout,
                                        row["engine"])
        # what the busiest rank read at the load: what it wrote and its replicas' module shares (its .metadata read,
        # tens of kB at these sizes, not counted)
        row.update(tensors_rank=held, tensors_written=written,
                   held_rank=row["bytes_per_rank_max"] + tensors.read_beyond_written(module, layout, row["engine"]))


# -- the whole fit -------------------------------------------------------------------------------------------


def fit_table(table: pd.DataFrame, limits: Limits, per_process: dict[str, int] | None = None, *,
              cores_per_node: int | None = None, scales: dict[str, float] | None = None) -> Fit:
    """Every term, fitted on the complete runs of ``table``; ``cores_per_node``: the calibrating machine's CPU cores
    per node (``os.cpu_count()`` where the runs were made), by which each run's CPU-bound parts are divided by its
    CPU share factor (None: not divided, see ``Fit.cores_per_node``); ``scales``: run_id → an emulated run's
    --emulate-scale (``calibration_runs.emulate_scales``; its width weighs DCP's choice of replicas)."""
    if table.empty:
        raise FitError("the calibration has no complete runs; runs that would fit the model: real runs of tiny and "
                       "small tp1pp1dp2 per engine, and emulated big checkpoints (bench/whatif_validation.py)")
    checkpoints, restarts = run_rows(with_own_times(table), limits, per_process or {}, cores_per_node, scales)
    real = [r for r in restarts if not is_emulated(r["engine"])]
    result = Fit(limits, calibrated_ranks=max((int(r["ranks"]) for r in real), default=1),
                 runs=sorted(set(table["run_id"])), cores_per_node=cores_per_node, device=_devices(table))
    for engine in sorted({r["engine"] for r in checkpoints}):
        try:
            result.engines[engine] = _engine_terms(engine, [r for r in checkpoints if r["engine"] == engine],
                                                   [r for r in restarts if r["engine"] == engine])
        except FitError as error:  # kept, and said whenever the engine is asked for
            result.unfitted[engine] = str(error)
    result.startup = _startup_terms(real)
    return result


def _devices(table: pd.DataFrame) -> str:
    """The calibration runs' devices, ``+``-joined (a table without the column: ``cpu``)."""
    found = sorted({str(d) for d in table["device"].dropna()}) if "device" in table else []
    return "+".join(found) or "cpu"


def _engine_terms(engine: str, checkpoints: list[dict], restarts: list[dict]) -> dict[str, Line]:
    """The engine's lines; a ``per_tensor`` engine's (``CostTraits``) with a cost per tensor: the tensors the rank
    writes for the stall and, for each of the ranks its process handles in turn, the durable time; those it holds for
    the load (``restartbench.whatif.terms``). The per-tensor cost is part of those engines' form, not tried as the
    per-file cost is (kept only where it predicts the calibration's runs better, each left out in turn): the tensors per
    rank vary with the depth per stage only, which few calibration configurations vary (in bench/whatif_validation.py's,
    33B tp1pp2 alone has another count at similar bytes; left out, the others' 132 and 133 tensors say nothing of the
    slope, so the comparison measures noise). Where the runs cannot tell it from the bytes (two real configurations,
    tiny and small, for an intercept and two slopes) it is left out, with a note."""
    per_tensor = ("tensors",) if cost_traits(engine).per_tensor else ()
    terms = {"stall": fit_line(f"{engine} stall", [{**r, "tensors": r["tensors_written"]}
                                                   for r in per_core(checkpoints, "stall_max_s")],
                               ("files", "bytes", *per_tensor), "stall_max_s"),
             "durable": fit_line(f"{engine} durable", [{**r, "files": r["files_node"],
                                                        "tensors": r["tensors_written"] * r["in_turn"]}
                                                       for r in checkpoints],
                                 ("files", "at_limit", *per_tensor), "durable_rank_max_s", intercept_per="in_turn"),
             "load": fit_line(f"{engine} ckpt load", [{**r, "at_limit": r["read_at_limit"], "files": r["files_rank"],
                                                       "tensors": r["tensors_rank"]} for r in restarts],
                              ("files", "at_limit", *per_tensor), "restart_ckpt_load_s")}
    if cost_traits(engine).asynchronous:
        terms["slowdown"] = _slowdown(engine, checkpoints)
    if not is_emulated(engine):
        terms["engine setup"] = fit_constant(f"{engine} engine setup", per_core(restarts, "restart_engine_setup_s"),
                                             "restart_engine_setup_s")
    return terms


def _slowdown(engine: str, checkpoints: list[dict]) -> Line:
    """σ: the slowdown of the overlapped iterations over the background work's duration, median over the
    checkpoints whose background work training saw to its end."""
    rows = [{"run_id": r["run_id"],
             "fraction": max(0.0, r["slowdown_s"]) / (r["durable_rank_max_s"] - r["stall_max_s"])}
            for r in checkpoints if r.get("background_seen") is True and _finite(r.get("slowdown_s"))
            and r["durable_rank_max_s"] > r["stall_max_s"]]
    if not rows:
        return Line(0.0, note=f"{engine}: no checkpoint's background work was seen to its end during training; runs "
                              "that would fit it: real runs with more than one save interval (--iters 4 "
                              "--save-interval 2)")
    return fit_constant(f"{engine} slowdown fraction", rows, "fraction")


#: Each CPU-bound start-up part's column in the tidy table (the analysis's names; the gaps are the critical path's).
STARTUP_COLUMNS = {**{label: column for column, label in RESTART_PART_COLUMNS if label in CPU_BOUND},
                   "gaps": "path_gaps_s"}


def per_core(rows: list[dict], target: str) -> list[dict]:
    """``rows`` with ``target`` divided by each row's CPU share factor (``cpu_factor``): the time the run's work
    would have taken with a core per process."""
    return [{**r, target: r[target] / r.get("cpu_factor", 1.0)} if _finite(r.get(target)) else r for r in rows]


def _startup_terms(restarts: list[dict]) -> dict[str, Line]:
    for part in CPU_BOUND:
        if part != "engine setup":  # the engine's own line (_engine_terms)
            restarts = per_core(restarts, STARTUP_COLUMNS[part])
    rows = [{**r, "params": r["params_rank"],
             "first_ratio": r["restart_1st_iter_s"] / r["iteration_s"] if _finite(r.get("iteration_s"))
             and r["iteration_s"] > 0 and _finite(r.get("restart_1st_iter_s")) else None} for r in restarts]
    return {"launch": fit_constant("launch", rows, "restart_launch_s"),
            "imports": fit_constant("imports", rows, "restart_imports_s"),
            "dist init": _maybe_line("dist init", rows, ("ranks",), "restart_dist_init_s"),
            "model build": _maybe_line("model build", rows, ("params",), "restart_model_build_s"),
            "ds init": _maybe_line("ds init", rows, ("params",), "restart_ds_init_s"),
            "1st iter ratio": fit_constant("1st iter ratio", rows, "first_ratio"),
            "gaps": fit_constant("gaps", rows, "path_gaps_s")}


def _maybe_line(term: str, rows: list[dict], regressors: tuple[str, ...], target: str) -> Line:
    """A line where its regressor varies over the runs, else the constant (with the note of what would fit it)."""
    try:
        return fit_line(term, rows, regressors, target)
    except FitError:
        constant = fit_constant(term, rows, target)
        return Line(constant.intercept, {}, constant.low, constant.high, constant.runs,
                    f"{', '.join(regressors)} not fitted (the same in every calibration run); runs that would fit "
                    f"it: {'; '.join(HINTS[x] for x in regressors)}")


# -- files ------------------------------------------------------------------------------------------------


def to_json(fit: Fit) -> dict[str, Any]:
    return {"limits": asdict(fit.limits), "calibrated_ranks": fit.calibrated_ranks, "runs": fit.runs,
            "unfitted": fit.unfitted, "cores_per_node": fit.cores_per_node, "device": fit.device,
            "collective_plan_s_per_item": fit.collective_plan_s_per_item,
            "collective_load_plan_s_per_item": fit.collective_load_plan_s_per_item,
            "engines": {e: {t: asdict(line) for t, line in terms.items()} for e, terms in fit.engines.items()},
            "startup": {t: asdict(line) for t, line in fit.startup.items()}}


def from_json(data: dict[str, Any]) -> Fit:
    def line(entry: dict[str, Any]) -> Line:
        return Line(entry["intercept"], entry["coefficients"], entry["low"], entry["high"], tuple(entry["runs"]),
                    entry["note"], entry.get("intercept_per", ""))
    return Fit(Limits(**data["limits"]), data["calibrated_ranks"],
               {e: {t: line(v) for t, v in terms.items()} for e, terms in data["engines"].items()},
               {t: line(v) for t, v in data["startup"].items()}, data["runs"], data.get("unfitted", {}),
               data.get("cores_per_node"), data.get("device", "cpu"), data.get("collective_plan_s_per_item"),
               data.get("collective_load_plan_s_per_item"))


def write_fit(fit: Fit, path: Path) -> None:
    path.write_text(json.dumps(to_json(fit), indent=1) + "\n")


def read_fit(path: Path) -> Fit:
    try:
        return from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise FitError(f"{path}: not a what-if fit file ({type(error).__name__}: {error}); write one with "
                       "python bench/whatif_validation.py") from error

"""The checkpoint plan: every file each rank writes for a preset, layout and engine, predicted without running.

    python -m restartbench.plan 70B tp8pp4dp2 --engine torch        # files per rank, counts per kind, totals
    python -m restartbench.plan 70B tp8pp4dp2 --engine dcp --json   # the same, as JSON
    python -m restartbench.plan --all-presets --layouts tp1pp1,tp8pp8 > docs/plan.md   # presets x layouts, engines
    python -m restartbench.plan 70B tp8pp8 --universal   # and the universal checkpoint ds_to_universal.py makes of it

Options are the run options of ``config-n-run.py`` (``--dtype``, ``--micro-batch``, ``--engine``, ...), plus
``--step`` (the checkpoint's iteration, default ``--save-interval``). Nothing is copied from DeepSpeed by hand:

- each rank's training state at the checkpoint is built from the model and DeepSpeed's own objects on meta tensors
  (``restartbench.shards``, which says how);
- every engine's files come from that state through the engine's own code: its predictor, in its folder
  (``restartbench/engines/<folder>/predict.py``, named by its registry entry; ``PREDICTORS``); an engine without
  one says why (``NOT_PREDICTED``);
- sizes (``restartbench.sizes``): the payload is the bytes of every tensor storage, exact; a torch.save'd file's
  size is what ``torch.save`` itself writes. The tests compare every name and size with real runs; each engine's
  stated tolerance per file is a named constant in its predictor, with its reason.

``zero_to_fp32.py`` and ``zero_to_torch.py``, which DeepSpeed's global rank 0 copies into the checkpoint folder's
root at every save, are listed apart (they are not written through the checkpoint engine, so a run's
``checkpoint.durable`` events do not count them either).

This module is the plan's front: the configuration to a ``ShardSetup`` (``setup_for``), the prediction, the cache
of predictions between processes, and the text, Markdown and JSON output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from restartbench import engines, rundir, storage
from restartbench.config import RunConfig, build_parser, config_from_parsed
from restartbench.engines.base import load
from restartbench.engines.deepspeed.predict import SIZE_TOLERANCE_BYTES
from restartbench.engines.deepspeed.universal_predict import UniversalPlan, predict_universal
from restartbench.engines.deepspeed.universal_predict import render_text as render_universal
from restartbench.events import number_ranges
from restartbench.launchers import choose_device
from restartbench.layout import LayoutError, validate_layout
from restartbench.presets import PRESETS, get_preset
from restartbench.render import render_ds_config
from restartbench.shards import ShardSetup, scaled_preset
from restartbench.sizes import KINDS, EnginePredictor, PlannedFile

#: Layouts of docs/plan.md (those that do not fit a preset are left out, with the reason).
DOC_LAYOUTS = ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp2", "tp2pp4dp1", "tp8pp4dp2", "tp8pp8dp1")


@dataclass
class CheckpointPlan:
    preset: str
    layout: str
    dtype: str
    engine: str
    tag: str
    world_size: int
    files: list[PlannedFile]
    root_files: dict[str, int] = field(default_factory=dict)
    """Files DeepSpeed's rank 0 copies into the checkpoint folder's root (name -> bytes), outside the engine."""
    scale: float = 1.0
    """Width factor of an emulated, scaled-down model (1.0: the preset as it is)."""
    tolerance_bytes: int = 0
    """Largest difference per file between a predicted and a written size (``EnginePredictor.tolerance_bytes``)."""
    note: str = ""
    held_to: str = "real runs"
    """What the tests hold the sizes to (``EnginePredictor.held_to``)."""

    @property
    def checkpoint_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def payload_bytes(self) -> int:
        return sum(f.payload_bytes for f in self.files)

    def rank_files(self, rank: int) -> list[PlannedFile]:
        return [f for f in self.files if f.rank == rank]

    def per_rank_bytes(self) -> dict[int, int]:
        totals = {rank: 0 for rank in range(self.world_size)}
        for f in self.files:
            totals[f.rank] += f.bytes
        return totals

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Files and bytes of each kind this plan has, in ``KINDS`` order."""
        return {kind: {"files": sum(1 for f in self.files if f.kind == kind),
                       "bytes": sum(f.bytes for f in self.files if f.kind == kind)}
                for kind in KINDS if any(f.kind == kind for f in self.files)}

    def totals(self) -> dict[str, Any]:
        per_rank = self.per_rank_bytes()
        busiest = max(per_rank, key=per_rank.get)
        return {"checkpoint_bytes": self.checkpoint_bytes, "payload_bytes": self.payload_bytes,
                "overhead_bytes": self.checkpoint_bytes - self.payload_bytes, "files": len(self.files),
                "per_rank_max_bytes": per_rank[busiest], "per_rank_max_rank": busiest,
                "per_rank_min_bytes": min(per_rank.values()), "by_kind": self.by_kind(),
                "root_files": self.root_files}

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "layout": self.layout, "dtype": self.dtype, "engine": self.engine,
                "tag": self.tag, "world_size": self.world_size, "scale": self.scale,
                "tolerance_bytes": self.tolerance_bytes, "note": self.note, "held_to": self.held_to,
                "totals": self.totals(),
                "files": [asdict(f) for f in self.files]}


# --- the plan -------------------------------------------------------------------------------


def setup_for(cfg: RunConfig, step: int | None = None, scale: float = 1.0) -> ShardSetup:
    """The checkpoint of run configuration ``cfg`` after iteration ``step`` (default: its first save)."""
    base = get_preset(cfg.model.preset, cfg.model.seq_len)  # the preset with the run's sequence length
    ranks = cfg.layout.nnodes * cfg.layout.nproc_per_node if cfg.layout.nproc_per_node else None
    layout = validate_layout(cfg.layout.layout, base, ranks)
    step = step or min(cfg.train.save_interval, cfg.train.iters)
    grad_accum = cfg.train.grad_accum or layout.pp
    return ShardSetup(preset=scaled_preset(base, scale, layout.tp), layout=layout, dtype=cfg.model.dtype,
                      ds_config=render_ds_config(cfg, grad_accum, layout.dp), step=step, tag=f"step{step}",
                      device=choose_device(cfg.launch.device, base.param_count()),
                      folder=checkpoint_folder(cfg, base.name, layout.name), nnodes=cfg.layout.nnodes)


def config_named(preset: str, layout: str, engine: str = "torch", dtype: str = "bf16") -> RunConfig:
    """The run configuration of ``preset`` at ``layout`` through ``engine``, its checkpoints in ``/checkpoints``: a
    fixed folder, since DCP pickles its path (docs/plan.md). What the what-if plans and measures a layout by."""
    cfg = RunConfig()
    cfg.model.preset, cfg.model.dtype, cfg.layout.layout, cfg.engine.engine = preset, dtype, layout, engine
    cfg.storage.checkpoint_dir = "/checkpoints"
    return cfg


def checkpoint_folder(cfg: RunConfig, preset: str, layout: str) -> str:
    """Where a run of ``cfg`` puts its checkpoints, as ``study.plan_run`` resolves it: ``--checkpoint-dir``, else
    ``<run folder>/checkpoints``; a run folder not made yet is ``<logs>/<preset>/<layout>/<engine>/<time>`` with
    ``rundir.PLACEHOLDER_STAMP`` for the time and its suffix (a path of the same length)."""
    if cfg.storage.checkpoint_dir:
        where = cfg.storage.checkpoint_dir
        return where if storage.is_remote(where) else str(Path(where).resolve())
    run_dir = Path(cfg.paths.run_dir or rundir.run_folder(cfg.paths.logs, preset, layout, cfg.engine.engine))
    return str((run_dir / rundir.CHECKPOINTS).resolve())


PREDICTORS: dict[str, EnginePredictor] = {name: load(info.predictor) for name in engines.engine_names()
                                          if (info := engines.engine_info(name)).predictor}
"""The engines whose files are predicted (``predict``), by name: each registry entry's predictor."""

NOT_PREDICTED: dict[str, str] = {name: info.not_predicted for name in engines.engine_names()
                                 if not (info := engines.engine_info(name)).predictor}
"""Engines without a prediction, and why (their registry entries say)."""


class NotPredictedError(ValueError):
    """The engine's files are not predicted (``NOT_PREDICTED`` says why)."""


def predictor(engine: str) -> EnginePredictor:
    if engine in NOT_PREDICTED:
        raise NotPredictedError(f"engine {engine!r}: {NOT_PREDICTED[engine]}")
    try:
        return PREDICTORS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; the plan predicts {', '.join(PREDICTORS)}") from None


def predict(cfg: RunConfig, step: int | None = None, scale: float = 1.0,
            ranks: frozenset[int] | None = None) -> CheckpointPlan:
    """Every file of one checkpoint of ``cfg`` (its engine's files) with its writing rank, kind, payload and size;
    ``ranks``: of those ranks only (``ShardSetup.ranks``), refused for a collective engine, whose ranks' files come
    from one global plan of them all."""
    engine = predictor(cfg.engine.engine)
    if ranks is not None and engines.cost_traits(cfg.engine.engine).collective:
        raise ValueError(f"engine {cfg.engine.engine!r} plans every rank's files together (a collective save): plan "
                         "all of its ranks")
    setup = replace(setup_for(cfg, step, scale), ranks=ranks)
    with tempfile.TemporaryDirectory(prefix="restartbench-plan-") as scratch, _deepspeed_quiet():
        files = engine.files(setup, scratch)
    return CheckpointPlan(preset=cfg.model.preset, layout=setup.layout.name, dtype=setup.dtype,
                          engine=cfg.engine.engine, tag=setup.tag, world_size=setup.layout.world_size, files=files,
                          root_files=engine.root_files(), scale=scale, tolerance_bytes=engine.tolerance_bytes,
                          note=engine.note, held_to=engine.held_to)


@contextlib.contextmanager
def _deepspeed_quiet() -> Iterator[None]:
    """DeepSpeed's logger warns when its scheduler is built before training starts (what the plan does): hush it."""
    from deepspeed.utils import logger  # imported first: DeepSpeed's import sets its level

    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Bytes of one checkpoint of ``cfg`` (every rank's files) as its engine writes them: the reference the disk
    check and the analysis use. An engine without a prediction (``NOT_PREDICTED``) is counted as DeepSpeed's default
    engine (whose files it would write through DeepSpeed's save); an emulated run (``--emulate``) at its scale.

    Only what shapes the files is kept (model, layout and ranks, training settings, engine and its options, device,
    and for engines that record it the checkpoint folder), so that runs differing in anything else share one
    prediction, in this process and, through ``PLAN_CACHE``, in later ones."""
    engine = "torch" if cfg.engine.engine in NOT_PREDICTED else cfg.engine.engine
    config: dict[str, Any] = {
        "model": {"preset": cfg.model.preset, "dtype": cfg.model.dtype}, "layout": asdict(cfg.layout),
        "engine": {**asdict(cfg.engine), "engine": engine}, "launch": {"device": cfg.launch.device},
        "train": {name: getattr(cfg.train, name) for name in ("iters", "save_interval", "micro_batch", "grad_accum",
                                                              "lr")}}
    folder = None
    if PREDICTORS.get(engine, PREDICTORS["torch"]).needs_folder:
        config |= {"paths": asdict(cfg.paths), "storage": {"checkpoint_dir": cfg.storage.checkpoint_dir}}
        preset = get_preset(cfg.model.preset)
        ranks = cfg.layout.nnodes * cfg.layout.nproc_per_node if cfg.layout.nproc_per_node else None
        folder = checkpoint_folder(cfg, preset.name, validate_layout(cfg.layout.layout, preset, ranks).name)
    scale = cfg.emulation.emulate_scale if cfg.emulation.emulate else 1.0
    return cached_bytes(json.dumps({"config": config, "folder": folder, "scale": scale}, sort_keys=True))


PLAN_CACHE = "RESTARTBENCH_PLAN_CACHE"
"""Environment variable: the folder where ``checkpoint_bytes`` keeps its results between processes (default
``$XDG_CACHE_HOME/restartbench/plan``, else ``~/.cache/restartbench/plan``), or ``off``. A result is found again
only for the same configuration, the same versions of torch, DeepSpeed and TorchSnapshot, and the same code
(``_code_digest``): it is the prediction itself, read back instead of computed (computing one imports torch and
DeepSpeed, seconds)."""


@lru_cache(maxsize=256)
def cached_bytes(key: str) -> int:
    where = os.environ.get(PLAN_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "restartbench", "plan")
    path = Path(where, hashlib.sha256(f"{_code_digest()}\n{key}".encode()).hexdigest() + ".json")
    if where != "off":
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(json.loads(path.read_text())["checkpoint_bytes"])
    recorded = json.loads(key)
    value = predict(RunConfig.from_dict(recorded["config"]), scale=recorded["scale"]).checkpoint_bytes
    if where != "off":
        with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"key": recorded, "checkpoint_bytes": value}))
            os.replace(partial, path)
    return value


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """What a prediction depends on besides its configuration: the versions of torch, DeepSpeed and TorchSnapshot,
    and every source file of this checkout the prediction may read (restartbench, templates, third_party)."""
    digest = hashlib.sha256()
    for package in ("torch", "deepspeed", "torchsnapshot"):
        with contextlib.suppress(PackageNotFoundError):
            digest.update(f"{package}=={version(package)}\n".encode())
    root = Path(__file__).resolve().parent.parent
    for path in sorted([*root.glob("restartbench/**/*.py"), *root.glob("templates/*"),
                        *root.glob("third_party/**/*.py")]):
        digest.update(f"{path.relative_to(root)}\n".encode() + path.read_bytes())
    return digest.hexdigest()


# --- output ---------------------------------------------------------------------------------


def _size(n: float) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def render_markdown(plan: CheckpointPlan, heading: str = "###") -> str:
    """Totals, counts per kind, and the files of every rank: ranks whose files have the same kinds and sizes are one
    row group (their names differ only in their own numbers), and consecutive files alike are one line."""
    t = plan.totals()
    lines = [f"{heading} {plan.preset} {plan.layout} ({plan.dtype}, engine {plan.engine}, tag {plan.tag})", "",
             f"- checkpoint: **{t['checkpoint_bytes']:,} B** ({_size(t['checkpoint_bytes'])}) in {t['files']} files; "
             f"tensor payload {t['payload_bytes']:,} B, serialization overhead {t['overhead_bytes']:,} B",
             f"- per rank: max {t['per_rank_max_bytes']:,} B ({_size(t['per_rank_max_bytes'])}, rank "
             f"{t['per_rank_max_rank']}), min {t['per_rank_min_bytes']:,} B ({_size(t['per_rank_min_bytes'])})",
             "- per kind: " + "; ".join(f"{kind} {v['files']} files, {_size(v['bytes'])}"
                                        for kind, v in t["by_kind"].items()),
             f"- {_tolerance(plan)}"]
    if plan.root_files:
        lines.append("- also at the checkpoint folder's root (rank 0 at every save, not through the engine): "
                     + ", ".join(f"`{n}` {b:,} B" for n, b in plan.root_files.items()))
    lines += ["", "| ranks | files of the first rank (the others: same sizes, their own numbers) | kind "
              "| payload B each | file B each |", "|---|---|---|---:|---:|"]
    for ranks, files in _rank_groups(plan):
        for first, last, count, kind, payload, size in _runs(files):
            name = f"`{first}`" if count == 1 else f"`{first}` … `{Path(last).name}` ({count} files)"
            lines.append(f"| {ranks} | {name} | {kind} | {payload:,} | {size:,} |")
            ranks = ""
    return "\n".join(lines) + "\n"


def _tolerance(plan: CheckpointPlan) -> str:
    if plan.tolerance_bytes == 0:
        return f"file sizes: exact (held byte for byte to {plan.held_to})"
    return f"file sizes: within {plan.tolerance_bytes} B each of a real run's"


def _rank_groups(plan: CheckpointPlan) -> list[tuple[str, list[PlannedFile]]]:
    groups: dict[tuple, list[int]] = {}
    for rank in range(plan.world_size):
        groups.setdefault(tuple((f.kind, f.payload_bytes, f.bytes) for f in plan.rank_files(rank)), []).append(rank)
    return [(number_ranges(ranks), plan.rank_files(ranks[0])) for ranks in groups.values()]


def _runs(files: list[PlannedFile]) -> Iterator[tuple[str, str, int, str, int, int]]:
    """(first path, last path, count, kind, payload, bytes) of each run of consecutive files alike."""
    i = 0
    while i < len(files):
        j = i
        while j + 1 < len(files) and (files[j + 1].kind, files[j + 1].payload_bytes, files[j + 1].bytes) == \
                (files[i].kind, files[i].payload_bytes, files[i].bytes):
            j += 1
        yield files[i].path, files[j].path, j - i + 1, files[i].kind, files[i].payload_bytes, files[i].bytes
        i = j + 1


def render_text(plan: CheckpointPlan) -> str:
    t = plan.totals()
    lines = [f"{plan.preset} {plan.layout}, {plan.dtype}, engine {plan.engine}: checkpoint {plan.tag}, "
             f"{plan.world_size} ranks", *([plan.note] if plan.note else []), ""]
    for rank in range(plan.world_size if plan.files else 0):
        files = plan.rank_files(rank)
        lines.append(f"rank {rank}: {len(files)} files, {sum(f.bytes for f in files):,} B")
        lines += [f"  {f.path:<60} {f.kind:<9} payload {f.payload_bytes:>16,}  file {f.bytes:>16,}" for f in files]
    kinds = "; ".join(f"{kind}: {v['files']} files, {v['bytes']:,} B" for kind, v in t["by_kind"].items())
    lines += [""] * bool(plan.files) + [
              f"per kind: {kinds or 'no files'}",
              f"checkpoint: {t['checkpoint_bytes']:,} B ({_size(t['checkpoint_bytes'])}) in {t['files']} files; "
              f"payload {t['payload_bytes']:,} B; overhead {t['overhead_bytes']:,} B",
              f"per rank: max {t['per_rank_max_bytes']:,} B (rank {t['per_rank_max_rank']}), "
              f"min {t['per_rank_min_bytes']:,} B", _tolerance(plan)]
    if plan.root_files:
        lines.append("root of the checkpoint folder (rank 0, every save, not through the engine): "
                     + ", ".join(f"{n} {b:,} B" for n, b in plan.root_files.items()))
    return "\n".join(lines) + "\n"


def render_not_predicted(cfg: RunConfig) -> str:
    return f"{cfg.model.preset} {cfg.layout.layout}, engine {cfg.engine.engine}: not predicted: " \
           f"{NOT_PREDICTED[cfg.engine.engine]}\n"


#: docs/plan.md's comparison of engines: one preset and layout.
ENGINE_DOC_CASE = ("70B", "tp8pp4dp2")


def render_all(dtype: str = "bf16", layouts: tuple[str, ...] = DOC_LAYOUTS) -> str:
    """docs/plan.md: DeepSpeed's default engine for every preset x ``layouts``, then every engine for
    ``ENGINE_DOC_CASE``."""
    command = f"python -m restartbench.plan --all-presets --layouts {','.join(layouts)} --dtype {dtype} > docs/plan.md"
    out = ["# Checkpoint plans", "",
           f"Generated by `{command}` (do not edit by hand). For each preset and "
           f"layout, the files one checkpoint of DeepSpeed's default engine writes ({dtype}, ZeRO-1, tag of the first "
           "save), predicted without running anything: see `restartbench/plan.py` for how each figure is obtained; "
           f"the last section compares the engines on {' '.join(ENGINE_DOC_CASE)}.",
           f"File sizes are torch.save's own, within {SIZE_TOLERANCE_BYTES} B per file of a real run "
           "(`tests/test_predict.py`).", "",
           "| preset | layout | ranks | files | checkpoint | payload | per-rank max | layer | model | optimizer |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    plans, skipped, cases = [], [], []
    for preset in PRESETS.values():
        for name in layouts:
            try:
                cfg = doc_config(preset.name, name, dtype, "torch")
                plan = predict(cfg)
            except LayoutError as error:
                skipped.append(f"- {preset.name} {name}: {str(error).splitlines()[-1].strip(' -')}")
                continue
            plans.append(plan)
            cases.append((cfg, plan))
            t = plan.totals()
            kinds = t["by_kind"]
            out.append(f"| {plan.preset} | {plan.layout} | {plan.world_size} | {t['files']} | "
                       f"{_size(t['checkpoint_bytes'])} | {_size(t['payload_bytes'])} | "
                       f"{_size(t['per_rank_max_bytes'])} | "
                       + " | ".join(_size(kinds[k]["bytes"]) for k in ("layer", "model", "optimizer")) + " |")
    out += ["", "Layouts that do not fit their preset:", "", *skipped, "", "## Files per rank", ""]
    out += [render_markdown(plan) for plan in plans]
    return "\n".join(out) + "\n" + render_engines(*ENGINE_DOC_CASE, dtype) + "\n" + render_universal_table(cases)


#: The checkpoint folder of docs/plan.md's plans (DCP pickles its path into ``.metadata``): the same wherever the
#: document is generated.
DOC_CHECKPOINT_DIR = "/checkpoints"


def doc_config(preset: str, layout: str, dtype: str, engine: str) -> RunConfig:
    cfg = RunConfig()
    cfg.model.preset, cfg.model.dtype, cfg.layout.layout, cfg.engine.engine = preset, dtype, layout, engine
    cfg.storage.checkpoint_dir = DOC_CHECKPOINT_DIR
    return cfg


def render_engines(preset: str, layout: str, dtype: str) -> str:
    """docs/plan.md's last section: one checkpoint of ``preset`` and ``layout`` as each engine writes it."""
    out = [f"## Engines: {preset} {layout}", "",
           f"One checkpoint of {preset} {layout} ({dtype}, tag of the first save) as each engine writes it "
           f"(`python -m restartbench.plan {preset} {layout} --engine NAME --checkpoint-dir {DOC_CHECKPOINT_DIR}`: "
           "DCP pickles the checkpoint folder's path into `.metadata`).", "",
           "| engine | files | checkpoint | payload | per-rank max | files per kind | file sizes |",
           "|---|---:|---:|---:|---:|---|---|"]
    sections = []
    for engine in PREDICTORS:
        plan = predict(doc_config(preset, layout, dtype, engine))
        t = plan.totals()
        kinds = ", ".join(f"{kind} {v['files']}" for kind, v in t["by_kind"].items()) or "-"
        exact = "exact" if plan.tolerance_bytes == 0 else f"± {plan.tolerance_bytes} B"
        out.append(f"| {engine} | {t['files']} | {_size(t['checkpoint_bytes'])} | {_size(t['payload_bytes'])} | "
                   f"{_size(t['per_rank_max_bytes'])} | {kinds} | {exact} |")
        if plan.files and engine != "torch":  # torch's files are listed above
            sections.append(render_markdown(plan))
    out += ["", "Not predicted:", "", *(f"- {engine}: {why}" for engine, why in NOT_PREDICTED.items()), "", *sections]
    return "\n".join(out)


def render_universal_table(cases: list[tuple[RunConfig, CheckpointPlan]]) -> str:
    """docs/plan.md's last section: the universal checkpoint ds_to_universal.py makes of each checkpoint of DeepSpeed's
    default engine listed above (``universal_row`` for each)."""
    out = ["## Universal checkpoints", "",
           "What DeepSpeed's `ds_to_universal.py --input_folder <checkpoints>/<tag> --output_folder "
           "<checkpoints>/<tag>_universal` writes from each checkpoint of the first table "
           "(`python -m restartbench.plan PRESET LAYOUT --universal` lists the files): per parameter its fp32 weights, "
           "exp_avg and exp_avg_sq at full shape and Adam's step, the optimizer's common state, a copy of each model "
           "file and `latest_universal`. "
           "The temporary fragments (every rank's share of each parameter's states, in `<tag>_universal/tmp`) are "
           "written, read back and removed during the conversion: bytes written besides the checkpoint's, and "
           "disk room it needs at once. File sizes are torch.save's own, exact (`tests/test_universal.py`).", "",
           "| preset | layout | files | universal checkpoint | payload | temporary fragments | fragment bytes |",
           "|---|---|---:|---:|---:|---:|---:|"]
    return "\n".join(out + [universal_row(cfg, plan) for cfg, plan in cases]) + "\n"


def universal_row(cfg: RunConfig, plan: CheckpointPlan) -> str:
    t = _universal(cfg, None, plan).totals()
    return (f"| {plan.preset} | {plan.layout} | {t['files']} | {_size(t['bytes'])} | {_size(t['payload_bytes'])} | "
            f"{t['fragment_files']} | {_size(t['fragment_bytes'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = plan_parser()
    args = vars(parser.parse_args(argv))
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to the stdout of its import: keep stdout the plan's
        import deepspeed  # noqa: F401
    layouts = tuple(name for name in args.pop("layouts").split(",") if name)
    if args.pop("all_presets"):
        print(render_all(args["model.dtype"], layouts), end="")
        return 0
    step, as_json, universal = args.pop("step"), args.pop("json"), args.pop("universal")
    cfg = config_from_parsed(parser, args)
    if step is not None and step < 1:
        parser.error(f"--step must be at least 1 (got {step})")
    if universal and cfg.engine.engine != "torch":
        parser.error("--universal: ds_to_universal.py converts the checkpoints of DeepSpeed's default engine "
                     f"(--engine torch), not {cfg.engine.engine!r}")
    try:
        plan = predict(cfg, step=step)
        converted = _universal(cfg, step, plan) if universal else None
    except NotPredictedError:  # the plan's answer, not a mistake: said on stdout
        print(json.dumps({"engine": cfg.engine.engine, "predicted": False, "reason": NOT_PREDICTED[cfg.engine.engine]})
              if as_json else render_not_predicted(cfg), end="\n" if as_json else "")
        return 0
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({**plan.to_dict(), **({"universal": converted.to_dict()} if converted else {})}, indent=1))
    else:
        print(render_text(plan) + (f"\n{render_universal(converted)}" if converted else ""), end="")
    return 0


def plan_parser() -> argparse.ArgumentParser:
    """The run configuration's options (``build_parser``) and the plan's own."""
    parser = build_parser(prog="python -m restartbench.plan")
    parser.description = ("Print the files one checkpoint of a preset and layout writes, rank by rank, with their "
                          "sizes, without running anything.")
    parser.add_argument("--step", type=int, default=None,
                        help="Iteration of the checkpoint (default: --save-interval).")
    parser.add_argument("--json", action="store_true", help="Print the plan as JSON.")
    parser.add_argument("--all-presets", action="store_true",
                        help="Markdown for every preset x --layouts (docs/plan.md); preset and layout are ignored.")
    parser.add_argument("--layouts", default=",".join(DOC_LAYOUTS),
                        help="Comma-separated layouts for --all-presets (default: %(default)s).")
    parser.add_argument("--universal", action="store_true",
                        help="Also the universal checkpoint DeepSpeed's ds_to_universal.py makes of this checkpoint "
                             "(into <tag>_universal): its files and bytes, and its temporary fragments' bytes "
                             "(--engine torch only).")
    return parser


def _universal(cfg: RunConfig, step: int | None, plan: CheckpointPlan) -> UniversalPlan:
    """``--universal``: the conversion of the checkpoint ``plan`` predicts (its model files are copied as they are)."""
    with _deepspeed_quiet():
        return predict_universal(setup_for(cfg, step), plan.files)


if __name__ == "__main__":
    sys.exit(main())

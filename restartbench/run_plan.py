"""Check and plan one run before anything is written or launched: ``plan_run`` (preset, layout, nodes and ranks,
device, engine, checkpoint location, memory per rank) and ``plan_layout_restart`` (a restart of a run on another
layout). Every bad input raises ``StudyError`` with what was wrong and what to do; the result is a ``rundir.RunPlan``.
Writing and launching the run are ``restartbench.study``'s.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from restartbench import engines, rundir, storage
from restartbench.config import RunConfig
from restartbench.config_fields import flag
from restartbench.errors import StudyError
from restartbench.estimate import GiB, checkpoint_bytes, memory_per_rank
from restartbench.launchers import Launcher, allocation_gpus, choose_device, resolve_launcher
from restartbench.layout import Layout, LayoutError, restore_grad_accum, validate_layout
from restartbench.presets import ModelPreset, UnknownPresetError, get_preset
from restartbench.rundir import RunPlan

GPUS_PER_NODE_DEFAULT = 8

def plan_run(cfg: RunConfig) -> RunPlan:
    preset = _preset(cfg)
    device = choose_device(cfg.launch.device, preset.param_count())
    nnodes, nproc = cfg.layout.nnodes, cfg.layout.nproc_per_node
    try:
        layout = validate_layout(cfg.layout.layout, preset, nnodes * nproc if nproc else None)
    except LayoutError as error:
        raise StudyError(str(error)) from None
    gpus_per_node = cfg.launch.gpus_per_node or GPUS_PER_NODE_DEFAULT
    if not nproc:
        nnodes, nproc = _default_nodes(layout.world_size, device, nnodes, gpus_per_node)
    launcher = resolve_launcher(cfg.launch.launcher)
    if device == "cuda":
        _check_gpus(layout.world_size, nnodes, nproc, gpus_per_node, launcher)
    _check_engine(cfg.engine.engine)
    ignored = engines.ignored_options(cfg.engine)
    if ignored:
        raise StudyError("\n".join(ignored))
    grad_accum = cfg.train.grad_accum or layout.pp
    memory = memory_per_rank(preset, layout, dtype=cfg.model.dtype, micro_batch=cfg.train.micro_batch,
                             grad_accum=grad_accum, device=device,
                             activation_checkpoint_interval=cfg.model.activation_checkpoint_interval)
    run_dir = Path(cfg.paths.run_dir or rundir.new_run_folder(cfg.paths.logs, cfg.model.preset, layout.name,
                                                              cfg.engine.engine))
    checkpoint_dir, remote = _checkpoint_target(cfg, run_dir)
    plan = RunPlan(
        preset=asdict(preset), layout=asdict(layout), layout_name=layout.name, world_size=layout.world_size,
        nnodes=nnodes, nproc_per_node=nproc, device=device, backend="nccl" if device == "cuda" else "gloo",
        grad_accum=grad_accum, run_dir=str(run_dir.resolve()), checkpoint_dir=checkpoint_dir, remote=remote,
        master_port=cfg.launch.master_port or (free_port() if nnodes == 1 else 29500),
        checkpoint_bytes_estimate=checkpoint_bytes(cfg),
        memory_per_rank_estimate=memory.describe(), launcher=launcher.name,
    )
    if not cfg.launch.dry_run and cfg.launch.memory_check:
        _check_memory(preset, plan, memory.total)
    return plan


def plan_layout_restart(cfg: RunConfig, plan: RunPlan, layout_name: str) -> tuple[RunConfig, RunPlan]:
    """The config and plan of a restart of a run (``cfg``, ``plan``) on another layout: the same run folder and
    checkpoints where the plan found them (the run folder's own moved with it), the same device, the layout's ranks
    on as many nodes, and the run's global batch (``restore_grad_accum``), so that the restart resumes the same
    training. Refused, saying why, where the layout does not fit the model or the batch, or is the run's own."""
    saved = Layout(**plan.layout)
    try:
        new = validate_layout(layout_name, _preset(cfg))
        grad_accum = restore_grad_accum(saved, plan.grad_accum, new)
    except LayoutError as error:
        raise StudyError(f"--restore-layout {layout_name}: {error}") from None
    if new == saved:
        raise StudyError(f"--restore-layout {layout_name} is the run's own layout ({saved.name}); leave it out to "
                         "restart on the same layout")
    changed = replace(cfg, layout=replace(cfg.layout, layout=new.name, nproc_per_node=None, nnodes=plan.nnodes),
                      train=replace(cfg.train, grad_accum=grad_accum), paths=replace(cfg.paths, run_dir=plan.run_dir),
                      storage=replace(cfg.storage, checkpoint_dir=plan.checkpoint_dir))
    return changed, plan_run(changed)


def _checkpoint_target(cfg: RunConfig, run_dir: Path) -> tuple[str, dict[str, Any] | None]:
    """The checkpoint location as the ranks use it (an absolute folder, s3://bucket/prefix or gs://bucket/prefix),
    and for an object store how to reach it."""
    location, options = cfg.storage.checkpoint_dir, cfg.storage
    scheme = next((s for s in storage.OBJECT_SCHEMES if str(location or "").startswith(s)), None)
    given = [flag(name) for name, applies in STORAGE_OPTIONS.items()
             if getattr(options, name) is not None and applies != scheme]
    if given:
        raise StudyError(f"{', '.join(given)} do not apply to the checkpoints' location "
                         f"{location or 'the run folder'}: the --s3-* options and --object-client are for an s3:// "
                         "--checkpoint-dir, --gcs-endpoint for gs://; give such a --checkpoint-dir or drop them")
    if scheme is None:
        return str(Path(location).resolve() if location else run_dir.resolve() / rundir.CHECKPOINTS), None
    try:
        where = storage.check_remote_location(location, options.object_client)
        engines.refuse_unless_object_store(cfg.engine.engine, location)
    except storage.StorageError as error:
        raise StudyError(str(error)) from None
    return where.url, storage.settings_to_plan(storage.resolve_settings(where, options))


#: Storage options that apply to one kind of location only: option -> the scheme it is for.
STORAGE_OPTIONS = {"s3_endpoint": storage.S3_SCHEME, "s3_region": storage.S3_SCHEME,
                   "s3_path_style": storage.S3_SCHEME, "object_client": storage.S3_SCHEME,
                   "gcs_endpoint": storage.GS_SCHEME}


def _preset(cfg: RunConfig) -> ModelPreset:
    try:
        preset = get_preset(cfg.model.preset, cfg.model.seq_len)
    except UnknownPresetError as error:
        raise StudyError(str(error)) from None
    cfg.model.preset = preset.name
    return preset


def _default_nodes(world_size: int, device: str, nnodes: int, gpus_per_node: int) -> tuple[int, int]:
    """Ranks per node when not given: all on one node on CPU; on GPUs one rank per GPU."""
    if nnodes > 1:
        if world_size % nnodes:
            raise StudyError(f"{world_size} ranks do not divide over {nnodes} nodes; give --nproc-per-node")
        return nnodes, world_size // nnodes
    if device == "cuda" and world_size > gpus_per_node:
        return math.ceil(world_size / gpus_per_node), gpus_per_node
    return 1, world_size


def _check_gpus(world_size: int, nnodes: int, nproc: int, gpus_per_node: int, launcher: Launcher) -> None:
    """One rank per GPU: the layout must fit the nodes asked for, and the allocation we are in."""
    if nproc > gpus_per_node:
        raise StudyError(f"{nproc} ranks per node but {gpus_per_node} GPUs per node; "
                         f"use --nnodes {math.ceil(world_size / gpus_per_node)} or a smaller layout")
    allocated = allocation_gpus(launcher)
    if allocated is not None and world_size > allocated:
        raise StudyError(f"the layout needs {world_size} GPUs but this Slurm allocation has {allocated}; "
                         "ask for more nodes/GPUs or choose a smaller layout")


def _check_engine_name(name: str) -> None:
    try:
        engines.engine_info(name)
    except engines.UnknownEngineError as error:
        raise StudyError(str(error)) from None


def _check_engine(name: str) -> None:
    """Unknown engine, or a required package missing (optional engines are skipped later instead)."""
    _check_engine_name(name)
    missing = engines.missing_requirements(name)
    if missing and not engines.engine_info(name).skip_when_missing:
        raise StudyError("\n".join(missing))


def _check_memory(preset: ModelPreset, plan: RunPlan, need: float) -> None:
    have, what = memory_per_rank_available(plan)
    if need > have:
        raise StudyError(
            f"{preset.name} with {plan.layout_name} needs about {plan.memory_per_rank_estimate} per rank, "
            f"but {what} gives {have / GiB:.2f} GiB per rank. Use a smaller preset, more tp/pp, "
            "--activation-checkpoint-interval 1, or --no-memory-check if the estimate is wrong for your machine."
        )


def memory_per_rank_available(plan: RunPlan) -> tuple[float, str]:
    if plan.device == "cuda":
        query = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        if query is None or query.returncode != 0 or not query.stdout.strip():
            raise StudyError("device cuda was chosen but no GPU is visible here (nvidia-smi found none); "
                             "run on a GPU node, use --device cpu with a CPU preset, or add --dry-run to only render")
        return float(query.stdout.split()[0]) * 1024**2, "this node's GPU"
    available = _meminfo_available()
    return (available / plan.nproc_per_node,
            f"this machine's {available / GiB:.1f} GiB available memory over {plan.nproc_per_node} ranks")


def _meminfo_available() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    return float("inf")


def free_port() -> int:
    """A TCP port free on this machine now: the rendezvous of a run on one node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

"""An emulated run (``--emulate``): planned, rendered and launched as a study run, with ``restartbench.emulate`` as
the program every process runs. What is real and what is emulated: ``restartbench.emulate``'s docstring."""

from __future__ import annotations

from typing import Any

from restartbench import emulate, engines, rundir, study
from restartbench.config import RunConfig
from restartbench.config_fields import flag
from restartbench.errors import StudyError
from restartbench.launchers import LAUNCHERS
from restartbench.layout import LayoutError, validate_layout
from restartbench.plan import checkpoint_bytes, predict, scaled_preset
from restartbench.presets import UnknownPresetError, get_preset
from restartbench.progress import say
from restartbench.render import Rendered
from restartbench.render import render as render_run
from restartbench.run_plan import memory_per_rank_available

ENTRY = "restartbench.emulate"


def run_emulation(cfg: RunConfig) -> int:
    """Plan, write the run folder and run both phases (train: save; restore: a fresh launch that loads)."""
    plan = plan_emulation(cfg)
    rendered = render(cfg, plan)
    if cfg.launch.dry_run:
        print(f"# run folder (not created): {plan.run_dir}")
        print(f"# emulation: {plan.world_size} ranks in {plan.nproc_per_node * plan.nnodes} processes; "
              f"one checkpoint {plan.checkpoint_bytes_estimate / 2**30:.3f} GiB")
        print(rendered.launch_script, end="")
        if rendered.job_script:
            print(f"# --- {LAUNCHERS[plan.launcher].job_file} ---\n{rendered.job_script}", end="")
        return 0
    launcher = study.check_launcher(cfg, plan)
    run_dir = study.prepare_run_dir(cfg, plan, rendered)
    meta = study.run_metadata(cfg, plan) | {"engine": engines.listed_as(cfg.engine.engine, emulated=True),
                                            "emulation": emulation_metadata(cfg, plan)}
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"run folder {run_dir} (emulated checkpoint I/O, no training)")
    if launcher.job_template and not launcher.inside_allocation():  # a Slurm/PBS job runs the phases
        return study.hand_to_batch_system(cfg, launcher, run_dir, rendered, meta)
    return study.execute(run_dir)


def plan_emulation(cfg: RunConfig) -> rundir.RunPlan:
    """study.plan_run for gloo processes on CPU: K ranks per process, memory checked against the emulated shards."""
    options = cfg.emulation
    _check_not_emulated(cfg)
    _check_engine(cfg)
    cfg.launch.device = "cpu"  # whatever the preset: these are gloo processes on CPUs
    probe = RunConfig.from_dict(cfg.to_dict())
    probe.launch.memory_check, probe.layout.nproc_per_node, probe.layout.nnodes = False, None, 1
    if not probe.paths.run_dir:  # <logs>/<preset>/<layout>/<engine>-emulated/<time>: apart from real runs
        probe.paths.run_dir = str(rundir.new_run_folder(probe.paths.logs, probe.model.preset, _layout_name(probe),
                                                        engines.listed_as(cfg.engine.engine, emulated=True)))
    plan = study.plan_run(probe)
    if plan.remote:
        raise StudyError("--emulate writes its files to a local folder; give --checkpoint-dir a path, not an "
                         "s3:// or gs:// location")
    processes = _processes(plan.world_size, options.ranks_per_process, cfg.layout.nnodes)
    plan.nnodes, plan.nproc_per_node = cfg.layout.nnodes, processes // cfg.layout.nnodes
    if plan.nnodes > 1 and not cfg.launch.master_port:  # the probe planned one node, on a port free here only
        plan.master_port = 29500  # --master-port's documented default across nodes
    if not cfg.launch.dry_run and cfg.launch.memory_check:
        _check_memory(probe, plan)
    return plan


def _check_memory(probe: RunConfig, plan: rundir.RunPlan) -> None:
    """Each process holds its ranks' states and their copies: read back on restore, or the lazy engine's host
    buffers."""
    options = probe.emulation
    shards = predict(probe, scale=options.emulate_scale).per_rank_bytes()
    need = 2 * max(shards.values()) * options.ranks_per_process
    have, what = memory_per_rank_available(plan)
    if need > have:
        raise StudyError(f"emulating {options.ranks_per_process} rank(s) per process needs about "
                         f"{need / 2**30:.2f} GiB per process, but {what} gives {have / 2**30:.2f} GiB; "
                         "lower --emulate-scale or --ranks-per-process, or add --no-memory-check")


#: Options of a real run that an emulated one does not do: option -> why.
NOT_EMULATED = {
    "restore_layout": "an emulated restore loads on the run's own layout only (restartbench.emulate has no "
                      "resharding load)",
    "consolidated_digest": "an emulated run trains no model, so it has no weights and moments to digest",
}


def _check_not_emulated(cfg: RunConfig) -> None:
    """Refuse the options an emulated run would otherwise ignore, naming each and why."""
    given = [f"{flag(name)} ({why})" for name, why in NOT_EMULATED.items()
             if getattr(cfg.launch, name) not in (None, False)]
    if given:
        raise StudyError(f"--emulate does not do {'; '.join(given)}: leave {'them' if len(given) > 1 else 'it'} "
                         "out, or run without --emulate to measure it for real")


def _check_engine(cfg: RunConfig) -> None:
    """The run's engine has an emulator (its registry entry names it), with options it can emulate."""
    engine = cfg.engine.engine
    try:
        emulator = engines.emulator_class(engine)
    except (engines.UnknownEngineError, engines.NotEmulatedError) as error:
        raise StudyError(f"{error}; --emulate runs the checkpoint I/O of --engine "
                         f"{', '.join(engines.emulated_engines())}: choose one of those, or run {engine} for real "
                         "without --emulate") from None
    refusal = emulator.refusal(cfg)
    if refusal:
        raise StudyError(refusal)


def _layout_name(cfg: RunConfig) -> str:
    try:
        return validate_layout(cfg.layout.layout, get_preset(cfg.model.preset)).name
    except (LayoutError, UnknownPresetError) as error:
        raise StudyError(str(error)) from None


def _processes(world_size: int, per_process: int, nnodes: int) -> int:
    if world_size % per_process or (world_size // per_process) % nnodes:
        raise StudyError(f"{world_size} ranks do not split into processes of --ranks-per-process {per_process} "
                         f"over {nnodes} node(s); choose K dividing {world_size} with world size / K a multiple of "
                         "--nnodes")
    return world_size // per_process


def render(cfg: RunConfig, plan: rundir.RunPlan) -> Rendered:
    """The study's scripts, with restartbench.emulate as the program of every process."""
    return render_run(cfg, plan, label=engines.listed_as(cfg.engine.engine, emulated=True), entry=ENTRY)


def emulation_metadata(cfg: RunConfig, plan: rundir.RunPlan) -> dict[str, Any]:
    options = cfg.emulation
    full = RunConfig.from_dict(cfg.to_dict())
    full.emulation.emulate = False
    preset = scaled_preset(get_preset(cfg.model.preset), options.emulate_scale, plan.layout["tp"])
    return {"emulated": True, "what": emulate.WHAT_IS_EMULATED, "engine": cfg.engine.engine,
            "engine_io": engines.emulator_class(cfg.engine.engine).how, "scale": options.emulate_scale,
            "ranks_per_process": options.ranks_per_process, "processes": plan.nnodes * plan.nproc_per_node,
            "emulated_model": {k: getattr(preset, k) for k in ("hidden", "ffn_hidden", "vocab_size", "layers",
                                                                "heads", "kv_heads")},
            "checkpoint_bytes": plan.checkpoint_bytes_estimate,
            "full_scale_checkpoint_bytes": checkpoint_bytes(full)}

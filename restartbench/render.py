"""Render a run's files from the Jinja templates: the DeepSpeed JSON, the launch script and the batch job script.

Templates are strict (an undefined variable is an error) and the DeepSpeed JSON is parsed back before use. The
rank program is a parameter: ``restartbench.train`` for a real run, ``restartbench.emulate`` for an emulated one.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from restartbench import engines
from restartbench.config import RunConfig
from restartbench.errors import StudyError
from restartbench.launchers import LAUNCHERS
from restartbench.rundir import RunPlan

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = REPO_ROOT / "templates"
TRAIN_ENTRY = "restartbench.train"
"""The module every rank of a real run executes (``python -m``)."""


@dataclass
class Rendered:
    ds_config: dict[str, Any]
    ds_config_text: str
    launch_script: str
    job_script: str | None
    """The batch job script (sbatch or PBS) where the launcher has one."""


def template_environment() -> jinja2.Environment:
    """The templates folder, with undefined variables refused and a ``q`` filter that shell-quotes a value."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def render_ds_config(cfg: RunConfig, grad_accum: int, dp: int,
                     extra_sections: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON of a run, parsed (also what the checkpoint plan puts in its files); ``extra_sections``:
    what a restart on another layout adds (an engine's converter's), merged into the engine's sections key by key."""
    sections = engines.ds_config_sections(cfg.engine)
    for name, values in (extra_sections or {}).items():
        sections[name] = {**sections.get(name, {}), **values}
    ds_text = template_environment().get_template("ds_config.json.j2").render(
        micro_batch=cfg.train.micro_batch, grad_accum=grad_accum, dp=dp, dtype=cfg.model.dtype,
        lr=cfg.train.lr, engine_sections=sections,
    )
    try:
        return json.loads(ds_text)
    except json.JSONDecodeError as error:
        raise StudyError(f"templates/ds_config.json.j2 rendered invalid JSON: {error}") from None


def render(cfg: RunConfig, plan: RunPlan, label: str | None = None, entry: str = TRAIN_ENTRY,
           extra_sections: dict[str, dict[str, Any]] | None = None, launch_dir: str | Path | None = None) -> Rendered:
    """The DeepSpeed JSON, launch script and job script of a run. ``label``: what the scripts call its engine (the
    job name, the header), default the engine itself; ``entry``: the module every rank runs; ``extra_sections``: see
    ``render_ds_config``; ``launch_dir``: the folder launch.sh goes to (default the run folder; ``layouts/<layout>/``
    for a restart on another layout). Neither script names the run folder by path: launch.sh finds it from its own
    place, the job script from where it was submitted, so that the run folder can be moved."""
    env = template_environment()
    label = label or cfg.engine.engine
    ds_config = render_ds_config(cfg, plan.grad_accum, plan.layout["dp"], extra_sections)
    launch = env.get_template("launch.sh.j2").render(
        preset=cfg.model.preset, layout=plan.layout_name, engine=label, world_size=plan.world_size,
        nnodes=plan.nnodes, nproc_per_node=plan.nproc_per_node, device=plan.device, backend=plan.backend,
        accelerator="cuda" if plan.device == "cuda" else "cpu", env=engines.launch_env(cfg.engine.engine, plan.device),
        python=sys.executable, master_port=plan.master_port, entry=entry,
        run_dir_from_script=os.path.relpath(plan.run_dir, launch_dir or plan.run_dir),
    )
    launcher = LAUNCHERS[plan.launcher]
    job = env.get_template(launcher.job_template).render(
        preset=cfg.model.preset, layout=plan.layout_name, engine=label, nnodes=plan.nnodes,
        cpus_per_task=max(plan.nproc_per_node, 1), gpus_per_node=plan.nproc_per_node if plan.device == "cuda" else 0,
        account=cfg.launch.account, partition=cfg.launch.partition, walltime=cfg.launch.walltime,
        setup=[line.strip() for line in (cfg.launch.setup or "").split(";") if line.strip()],
        python=sys.executable, job_file=launcher.job_file, repo_root=str(REPO_ROOT),
    ) if launcher.job_template else None
    return Rendered(ds_config, json.dumps(ds_config, indent=2) + "\n", launch, job)

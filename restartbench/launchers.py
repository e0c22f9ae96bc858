"""How a phase is launched: directly on this machine, or on every node of a Slurm or PBS allocation.

Each phase is one command; the launch script (``launch.sh PHASE``) runs ``torchrun`` on one
node, with ``NODE_RANK`` and ``MASTER_ADDR`` telling it where it stands. A batch launcher
also renders the job script that, inside the allocation, runs ``python -m restartbench.execute``,
which launches the phases one after the other (the restart is a genuinely separate launch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Launcher:
    name: str
    job_template: str | None = None
    """Jinja template of the batch job script (None: no batch system)."""
    job_file: str | None = None
    submit_command: str | None = None
    allocation_variable: str | None = None
    """Environment variable that is set inside one of this system's allocations."""

    def inside_allocation(self) -> bool:
        return self.allocation_variable is not None and self.allocation_variable in os.environ

    def phase_command(self, run_dir: Path, phase: str, nnodes: int) -> list[str]:
        """The command that runs ``launch.sh PHASE`` once on every node of the run."""
        script = str(Path(run_dir) / "launch.sh")
        if self.name == "slurm":
            return ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                    f"--cpus-per-task={os.environ.get('SLURM_CPUS_PER_TASK', '1')}",
                    "bash", "-c", 'NODE_RANK="$SLURM_NODEID" exec bash "$0" "$1"', script, phase]
        if self.name == "pbs":
            return ["pbsdsh", "-u", "--", "bash", "-c", 'NODE_RANK="$PBS_VNODENUM" exec bash "$0" "$1"', script, phase]
        return ["bash", script, phase]


LAUNCHERS = {
    "local": Launcher("local"),
    "slurm": Launcher("slurm", "sbatch.sh.j2", "job.sbatch", "sbatch", "SLURM_JOB_ID"),
    "pbs": Launcher("pbs", "pbs.sh.j2", "job.pbs", "qsub", "PBS_NODEFILE"),
}


def resolve_launcher(choice: str) -> Launcher:
    """``auto``: the batch system whose allocation we are inside, else local."""
    if choice != "auto":
        return LAUNCHERS[choice]
    return next((l for l in LAUNCHERS.values() if l.inside_allocation()), LAUNCHERS["local"])


def allocation_gpus(launcher: Launcher) -> int | None:
    """GPUs of the Slurm allocation we are inside (nodes × GPUs per node), where Slurm says."""
    if launcher.name != "slurm" or not launcher.inside_allocation():
        return None
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    per_node = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return nodes * int(per_node) if per_node.isdigit() else None

"""How a phase is launched: directly on this machine, or on every node of a Slurm or PBS allocation.

Each phase is one command; the launch script (``launch.sh PHASE``) runs ``torchrun`` on one
node, with ``NODE_RANK`` and ``MASTER_ADDR`` telling it where it stands. A batch launcher
also renders the job script that, inside the allocation, runs ``python -m restartbench.execute``,
which launches the phases one after the other (the restart is a genuinely separate launch).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

LAUNCHER_PID_VARIABLE = "RB_LAUNCHER_PID"
"""Set by launch.sh to its own pid, which ``exec`` hands to torchrun: the parent every rank must have."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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

    def missing_submit_command(self, submit: bool) -> str | None:
        """Why ``--submit`` cannot work here (the batch system's submit command is not on PATH), or None."""
        if not (self.job_template and submit) or shutil.which(self.submit_command) is not None:
            return None
        return (f"--launcher {self.name} --submit needs {self.submit_command!r}, which is not on PATH here; run on a "
                "login node of the cluster, or leave out --submit to only write the job script")

    def phase_command(self, launch_dir: Path, phase: str, nnodes: int, rank_args: tuple[str, ...] = ()) -> list[str]:
        """The command that runs ``launch.sh PHASE [RANK_ARGS]`` (in ``launch_dir``: the run folder, or a restart
        layout's folder in it) once on every node of the run."""
        script = str(Path(launch_dir) / "launch.sh")
        if self.name == "slurm":
            return ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                    f"--cpus-per-task={os.environ.get('SLURM_CPUS_PER_TASK', '1')}",
                    "bash", "-c", 'NODE_RANK="$SLURM_NODEID" exec bash "$0" "$@"', script, phase, *rank_args]
        if self.name == "pbs":
            return ["pbsdsh", "-u", "--", "bash", "-c", 'NODE_RANK="$PBS_VNODENUM" exec bash "$0" "$@"', script,
                    phase, *rank_args]
        return ["bash", script, phase, *rank_args]


LAUNCHERS = {
    "local": Launcher("local"),
    "slurm": Launcher("slurm", "sbatch.sh.j2", "job.sbatch", "sbatch", "SLURM_JOB_ID"),
    "pbs": Launcher("pbs", "pbs.sh.j2", "job.pbs", "qsub", "PBS_NODEFILE"),
}


def resolve_launcher(choice: str) -> Launcher:
    """``auto``: the batch system whose allocation we are inside, else local."""
    if choice != "auto":
        return LAUNCHERS[choice]
    return next((launcher for launcher in LAUNCHERS.values() if launcher.inside_allocation()), LAUNCHERS["local"])


def allocation_gpus(launcher: Launcher) -> int | None:
    """GPUs of the Slurm allocation we are inside (nodes × GPUs per node), where Slurm says."""
    if launcher.name != "slurm" or not launcher.inside_allocation():
        return None
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    per_node = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return nodes * int(per_node) if per_node.isdigit() else None


def set_parent_death_signal(signal_number: int) -> bool:
    """Ask the kernel to send ``signal_number`` to this process when the thread that started it exits (Linux's
    ``PR_SET_PDEATHSIG``; it survives ``exec``). Returns False off Linux, where nothing is done."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal_number), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}")
    return True


def die_with_launcher(signal_number: int = signal.SIGKILL) -> bool:
    """Have the kernel kill this rank the moment its launcher (torchrun) dies, however it dies.

    torchrun starts every rank in a session of its own (``start_new_session``), so a killed launcher's
    process group no longer includes the ranks: without this they sit in their next collective until
    its timeout. ``PR_SET_PDEATHSIG`` fires when the thread that forked us exits; torchrun forks the
    ranks from its main thread (elastic agent, ``SubprocessContext._start``), so that is when torchrun
    exits. SIGKILL, because a rank blocked inside a gloo/NCCL call never runs a Python signal handler.
    If the launcher died before the call (our parent is no longer the pid launch.sh exported), we die
    now. Returns False where there is no such mechanism (not Linux): nothing is done there.
    """
    if not set_parent_death_signal(signal_number):
        return False
    launcher = os.environ.get(LAUNCHER_PID_VARIABLE, "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(os.getpid(), signal_number)
    return True


def end_process(code: int) -> NoReturn:
    """Exit with ``code``, without the interpreter's teardown where nothing is left that it would wait for.

    Python's finalization of the modules a rank has imported (torch, DeepSpeed, and the inductor DeepSpeed imports)
    takes about 2 s of CPU per process, measured on the 2-core machine: 4-5 s of wall at the end of every 4-rank
    phase, after the rank's (or emulating process's) records are closed, that measure nothing. A process whose
    engine left a child process or a non-daemon thread alive (normal exit would join them) exits normally."""
    if multiprocessing.active_children() or any(
            thread.is_alive() and not thread.daemon for thread in threading.enumerate()
            if thread is not threading.main_thread()):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def placement() -> dict[str, Any]:
    """Where the launcher put this process, for its ``process.start`` event.

    ``node`` is the batch system's name for the node (Slurm's ``SLURMD_NODENAME``), else the host name:
    several Slurm nodes can share one host (one slurmd each), and then only the node name tells them
    apart. ``node_rank`` is torchrun's ``GROUP_RANK``.
    """
    host = os.uname().nodename
    return {"host": host, "node": os.environ.get("SLURMD_NODENAME") or host,
            "node_rank": int(os.environ.get("GROUP_RANK", "0")), "pid": os.getpid(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}


def cpu_share() -> int:
    """CPUs for this rank's own threads: those it may run on, shared with the other ranks torchrun started on its node
    (``LOCAL_WORLD_SIZE``; 1 outside torchrun), at least one: 8 ranks on a 112-core node get 14 each, not 112."""
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, len(os.sched_getaffinity(0)) // (int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1))


def choose_device(requested: str, param_count: float) -> str:
    """The ranks' device: ``requested`` unless it is auto; auto means cuda where a GPU is visible, and without one
    cpu for the CPU shapes (under 10^9 parameters) and cuda (render only) for the big ones."""
    if requested != "auto":
        return requested
    if gpu_count() > 0:
        return "cuda"
    return "cpu" if param_count < 1e9 else "cuda"


def gpu_count() -> int:
    """GPUs that nvidia-smi lists on this machine (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listing.stdout.count("GPU ") if listing.returncode == 0 else 0

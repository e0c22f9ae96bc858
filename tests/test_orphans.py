"""A killed launcher takes its ranks with it.

torchrun starts every rank in a session of its own, so killing the launcher's process group (what a sweep's
Ctrl-C, a timeout or a cancelled job does) used to leave the ranks running, stuck in their next collective
until its timeout. Each rank now asks the kernel to kill it when its parent (torchrun) dies
(``restartbench.launchers.die_with_launcher``).
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def processes_running(logs: Path, module: str) -> list[psutil.Process]:
    """The live processes running ``python -m MODULE ...`` for a run folder under ``logs`` (ranks, or torchrun).
    torchrun's command line names the ranks' module too, after its own ``-m restartbench.torchrun``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        runs = "-m" in cmdline and cmdline[cmdline.index("-m") + 1:][:1] == [module]
        if runs and str(logs) in " ".join(cmdline) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def survivors(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those still running (not exited, not a zombie waiting for its reaper) after up to ``timeout_s``."""
    deadline = time.time() + timeout_s
    alive = processes
    while alive and time.time() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return alive


def wait_for_training(run_dir_parent: Path, ranks: int, timeout_s: float = 300) -> None:
    """Until every rank of the (only) run under ``run_dir_parent`` has finished a training iteration."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        logs = list(run_dir_parent.glob("*/*/*/*/events/train-rank*.jsonl"))
        if len(logs) == ranks and all('"train.iteration"' in path.read_text() for path in logs):
            return
        time.sleep(0.5)
    raise AssertionError(f"the ranks did not start training within {timeout_s} s")


@pytest.mark.multirank
def test_ranks_die_when_torchrun_is_killed_mid_training(tmp_path):
    """SIGKILL to torchrun alone (no clean-up possible): the launcher above it lives on and keeps reading the ranks'
    output, so nothing but the ranks' parent-death signal stops them training on."""
    logs = tmp_path / "logs"
    launcher = subprocess.Popen([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp1pp1dp2", "--dtype", "fp32",
                                 "--iters", "100000", "--save-interval", "100000", "--baseline-mib", "0",
                                 "--logs", str(logs)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_training(logs, ranks=2)
        ranks = processes_running(logs, "restartbench.train")
        [torchrun] = processes_running(logs, "restartbench.torchrun")
        assert len(ranks) == 2 and all(rank.ppid() == torchrun.pid for rank in ranks)
        torchrun.kill()
        left = survivors(ranks, timeout_s=5)
        assert not left, f"ranks outlived their killed torchrun: {[p.pid for p in left]}"
    finally:  # whatever happened, leave nothing running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        for process in processes_running(logs, "restartbench.train") + processes_running(logs, "restartbench.torchrun"):
            process.kill()


def test_a_process_whose_launcher_is_already_gone_dies_at_once():
    """The launcher dying before the rank's prctl call is caught too: the parent is not the pid launch.sh
    exported (here the parent is a shell that exported another pid)."""
    code = "from restartbench.launchers import die_with_launcher; die_with_launcher(); print('survived')"
    child = subprocess.run(["bash", "-c", f'RB_LAUNCHER_PID=1 {sys.executable} -c "{code}"; echo "status $?"'],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "survived" not in child.stdout and f"status {128 + signal.SIGKILL}" in child.stdout


def test_die_with_launcher_sets_the_parent_death_signal():
    code = ("import ctypes, signal; from restartbench.launchers import die_with_launcher; "
            "assert die_with_launcher(signal.SIGTERM); value = ctypes.c_int(); "
            "ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0); print(value.value)")  # 2: PR_GET_PDEATHSIG
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "RB_LAUNCHER_PID"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(int(signal.SIGTERM))


def test_a_phase_gets_sigterm_when_the_study_process_dies(tmp_path):
    """The phase command (launch.sh, exec'ing torchrun or srun) carries SIGTERM as its parent-death signal, so a
    study process killed alone still stops its phase (torchrun stops its ranks on SIGTERM, srun its step). Killing
    it mid-run usually breaks the phase's output pipe too, which is why this is checked on the signal itself."""
    from restartbench.study import run_phase

    code = ("import ctypes; value = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0); "
            "print(value.value)")  # 2: PR_GET_PDEATHSIG
    result = run_phase(tmp_path, "probe", [sys.executable, "-c", code], timeout_s=60)
    assert result["exit_code"] == 0
    assert (tmp_path / "probe.stdout.log").read_text().strip() == str(int(signal.SIGTERM))

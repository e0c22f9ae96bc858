"""Runs on a real Slurm (two nodes on this one host, brought up by the test), and PBS scripts checked by parsing."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, free_port

from restartbench import emulated_study
from restartbench.config import config_from_args
from restartbench.study import StudyError, plan_run, render
from restartbench.study import run_study as run_study_in_process

SLURM_LOCAL = ROOT / "scripts" / "slurm-local.sh"
NODES = ("node1", "node2")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A two-node Slurm cluster for this module (one slurmd per node, both on 127.0.0.1); skipped with the reason
    when it cannot be brought up."""
    install = subprocess.run(["bash", str(SLURM_LOCAL), "install"], capture_output=True, text=True)
    if install.returncode != 0:
        pytest.skip(f"Slurm cannot be installed here: {install.stderr.strip()[-300:]}")
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_LOCAL_PORT": "16817"}
    up = subprocess.run(["bash", str(SLURM_LOCAL), "up", str(state), "8", str(len(NODES))], capture_output=True,
                        text=True, env=env)
    if up.returncode != 0:
        subprocess.run(["bash", str(SLURM_LOCAL), "down", str(state)])
        pytest.skip(f"Slurm did not come up: {up.stderr.strip()[-300:]}")
    yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    subprocess.run(["bash", str(SLURM_LOCAL), "down", str(state)])


def submit(env, logs, *argv):
    """submit-job.sh ... --launcher slurm --submit: the run folder and the job id it printed."""
    proc = subprocess.run([str(ROOT / "submit-job.sh"), *argv, "--launcher", "slurm", "--submit", "--logs", str(logs)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), proc.stdout
    return next(logs.glob("*/*/*/*")), job_id


def wait_for_status(run_dir, env, job_id, timeout_s=400):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = json.loads((run_dir / "metadata.json").read_text())["status"]
        if status in ("complete", "failed"):
            return status
        time.sleep(2)
    subprocess.run(["scancel", "--full", job_id], env=env)
    raise AssertionError(f"job did not finish in {timeout_s} s; squeue: "
                         + subprocess.run(["squeue"], capture_output=True, text=True, env=env).stdout)


@pytest.mark.multirank
def test_submit_through_real_slurm_runs_both_phases(slurm, tmp_path):
    run_dir, job_id = submit(slurm, tmp_path / "logs", "tiny", "pp2dp2", "--dtype", "fp32", "--iters", "2")
    assert (run_dir / "job.sbatch").is_file()
    assert wait_for_status(run_dir, slurm, job_id) == "complete", (run_dir / f"slurm-{job_id}.out").read_text()[-3000:]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["job_id"] == job_id and set(meta["phases"]) == {"train", "restore"}
    assert "restore exact" in (run_dir / f"slurm-{job_id}.out").read_text()


@pytest.mark.multirank
def test_emulated_checkpoint_io_spans_two_slurm_nodes(slurm, tmp_path):
    """--emulate across nodes: one torchrun per Slurm node (srun), a rendezvous at the first node's NodeAddr,
    each process recording the node it ran on; the analysis reads the run folder."""
    logs = tmp_path / "logs"
    run_dir, job_id = submit(slurm, logs, "7B", "tp2pp2", "--emulate", "--emulate-scale", "0.02",
                             "--ranks-per-process", "2", "--nnodes", "2", "--master-port", str(free_port()),
                             "--iters", "1", "--save-interval", "1", "--baseline-mib", "0")
    assert run_dir.parent.name == "torch-emulated"
    assert wait_for_status(run_dir, slurm, job_id) == "complete", (run_dir / f"slurm-{job_id}.out").read_text()[-3000:]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["job_id"] == job_id and meta["emulation"]["processes"] == 2
    events = [json.loads(line) for path in (run_dir / "events").glob("*.jsonl")
              for line in path.read_text().splitlines()]
    for phase in ("train", "restore"):
        starts = {e["rank"]: (e["node"], e["node_rank"]) for e in events
                  if e["event"] == "process.start" and e["phase"] == phase}
        assert starts == {0: ("node1", 0), 1: ("node1", 0), 2: ("node2", 1), 3: ("node2", 1)}, (phase, starts)
    assert sorted(e["rank"] for e in events if e["event"] == "restore.result" and e["exact"]) == [0, 1, 2, 3]

    summary = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(logs), "--no-plots",
                              "--out", str(tmp_path / "summary")], capture_output=True, text=True, timeout=600)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "1 complete run(s)" in summary.stdout and "torch-emulated" in summary.stdout


def test_multinode_emulation_sbatch(tmp_path):
    cfg = config_from_args(["70B", "tp8pp8", "--emulate", "--emulate-scale", "0.016", "--ranks-per-process", "16",
                            "--launcher", "slurm", "--nnodes", "2", "--dry-run", "--logs", str(tmp_path)])
    plan = emulated_study.plan_emulation(cfg)
    rendered = emulated_study.render(cfg, plan)
    directives = dict(line[len("#SBATCH --"):].split("=", 1)
                      for line in rendered.job_script.splitlines() if line.startswith("#SBATCH"))
    assert directives["nodes"] == "2" and directives["ntasks-per-node"] == "1" and directives["cpus-per-task"] == "2"
    assert directives["job-name"] == "rb-70B-tp8pp8dp1-torch-emulated"
    assert "gpus-per-node" not in directives and "restartbench.execute" in rendered.job_script
    assert "--nnodes 2 --nproc-per-node 2" in rendered.launch_script
    assert '--master-port "${RB_MASTER_PORT:-29500}"' in rendered.launch_script
    assert "-m restartbench.emulate " in rendered.launch_script
    for script in (rendered.job_script, rendered.launch_script):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_without_submit_the_job_script_is_written_for_inspection(tmp_path):
    cfg = config_from_args(["tiny", "tp2pp2", "--launcher", "slurm", "--logs", str(tmp_path)])
    assert run_study_in_process(cfg) == 0
    run_dir = next(tmp_path.glob("*/*/*/*"))
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "prepared"
    assert subprocess.run(["bash", "-n", str(run_dir / "job.sbatch")]).returncode == 0


def test_70b_multinode_sbatch(tmp_path):
    cfg = config_from_args(["70B", "tp8pp8", "--launcher", "slurm", "--nnodes", "8", "--gpus-per-node", "8",
                            "--account", "proj", "--partition", "gpu", "--dry-run", "--logs", str(tmp_path)])
    plan = plan_run(cfg)
    job = render(cfg, plan).job_script
    directives = dict(line[len("#SBATCH --"):].split("=", 1) for line in job.splitlines() if line.startswith("#SBATCH"))
    assert directives["nodes"] == "8" and directives["gpus-per-node"] == "8" and directives["ntasks-per-node"] == "1"
    assert directives["account"] == "proj" and directives["partition"] == "gpu"
    assert "scontrol show hostnames" in job and "NodeAddr=" in job and "restartbench.execute" in job
    assert subprocess.run(["bash", "-n"], input=job, text=True).returncode == 0


def test_pbs_script_parses(tmp_path):
    cfg = config_from_args(["13B", "tp2pp4dp2", "--launcher", "pbs", "--device", "cuda", "--gpus-per-node", "4",
                            "--walltime", "02:30:00", "--partition", "workq", "--setup", "module load cuda",
                            "--dry-run", "--logs", str(tmp_path)])
    plan = plan_run(cfg)
    job = render(cfg, plan).job_script
    pbs = [line.split(None, 1)[1] for line in job.splitlines() if line.startswith("#PBS")]
    assert "-l select=4:ncpus=4:ngpus=4:mpiprocs=1" in pbs and "-l walltime=02:30:00" in pbs and "-q workq" in pbs
    assert "module load cuda" in job and "PBS_NODEFILE" in job
    assert subprocess.run(["bash", "-n"], input=job, text=True).returncode == 0


def test_submit_without_sbatch_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    cfg = config_from_args(["tiny", "tp2pp2", "--launcher", "slurm", "--submit", "--logs", str(tmp_path / "logs")])
    with pytest.raises(StudyError, match="needs 'sbatch', which is not on PATH"):
        run_study_in_process(cfg)
    assert not (tmp_path / "logs").exists()


def test_layout_larger_than_the_allocation_is_refused(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    cfg = config_from_args(["13B", "tp2pp8", "--device", "cuda", "--dry-run"])
    with pytest.raises(StudyError, match="needs 16 GPUs but this Slurm allocation has 8"):
        plan_run(cfg)


def test_layout_needing_more_gpus_than_nodes_have_is_refused():
    cfg = config_from_args(["70B", "tp8pp8", "--nnodes", "4", "--gpus-per-node", "8", "--dry-run"])
    with pytest.raises(StudyError, match="16 ranks per node but 8 GPUs per node; use --nnodes 8"):
        plan_run(cfg)

"""A run folder tells one truth: every value is in range before anything is written, run folders are created
atomically and uniquely however many launches start at once, and a launch never removes a folder it did not make."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from restartbench import rundir
from restartbench.config import RunConfig
from restartbench.study import checkpoints_saved


@pytest.mark.parametrize("option, value, message", [
    ("--activation-checkpoint-interval", "-5", "--activation-checkpoint-interval must be at least 0 (got -5)"),
    ("--lr", "nan", "--lr must be a finite number at least 0 (got nan)"),
    ("--lr", "inf", "--lr must be a finite number at least 0 (got inf)"),
    ("--lr", "-0.1", "--lr must be at least 0 (got -0.1)"),
    ("--master-port", "70000", "--master-port must be between 0 and 65535 (got 70000)"),
    ("--phase-timeout-s", "-1", "--phase-timeout-s must be at least 1 (got -1)"),
    ("--collective-timeout-s", "0", "--collective-timeout-s must be at least 1 (got 0)"),
    ("--lazy-chunk-mb", "0", "--lazy-chunk-mb must be at least 1 (got 0)"),
    ("--lazy-io-threads", "-2", "--lazy-io-threads must be at least 1 (got -2)"),
    ("--walltime", "2h", "--walltime must be HH:MM:SS, such as 02:30:00 (hours may pass 24) (got '2h')"),
    ("--logs", "", "--logs must be a folder, not empty (got '')"),
    ("--iters", "0", "--iters must be at least 1 (got 0)"),
    ("--seq-len", "0", "--seq-len must be at least 1 (got 0)"),
    ("--baseline-mib", "-1", "--baseline-mib must be at least 0 (got -1)"),
    ("--emulate-scale", "1.5", "--emulate-scale must be above 0 and at most 1 (got 1.5)"),
])
def test_an_option_out_of_range_is_refused_by_name_before_anything_is_written(tmp_path, option, value, message):
    argv = ["tiny", "tp2pp2", "--logs", str(tmp_path / "logs"), option, value]
    proc = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_a_sweep_or_config_json_value_out_of_range_is_refused_too():
    with pytest.raises(ValueError, match=r"--lazy-chunk-mb must be at least 1 \(got 0\)"):
        RunConfig.from_dict({"engine": {"lazy_chunk_mb": 0}})
    assert RunConfig.from_dict({"launch": {"walltime": "100:00:00", "master_port": 0}}).launch.walltime == "100:00:00"


def test_checkpoints_saved_is_computed_not_counted():
    assert [checkpoints_saved(iters, 2) for iters in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert checkpoints_saved(10**12, 10**12) == 1 and checkpoints_saved(10**12, 1) == 10**12


def test_a_huge_iteration_count_is_planned_at_once(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--iters", str(10**12),
                           "--save-interval", str(10**12), "--launcher", "pbs", "--logs", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_run_folder_names_are_unique_and_as_long_as_the_placeholder(tmp_path):
    """1000 names made within a second or two differ by their random suffix (6 hex digits: two names collide with a
    chance of 1 in 16.7 million, so 1000 names hold a colliding pair about 3 % of the time, and 5 such pairs almost
    never). A collision is refused, not shared: ``create_run_folder`` below."""
    names = [rundir.new_run_folder(tmp_path, "tiny", "tp2pp2dp1", "torch").name for _ in range(1000)]
    assert len(set(names)) >= 995
    assert {len(name) for name in names} == {len(rundir.PLACEHOLDER_STAMP)}


def test_creating_a_run_folder_that_exists_fails_and_leaves_it_alone(tmp_path):
    folder = tmp_path / "logs" / "tiny" / "tp2pp2dp1" / "torch" / "stamp"
    rundir.create_run_folder(folder)
    (folder / "config.json").write_text("{}")
    with pytest.raises(FileExistsError):
        rundir.create_run_folder(folder)
    assert (folder / "config.json").read_text() == "{}"


def test_many_launches_into_one_logs_folder_at_once_all_succeed(tmp_path):
    """Launches starting in the same second, three bursts: every one prepares its own intact run folder."""
    logs = tmp_path / "logs"
    command = [sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--launcher", "pbs", "--logs",
               str(logs)]
    for _ in range(3):
        launches = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for _ in range(6)]
        outcomes = [(launch.wait(timeout=300), launch.stderr.read()) for launch in launches]
        assert [code for code, _ in outcomes] == [0] * 6, outcomes
    folders = sorted(logs.glob("tiny/tp2pp2dp1/torch/*"))
    assert len(folders) == 18
    for folder in folders:
        assert json.loads((folder / "metadata.json").read_text())["status"] == "prepared"
        assert json.loads((folder / "config.json").read_text())["paths"]["run_dir"] == "."  # inside: relative
        assert RunConfig.load(folder / "config.json").paths.run_dir == str(folder.resolve())  # loaded: where it is
        assert json.loads((folder / "plan.json").read_text())["run_dir"] == "."
        assert rundir.RunPlan.load(folder).run_dir == str(folder)


@pytest.mark.parametrize("argv, message", [
    (["-m", "restartbench.plan", "tiny", "tp2pp2", "--step", "0"], "--step must be at least 1 (got 0)"),
    (["-m", "restartbench.plan", "tiny", "tp2pp2", "--lr", "nan"], "--lr must be a finite number at least 0"),
    (["-m", "restartbench.execute", "/nonexistent/run"], "error: /nonexistent/run is not a prepared run folder"),
    ([str(ROOT / "analysis" / "summarize.py"), "{tmp}", "--out", "{tmp}/a-file"], "the results cannot go to"),
    (["-m", "restartbench.sweep", "{tmp}/sweep.yaml"], "'logs' must be a folder name, got 5"),
])
def test_a_user_mistake_is_said_in_one_line_never_a_traceback(tmp_path, argv, message):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "sweep.yaml").write_text("presets: [tiny]\nlayouts: [tp2pp2]\nengines: [torch]\nlogs: 5\n")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_several_nodes_with_the_local_launcher_are_refused_not_waited_for(tmp_path):
    command = [sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--nnodes", "2", "--launcher", "local",
               "--logs", str(tmp_path / "logs")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "--nnodes 2 with the local launcher would start this machine's ranks only" in refused.stdout
    assert not (tmp_path / "logs").exists()
    printed = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and "--nnodes 2 --nproc-per-node 2" in printed.stdout


def test_a_checkpoint_dir_with_another_runs_checkpoints_is_refused_unless_reused(tmp_path):
    other = tmp_path / "shared-ckpt"
    (other / "step2").mkdir(parents=True)
    (other / "step2" / "manifest.json").write_text(json.dumps({"tag": "step2", "files": []}))
    (other / "latest").write_text("step2")
    command = [sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--launcher", "pbs", "--logs",
               str(tmp_path / "logs"), "--checkpoint-dir", str(other)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert f"--checkpoint-dir {other} already holds committed checkpoints (step2) of another run" in refused.stdout
    assert not (tmp_path / "logs").exists()
    reused = subprocess.run([*command, "--reuse-checkpoint-dir"], capture_output=True, text=True, timeout=120)
    assert reused.returncode == 0, reused.stdout + reused.stderr

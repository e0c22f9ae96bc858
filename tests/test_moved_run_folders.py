"""A run folder can be moved or copied: plan.json, config.json and the scripts name its paths relative to it, and
checkpoints outside it as such; run folders written before (absolute paths) still read, and one that has moved is
refused a launch. The bad inputs of a relaunch or an execute end in one line naming the file, never a traceback.
The real relaunch of a copied run folder is tests/test_restore_attempts.py's."""

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from restartbench import cli, relaunch, rundir
from restartbench.config import RunConfig, config_from_args
from restartbench.errors import StudyError
from restartbench.execute import main as execute_main
from restartbench.render import render
from restartbench.rundir import RunFolderError, RunPlan
from restartbench.study import plan_run


@pytest.fixture
def plan(tmp_path) -> RunPlan:
    return plan_run(config_from_args(["tiny", "tp2pp2", "--logs", str(tmp_path / "logs"), "--dry-run"]))


def stored_plan(folder: Path) -> dict:
    return json.loads((folder / rundir.PLAN).read_text())


def test_plan_json_names_the_run_folder_and_its_checkpoints_relative_to_it(plan, tmp_path):
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    plan.save(run_dir)
    stored = stored_plan(run_dir)
    assert (stored["run_dir"], stored["checkpoint_dir"], stored["checkpoint_external"]) == (".", "checkpoints", False)
    moved = tmp_path / "archive" / "run"
    moved.parent.mkdir()
    os.rename(run_dir, moved)
    loaded = RunPlan.load(moved)
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(moved), str(moved / "checkpoints"))
    assert loaded == replace(plan, run_dir=str(moved), checkpoint_dir=str(moved / "checkpoints"))
    assert rundir.moved_from(moved) is None


def test_a_restart_layouts_plan_names_the_run_folder_two_up(plan, tmp_path):
    folder = rundir.launch_folder(plan.run_dir, "tp1pp1dp4")
    folder.mkdir(parents=True)
    plan.save(folder)
    assert stored_plan(folder)["run_dir"] == "../.."
    assert RunPlan.load(folder).run_dir == plan.run_dir


@pytest.mark.parametrize("where", ["/scratch/elsewhere/ckpt", "s3://bucket/run1"])
def test_checkpoints_outside_the_run_folder_are_named_as_they_are_and_marked_external(plan, tmp_path, where):
    plan.checkpoint_dir = where
    plan.save(tmp_path)
    stored = stored_plan(tmp_path)
    assert (stored["checkpoint_dir"], stored["checkpoint_external"]) == (where, True)
    assert RunPlan.load(tmp_path).checkpoint_dir == where


def legacy_plan(plan: RunPlan, written_at: Path, checkpoint_dir: str | None = None) -> dict:
    """plan.json as restartbench wrote it before run folders could move: absolute paths, no checkpoint_external."""
    stored = {**plan.stored(written_at), "run_dir": str(written_at),
              "checkpoint_dir": checkpoint_dir or str(written_at / "checkpoints")}
    del stored["checkpoint_external"]
    return stored


def test_a_run_folder_with_absolute_paths_reads_where_it_is_and_is_said_moved(plan, tmp_path):
    original = tmp_path / "original"
    original.mkdir()
    (original / rundir.PLAN).write_text(json.dumps(legacy_plan(plan, original)))
    assert RunPlan.load(original).checkpoint_dir == str(original / "checkpoints")  # in place: as written
    assert rundir.moved_from(original) is None
    moved = tmp_path / "moved"
    os.rename(original, moved)
    loaded = RunPlan.load(moved)
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(moved), str(moved / "checkpoints"))
    assert rundir.moved_from(moved) == str(original)
    (moved / rundir.PLAN).write_text(json.dumps(legacy_plan(plan, original, "/scratch/ckpt")))
    assert RunPlan.load(moved).checkpoint_dir == "/scratch/ckpt"  # an external folder stays where it is


def test_the_scripts_name_no_run_folder_path(tmp_path):
    for launcher in ("local", "slurm", "pbs"):
        cfg = config_from_args(["tiny", "tp2pp2", "--launcher", launcher, "--logs", str(tmp_path), "--dry-run"])
        plan = plan_run(cfg)
        rendered = render(cfg, plan)
        assert 'RUN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")"/. && pwd)"' in rendered.launch_script
        for script in filter(None, (rendered.launch_script, rendered.job_script)):
            assert str(tmp_path) not in script and "--run-dir" not in script.replace('--run-dir "$RUN_DIR"', "")
    layout = render(cfg, plan, launch_dir=rundir.launch_folder(plan.run_dir, "tp1pp1dp4"))
    assert '"$(dirname "${BASH_SOURCE[0]}")"/../.. && pwd)"' in layout.launch_script


def test_the_launch_script_finds_its_run_folder_wherever_it_is(tmp_path):
    """launch.sh's RUN_DIR line, run by bash from a moved copy: it names the copy."""
    cfg = config_from_args(["tiny", "tp2pp2", "--logs", str(tmp_path), "--dry-run"])
    plan = plan_run(cfg)
    line = next(line for line in render(cfg, plan).launch_script.splitlines() if line.startswith("RUN_DIR="))
    copy = tmp_path / "moved" / "run"
    copy.mkdir(parents=True)
    (copy / "launch.sh").write_text(f'{line}\necho "$RUN_DIR"\n')
    printed = subprocess.run(["bash", str(copy / "launch.sh")], capture_output=True, text=True, cwd="/")
    assert printed.stdout.strip() == str(copy.resolve())


def folder_state(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_relaunch_of_a_run_whose_metadata_is_not_json_names_the_file_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metadata.json").write_text('{"status": "complete", ')
    before = folder_state(run_dir)
    assert relaunch.main([str(run_dir)]) == 2
    said = capsys.readouterr().out
    assert f"{run_dir / 'metadata.json'} is not valid JSON" in said and "Put back the file" in said
    assert folder_state(run_dir) == before and sorted(os.listdir(run_dir)) == ["metadata.json"]


def test_metadata_that_is_no_json_object_is_refused(tmp_path):
    (tmp_path / "metadata.json").write_text("[1]")
    with pytest.raises(RunFolderError, match=r"holds list, not a JSON object"):
        rundir.read_metadata(tmp_path)


def test_a_run_folder_without_plan_json_is_refused_naming_it(tmp_path):
    with pytest.raises(RunFolderError, match=rf"{tmp_path / 'plan.json'} is missing"):
        RunPlan.load(tmp_path)


@pytest.mark.parametrize("config, message", [
    ({"model": 5}, "config section 'model' must be an object of its options, got 5 (int)"),
    ([1, 2], "a run configuration is a JSON object of sections, got list"),
])
def test_execute_on_a_config_json_whose_section_is_no_object_names_it(tmp_path, capsys, config, message):
    plan_run(config_from_args(["tiny", "tp2pp2", "--logs", str(tmp_path), "--dry-run"])).save(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "metadata.json").write_text(json.dumps({"status": "prepared", "phases": {}}))
    before = folder_state(tmp_path)
    assert execute_main([str(tmp_path)]) == 2
    said = capsys.readouterr().err
    assert f"{tmp_path / 'config.json'}: {message}" in said and "Traceback" not in said
    assert folder_state(tmp_path) == before


def test_a_run_folders_config_names_the_folder_where_it_is_now(tmp_path):
    """config.json says paths.run_dir "."; loaded from a moved folder it names the new place (the emulated run's
    predicted DCP .metadata pickles the checkpoint folder's path, so a path relative to the working directory gave
    another size than the file written)."""
    folder = tmp_path / "moved" / "run"
    folder.mkdir(parents=True)
    cfg = RunConfig()
    cfg.paths.run_dir = "."
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert RunConfig.load(folder / "config.json").paths.run_dir == str(folder.resolve())
    cfg.paths.run_dir = "/elsewhere/run"
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert RunConfig.load(folder / "config.json").paths.run_dir == "/elsewhere/run"


def test_a_config_json_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'config.json'}: Expecting"):
        RunConfig.load(tmp_path / "config.json")


@pytest.mark.parametrize("options, message", [
    (["--restore-layout", "dp4"], "--emulate does not do --restore-layout (an emulated restore loads on the run's "
                                  "own layout only"),
    (["--consolidated-digest"], "--emulate does not do --consolidated-digest (an emulated run trains no model"),
])
def test_emulate_refuses_what_it_would_ignore(tmp_path, capsys, options, message):
    logs = tmp_path / "logs"
    assert cli.main(["tiny", "tp2pp2", "--emulate", "--logs", str(logs), *options]) == 2
    assert message in capsys.readouterr().out
    assert not logs.exists()


def test_emulate_refuses_both_at_once_naming_both(tmp_path):
    cfg = config_from_args(["tiny", "tp2pp2", "--emulate", "--logs", str(tmp_path / "logs"), "--restore-layout",
                            "dp4", "--consolidated-digest"])
    with pytest.raises(StudyError, match=r"--restore-layout .*; --consolidated-digest .*: leave them out"):
        cli.run(cfg)


def test_an_absolute_run_folder_with_relative_checkpoints_reads_them_under_it(plan, tmp_path):
    """A plan.json whose run folder was named by hand (absolute) keeps its own checkpoints relative to it."""
    (tmp_path / rundir.PLAN).write_text(json.dumps({**plan.stored(tmp_path), "run_dir": str(tmp_path)}))
    assert RunPlan.load(tmp_path).checkpoint_dir == str(tmp_path / "checkpoints")

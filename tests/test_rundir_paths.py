"""The run folder's paths (restartbench.rundir): where a run folder, a launch's files and a phase's logs are; a run
folder made atomically; plan.json's paths relative to the run folder, so that a moved or copied folder reads its
own checkpoints; run folders written before (absolute paths) read where they are now and are said moved; and the
words of each refusal of a malformed file, which name the file and what to do."""

import json
import os
import re
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from restartbench import rundir
from restartbench.config import config_from_args
from restartbench.rundir import RunFolderError, RunPlan
from restartbench.study import plan_run


@pytest.fixture
def plan(tmp_path) -> RunPlan:
    """A planned run whose run folder is ``tmp_path/logs/tiny/tp2pp2/<engine>/<stamp>`` (not made yet)."""
    return plan_run(config_from_args(["tiny", "tp2pp2", "--logs", str(tmp_path / "logs"), "--dry-run"]))


def stored(folder: Path) -> dict:
    return json.loads((folder / rundir.PLAN).read_text())


def legacy_plan(plan: RunPlan, written_at: Path, checkpoint_dir: str | None = None) -> dict:
    """plan.json as restartbench wrote it before run folders could move: absolute paths, no checkpoint_external."""
    return {**asdict(plan), "run_dir": str(written_at), "checkpoint_dir": checkpoint_dir or str(written_at / "ckpts")}


def write_legacy(folder: Path, plan: RunPlan, written_at: Path, checkpoint_dir: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / rundir.PLAN).write_text(json.dumps(legacy_plan(plan, written_at, checkpoint_dir)))


# -- where things are ----------------------------------------------------------------------------------------------


def test_a_new_run_folder_is_named_after_the_time_now_and_a_random_suffix(tmp_path):
    """``<logs>/<preset>/<layout>/<engine>/<stamp>``: the stamp is the time now and six hex digits, as long as the
    predictor's placeholder stamp; two launches in the same second get different folders."""
    before = time.time()
    first = rundir.new_run_folder(tmp_path, "tiny", "tp2pp2", "torch")
    second = rundir.new_run_folder(str(tmp_path), "tiny", "tp2pp2", "torch")
    assert first.parent == second.parent == tmp_path / "tiny" / "tp2pp2" / "torch"
    assert first != second
    for folder in (first, second):
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", folder.name), folder.name
        assert len(folder.name) == len(rundir.PLACEHOLDER_STAMP)
        stamped = time.mktime(time.strptime(folder.name[:15], rundir.STAMP_FORMAT))
        assert int(before) - 1 <= stamped <= time.time()
    assert not first.exists(), "naming a run folder makes nothing"


def test_a_run_folder_is_made_with_its_parents(tmp_path):
    path = tmp_path / "logs" / "tiny" / "dp4" / "torch" / "20260101-000000-abcdef"
    rundir.create_run_folder(str(path))
    assert path.is_dir() and list(path.iterdir()) == []


def test_a_run_folder_is_made_beside_another_launchs(tmp_path):
    """Other launches make the same parents: they may exist."""
    (tmp_path / "engine" / "other-run").mkdir(parents=True)
    rundir.create_run_folder(tmp_path / "engine" / "this-run")
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["other-run", "this-run"]


def test_a_run_folder_that_exists_is_refused_and_left_untouched(tmp_path):
    """Another launch owns it."""
    owned = tmp_path / "engine" / "run"
    owned.mkdir(parents=True)
    (owned / "metadata.json").write_text("{}")
    with pytest.raises(FileExistsError):
        rundir.create_run_folder(owned)
    assert [p.name for p in owned.iterdir()] == ["metadata.json"] and (owned / "metadata.json").read_text() == "{}"


def test_a_launch_is_in_the_run_folder_or_in_layouts_for_a_restart_on_another_layout(tmp_path):
    assert rundir.launch_folder(str(tmp_path)) == tmp_path
    assert rundir.launch_folder(tmp_path, None) == tmp_path
    assert rundir.launch_folder(str(tmp_path), "tp1pp1dp4") == tmp_path / "layouts" / "tp1pp1dp4"


def test_a_phases_output_is_a_log_file_per_stream_in_the_run_folder(tmp_path):
    assert rundir.phase_log(str(tmp_path), "restore-2", "stderr") == tmp_path / "restore-2.stderr.log"


def test_write_json_replaces_the_file_whole_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "metadata.json"
    rundir.write_json(path, {"status": "running"})
    rundir.write_json(str(path), {"status": "complete", "phases": [1, 2]})
    assert rundir.read_json(path) == {"status": "complete", "phases": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["metadata.json"]


# -- metadata.json ---------------------------------------------------------------------------------------------------

TAIL = ("it is the run's record of its status, phases and restore attempts, and nothing can be added to it. Put back "
        "the file from the folder this run was copied from (or a backup); nothing was written")


def test_metadata_is_read_as_the_object_it_holds(tmp_path):
    rundir.write_json(tmp_path / rundir.METADATA, {"status": "complete", "restarts": []})
    assert rundir.read_metadata(str(tmp_path)) == {"status": "complete", "restarts": []}


def test_metadata_that_is_not_json_is_refused_naming_the_file_the_line_and_what_to_do(tmp_path):
    path = tmp_path / rundir.METADATA
    path.write_text('{"status": "running",\n')  # cut short while it was copied
    with pytest.raises(RunFolderError) as refused:
        rundir.read_metadata(tmp_path)
    assert str(refused.value) == (f"{path} is not valid JSON (Expecting property name enclosed in double quotes at "
                                  f"line 2): {TAIL}")


@pytest.mark.parametrize(("text", "kind"), [("[1, 2]", "list"), ("null", "NoneType"), ('"complete"', "str")])
def test_metadata_that_is_no_json_object_is_refused_naming_what_it_holds(tmp_path, text, kind):
    path = tmp_path / rundir.METADATA
    path.write_text(text)
    with pytest.raises(RunFolderError) as refused:
        rundir.read_metadata(tmp_path)
    assert str(refused.value) == f"{path} holds {kind}, not a JSON object: {TAIL}"


# -- plan.json: the words of its refusals ----------------------------------------------------------------------------


def test_a_folder_without_plan_json_is_refused_as_no_planned_run_folder(tmp_path):
    with pytest.raises(RunFolderError) as refused:
        RunPlan.load(tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'plan.json'} is missing: {tmp_path} is no run folder planned by "
                                  "config-n-run.py (or its plan.json was not copied with it)")


def test_a_plan_json_holding_a_list_is_refused_naming_the_type(tmp_path):
    (tmp_path / rundir.PLAN).write_text("[1, 2]")
    with pytest.raises(RunFolderError) as refused:
        rundir.moved_from(tmp_path)
    assert str(refused.value) == f"{tmp_path / 'plan.json'}: expected a JSON object, got list"


def test_a_plan_json_of_another_version_names_every_field_and_what_to_do(plan, tmp_path):
    old = asdict(plan)
    del old["backend"], old["device"]
    (tmp_path / rundir.PLAN).write_text(json.dumps({**old, "nodes": 2, "ranks": 4}))
    with pytest.raises(RunFolderError) as refused:
        RunPlan.load(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'plan.json'} was written by another version of restartbench: it lacks the field(s) 'device', "
        "'backend'; it has the unknown field(s) 'nodes', 'ranks'. Plan and run it again with this version "
        "(config-n-run.py), or read it with the version that wrote it")


# -- plan.json: relative paths, moved and copied run folders -------------------------------------------------------


def test_a_plan_saved_in_its_run_folder_names_its_checkpoints_inside_it_and_marks_them_so(plan):
    """plan.json says ``"checkpoint_external": false`` for checkpoints that move with the folder, whatever folder
    the launch ran from."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    assert not plan.checkpoint_external
    plan.save(run_dir)
    assert (stored(run_dir)["run_dir"], stored(run_dir)["checkpoint_dir"]) == (".", "checkpoints")
    assert stored(run_dir)["checkpoint_external"] is False


def test_object_store_checkpoints_are_external_wherever_the_launch_runs(plan, monkeypatch):
    """A URL is never inside the run folder, even read from the run folder itself (where the URL, taken for a
    relative path, would lie under it)."""
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(run_dir)
    plan.checkpoint_dir = "s3://bucket/runs/r1"
    assert plan.checkpoint_external
    plan.save(run_dir)
    assert (stored(run_dir)["checkpoint_dir"], stored(run_dir)["checkpoint_external"]) == ("s3://bucket/runs/r1", True)
    assert RunPlan.load(".").checkpoint_dir == "s3://bucket/runs/r1"


def test_a_copied_run_folder_reads_the_copys_checkpoints(plan, tmp_path):
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    plan.save(run_dir)
    copy = tmp_path / "archive" / "copy"
    shutil.copytree(run_dir, copy)
    loaded = RunPlan.load(copy)
    assert loaded == replace(plan, run_dir=str(copy), checkpoint_dir=str(copy / "checkpoints"))
    assert rundir.moved_from(copy) is None and rundir.moved_from(run_dir) is None


def test_an_old_run_folder_still_where_it_was_written_reads_as_written(plan, tmp_path):
    original = tmp_path / "original"
    write_legacy(original, plan, original)
    loaded = RunPlan.load(original)
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(original), str(original / "ckpts"))
    assert rundir.moved_from(str(original)) is None


def test_an_old_run_folder_reached_through_a_link_is_where_it_was_written(plan, tmp_path):
    """The same folder by another name (a symbolic link) has not moved."""
    original = tmp_path / "original"
    write_legacy(original, plan, original)
    (tmp_path / "link").symlink_to(original)
    loaded = RunPlan.load(tmp_path / "link")
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(original), str(original / "ckpts"))
    assert rundir.moved_from(tmp_path / "link") is None


def test_an_old_run_folder_moved_away_reads_its_checkpoints_where_it_is_and_names_its_old_place(plan, tmp_path):
    original, moved = tmp_path / "original", tmp_path / "archive" / "moved"
    write_legacy(original, plan, original)
    moved.parent.mkdir()
    os.rename(original, moved)
    loaded = RunPlan.load(moved)
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(moved), str(moved / "ckpts"))
    assert rundir.moved_from(moved) == str(original)


def test_an_old_run_folder_copied_elsewhere_reads_the_copy_and_names_the_original(plan, tmp_path):
    """The original is still there: the copy reads its own checkpoints (nested ones included), the original its own,
    and the copy is said moved from the original (its launch.sh would run there)."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    write_legacy(original, plan, original, str(original / "ckpts" / "nested"))
    shutil.copytree(original, copy)
    assert (RunPlan.load(copy).run_dir, RunPlan.load(copy).checkpoint_dir) == (str(copy), str(copy / "ckpts/nested"))
    assert RunPlan.load(original).checkpoint_dir == str(original / "ckpts" / "nested")
    assert rundir.moved_from(copy) == str(original) and rundir.moved_from(original) is None


def test_an_old_copied_run_folder_reads_its_checkpoints_whatever_the_working_folder(plan, tmp_path, monkeypatch):
    """Read from inside the original (the working folder of a person comparing the two), the copy still reads its
    own checkpoints: nothing is resolved against the working folder."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    write_legacy(original, plan, original)
    shutil.copytree(original, copy)
    (original / "ckpts").mkdir()
    monkeypatch.chdir(original / "ckpts")
    loaded = RunPlan.load(copy)
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(copy), str(copy / "ckpts"))


def test_an_old_plan_with_relative_checkpoints_reads_them_under_the_run_folder_whatever_the_working_folder(
        plan, tmp_path, monkeypatch):
    original, copy = tmp_path / "original", tmp_path / "copy"
    write_legacy(original, plan, original, "checkpoints")
    shutil.copytree(original, copy)
    (original / "sub").mkdir()
    monkeypatch.chdir(original / "sub")
    assert RunPlan.load(copy).checkpoint_dir == str(copy / "checkpoints")


def test_an_old_run_folders_external_checkpoints_stay_where_they_are(plan, tmp_path):
    original, moved = tmp_path / "original", tmp_path / "moved"
    write_legacy(original, plan, original, str(tmp_path / "scratch" / "ckpt"))
    os.rename(original, moved)
    assert RunPlan.load(moved).checkpoint_dir == str(tmp_path / "scratch" / "ckpt")


def test_an_old_restart_layouts_plan_belongs_to_the_run_folder_two_up(plan, tmp_path):
    """A plan in ``layouts/<layout>/`` of a moved old run folder: the run folder is two up from it."""
    original, moved = tmp_path / "original", tmp_path / "moved"
    write_legacy(rundir.launch_folder(original, "tp1pp1dp4"), plan, original)
    os.rename(original, moved)
    loaded = RunPlan.load(rundir.launch_folder(moved, "tp1pp1dp4"))
    assert (loaded.run_dir, loaded.checkpoint_dir) == (str(moved), str(moved / "ckpts"))


def test_a_plan_without_a_recorded_run_folder_is_not_said_moved(tmp_path):
    (tmp_path / rundir.PLAN).write_text(json.dumps({"world_size": 4}))
    assert rundir.moved_from(tmp_path) is None

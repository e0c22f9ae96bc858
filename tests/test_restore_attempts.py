"""Restarts measured again from a run's kept checkpoints (``./submit-job.sh --restore RUN_DIR --repeat N``): each
attempt a record of its own, nothing appended to an earlier one, a run folder never executed twice."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, copy_run, relaunch

from restartbench import analysis

pytestmark = pytest.mark.multirank


def test_three_more_attempts_are_three_exact_restart_rows_and_nothing_appends(tiny_dp2_run, tmp_path):
    logs = tmp_path / "logs"
    run_dir = copy_run(tiny_dp2_run, logs)
    first = {p.name: p.read_bytes() for p in (run_dir / "events").iterdir()}

    again = subprocess.run([str(ROOT / "submit-job.sh"), "--restore", str(run_dir), "--repeat", "3"],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert [line.split("restore attempt ")[1][:8] for line in again.stdout.splitlines()
            if "restore attempt " in line] == ["2: exact", "3: exact", "4: exact"]
    assert {name: (run_dir / "events" / name).read_bytes() for name in first} == first, "earlier records untouched"
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert [(r["attempt"], r["record"], r["verdict"], r["exit_code"]) for r in meta["restarts"]] == [
        (1, "restore", "exact", 0), (2, "restore-2", "exact", 0), (3, "restore-3", "exact", 0),
        (4, "restore-4", "exact", 0)]
    assert meta["status"] == "complete"

    table = analysis.collect(logs).table()
    rows = table[table["kind"] == "restart"].sort_values("attempt")
    assert rows["attempt"].tolist() == [1, 2, 3, 4] and rows["verdict"].tolist() == ["exact"] * 4
    assert (rows["restart_s"] > 0).all() and (rows["tag"] == "step2").all() and (rows["cache"] == "cold").all()
    summary = analysis.restart_summary(table).iloc[0]
    assert (summary["attempts"], summary["verdicts"]) == (4, "4 exact")
    assert summary["restart_s"] == pytest.approx(rows["restart_s"].median())

    tagged = relaunch(run_dir, "--tag", "step1", "--restore-cache", "warm")
    assert tagged.returncode == 0, tagged.stdout + tagged.stderr[-3000:]
    entry = json.loads((run_dir / "metadata.json").read_text())["restarts"][-1]
    assert (entry["attempt"], entry["requested_tag"], entry["tag"], entry["restore_cache"], entry["verdict"]) == \
        (5, "step1", "step1", "warm", "exact")

    unknown = relaunch(run_dir, "--tag", "step9")
    assert unknown.returncode == 2 and "--tag step9 is not a committed checkpoint" in unknown.stdout
    assert "checkpoints are step2, step1" in unknown.stdout

    records = sorted(p.name for p in (run_dir / "events").iterdir())
    direct = subprocess.run(["bash", str(run_dir / "launch.sh"), "restore"], capture_output=True, text=True,
                            timeout=300)
    assert direct.returncode != 0 and direct.stderr.count("never appended to") == 1, direct.stderr[-3000:]
    executed = subprocess.run([sys.executable, "-m", "restartbench.execute", str(run_dir)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    assert executed.returncode == 2 and "was executed before" in executed.stderr and "--restore" in executed.stderr
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == records, "refused launches wrote nothing"
    assert {name: (run_dir / "events" / name).read_bytes() for name in first} == first


def test_bad_restore_options_are_refused_before_anything_launches(tmp_path):
    def refused(*argv: str) -> str:
        result = subprocess.run([sys.executable, "-m", "restartbench.relaunch", *argv], capture_output=True,
                                text=True, cwd=ROOT)
        assert result.returncode == 2
        return result.stdout + result.stderr

    assert "--repeat: must be at least 1 (got 0)" in refused(str(tmp_path), "--repeat", "0")
    assert f"{tmp_path} is not a run folder (no metadata.json)" in refused(str(tmp_path))


def file_hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (symlinks as their targets' names) by its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(str(p.readlink()).encode() if p.is_symlink() else
                                                       p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


def test_a_copied_run_folder_relaunches_and_summarizes_where_it_is_and_leaves_the_original_alone(tiny_dp2_run,
                                                                                                  tmp_path):
    """cp -r RUN ARCHIVE/RUN; ./submit-job.sh --restore ARCHIVE/RUN: the copy restores from its own checkpoints and
    records the attempt in itself; the original is byte for byte as it was. A copy without its checkpoints, and a
    run folder from before run folders could move that has moved, are refused before anything is written."""
    written = (tiny_dp2_run / "launch.sh").read_text() + (tiny_dp2_run / "config.json").read_text()
    assert str(tiny_dp2_run) not in written, "a run folder names no place of its own"
    logs = tmp_path / "logs"
    run_dir = copy_run(tiny_dp2_run, logs)  # the original of this test, the session's run left as it is
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["run_dir"], plan["checkpoint_dir"], plan["checkpoint_external"]) == (".", "checkpoints", False)
    copy = tmp_path / "archive" / run_dir.relative_to(logs)
    shutil.copytree(run_dir, copy, symlinks=True)
    original = file_hashes(run_dir)

    done = relaunch(copy)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restore attempt 2: exact" in done.stdout
    assert file_hashes(run_dir) == original, "the original run folder is untouched"
    restarts = json.loads((copy / "metadata.json").read_text())["restarts"]
    assert [(r["attempt"], r["verdict"]) for r in restarts] == [(1, "exact"), (2, "exact")]
    assert sorted(p.name for p in (copy / "events").glob("restore-2-rank*.jsonl")) == [
        "restore-2-rank00000.jsonl", "restore-2-rank00001.jsonl"]
    table = analysis.collect(tmp_path / "archive").table()
    rows = table[table["kind"] == "restart"].sort_values("attempt")
    assert rows["attempt"].tolist() == [1, 2] and rows["verdict"].tolist() == ["exact", "exact"]

    gone = tmp_path / "no-checkpoints" / "run"
    shutil.copytree(run_dir, gone, ignore=shutil.ignore_patterns("checkpoints"))
    before = file_hashes(gone)
    refused = relaunch(gone)
    assert refused.returncode == 2, refused.stdout + refused.stderr[-3000:]
    assert (f"the checkpoints of run {gone} are gone: looked in {gone / 'checkpoints'} (the run folder's own "
            "checkpoints/)") in refused.stdout
    assert file_hashes(gone) == before and not (gone / ".restore.lock").exists()

    legacy = tmp_path / "moved-legacy" / run_dir.relative_to(logs)
    shutil.copytree(run_dir, legacy, symlinks=True)
    as_written_before = {k: v for k, v in plan.items() if k != "checkpoint_external"}  # absolute paths, no mark
    (legacy / "plan.json").write_text(json.dumps({**as_written_before, "run_dir": str(run_dir),
                                                  "checkpoint_dir": str(run_dir / "checkpoints")}))
    before = file_hashes(legacy)
    refused = relaunch(legacy)
    assert refused.returncode == 2, refused.stdout + refused.stderr[-3000:]
    assert f"run folder {legacy} was written at {run_dir} by an earlier version" in refused.stdout
    assert file_hashes(legacy) == before and file_hashes(run_dir) == original
    legacy_rows = analysis.collect(tmp_path / "moved-legacy").table()
    assert legacy_rows[legacy_rows["kind"] == "restart"]["verdict"].tolist() == ["exact"]

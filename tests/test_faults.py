"""Faults injected into real runs (tiny preset, 2 gloo ranks): the study never loses a checkpoint,
never reports a broken one as good and never hangs. Logs live under a path with spaces on purpose."""

import json
import subprocess
import time

import pytest
from conftest import STUDY_CASES, STUDY_SECRETS, copy_run, last_attempt_events, relaunch, run_study

from restartbench.events import read_events
from restartbench.results import restart

pytestmark = pytest.mark.multirank
QUICK = ("tiny", "tp1pp1dp2", "--dtype", "fp32", "--iters", "4", "--save-interval", "2", "--baseline-mib", "0")
"""A short tiny run without the storage baseline (fio, seconds a run), which no test here reads."""
FLIPPED_KEY = "module.0.weight"
"""The first tensor of tiny's module (the embedding), where flip-in-save flips a bit."""
DEATH_TO_END_S = 10
"""README's "a rank that dies during restore fails the run within seconds", from the death to the end of the phase
(every rank and torchrun gone): 1.1–1.6 s measured here on 2 cores at load average 8–11."""
TIMEOUT_TO_END_S = 25
"""From a collective's timeout to the end of the phase: 2.5–9.6 s measured in the same conditions (the failed rank's
process takes 2–6 s to exit, then torchrun stops the stalled one)."""


def metadata(run_dir):
    return json.loads((run_dir / "metadata.json").read_text())


def last_restore(run_dir):
    events = last_attempt_events(run_dir)
    return events, next(e for e in events if e["event"] == "restore.result")


def test_rank_killed_mid_save_keeps_the_previous_checkpoint(tmp_path):
    proc, run_dir = run_study(tmp_path / "logs with spaces", *QUICK,
                              env={"RESTARTBENCH_FAULT": "kill-in-save:tag=step4:rank=1"})
    assert proc.returncode == 1
    meta = metadata(run_dir)
    assert meta["status"] == "failed"
    assert meta["failed_checkpoints"] == [{"tag": "step4",
                                           "error": "begun, never committed: the phase died during the save",
                                           "latest_kept": "step2"}]
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "step2" and not (ckpt / "step4" / "manifest.json").exists()
    again = relaunch(run_dir)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    _, result = last_restore(run_dir)
    assert result["tag"] == "step2" and result["exact"] is True


def test_a_rank_crashed_by_a_signal_says_where_in_the_runs_error(tmp_path):
    """A segfault (as in an engine's compiled writer) leaves no Python error in the events: the run's error names the
    signal and the crashed thread's innermost frames, from the fault handler every rank enables, and the checkpoint
    it died in is not taken for committed."""
    proc, run_dir = run_study(tmp_path / "logs", *QUICK,
                              env={"RESTARTBENCH_FAULT": "segfault-in-save:tag=step4:rank=1"})
    assert proc.returncode == 1
    meta = metadata(run_dir)
    assert meta["error"].startswith("phase train failed: rank 1 crashed: Segmentation fault in string_at "
                                    "(__init__.py:"), meta["error"]
    assert "< segfault_in_save (faults.py:" in meta["error"] and "< _checkpoint (train.py:" in meta["error"]
    assert "train.stderr.log" in meta["error"]
    assert meta["failed_checkpoints"] == [{"tag": "step4",
                                           "error": "begun, never committed: the phase died during the save",
                                           "latest_kept": "step2"}]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 7 MiB tmpfs: room for one tiny fp32 checkpoint (about 5.1 MB), not two."""
    mount_point = tmp_path / "small disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)])


def test_full_disk_fails_the_save_cleanly_and_keeps_training_state(tmp_path, small_tmpfs):
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, "--checkpoint-dir", str(small_tmpfs / "ckpt"),
                              "--no-disk-check")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    meta = metadata(run_dir)
    assert meta["status"] == "failed" and "is full" in meta["error"] and "no space left on device" in meta["error"]
    assert [c["tag"] for c in meta["failed_checkpoints"]] == ["step4"]
    failed = [e for e in read_events(run_dir) if e["event"] == "checkpoint.failed"][0]
    assert failed["target"] == str(small_tmpfs / "ckpt") and failed["needed_bytes_estimate"] > failed["free_bytes"]
    assert not (small_tmpfs / "ckpt" / "step4").exists(), "the partial checkpoint is removed"
    assert (small_tmpfs / "ckpt" / "latest").read_text() == "step2"
    # Training state was not lost: phase 1 went on to its reference iteration, and step2 restores exactly.
    assert any(e["event"] == "train.iteration" and e.get("reference") for e in read_events(run_dir))
    assert metadata(run_dir)["phases"]["restore"]["exit_code"] == 0
    _, result = last_restore(run_dir)
    assert result["tag"] == "step2" and result["exact"] is True


def test_full_disk_is_refused_up_front_by_default(tmp_path, small_tmpfs):
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, "--checkpoint-dir", str(small_tmpfs / "ckpt"))
    assert proc.returncode == 2 and run_dir is None
    assert "GiB free, but 2 checkpoint(s)" in proc.stdout


@pytest.fixture
def complete_run(tiny_dp2_run, tmp_path):
    """This test's own copy of the session's complete run (checkpoints step1 and step2)."""
    return copy_run(tiny_dp2_run, tmp_path / "logs with spaces")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_checkpoint_is_detected_named_and_refused_then_fallen_back_from(complete_run, damage):
    victim = complete_run / "checkpoints" / "step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 3]
    victim.write_bytes(bytes(data))

    refused = relaunch(complete_run)
    assert refused.returncode != 0
    errors = [e for e in last_attempt_events(complete_run) if e["event"] == "phase.error"]
    assert {e["rank"] for e in errors} == {0, 1} and all(e["refused"] for e in errors)
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in errors[-1]["error"]
    assert ("hash differs from the manifest" if damage == "flip" else "truncated") in errors[-1]["error"]
    started = {e["event"] for e in last_attempt_events(complete_run)}
    assert "restore.check_files" in started and "startup.model_build" not in started, "refused before the start-up"
    said = (complete_run / "restore-2.stderr.log").read_text()
    assert said.count("fails its manifest check") == 1 and "restartbench/train.py" not in said, "once, no traceback"
    assert refused.stdout.count("fails its manifest check") == 1
    assert metadata(complete_run)["restarts"][-1]["verdict"] == "refused"

    again = relaunch(complete_run, "--on-corrupt", "fallback")
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    events, result = last_restore(complete_run)
    assert result["tag"] == "step1" and result["exact"] is True
    fallback = [e for e in events if e["event"] == "restore.fallback"][-1]
    assert (fallback["wanted"], fallback["restored"]) == ("step2", "step1")
    entry = metadata(complete_run)["restarts"][-1]
    assert (entry["attempt"], entry["on_corrupt"], entry["tag"], entry["fell_back_from"], entry["verdict"]) == \
        (3, "fallback", "step1", "step2", "exact")


def test_a_checkpoint_that_passes_its_manifest_but_holds_another_state_fails_the_restore(tmp_path):
    """flip-in-save on rank 0, which writes the module file both data-parallel ranks load: every file matches its
    manifest, yet the saved weight differs by one bit from the one trained on; only the digest proof can see it."""
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, env={"RESTARTBENCH_FAULT": "flip-in-save:tag=step4:rank=0"})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    meta = metadata(run_dir)
    assert meta["status"] == "failed" and meta["phases"]["train"]["exit_code"] == 0
    assert "RestoreMismatch: rank 0: restore of step4 is not exact" in meta["error"]
    assert f"{FLIPPED_KEY}: differs" in meta["error"]
    events = read_events(run_dir)
    assert [(e["fault"], e["tag"]) for e in events if e["event"] == "fault.injected"] == [("flip-in-save", "step4")]
    checks = [e for e in events if e["event"] == "restore.check_files"]
    assert checks and all(check["problems"] == [] for check in checks)
    result = next(e for e in events if e["event"] == "restore.result" and e["rank"] == 0)
    assert result["exact"] is False and result["problems"] == [f"{FLIPPED_KEY}: differs"]


def fault_time(run_dir, kind):
    """When the fault struck: its fault.injected event, written just before it acted."""
    return next(e["time"] for e in read_events(run_dir) if e["event"] == "fault.injected" and e["fault"] == kind)


def phase_end(run_dir, phase):
    record = metadata(run_dir)["phases"][phase]
    return record["start"] + record["wall_s"]


def test_rank_dying_during_restore_fails_the_run_within_seconds(tmp_path):
    """Timed from the rank's death (its fault.injected event, written just before it SIGKILLs itself) to the end
    of the restore phase in metadata.json."""
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, env={"RESTARTBENCH_FAULT": "kill-in-load:rank=1"})
    assert proc.returncode == 1
    meta = metadata(run_dir)
    assert meta["status"] == "failed" and meta["error"].startswith("phase restore failed")
    assert meta["phases"]["train"]["exit_code"] == 0
    death_to_end = phase_end(run_dir, "restore") - fault_time(run_dir, "kill-in-load")
    assert 0 < death_to_end < DEATH_TO_END_S, death_to_end


@pytest.mark.parametrize("fault", ["hang-before-save:tag=step2:rank=1", "hang-before-iteration:step=3:rank=1"])
def test_a_stalled_rank_fails_the_run_when_the_collective_times_out(tmp_path, fault):
    """README: every collective times out after --collective-timeout-s. Rank 1 stalls while rank 0 waits in the
    save's collectives on the world group, or in an iteration's on DeepSpeed's data-parallel group. The phase
    timeout is there only so that a collective without the timeout fails this test in minutes, not hangs it."""
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, "--collective-timeout-s", "5", "--phase-timeout-s", "150",
                              env={"RESTARTBENCH_FAULT": fault})
    assert proc.returncode == 1
    meta = metadata(run_dir)
    assert meta["status"] == "failed" and meta["error"].startswith("phase train failed: rank 0:")
    assert "Timed out waiting 5000ms" in meta["error"], meta["error"]
    stall_to_end = phase_end(run_dir, "train") - fault_time(run_dir, fault.split(":")[0])
    assert 5 < stall_to_end < 5 + TIMEOUT_TO_END_S, stall_to_end


def test_distributed_init_timeout_fails_in_bounded_time(tmp_path):
    start = time.time()
    proc, run_dir = run_study(tmp_path / "logs", *QUICK, "--collective-timeout-s", "5",
                              env={"RESTARTBENCH_FAULT": "hang-before-init:rank=1"})
    elapsed = time.time() - start
    assert proc.returncode == 1 and elapsed < 120, elapsed
    meta = metadata(run_dir)
    assert meta["status"] == "failed" and meta["error"].startswith("phase train failed")
    assert restart(read_events(run_dir)) is None


@pytest.mark.parametrize("layout", [layout for layout, _, _ in STUDY_CASES])
def test_credentials_in_the_environment_never_reach_the_run_folder(study_runs, layout):
    """The session's study runs had STUDY_SECRETS in their environment (and a storage baseline, whose
    baseline.json records its tools): no file of the run folder, nor what the run printed, holds one."""
    proc, run_dir = study_runs[layout]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert (run_dir / "baseline.json").is_file()
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for value in STUDY_SECRETS.values():
                assert value.encode() not in data, f"{value} found in {path}"
    assert not any(value in proc.stdout + proc.stderr for value in STUDY_SECRETS.values())

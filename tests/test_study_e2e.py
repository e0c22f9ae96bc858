"""Real multi-rank DeepSpeed runs on gloo (tiny preset): files DeepSpeed wrote, events, exact restore.

Each case is two real `torchrun` launches (train, then restore) through config-n-run.py.
"""

import json
from collections import Counter

import pytest
from conftest import copy_run, last_attempt_events, relaunch, run_study

from restartbench.events import read_events
from restartbench.presets import PRESETS
from restartbench.results import checkpoints, restart

pytestmark = pytest.mark.multirank


def expected_files(tp, pp, dp, dtype):
    """DeepSpeed's naming for a PipelineModule checkpoint (per tag)."""
    layers = PRESETS["tiny"].layers + 3  # embedding, decoder layers, final norm, head
    prefix = "bf16_" if dtype == "bf16" else ""
    names = {f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in range(layers) for t in range(tp)}
    names |= {f"mp_rank_{m:02d}_model_states.pt" for m in range(tp * pp)}
    names |= {f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(dp) for m in range(tp * pp)}
    return names


@pytest.mark.parametrize("layout, tp, pp, dp, dtype", [
    ("tp2pp2", 2, 2, 1, "fp32"),
    ("pp2dp2", 1, 2, 2, "bf16"),
    ("tp1pp1dp2", 1, 1, 2, "fp32"),
])
def test_train_checkpoint_relaunch_restore_is_exact(study_runs, layout, tp, pp, dp, dtype):
    proc, run_dir = study_runs[layout]
    assert json.loads((run_dir / "config.json").read_text())["model"]["dtype"] == dtype
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["world_size"] == tp * pp * dp
    for name in ("config.json", "plan.json", "ds_config.json", "launch.sh", "inventory.json", "runtime.json"):
        assert (run_dir / name).is_file(), name

    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "step4"
    for tag in ("step2", "step4"):
        written = {p.name for p in (ckpt / tag).iterdir() if p.name.endswith(".pt")}
        assert written == expected_files(tp, pp, dp, dtype)

    inventory = json.loads((run_dir / "inventory.json").read_text())
    layer_writers = {f["rank"] for f in inventory if f["kind"] == "layer"}
    dp_rank_zero = {r for r in range(tp * pp * dp) if (r // tp) % dp == 0}  # ranks ordered (pipe, data, model)
    assert layer_writers == dp_rank_zero, "layer files come from data-parallel rank 0 only"
    assert Counter(f["kind"] for f in inventory if f["tag"] == "step4")["optimizer"] == tp * pp * dp

    events = read_events(run_dir)
    rows = checkpoints(events)
    assert [r["tag"] for r in rows] == ["step2", "step4"]
    for row in rows:
        assert row["ranks"] == tp * pp * dp and row["files"] == len(expected_files(tp, pp, dp, dtype))
        assert 0 < row["stall_max_s"] <= row["durable_rank_max_s"] <= row["committed_s"]
        assert row["bytes"] == sum(f["bytes"] for f in inventory if f["tag"] == row["tag"] and f["kind"] != "other")
    info = restart(events)
    assert info["exact"] is True and info["tag"] == "step4"
    assert info["total_s"] > 0 and info["parts"].pop("convert") is None, "the run's own layout: no conversion"
    assert all(v is not None for v in info["parts"].values())
    assert "restore exact" in proc.stdout


def test_the_terminal_names_each_long_part_before_it_runs(study_runs):
    """A person watching reads what the run is doing before each part that grows with the model (tens of seconds
    each at 1B on a GPU): the model build, deepspeed.initialize, the engine's set-up, the proof's digests, the wait
    until durable with the manifest's checksums, the files' check before the relaunch's start-up, and the load."""
    proc, _ = study_runs["tp2pp2"]
    said = [line.split(" ", 2)[2] for line in proc.stdout.splitlines() if line.startswith("[restartbench]")]
    expected = ["train: 4 ranks up (gloo)", "train: model built; deepspeed.initialize",
                "train: DeepSpeed ready; setting up the torch engine",
                "train: checkpoint step2 -> ", "the proof's digest first",
                "train: checkpoint step2: waiting until durable, then its files' checksums for its manifest",
                "train: checkpoint step2 durable on every rank and committed",
                "restore: 4 ranks up (gloo)", "restore: checking step4's files against its manifest",
                "restore: model built; deepspeed.initialize", "restore: DeepSpeed ready; setting up the torch engine",
                "restore: loading step4 ",
                "restore: step4 loaded; the proof's digest of the restored state", "restore: resumed at iteration 5"]
    position = 0
    for phrase in expected:  # each in order, the digest's clause on the checkpoint's own line
        position = next((i for i in range(max(0, position - 1), len(said)) if phrase in said[i]), None)
        assert position is not None, f"{phrase!r} not said in order:\n" + "\n".join(said)
        position += 1


@pytest.mark.parametrize("layout", ["tp2pp2", "tp1pp1dp2"])
def test_parallel_run_computes_the_single_process_loss(study_runs, layout):
    """Iteration 1's loss on the real multi-rank run equals the same model's loss in one process (fp32)."""
    import torch
    from test_model_vs_transformers import our_stack

    from restartbench.data import micro_batches
    from restartbench.model import cross_entropy

    _, run_dir = study_runs[layout]
    plan = json.loads((run_dir / "plan.json").read_text())
    preset, dp, grad_accum = PRESETS["tiny"], plan["layout"]["dp"], plan["grad_accum"]
    model = our_stack(preset, seed=1234)
    with torch.no_grad():
        losses = [cross_entropy(model(tokens), labels).item()
                  for dp_rank in range(dp)
                  for tokens, labels in micro_batches(vocab_size=preset.vocab_size, seq_len=preset.seq_len,
                                                      micro_batch=1, grad_accum=grad_accum, step=1, dp_rank=dp_rank,
                                                      seed=1234)]
    measured = [e["loss"] for e in read_events(run_dir) if e["event"] == "train.iteration" and e["step"] == 1]
    assert measured and all(loss == pytest.approx(sum(losses) / len(losses), abs=1e-5) for loss in measured)


def test_the_proofs_digests_are_timed_spans_with_what_they_hashed(tiny_dp2_run):
    """Each save's state digest and the weights' after iteration K+1 are spans of their own (the harness's time,
    labelled), as the restore's verify is; before, a 1B run's 16 s digests were unlabelled gaps in its timeline."""
    for rank in (0, 1):
        spans = [e for e in read_events(tiny_dp2_run, "train", rank) if e["event"] == "proof.digest"]
        assert [(e["tag"], e["kind"]) for e in spans] == [("step1", "state"), ("step2", "state"),
                                                          ("after-step3", "module")]
        assert all(e["duration_s"] > 0 and e["digest_tensor_bytes"] > 0 and e["digest_hash_s"] > 0 for e in spans)
    verify = [e for e in last_attempt_events(tiny_dp2_run) if e["event"] == "restore.verify"]
    assert sorted(e["rank"] for e in verify) == [0, 1] and all(e["digest_tensor_bytes"] > 0 for e in verify)


def test_restore_with_no_complete_checkpoint_fails_clearly(tiny_dp2_run, tmp_path):
    run_dir = copy_run(tiny_dp2_run, tmp_path / "logs")
    (run_dir / "checkpoints" / "latest").unlink()
    for tag in ("step1", "step2"):
        (run_dir / "checkpoints" / tag / "manifest.json").unlink()
    records = sorted(p.name for p in (run_dir / "events").iterdir())
    result = relaunch(run_dir)
    assert result.returncode == 2 and "holds no committed checkpoint" in result.stdout, result.stdout
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == records, "nothing launched, nothing written"


def test_latest_is_a_pointer_not_the_only_truth(tiny_dp2_run, tmp_path):
    """Without 'latest', the restore names the committed checkpoints it found, and restores the newest under
    --on-corrupt fallback."""
    run_dir = copy_run(tiny_dp2_run, tmp_path / "logs")
    (run_dir / "checkpoints" / "latest").unlink()

    assert relaunch(run_dir).returncode != 0
    errors = [e for e in last_attempt_events(run_dir) if e["event"] == "phase.error"]
    assert errors and "the committed checkpoints here are step2, step1" in errors[0]["error"]
    result = relaunch(run_dir, "--on-corrupt", "fallback")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    restored = [e for e in last_attempt_events(run_dir) if e["event"] == "restore.result"]
    assert [(e["tag"], e["exact"], e["attempt"]) for e in restored] == [("step2", True, 3), ("step2", True, 3)]


def test_a_phase_past_its_timeout_is_killed_whole_and_the_run_marked_failed(tmp_path):
    """Rank 1 hangs before iteration 3 (rank 0 waits for it in the collective, up to --collective-timeout-s's 600 s),
    so the train phase cannot end before its 4 s: the test does not depend on how fast the machine runs a tiny phase
    (on 2026-12-07 the 2-core machine ran the whole tiny run in 7 s, and a timeout of 4 s alone no longer fired)."""
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", "--dtype", "fp32", "--phase-timeout-s", "4",
                              "--baseline-mib", "0", env={"RESTARTBENCH_FAULT": "hang-before-iteration:step=3:rank=1"})
    assert proc.returncode == 1
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "failed" and "timed out after 4 s" in meta["error"]
    leftovers = [p for p in psutil.process_iter(["pid", "cmdline"])  # this run's ranks
                 if p.pid not in before and str(run_dir.resolve()) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers, leftovers

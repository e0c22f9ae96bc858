"""--emulate: the checkpoint I/O of a big layout with a few CPU processes, through the chosen engine's own code,
read by the analysis like any run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_study

from restartbench import emulate, emulated_study, results, study
from restartbench.config import RunConfig, config_from_args
from restartbench.engines.lazy.emulate import LazyFiles
from restartbench.engines.lazy.format import read_header
from restartbench.plan import predict
from restartbench.rank_args import RankArgs, parse_rank_args

ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.016"  # 70B's widths x 0.016: hidden 128, about 250 MB per checkpoint in bf16


def events_of(run: Path) -> list[dict]:
    return [json.loads(line) for path in (run / "events").glob("*.jsonl") for line in path.read_text().splitlines()]


def assert_emulated_run(proc: subprocess.CompletedProcess, run: Path, engine: str, world_size: int) -> dict:
    """The run completed under ``<engine>-emulated``; every checkpoint's files are the prediction's for the engine,
    file by file (name, size, writing rank); every rank saved, was durable, loaded and restored exactly. Returns
    metadata.json."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run.parent.name == f"{engine}-emulated"  # never mixed with real runs of the engine
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["engine"] == f"{engine}-emulated"
    assert meta["world_size"] == world_size and meta["emulation"]["engine"] == engine
    cfg = RunConfig.load(run / "config.json")
    inventory = json.loads((run / "inventory.json").read_text())
    events = events_of(run)
    tags = sorted({f["tag"] for f in inventory if f["tag"]})
    assert tags
    for tag in tags:
        plan = predict(cfg, step=int(tag.removeprefix("step")), scale=cfg.emulation.emulate_scale)
        written = {f["path"]: (f["bytes"], f["rank"]) for f in inventory if f["tag"] == tag}
        assert written == {f.path: (f.bytes, f.rank) for f in plan.files}
        durable = [e for e in events if e["event"] == "checkpoint.durable" and e["tag"] == tag]
        assert sum(e["bytes"] for e in durable) == plan.checkpoint_bytes
        assert sorted(e["rank"] for e in durable) == list(range(world_size))
    assert meta["emulation"]["checkpoint_bytes"] == plan.checkpoint_bytes
    for name, phase in (("checkpoint.save", "train"), ("restore.load", "restore"), ("restore.result", "restore")):
        ranks = sorted(e["rank"] for e in events if e["event"] == name and e["phase"] == phase)
        assert ranks == sorted(list(range(world_size)) * (len(tags) if phase == "train" else 1)), name
    assert all(e["exact"] for e in events if e["event"] == "restore.result")
    for row in results.checkpoints(events):  # one clock per checkpoint: the commit follows every rank's durability
        assert row["committed_s"] >= row["durable_rank_max_s"] > 0, row
    return meta


def assert_summarized(logs: Path, out: Path, *expected: str) -> None:
    summary = subprocess.run([sys.executable, str(ROOT / "analysis" / "summarize.py"), str(logs), "--no-plots",
                              "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert all(text in summary.stdout for text in expected), summary.stdout[-3000:]
    assert "excluded" not in summary.stdout.lower() or "0 excluded" in summary.stdout.lower()


@pytest.mark.multirank
def test_70b_tp8pp8_emulated_by_two_processes(tmp_path):
    logs = tmp_path / "logs"
    proc, run = run_study(logs, "70B", "tp8pp8", "--emulate", "--emulate-scale", SCALE, "--ranks-per-process", "32",
                          "--iters", "1", "--save-interval", "1", "--baseline-mib", "0", timeout=900)
    meta = assert_emulated_run(proc, run, "torch", 64)
    emulation = meta["emulation"]
    assert emulation["processes"] == 2 and emulation["ranks_per_process"] == 32 and emulation["scale"] == 0.016
    assert emulation["emulated_model"]["hidden"] == 128 and "no model, optimizer or training step" in emulation["what"]
    assert emulation["full_scale_checkpoint_bytes"] > 900 * 2**30
    assert_summarized(logs, tmp_path / "summary", "torch-emulated", "tp8pp8dp1")


@pytest.mark.multirank
def test_70b_tp8pp4dp2_through_the_lazy_engine(tmp_path):
    """The lazy engine's own save and restore of 64 ranks in 2 processes: its files as predicted; every replica of
    a stage reads the model file data-parallel rank 0 wrote; the next step's wait for the copies is recorded."""
    logs = tmp_path / "logs"
    proc, run = run_study(logs, "70B", "tp8pp4dp2", "--emulate", "--engine", "lazy", "--emulate-scale", SCALE,
                          "--ranks-per-process", "32", "--iters", "1", "--save-interval", "1", "--baseline-mib", "0",
                          timeout=900)
    meta = assert_emulated_run(proc, run, "lazy", 64)
    assert "LazyEngine.save_captured" in meta["emulation"]["engine_io"]
    events = events_of(run)
    assert sorted(e["rank"] for e in events if e["event"] == "checkpoint.copy_wait") == list(range(64))
    assert {e["n_files"] for e in events if e["event"] == "restore.load"} == {2}  # model file and own optimizer file
    assert_summarized(logs, tmp_path / "summary", "lazy-emulated", "tp8pp4dp2")


@pytest.mark.multirank
@pytest.mark.parametrize("engine, layout", [("dcp", "tp1pp1dp2"),  # the module deduplicated across replicas
                                            ("dcp-async", "tp1pp2")])
def test_7b_through_dcp(tmp_path, engine, layout):
    logs = tmp_path / "logs"
    proc, run = run_study(logs, "7B", layout, "--emulate", "--engine", engine, "--emulate-scale", "0.02",
                          "--iters", "1", "--save-interval", "1", "--baseline-mib", "0", timeout=900)
    assert_emulated_run(proc, run, engine, 2)
    assert_summarized(logs, tmp_path / "summary", f"{engine}-emulated")


def rank_args(run_dir: Path, phase: str) -> RankArgs:
    return parse_rank_args(["--run-dir", str(run_dir), "--phase", phase], "an emulating process")


def test_lazy_emulator_restores_every_rank_exactly_and_names_a_changed_byte(tmp_path):
    """In this process, no launch: four ranks (two stages, two replicas each) saved and restored through the lazy
    engine's own code; after one byte of a model file changes, the replica that reads it names the tensor."""
    cfg = config_from_args(["7B", "tp1pp2dp2", "--emulate", "--engine", "lazy", "--emulate-scale", "0.02",
                            "--ranks-per-process", "4", "--iters", "1", "--logs", str(tmp_path / "logs")])
    plan = emulated_study.plan_emulation(cfg)
    run_dir = study.prepare_run_dir(cfg, plan, emulated_study.render(cfg, plan))
    saver = LazyFiles(emulate.EmulatedRanks(rank_args(run_dir, "train")))
    for rank in range(4):
        saver.save(rank, saver.stage(rank, 1), "step1")
        saver.next_step(rank, "step1")
        saver.wait_until_durable(rank)
    written = {Path(r.path).name: r.bytes for rank in range(4) for r in saver.written(rank)}
    assert written == {Path(f.path).name: f.bytes for f in predict(cfg, step=1, scale=0.02).files}

    loader = LazyFiles(emulate.EmulatedRanks(rank_args(run_dir, "restore")))

    def restore(rank: int) -> list[str]:
        held = loader.hold(rank, 1)
        read, restored = loader.load(rank, "step1", held)
        assert len(read) == 2
        return loader.compare(rank, 1, held, restored)

    assert [restore(rank) for rank in range(4)] == [[]] * 4
    model = Path(plan.checkpoint_dir) / "step1" / "model_pp01_tp00.lazy"
    header, data_offset = read_header(model)
    first = header["tensors"][0]
    with open(model, "r+b") as handle:
        handle.seek(data_offset + first["offset"])
        byte = handle.read(1)
        handle.seek(data_offset + first["offset"])
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert restore(3) == [f"model_pp01_tp00.lazy: {first['name']} differs after the restore"]  # stage 1, replica 1


def test_dry_run_prints_the_emulation_and_writes_nothing(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "70B", "tp8pp8", "--emulate",
                          "--emulate-scale", SCALE, "--ranks-per-process", "16", "--dry-run", "--logs", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "64 ranks in 4 processes" in out.stdout and "-m restartbench.emulate " in out.stdout
    assert "--nproc-per-node 4" in out.stdout and not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (("--ranks-per-process", "3"), "do not split into processes"),
    (("--emulate-scale", "0"), "--emulate-scale must be above 0 and at most 1 (got 0.0)"),
    (("--engine", "torchsnapshot"), "engine 'torchsnapshot' is not emulated: TorchSnapshot's save is not emulated "
                                    "yet; run it for real without --emulate; --emulate runs the checkpoint I/O of "
                                    "--engine torch, dcp, dcp-async, lazy"),
    (("--engine", "dcp-async", "--ranks-per-process", "2"), "needs --ranks-per-process 1"),
    (("--engine", "lazy", "--dp-read-once"), "--dp-read-once is not emulated"),
])
def test_bad_emulation_options_are_refused(tmp_path, argv, message):
    out = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--emulate", *argv,
                          "--logs", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and message in out.stdout + out.stderr
    assert not any(tmp_path.iterdir())


def test_every_ranks_state_is_staged_before_the_barrier_and_none_between_two_saves(monkeypatch):
    """A process emulating several ranks builds all their states before the checkpoint's barrier: a state built
    between two ranks' saves would count in the checkpoint's durable time (first save's start to last rank durable),
    and a process still staging would start its saves after the others."""
    import contextlib

    import torch.distributed as dist

    calls = []

    class Log:
        def span(self, *args, **kwargs):
            return contextlib.nullcontext()

    class Ranks:
        ranks, logs, store, engine = [3, 4], {3: Log(), 4: Log()}, None, "x"
        plan = type("Plan", (), {"checkpoint_bytes_estimate": 0})
        cfg = type("Cfg", (), {"storage": type("Storage", (), {"keep_checkpoints": 0}),
                               "train": type("Train", (), {"iters": 2, "save_interval": 2})})  # one checkpoint

        def say(self, message):
            calls.append("say")

    class Emulator:
        def stage(self, rank, step):
            calls.append(f"stage {rank}")
            return f"state {rank}"

        def save(self, rank, staged, tag):
            calls.append(f"save {rank} {staged}")

        def next_step(self, rank, tag):
            pass

        wait_until_durable = written = next_step  # bound by the save, never called: durable_share is a stand-in

    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(emulate.harness, "begin_save", lambda *args, **kwargs: None)
    monkeypatch.setattr(emulate.harness, "durable_share", lambda *args, **kwargs: None)
    monkeypatch.setattr(emulate.harness, "settle", lambda *args, **kwargs: [])
    emulate.train_phase(Ranks(), Emulator())
    assert calls == ["say", "stage 3", "stage 4", "barrier", "save 3 state 3", "save 4 state 4", "say"]

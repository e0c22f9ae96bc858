"""restartbench.plan: every file of a checkpoint predicted without running, held to real runs file by file."""

import json
import math
import os
import subprocess
import sys
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import ENGINE_CASES, STUDY_CASES

from restartbench import engines
from restartbench.config import RunConfig
from restartbench.engines.dcp import predict as dcp_predict
from restartbench.engines.dcp.predict import tensor_saved_size
from restartbench.engines.deepspeed.predict import deepspeed_files, fastpersist_writers
from restartbench.engines.torchsnapshot.predict import (
    random_names_as_placeholders,
    snapshot_request_bytes,
    snapshot_requests,
)
from restartbench.plan import (
    NOT_PREDICTED,
    PLAN_CACHE,
    PREDICTORS,
    CheckpointPlan,
    cached_bytes,
    checkpoint_bytes,
    predict,
    setup_for,
)
from restartbench.presets import get_preset
from restartbench.shards import ZeroOptimizer, scaled_preset, shard_files, zero_partition
from restartbench.sizes import PlannedFile, materialize, payload_bytes, saved_size

ROOT = Path(__file__).resolve().parent.parent

def config(preset: str, layout: str, dtype: str = "bf16", engine: str = "torch", **train) -> RunConfig:
    cfg = RunConfig()
    cfg.model.preset, cfg.layout.layout, cfg.model.dtype, cfg.engine.engine = preset, layout, dtype, engine
    for name, value in train.items():
        setattr(cfg.train, name, value)
    return cfg


@pytest.fixture(autouse=True)
def plan_cache_in_tmp(tmp_path, monkeypatch):
    """checkpoint_bytes keeps predictions between processes (``PLAN_CACHE``): here it starts empty, so that no test
    compares a prediction with a stored copy of itself."""
    monkeypatch.setenv(PLAN_CACHE, str(tmp_path / "plan-cache"))
    cached_bytes.cache_clear()
    yield
    cached_bytes.cache_clear()


# Every stored real run (tests/data/real_runs, made by its make.py): DeepSpeed's default engine in the suite's study
# layouts, then one run per other engine: (engine, layout, dtype, extra options).
REAL_RUN_CASES = ([("torch", layout, dtype, extra) for layout, dtype, extra in STUDY_CASES]
                  + [(engine, layout, dtype, ()) for engine, layout, dtype in ENGINE_CASES])
REAL_RUNS = Path(__file__).resolve().parent / "data" / "real_runs"
STORED_FILES = ("config.json", "inventory.json", "durable.json", "plan.json")


def real_run_name(engine: str, layout: str, dtype: str) -> str:
    return f"{engine}-{layout}-{dtype}"


STORED_RUNS = [real_run_name(*case[:3]) for case in REAL_RUN_CASES]


def stored_parts(run: Path) -> dict[str, Any]:
    """``STORED_FILES`` of a run folder: its config and inventory, the durable bytes per tag and rank from its
    ``checkpoint.durable`` events, and from plan.json the device it ran on and the pre-launch estimate (what
    tests/data/real_runs keeps of a run)."""
    durable: dict[str, dict[str, int]] = {}
    for path in sorted((run / "events").glob("train-rank*.jsonl")):
        for event in map(json.loads, path.read_text().splitlines()):
            if event["event"] == "checkpoint.durable":
                durable.setdefault(event["tag"], {})[str(event["rank"])] = event["bytes"]
    plan = json.loads((run / "plan.json").read_text())
    return {"config.json": RunConfig.load(run / "config.json").to_dict(),  # the run folder named where it is
            "inventory.json": json.loads((run / "inventory.json").read_text()),
            "durable.json": {tag: dict(sorted(ranks.items(), key=lambda item: int(item[0])))
                             for tag, ranks in sorted(durable.items())},
            "plan.json": {key: plan[key] for key in ("device", "checkpoint_bytes_estimate")}}


def stored_run(name: str) -> dict[str, Any]:
    return {part: json.loads((REAL_RUNS / name / part).read_text()) for part in STORED_FILES}


def allowed_difference(plan: CheckpointPlan, device: str) -> int:
    """Bytes a file of a run on ``device`` may differ from its prediction by: 0 on a CPU run, whatever the engine, where
    the plan's pickles are the run's byte for byte (torch.save's data.pkl, DCP's pickled entries); on a GPU the engine's
    stated tolerance (``SIZE_TOLERANCE_BYTES`` says what the device changes in DeepSpeed's optimizer files)."""
    return 0 if device == "cpu" else plan.tolerance_bytes


def assert_files_as_predicted(run: dict[str, Any]) -> None:
    """Both checkpoints of a run (``stored_parts``): the same file names (random parts aside), each written by the
    predicted rank with the predicted size (``allowed_difference``); each rank's durable bytes agree, and the first
    checkpoint's bytes are plan.json's pre-launch estimate and the disk check's figure; the files at the checkpoint
    folder's root are DeepSpeed's scripts as predicted."""
    cfg = RunConfig.from_dict(run["config.json"])
    cfg.launch.device = run["plan.json"]["device"]  # as the run resolved it (auto: cuda on a machine with a GPU)
    written = [f for f in run["inventory.json"] if f["tag"]]
    assert sorted({f["tag"] for f in written}) == ["step2", "step4"] == sorted(run["durable.json"])
    for tag in ("step2", "step4"):
        plan = predict(cfg, step=int(tag.removeprefix("step")))
        slack = allowed_difference(plan, cfg.launch.device)
        real = sorted((random_names_as_placeholders(f["path"]), f["rank"], f["bytes"]) for f in written
                      if f["tag"] == tag)
        predicted = sorted((f.path, f.rank, f.bytes) for f in plan.files)
        assert [r[:2] for r in real] == [p[:2] for p in predicted]
        for (path, _, size), (_, _, expected) in zip(real, predicted):
            assert abs(size - expected) <= slack, (path, size, expected)
        durable = {int(rank): size for rank, size in run["durable.json"][tag].items()}
        for rank, expected in plan.per_rank_bytes().items():
            assert abs(durable.get(rank, 0) - expected) <= slack * len(plan.rank_files(rank)), (tag, rank)
    first = sum(f["bytes"] for f in written if f["tag"] == "step2")
    assert abs(run["plan.json"]["checkpoint_bytes_estimate"] - first) <= slack * len(plan.files)
    assert abs(checkpoint_bytes(cfg) - first) <= slack * len(plan.files)
    roots = {f["path"]: f["bytes"] for f in run["inventory.json"] if not f["tag"]}
    assert {name: roots[name] for name in plan.root_files} == plan.root_files


# -- against the stored real runs: no launch -------------------------------------------------------------------


def test_a_real_run_is_stored_for_every_case():
    assert sorted(path.parent.name for path in REAL_RUNS.glob("*/config.json")) == sorted(STORED_RUNS)
    unheld = {name for name, p in PREDICTORS.items() if p.held_to != "real runs"}
    assert unheld == {"datastates"}, "CUDA only: held to DataStates' own layout code until a GPU visit stores a run"
    assert {case[0] for case in REAL_RUN_CASES} == set(PREDICTORS) - {"none"} - unheld


@pytest.mark.parametrize("name", STORED_RUNS)
def test_stored_real_runs_files_as_predicted(name):
    assert_files_as_predicted(stored_run(name))


GPU_RUNS = Path(__file__).resolve().parent / "data" / "gpu_runs"


def test_the_first_gpu_runs_files_are_as_predicted_within_the_stated_64_bytes():
    """The 64 B GPU tolerance of torch's predictor was reasoned (zip record alignment), not measured, until the first
    H100 visit: 1B tp1pp1 bf16, 21 files of step2, every name and writer as predicted, 20 sizes exact and the
    optimizer file 64 B over (the durable bytes and the pre-launch estimate with it). Exactly the tolerance: a
    smaller one would fail here."""
    run = {part: json.loads((GPU_RUNS / "torch-1B-tp1pp1-bf16-h100" / part).read_text()) for part in STORED_FILES}
    cfg = RunConfig.from_dict(run["config.json"])
    cfg.launch.device = run["plan.json"]["device"]
    plan = predict(cfg, step=2)
    real = sorted((f["path"], f["rank"], f["bytes"]) for f in run["inventory.json"] if f["tag"] == "step2")
    predicted = sorted((f.path, f.rank, f.bytes) for f in plan.files)
    assert [r[:2] for r in real] == [p[:2] for p in predicted] and len(real) == 21
    differences = {path: size - expected for (path, _, size), (_, _, expected) in zip(real, predicted)
                   if size != expected}
    assert differences == {"step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 64} == {
        path: plan.tolerance_bytes for path in differences}
    assert run["durable.json"]["step2"]["0"] - sum(f.bytes for f in plan.files) == 64
    assert run["durable.json"]["step2"]["0"] - run["plan.json"]["checkpoint_bytes_estimate"] == 64


@pytest.mark.parametrize("name, estimate_over", [
    ("dcp-async-1B-tp1pp1-bf16-h100", 0), ("lazy-1B-tp1pp1-bf16-h100-second-visit", 0),
    ("dcp-1B-tp1pp1-bf16-h100-third-visit", 64), ("lazy-direct-1B-tp1pp1-bf16-h100-third-visit", 0)])
def test_the_gpu_visits_1b_files_are_predicted_byte_for_byte(name, estimate_over):
    """The second and third H100 visits' 1B runs (2026-11-27), all restored exactly: dcp-async's and dcp's two files
    (their ``.metadata`` pickles the checkpoint folder's path, the run's own here) and lazy's two, buffered and with
    --lazy-direct-io, each as predicted to the byte, as their stated tolerance of 0 says; the durable bytes of step2
    are their sum. So is the pre-launch estimate the run made, but for dcp's: made before ``dcp_save_files`` took
    the tensors smallest first on CUDA, as dcp.save writes them there, it is 64 bytes over (its ``.metadata``)."""
    run = {part: json.loads((GPU_RUNS / name / part).read_text()) for part in STORED_FILES}
    cfg = RunConfig.from_dict(run["config.json"])
    cfg.launch.device = run["plan.json"]["device"]
    plan = predict(cfg, step=2)
    real = sorted((f["path"], f["rank"], f["bytes"]) for f in run["inventory.json"] if f["tag"] == "step2")
    assert plan.tolerance_bytes == 0 and len(real) == 2
    assert real == sorted((f.path, f.rank, f.bytes) for f in plan.files)
    assert run["durable.json"]["step2"]["0"] == sum(r[2] for r in real)
    assert run["plan.json"]["checkpoint_bytes_estimate"] - sum(r[2] for r in real) == estimate_over


@pytest.mark.parametrize("name", ["torch-small-tp1pp1-bf16-h100", "lazy-small-tp1pp1-bf16-h100"])
def test_the_first_gpu_smoke_runs_files_are_as_predicted(name):
    """The first H100 visit's smoke runs (small tp1pp1 bf16 on cuda, saves at steps 2 and 4), held to their engine's
    stated tolerance on a GPU: torch's within 64 B (its optimizer file is 64 B over, as at 1B), lazy's byte for byte
    (tolerance 0: its prediction writes the header with the device the state lives on, as the run does)."""
    assert_files_as_predicted({part: json.loads((GPU_RUNS / name / part).read_text()) for part in STORED_FILES})


def test_the_first_gpu_visits_lazy_1b_files_are_predicted_byte_for_byte():
    """Lazy's 1B run of the first H100 visit never finished (the visit's time ran out in its restore), so it has no
    inventory: its files are those its durable events recorded at steps 1 and 2, each as predicted to the byte, and
    the pre-launch estimate is the first checkpoint's bytes."""
    folder = GPU_RUNS / "lazy-1B-tp1pp1-bf16-h100"
    cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    launched = json.loads((folder / "plan.json").read_text())
    cfg.launch.device = launched["device"]
    written = json.loads((folder / "durable-files.json").read_text())
    assert sorted(written) == ["step1", "step2"]
    for tag, files in written.items():
        plan = predict(cfg, step=int(tag.removeprefix("step")))
        assert plan.tolerance_bytes == 0 and len(files) == 2
        assert sorted((f["path"], f["rank"], f["bytes"]) for f in files) == sorted(
            (f.path, f.rank, f.bytes) for f in plan.files)
    assert launched["checkpoint_bytes_estimate"] == sum(f["bytes"] for f in written["step1"]) == 20_978_831_360


# -- against fresh real runs, today's engines: the session's (torch: tp2pp2 fp32, pp2dp2 bf16, tp1pp1dp2 fp32) and
# one per engine ---------------------------------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["tp2pp2", "pp2dp2", "tp1pp1dp2"])
def test_every_file_name_size_and_writer_as_predicted(study_runs, layout):
    proc, run = study_runs[layout]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(stored_parts(run))


@pytest.mark.multirank
@pytest.mark.parametrize("engine", [pytest.param(case[0], marks=pytest.mark.deepspeed_ops)
                                    if case[0] in ("fastpersist", "decoupled") else case[0] for case in ENGINE_CASES])
def test_every_engines_files_as_predicted(engine_runs, engine):
    proc, run = engine_runs(engine)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(stored_parts(run))


def test_every_engine_is_predicted_or_says_why_not():
    assert set(PREDICTORS) | set(NOT_PREDICTED) == set(engines.engine_names())
    assert not set(PREDICTORS) & set(NOT_PREDICTED)
    assert {name: p.tolerance_bytes for name, p in PREDICTORS.items()} == {
        "none": 0, "torch": 64, "fastpersist": 64, "lazy": 0, "dcp": 0, "dcp-async": 0, "torchsnapshot": 0,
        "datastates": 0}


# -- without processes ------------------------------------------------------------------------------------------


def test_names_follow_deepspeeds_rules():
    plan = predict(config("tiny", "tp2pp2dp2", "bf16"))
    names = {f.path.split("/")[1] for f in plan.files}
    layer_writers = {f.rank for f in plan.files if f.kind == "layer"}
    # data-parallel rank 0 of each stage and tensor rank (ranks pipe·4 + dp·2 + tp)
    assert layer_writers == {0, 1, 4, 5}
    assert {f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in range(7) for t in range(2)} <= names
    assert {f"mp_rank_{m:02d}_model_states.pt" for m in range(4)} <= names
    assert {f"bf16_zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(2) for m in range(4)} <= names
    assert len(names) == 14 + 4 + 8 and len(plan.files) == 26
    fp32 = predict(config("tiny", "tp2pp2dp2", "fp32"))
    assert {f.path.split("/")[1] for f in fp32.files if f.kind == "optimizer"} == {
        f"zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(2) for m in range(4)}


def test_zero1_partitions_pad_to_twice_dp():
    assert zero_partition(10, dp=4, dp_rank=0) == (0, 4, 0)
    assert zero_partition(10, dp=4, dp_rank=2) == (8, 4, 2)
    assert zero_partition(10, dp=4, dp_rank=3) == (12, 4, 4)
    assert zero_partition(12, dp=3, dp_rank=2) == (8, 4, 0)


def test_predicted_sizes_equal_real_torch_saves_of_the_same_state(tmp_path):
    """dp3 leaves padding in the last partition (saved as a slice of the padded storage): every file of the plan,
    written for real with random data, has exactly the predicted size and payload."""
    cfg = config("tiny", "tp2pp1dp3", "bf16")
    plan = {f.path: f for f in predict(cfg).files}
    shards = shard_files(setup_for(cfg))
    assert any(s.state.get("optimizer_state_dict", {}).get("group_paddings", [0])[0] for s in shards)
    for shard in shards:
        state = materialize(shard.state, lambda numel, dtype: torch.rand(numel).to(dtype))
        path = tmp_path / shard.path
        path.parent.mkdir(exist_ok=True)
        torch.save(state, path)
        assert path.stat().st_size == plan[shard.path].bytes, shard.path
        assert payload_bytes(state) == plan[shard.path].payload_bytes
        loaded = torch.load(path, weights_only=False)
        assert json.dumps(_shapes(loaded)) == json.dumps(_shapes(state))


class HostTierStandIn:
    """What DataStates-LLM's compiled engine does with the tensors ``save_background`` hands it, for its Python
    layout code to run without CUDA: ``async_save`` checks each tensor as its ``CkptEngine`` does
    (datastates/ckpt/ckpt_engine.py lines 20-29) and queues it; ``flush`` writes each one's bytes at its offset of
    the file, as the host tier's thread does later (tiers/host_tier.cpp lines 35-55: the file opened in and out,
    seek, write). It stands in for the copies and the writes, not for the layout: that is DataStates' own code."""

    def __init__(self):
        self.queued = []

    def async_save(self, tensors):
        for _version, tensor, file_offset, path in tensors:
            assert tensor.numel() * tensor.element_size() > 0, "Tensor size should be > 0"
            self.queued.append((tensor, file_offset, path))

    def flush(self):
        for tensor, file_offset, path in self.queued:
            with open(path, "r+b") as handle:
                handle.seek(file_offset)
                handle.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        self.queued = []


@pytest.fixture
def datastates_checkpointing(monkeypatch):
    """DataStates-LLM's ``Checkpointing`` from its vendored source (third_party/datastates-llm), without its
    ``__init__`` (which needs CUDA and the compiled engine), on ``HostTierStandIn``."""
    for name in [name for name in sys.modules if name == "datastates" or name.startswith("datastates.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(ROOT / "third_party" / "datastates-llm"))
    monkeypatch.setitem(sys.modules, "datastates.ckpt", SimpleNamespace(CkptEngine=None))
    from datastates.llm.checkpointing import Checkpointing
    from datastates.utils import get_logger

    checkpointing = Checkpointing.__new__(Checkpointing)
    checkpointing.ckpt_engine, checkpointing.last_ckpt_version = HostTierStandIn(), -1
    checkpointing.logger = get_logger("datastates-under-test")
    checkpointing.executor = ThreadPoolExecutor(1)  # its __del__ shuts it down; save_background is called directly
    return checkpointing


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")  # DataStates' load, torch.frombuffer
def test_datastates_files_are_laid_out_as_datastates_own_code_lays_them_out(tmp_path, datastates_checkpointing):
    """Every file of a plan (tiny tp2pp1dp3 bf16: padded partitions, DeepSpeed's objects in the states), its state
    materialized with random data and saved by DataStates-LLM's own ``save_background``: the predicted size to the
    byte, and DataStates' own ``load`` gives every tensor back."""
    cfg = config("tiny", "tp2pp1dp3", "bf16", engine="datastates")
    plan = {f.path: f for f in predict(cfg).files}
    shards = shard_files(setup_for(cfg))
    assert plan.keys() == {s.path for s in shards}
    for shard in shards:
        state = materialize(shard.state, lambda numel, dtype: torch.rand(numel).to(dtype))
        path = tmp_path / shard.path
        path.parent.mkdir(exist_ok=True)
        datastates_checkpointing.save_background(state, str(path))
        datastates_checkpointing.ckpt_engine.flush()
        assert path.stat().st_size == plan[shard.path].bytes, shard.path
        loaded = datastates_checkpointing.load(str(path))
        assert json.dumps(_shapes(loaded)) == json.dumps(_shapes(state)), shard.path
        assert all(torch.equal(a, b) for a, b in zip(_tensors_of(loaded), _tensors_of(state), strict=True))


def test_datastates_layout_refuses_what_datastates_refuses():
    from restartbench.engines.deepspeed.predict import datastates_layout

    with pytest.raises(ValueError, match="'optimizer|m' has no element.*Tensor size should be > 0"):
        datastates_layout({"optimizer": {"m": torch.empty(0)}}, "x.pt")
    with pytest.raises(ValueError, match="tuple at 'pair' holds a tensor"):
        datastates_layout({"pair": (torch.ones(2), 1)}, "x.pt")
    assert datastates_layout({"w": torch.ones(3, dtype=torch.bfloat16), "n": 1})[0] == 6


def _tensors_of(item):
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, dict):
        return [t for v in item.values() for t in _tensors_of(v)]
    if isinstance(item, list):
        return [t for v in item for t in _tensors_of(v)]
    return []


def _shapes(item):
    if isinstance(item, torch.Tensor):
        return [list(item.shape), str(item.dtype)]
    if isinstance(item, dict):
        return {str(k): _shapes(v) for k, v in item.items()}
    if type(item) in (list, tuple):
        return [_shapes(v) for v in item]
    return repr(item)


def test_70b_payload_is_the_model_and_adam_state():
    """Layer files hold every tensor shard once in bf16; optimizer files 12 bytes per parameter of each stage's
    flat buffer (padded to 2·dp) plus Adam's step; the checkpoint is the DLIO estimate plus replicated norms."""
    preset = get_preset("70B")
    plan = predict(config("70B", "tp8pp4dp2"))
    totals = plan.totals()
    assert (totals["by_kind"]["layer"]["files"], totals["by_kind"]["model"]["files"],
            totals["by_kind"]["optimizer"]["files"]) == (8 * (preset.layers + 3), 4 * 8, 64)
    norms = (2 * preset.layers + 1) * preset.hidden * (8 - 1)  # replicated on every tensor rank
    layer_payload = sum(f.payload_bytes for f in plan.files if f.kind == "layer")
    assert layer_payload == 2 * (preset.param_count() + norms)
    optimizer_payload = sum(f.payload_bytes for f in plan.files if f.kind == "optimizer")
    assert 0 <= optimizer_payload - 12 * (preset.param_count() + norms) - 4 * 64 <= 12 * 4 * 32 * 4
    assert totals["overhead_bytes"] < 1e-5 * totals["checkpoint_bytes"]
    assert totals["per_rank_max_bytes"] == max(plan.per_rank_bytes().values())


def test_scaled_preset_keeps_the_layout_valid():
    preset = scaled_preset(get_preset("70B"), 0.016, tp=8)
    assert (preset.layers, preset.heads, preset.kv_heads) == (80, 64, 8)
    assert preset.hidden % (2 * preset.heads) == 0 and preset.ffn_hidden % 8 == 0 and preset.vocab_size % 8 == 0
    assert scaled_preset(get_preset("70B"), 1.0, tp=8) == get_preset("70B")


def plan_cli(*argv: str) -> str:
    out = subprocess.run([sys.executable, "-m", "restartbench.plan", *argv], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def first_checkpoint(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in run["inventory.json"] if f["tag"] == "step2"]


def test_cli_prints_a_real_runs_files_per_rank_and_totals():
    """The CLI's text and JSON for the settings of two stored real runs: every figure is the run's own."""
    files = first_checkpoint(stored_run("torch-pp2dp2-bf16"))
    text = plan_cli("tiny", "pp2dp2", "--dtype", "bf16", "--device", "cpu")
    lines = text.splitlines()
    assert {line.split()[0]: line.split()[-1] for line in lines if line.startswith("  ")} == {
        f["path"]: f"{f['bytes']:,}" for f in files}
    ranks = sorted({f["rank"] for f in files})
    per_rank = {rank: [f["bytes"] for f in files if f["rank"] == rank] for rank in ranks}
    assert all(f"rank {rank}: {len(sizes)} files, {sum(sizes):,} B" in lines for rank, sizes in per_rank.items())
    busiest = max(ranks, key=lambda rank: sum(per_rank[rank]))
    assert f"checkpoint: {sum(f['bytes'] for f in files):,} B" in text and "within 64 B" in text
    assert f"per rank: max {sum(per_rank[busiest]):,} B (rank {busiest})" in text
    dcp = stored_run("dcp-tp1pp1dp2-bf16")
    plan = json.loads(plan_cli("tiny", "tp1pp1dp2", "--engine", "dcp", "--dtype", "bf16", "--device", "cpu",
                               "--run-dir", dcp["config.json"]["paths"]["run_dir"], "--json"))
    files = first_checkpoint(dcp)
    assert sorted((f["path"], f["rank"], f["bytes"]) for f in plan["files"]) == sorted(
        (f["path"], f["rank"], f["bytes"]) for f in files)
    data = [f["bytes"] for f in files if f["path"].endswith(".distcp")]
    assert plan["totals"]["by_kind"] == {"data": {"files": len(data), "bytes": sum(data)},
                                         "metadata": {"files": 1, "bytes": sum(f["bytes"] for f in files) - sum(data)}}
    refused = plan_cli("tiny", "tp2pp2", "--engine", "decoupled")
    assert "not predicted" in refused and "non-leaf" in refused


def test_engines_without_files_or_prediction():
    assert predict(config("tiny", "pp2dp2", engine="none")).files == []
    assert checkpoint_bytes(config("tiny", "pp2dp2", "fp32", engine="decoupled")) == \
        checkpoint_bytes(config("tiny", "pp2dp2", "fp32"))


def test_torchsnapshot_on_a_gpu_batches_adams_step_apart():
    """TorchSnapshot batches CPU and GPU tensors apart, and torch.optim keeps Adam's step on the CPU: on a GPU run
    each rank writes one batch file more than on CPU (not checked against a GPU run here)."""
    files = {}
    for device in ("cpu", "cuda"):
        cfg = config("tiny", "tp1pp1dp2", engine="torchsnapshot")
        cfg.launch.device = device
        files[device] = Counter(f.kind for f in predict(cfg).files)
    assert files["cuda"]["data"] == files["cpu"]["data"] + 2


def test_plan_cache_gives_back_the_prediction(tmp_path, monkeypatch):
    from restartbench import plan

    monkeypatch.setenv(plan.PLAN_CACHE, str(tmp_path))
    plan.cached_bytes.cache_clear()
    cfg = config("tiny", "pp2dp1", "fp32", engine="dcp")
    computed = checkpoint_bytes(cfg)
    assert len(list(tmp_path.glob("*.json"))) == 1
    plan.cached_bytes.cache_clear()
    monkeypatch.setattr(plan, "predict", lambda *a, **k: pytest.fail("the cached prediction was not used"))
    assert checkpoint_bytes(cfg) == computed
    plan.cached_bytes.cache_clear()


def test_docs_plan_md_is_what_the_generator_writes():
    """docs/plan.md is `python -m restartbench.plan --all-presets > docs/plan.md`; its tiny sections, their universal
    checkpoints' rows and its lazy engine section, regenerated here (the rest takes longer), must be in it verbatim: a
    stale document fails."""
    from restartbench.plan import DOC_LAYOUTS, ENGINE_DOC_CASE, doc_config, render_markdown, universal_row

    doc = (ROOT / "docs" / "plan.md").read_text()
    assert "python -m restartbench.plan --all-presets --layouts " + ",".join(DOC_LAYOUTS) in doc
    for layout in ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2"):
        assert render_markdown(predict(config("tiny", layout))) in doc, f"regenerate docs/plan.md ({layout})"
        cfg = doc_config("tiny", layout, "bf16", "torch")
        assert universal_row(cfg, predict(cfg)) in doc[doc.index("## Universal checkpoints"):], layout
    engines_section = doc[doc.index("## Engines: " + " ".join(ENGINE_DOC_CASE)):]
    assert render_markdown(predict(doc_config(*ENGINE_DOC_CASE, "bf16", "lazy"))) in engines_section
    assert all(f"| {engine} |" in engines_section for engine in PREDICTORS)
    assert all(f"- {engine}: {why}" in engines_section for engine, why in NOT_PREDICTED.items())


def test_70b_tp8pp8_puts_10_of_the_80_decoder_layers_on_each_of_8_stages():
    """DeepSpeed's type:DecoderLayerPipe partition; names and writers only (sizes are not computed: fast)."""
    files = shard_files(setup_for(config("70B", "tp8pp8")))
    stages: dict[int, set[int]] = {}
    for f in files:
        if f.kind == "layer":  # layer_XX-model_YY: rank = stage·8 + tensor rank (dp 1)
            stages.setdefault(f.rank // 8, set()).add(int(f.path.split("/")[1][len("layer_"):][:2]))
    assert sorted(i for layers in stages.values() for i in layers) == list(range(83))  # embedding, 80, norm, head
    assert {s: len(layers - {0, 81, 82}) for s, layers in stages.items()} == {s: 10 for s in range(8)}
    assert 0 in stages[0] and {81, 82} <= stages[7]
    kinds = [f.kind for f in files]
    assert (kinds.count("layer"), kinds.count("model"), kinds.count("optimizer")) == (83 * 8, 64, 64)


def test_a_layout_that_does_not_fit_surfaces_the_layout_message(capsys):
    from restartbench.plan import main

    assert main(["70B", "tp3pp4"]) == 2
    err = capsys.readouterr().err
    assert "layout tp3pp4dp1 does not fit 70B" in err and "not divisible by tp=3" in err


# -- each file's writer, kind and payload against hand-computed values, DeepSpeed's and TorchSnapshot's own objects --


def tiny_numel() -> dict[str, int]:
    """Parameters of the tiny preset on one tensor rank, counted by hand from its widths: the embedding and the head
    vocabulary × hidden; each decoder layer two norms, q and o hidden², k and v hidden × (hidden · kv_heads / heads),
    gate, up and down hidden × ffn; the final norm hidden."""
    p = get_preset("tiny")
    kv = p.hidden * p.kv_heads // p.heads
    layer = 2 * p.hidden + 2 * p.hidden ** 2 + 2 * p.hidden * kv + 3 * p.hidden * p.ffn_hidden
    table = p.vocab_size * p.hidden
    return {"embedding": table, "layer": layer, "norm": p.hidden, "head": table,
            "all": 2 * table + p.layers * layer + p.hidden, "layers": p.layers}


def test_plan_totals_and_json_hold_every_file_as_given():
    files = [PlannedFile("step2/a", 0, "layer", 100, 164), PlannedFile("step2/b", 1, "optimizer", 300, 420),
             PlannedFile("step2/c", 1, "model", 0, 50), PlannedFile("step2/d", 2, "layer", 10, 70)]
    plan = CheckpointPlan("tiny", "tp1pp1dp4", "bf16", "torch", "step2", 4, files, {"zero_to_fp32.py": 7}, 0.5, 64,
                          "a note")
    totals = {"checkpoint_bytes": 704, "payload_bytes": 410, "overhead_bytes": 294, "files": 4,
              "per_rank_max_bytes": 470, "per_rank_max_rank": 1, "per_rank_min_bytes": 0,  # rank 3 writes nothing
              "by_kind": {"layer": {"files": 2, "bytes": 234}, "model": {"files": 1, "bytes": 50},
                          "optimizer": {"files": 1, "bytes": 420}}, "root_files": {"zero_to_fp32.py": 7}}
    assert plan.totals() == totals
    as_json = json.loads(json.dumps(plan.to_dict()))
    assert as_json == {"preset": "tiny", "layout": "tp1pp1dp4", "dtype": "bf16", "engine": "torch", "tag": "step2",
                       "world_size": 4, "scale": 0.5, "tolerance_bytes": 64, "note": "a note",
                       "held_to": "real runs", "totals": totals,
                       "files": [{"path": f.path, "rank": f.rank, "kind": f.kind, "payload_bytes": f.payload_bytes,
                                  "bytes": f.bytes} for f in files]}


def test_scaled_preset_rounds_each_width_and_refuses_scales_outside_0_to_1():
    # 8192 · 0.016 = 131.1 -> one multiple of 2 · 64 heads; 28672 · 0.016 = 458.8 = 57.3 · 8; 128256 · 0.016 = 256.5 · 8
    scaled = scaled_preset(get_preset("70B"), 0.016, tp=8)
    assert (scaled.name, scaled.hidden, scaled.ffn_hidden, scaled.vocab_size) == ("70B@0.016", 128, 456, 2056)
    tiny = scaled_preset(get_preset("70B"), 0.001, tp=8)  # each width at least one multiple
    assert (tiny.hidden, tiny.ffn_hidden, tiny.vocab_size) == (128, 32, 128)
    for scale in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match=rf"scale must be in \(0, 1\], got {scale}"):
            scaled_preset(get_preset("70B"), scale, tp=8)


def test_torch_files_payload_is_each_shards_numel_times_its_itemsize():
    """tiny tp1pp1dp3 bf16: data-parallel rank 0 writes the 7 layer files (bf16) and the model file (no tensor); each
    rank its optimizer file: the fp32 partition (its storage, padding included), Adam's two moments and its step."""
    n = tiny_numel()
    partition = -(-n["all"] // 6) * 6 // 3  # the flat buffer padded to a multiple of 2 · dp, split in 3
    layers = [n["embedding"], *[n["layer"]] * n["layers"], n["norm"], n["head"]]
    expected = ([(f"step2/layer_{i:02d}-model_00-model_states.pt", 0, "layer", 2 * numel)
                 for i, numel in enumerate(layers)] + [("step2/mp_rank_00_model_states.pt", 0, "model", 0)]
                + [(f"step2/bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt", d, "optimizer", 3 * 4 * partition + 4)
                   for d in range(3)])
    plan = predict(config("tiny", "tp1pp1dp3", "bf16"))
    assert sorted((f.path, f.rank, f.kind, f.payload_bytes) for f in plan.files) == sorted(expected)


def test_a_torch_saved_files_size_depends_on_its_names_length(tmp_path):
    """torch.save names the zip's root folder after the file: layer_99 and layer_100 hold the same state, yet their
    files differ in size, each predicted as torch.save writes it."""
    setup = setup_for(config("tiny", "tp1pp1dp1", "bf16"))
    setup = replace(setup, preset=replace(setup.preset, layers=100))
    names = [f"step2/layer_{i}-model_00-model_states.pt" for i in (99, 100)]
    planned = {f.path: f for f in deepspeed_files(setup, str(tmp_path))}
    shards = {f.path: f for f in shard_files(setup) if f.path in names}
    for name in names:
        torch.save(materialize(shards[name].state, lambda numel, dtype: torch.zeros(numel, dtype=dtype)),
                   tmp_path / os.path.basename(name))
        assert planned[name].bytes == (tmp_path / os.path.basename(name)).stat().st_size, name
        assert planned[name].payload_bytes == 2 * tiny_numel()["layer"]
    assert planned[names[0]].bytes != planned[names[1]].bytes


def test_dcp_on_one_rank_writes_every_tensor_byte_once_and_the_metadata(monkeypatch):
    monkeypatch.setattr(dcp_predict, "TENSOR_SIZES", {})  # every entry measured here, none from an earlier test
    n = tiny_numel()["all"]
    plan = predict(config("tiny", "tp1pp1dp1", "bf16", engine="dcp"))
    # bf16 module, then the fp32 partition (padded to 2 · dp) and Adam's two moments, and Adam's step (a 0-d fp32)
    assert [(f.path, f.rank, f.kind, f.payload_bytes) for f in plan.files] == [
        ("step2/__0_0.distcp", 0, "data", 2 * n + 3 * 4 * (n + n % 2) + 4), ("step2/.metadata", 0, "metadata", 0)]


@pytest.mark.parametrize("name", [name for name in STORED_RUNS if name.startswith("dcp")])
def test_stored_dcp_runs_files_as_predicted_with_every_tensor_entry_measured_afresh(name, monkeypatch):
    monkeypatch.setattr(dcp_predict, "TENSOR_SIZES", {})
    cached_bytes.cache_clear()
    assert_files_as_predicted(stored_run(name))


def test_a_tensor_entry_is_measured_without_allocating_it(tmp_path, monkeypatch):
    """A 1 TiB tensor entry, on a machine with far less memory: meta tensors and a sparse file, no byte allocated."""
    monkeypatch.setattr(dcp_predict, "TENSOR_SIZES", {})
    assert 2**40 < tensor_saved_size(torch.float32, (2**38,), str(tmp_path)) < 2**40 + 4096


def test_saved_size_is_torch_saves_size_at_a_path_of_that_name_and_touches_nothing_else(tmp_path, monkeypatch):
    state = {"weight": torch.empty((3, 5), dtype=torch.bfloat16, device="meta"), "step": 7}
    real = tmp_path / "real"
    real.mkdir()
    torch.save({"weight": torch.zeros((3, 5), dtype=torch.bfloat16), "step": 7}, real / "model_states.pt")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(tmp_path)
    Path("model_states.pt").write_text("not the plan's")
    assert saved_size(state, "step2/model_states.pt", str(scratch)) == (real / "model_states.pt").stat().st_size
    assert Path("model_states.pt").read_text() == "not the plan's"
    assert "model_states.pt" not in os.listdir(scratch)


def test_saved_size_of_a_state_it_cannot_save_raises_that_error(tmp_path):
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    with pytest.raises(NotImplementedError, match="storage of SparseTensorImpl"):
        saved_size({"sparse": sparse}, "step2/x.pt", str(tmp_path))


def test_torchsnapshot_writes_tensors_raw_in_batches_objects_and_metadata_apart():
    n = tiny_numel()["all"]
    plan = predict(config("tiny", "tp1pp1dp1", "bf16", engine="torchsnapshot"))
    data = [f for f in plan.files if f.kind == "data"]
    assert [f.path for f in data] == ["step2/rank00000/batched/<uuid4>"]
    assert data[0].payload_bytes == data[0].bytes == 2 * n + 3 * 4 * (n + n % 2) + 4
    objects = {f.path.rsplit("/", 1)[1]: f.payload_bytes for f in plan.files if f.kind == "object"}
    assert objects == {"betas": 0, "foreach": 0, "fused": 0}  # AdamW's non-scalar options, each torch.save'd
    assert [(f.path, f.rank, f.payload_bytes) for f in plan.files if f.kind == "metadata"] == [
        ("step2/rank00000/.snapshot_metadata", 0, 0)]
    assert len(plan.files) == len(data) + len(objects) + 1


def test_torchsnapshot_without_batching_writes_each_tensor_raw_to_a_file_of_its_own(monkeypatch):
    monkeypatch.setenv("TORCHSNAPSHOT_DISABLE_BATCHING", "1")
    n = tiny_numel()
    plan = predict(config("tiny", "tp1pp1dp1", "bf16", engine="torchsnapshot"))
    data = {f.path.split("/harness/")[1]: (f.payload_bytes, f.bytes) for f in plan.files if f.kind == "data"}
    partition = 4 * (n["all"] + n["all"] % 2)
    assert {key: data[key] for key in ("module/0.weight", "module/5.weight", "optimizer/fp32_partitions/0",
                                       "optimizer/base/state/0/step", "optimizer/base/state/0/exp_avg")} == {
        "module/0.weight": (2 * n["embedding"],) * 2, "module/5.weight": (2 * n["norm"],) * 2,
        "optimizer/fp32_partitions/0": (partition,) * 2, "optimizer/base/state/0/step": (4, 4),
        "optimizer/base/state/0/exp_avg": (partition,) * 2}
    assert sum(payload for payload, _ in data.values()) == 2 * n["all"] + 3 * partition + 4
    assert all(payload == size for payload, size in data.values())


def test_torchsnapshot_writes_the_plan_cannot_size_are_refused_by_name():
    requests, _ = snapshot_requests({"z": torch.zeros(3, dtype=torch.complex64)}, "cpu")  # torch.save'd, not raw
    with pytest.raises(NotImplementedError, match=r"would torch.save \S*z \(torch.complex64\)"):
        [snapshot_request_bytes(request) for request in requests]
    with pytest.raises(NotImplementedError, match=r"request w of an unknown kind \(object\)"):
        snapshot_request_bytes(SimpleNamespace(path="w", buffer_stager=object()))


def fastpersist_config(layout: str, nnodes: int, per_node: int, unit: str) -> RunConfig:
    cfg = config("tiny", layout, "fp32", engine="fastpersist")
    cfg.layout.nnodes, cfg.layout.nproc_per_node, cfg.engine.writer_data_parallel = nnodes, per_node, unit
    return cfg


# (layout, nodes, ranks per node, writer.data_parallel, rank -> (writer index, writers)) worked out by hand from
# DeepSpeed 0.19.8's DataParallelWriterFactory. Ranks are pipe·(dp·tp) + data·tp + tensor; two sockets per machine.
# Under ZeRO-1 a rank that gets no data-parallel writer gets one of its own (index 0 of 1).
FASTPERSIST_WRITERS = [
    # pure data parallel, one writer per machine: the first rank of each machine, indexed by its machine
    ("dp4", 2, 2, "machine", {0: (0, 2), 1: (0, 1), 2: (1, 2), 3: (0, 1)}),
    # pure data parallel, one rank per machine: every rank writes, indexed by its data-parallel rank
    ("dp2", 2, 1, "socket", {0: (0, 2), 1: (1, 2)}),
    # 4 sockets for 4 ranks: each stage's two data-parallel ranks are on two sockets, each a writer
    ("pp2dp2", 2, 2, "socket", {0: (0, 2), 1: (1, 2), 2: (0, 2), 3: (1, 2)}),
    # each tensor slice's data-parallel peers (ranks 0 and 2, 1 and 3) on their own sockets: index (rank - first)
    ("tp2dp2", 2, 2, "socket", {0: (0, 2), 1: (0, 2), 2: (2, 2), 3: (2, 2)}),
]


@pytest.mark.parametrize(("layout", "nnodes", "per_node", "unit", "writers"), FASTPERSIST_WRITERS)
def test_fastpersist_writers_on_machines_and_sockets_as_deepspeed_assigns_them(layout, nnodes, per_node, unit,
                                                                               writers):
    assert fastpersist_writers(setup_for(fastpersist_config(layout, nnodes, per_node, unit))) == writers


def test_fastpersist_model_file_keeps_its_name_at_the_lowest_writer_and_a_suffix_elsewhere():
    """dp4 on 2 machines, a writer per machine: rank 0 (writer 0 of 2) keeps DeepSpeed's name, rank 2 (writer 1 of 2,
    the second machine) keeps FastPersist's suffix; every rank writes its own optimizer partition."""
    files = predict(fastpersist_config("dp4", 2, 2, "machine")).files
    model = {f.rank: f.path for f in files if f.kind == "model"}
    assert (model[0], model[2]) == ("step2/mp_rank_00_model_states.pt", "step2/mp_rank_00_model_states.pt-1.2")
    assert {f.rank: f.path for f in files if f.kind == "optimizer"} == {
        rank: f"step2/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(4)}


def test_zero1_optimizer_state_is_deepspeeds_own(monkeypatch):
    """The optimizer file's content against a real single-rank DeepSpeed engine (gloo, ZeRO-1, the study's optimizer
    and scheduler, with DeepSpeed's own adam_w_mode option too), stepped 3 times: the same keys in the same order, the
    same values and objects, tensors of the same dtypes, shapes and storages (75 parameters: one element of padding)."""
    import deepspeed
    import torch.distributed as dist

    from restartbench import runtime

    setup = setup_for(config("tiny", "tp1pp1dp1", "fp32"), step=3)
    optimizer = setup.ds_config["optimizer"]
    setup = replace(setup, ds_config={**setup.ds_config, "optimizer": {
        **optimizer, "params": {**optimizer["params"], "adam_w_mode": True}}})
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    runtime.skip_shm_comm_build()
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=setup.ds_config)
        for _ in range(3):
            engine.backward(engine(torch.randn(1, 8)).square().mean())
            engine.step()
        real, real_scheduler = engine.optimizer.state_dict(), engine.lr_scheduler.state_dict()
    finally:
        deepspeed.comm.destroy_process_group()
    params = OrderedDict((name, torch.empty(p.shape, device="meta")) for name, p in model.named_parameters())
    stand_in = ZeroOptimizer(setup, params, dp_rank=0)
    state = stand_in.state_dict()
    assert list(state) == list(real)
    assert _structure(state) == _structure(real)
    assert stand_in.scheduler.state_dict() == real_scheduler


def _structure(item: Any) -> Any:
    """What a saved state holds besides its tensors' values: containers, keys, plain values, objects' attributes, and
    each tensor's dtype, shape and storage bytes."""
    if isinstance(item, torch.Tensor):
        return "tensor", item.dtype, tuple(item.shape), item.untyped_storage().nbytes()
    if isinstance(item, dict):
        return type(item).__name__, [(key, _structure(value)) for key, value in item.items()]
    if isinstance(item, (list, tuple)):
        return type(item).__name__, [_structure(value) for value in item]
    # compared by identity: DeepSpeed's loss scaler
    if type(item).__eq__ is object.__eq__ and hasattr(item, "__dict__"):
        return type(item).__name__, _structure(vars(item))
    return type(item).__name__, item


def test_zero1_fp32_partition_and_adam_moments_are_fp32_whatever_torchs_default_dtype():
    setup = setup_for(config("tiny", "tp1pp1dp1", "bf16"))
    params = OrderedDict(weight=torch.empty((5,), dtype=torch.bfloat16, device="meta"))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        state = ZeroOptimizer(setup, params, dp_rank=0).state_dict()
    finally:
        torch.set_default_dtype(default)
    moments = state["base_optimizer_state"]["state"][0]
    assert (moments["exp_avg"].dtype, moments["exp_avg_sq"].dtype) == (torch.float32, torch.float32)
    assert state["single_partition_of_fp32_groups"][0].dtype == torch.float32


def test_adamw_without_a_scheduler_in_the_config_has_none():
    setup = setup_for(config("tiny", "tp1pp1dp1", "bf16"))
    setup = replace(setup, ds_config={k: v for k, v in setup.ds_config.items() if k != "scheduler"})
    params = OrderedDict(weight=torch.empty((4,), dtype=torch.bfloat16, device="meta"))
    stand_in = ZeroOptimizer(setup, params, dp_rank=0)
    lr = stand_in.optimizer.param_groups[0]["lr"]
    assert stand_in.scheduler is None and lr == setup.ds_config["optimizer"]["params"]["lr"]


def test_lazy_headers_hold_the_checkpoints_tag(tmp_path):
    """The lazy format's header (JSON, padded to 4096-byte pages) holds the tag: a tag 4096 bytes longer makes every
    file exactly one page longer."""
    setup = setup_for(config("tiny", "pp2dp1", "bf16", engine="lazy"))
    short = PREDICTORS["lazy"].files(setup, str(tmp_path))
    long = PREDICTORS["lazy"].files(replace(setup, tag="step2" + "x" * 4096), str(tmp_path))
    assert [(f.rank, f.kind, f.bytes + 4096) for f in short] == [(f.rank, f.kind, f.bytes) for f in long]


def test_clip_grad_without_gradient_clipping_in_the_config_is_deepspeeds_default():
    """DeepSpeed reads a config without ``gradient_clipping`` as its default (1.0), and ZeRO saves that value."""
    from deepspeed.runtime.config import get_gradient_clipping

    setup = setup_for(config("tiny", "tp1pp1dp1", "bf16"))
    setup = replace(setup, ds_config={k: v for k, v in setup.ds_config.items() if k != "gradient_clipping"})
    params = OrderedDict(weight=torch.empty((5,), dtype=torch.bfloat16, device="meta"))
    assert ZeroOptimizer(setup, params, dp_rank=0).state_dict()["clip_grad"] == get_gradient_clipping({}) == 1.0


def test_clip_grad_is_the_configs_gradient_clipping():
    setup = setup_for(config("tiny", "tp1pp1dp1", "bf16"))
    setup = replace(setup, ds_config={**setup.ds_config, "gradient_clipping": 0.25})
    params = OrderedDict(weight=torch.empty((5,), dtype=torch.bfloat16, device="meta"))
    assert ZeroOptimizer(setup, params, dp_rank=0).state_dict()["clip_grad"] == 0.25


# --- the universal checkpoint ds_to_universal.py makes (issue 19) ---------------------------------------------------


@pytest.mark.parametrize(("preset", "layout"), [("tiny", "tp2pp2"), ("tiny", "tp1pp1dp2"), ("70B", "tp8pp8")])
def test_universal_files_are_four_per_parameter_the_optimizer_state_and_the_model_files(preset, layout):
    """One file per parameter x {fp32, exp_avg, exp_avg_sq, step} under <tag>_universal/zero, the optimizer's common
    state, a copy of every model file (one per pipeline stage x tensor rank) and latest_universal; each state file
    holds the parameter at full shape in fp32, the step file Adam's one fp32 step."""
    from restartbench.engines.deepspeed.universal_predict import predict_universal
    from restartbench.model import parameter_splits

    cfg = config(preset, layout)
    setup = setup_for(cfg)
    plan = predict_universal(setup)
    names = [name for name, _, _ in parameter_splits(setup.preset)]
    stages_x_tp = setup.layout.pp * setup.layout.tp
    expected = {f"step2_universal/zero/{name}/{state}.pt"
                for name in names for state in ("fp32", "exp_avg", "exp_avg_sq", "step")}
    expected |= {"step2_universal/zero/optimizer_state.pt", "latest_universal"}
    expected |= {f"step2_universal/mp_rank_{mp:02d}_model_states.pt" for mp in range(stages_x_tp)}
    assert {f.path for f in plan.files} == expected and len(plan.files) == 4 * len(names) + 2 + stages_x_tp

    numel = dict(zip(names, (math.prod(shape) for shape in full_shapes(setup.preset).values())))
    payload = {f.path: f.payload_bytes for f in plan.files}
    for name in names:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            assert payload[f"step2_universal/zero/{name}/{state}.pt"] == 4 * numel[name], (name, state)
        assert payload[f"step2_universal/zero/{name}/step.pt"] == 4
    model = {f.path.split("/")[1]: f.bytes for f in predict(cfg).files if f.kind == "model"}
    assert {f.path.split("/")[1]: f.bytes for f in plan.files if f.kind == "model"} == model
    assert next(f.bytes for f in plan.files if f.path == "latest_universal") == len("step2_universal")
    assert all(f.bytes > f.payload_bytes for f in plan.files if f.kind != "metadata")


@pytest.mark.parametrize(("preset", "layout"), [("tiny", "tp2pp2"), ("tiny", "tp2pp1dp2"), ("70B", "tp8pp8")])
def test_universal_fragments_are_every_ranks_share_of_each_state(preset, layout):
    """The temporary fragments hold each rank's ZeRO-1 share of every parameter's fp32, exp_avg and exp_avg_sq once
    (a replicated parameter once per tensor rank, as each holds it whole), and one step tensor per fragment of a
    parameter: their payload is the checkpoint's optimizer payload without the padding and the step counters."""
    from restartbench.engines.deepspeed.universal_predict import predict_universal
    from restartbench.model import parameter_splits

    setup = setup_for(config(preset, layout))
    plan = predict_universal(setup)
    tp = setup.layout.tp
    shapes = full_shapes(setup.preset)
    shares = sum(math.prod(shapes[name]) * (tp if dim is None else 1)
                 for name, dim, _ in parameter_splits(setup.preset))
    states = Counter()
    for f in plan.fragments:
        parts = f.path.split("/")
        assert parts[:2] == ["step2_universal", "tmp"] and int(parts[3]) < tp, f.path
        states[parts[4].split(".")[0]] += f.payload_bytes
    assert states == {"fp32": 4 * shares, "exp_avg": 4 * shares, "exp_avg_sq": 4 * shares,
                      "step": 4 * sum(1 for f in plan.fragments if f.path.split("/")[4].startswith("step."))}
    assert plan.fragment_bytes == sum(f.bytes for f in plan.fragments) > 3 * 4 * shares


def test_plan_cli_lists_the_universal_checkpoint_with_torch_only():
    plan = json.loads(plan_cli("tiny", "tp2pp2", "--dtype", "fp32", "--universal", "--json"))
    universal = plan["universal"]
    assert universal["folder"] == "step2_universal"
    assert universal["totals"]["bytes"] == sum(f["bytes"] for f in universal["files"])
    assert universal["totals"]["fragment_bytes"] > 0 and "fragments" not in universal
    text = plan_cli("tiny", "tp2pp2", "--dtype", "fp32", "--universal")
    assert f"universal checkpoint: {universal['totals']['bytes']:,} B in {universal['totals']['files']} files" in text
    assert f"{universal['totals']['fragment_bytes']:,} B in {universal['totals']['fragment_files']} files" in text
    refused = subprocess.run([sys.executable, "-m", "restartbench.plan", "tiny", "tp2pp2", "--engine", "lazy",
                              "--universal"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 2 and "--engine torch" in refused.stderr


def full_shapes(preset) -> dict[str, tuple[int, ...]]:
    """Every parameter's full shape (PipelineModule name), the model built with tp 1 on the meta device."""
    from restartbench.model import TensorParallel, layer_specs

    with torch.device("meta"):
        layers = [spec.build() for spec in layer_specs(preset, TensorParallel(1, 0), seed=0)]
    return {f"{index}.{name}": tuple(p.shape) for index, layer in enumerate(layers)
            for name, p in layer.named_parameters()}

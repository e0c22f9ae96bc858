"""restartbench.plan: every file of a checkpoint predicted without running, held to real runs file by file."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import run_study
from restartbench import engines
from restartbench.config import RunConfig
from restartbench.plan import (NOT_PREDICTED, PREDICTORS, checkpoint_bytes, materialize, payload_bytes, predict,
                               random_names_as_placeholders, scaled_preset, setup_for, shard_files, zero_partition)
from restartbench.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent

# One real run per engine besides torch (whose runs are the session's study_runs), layouts and dtypes spread
# over them: (engine, layout, dtype).
ENGINE_CASES = [("fastpersist", "pp2dp2", "fp32"),  # every data-parallel writer writes its stage's model file
                ("lazy", "pp2dp1", "bf16"),
                ("dcp", "tp1pp1dp2", "bf16"),  # DCP's deduplication of the module across data-parallel replicas
                ("dcp-async", "tp2pp1dp1", "fp32"),
                ("torchsnapshot", "tp2pp1dp1", "bf16")]


def config(preset: str, layout: str, dtype: str = "bf16", engine: str = "torch", **train) -> RunConfig:
    cfg = RunConfig()
    cfg.model.preset, cfg.layout.layout, cfg.model.dtype, cfg.engine.engine = preset, layout, dtype, engine
    for name, value in train.items():
        setattr(cfg.train, name, value)
    return cfg


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory):
    """engine -> (process, run folder) of its ENGINE_CASES run, made on first use (4 iterations, saves at 2 and 4)."""
    logs = tmp_path_factory.mktemp("engines") / "logs"
    runs = {}

    def run(engine):
        if engine not in runs:
            missing = engines.missing_requirements(engine)
            if missing:
                pytest.skip("; ".join(missing))
            _, layout, dtype = next(case for case in ENGINE_CASES if case[0] == engine)
            # fastpersist's first run on a machine JIT-builds DeepSpeed's ops (minutes on 2 cores)
            runs[engine] = run_study(logs, "tiny", layout, "--dtype", dtype, "--engine", engine, "--iters", "4",
                                     "--save-interval", "2", timeout=1200)
        return runs[engine]

    return run


def assert_files_as_predicted(run: Path) -> None:
    """Both checkpoints of the run: the same file names (random parts aside), each written by the predicted rank
    with the predicted size within the engine's stated tolerance; the durable events, plan.json's estimate and the
    files at the checkpoint folder's root agree."""
    cfg = RunConfig.load(run / "config.json")
    inventory = json.loads((run / "inventory.json").read_text())
    written = [f for f in inventory if f["tag"]]
    tags = sorted({f["tag"] for f in written})
    assert tags == ["step2", "step4"]
    for tag in tags:
        plan = predict(cfg, step=int(tag.removeprefix("step")))
        real = sorted((random_names_as_placeholders(f["path"]), f["rank"], f["bytes"]) for f in written
                      if f["tag"] == tag)
        predicted = sorted((f.path, f.rank, f.bytes) for f in plan.files)
        assert [r[:2] for r in real] == [p[:2] for p in predicted]
        for (path, _, size), (_, _, expected) in zip(real, predicted):
            assert abs(size - expected) <= plan.tolerance_bytes, (path, size, expected)
        durable = [e for p in (run / "events").glob("train-rank*.jsonl") for e in map(json.loads, p.read_text().splitlines())
                   if e["event"] == "checkpoint.durable" and e["tag"] == tag]
        assert abs(sum(e["bytes"] for e in durable) - plan.checkpoint_bytes) <= plan.tolerance_bytes * len(plan.files)
    roots = {f["path"]: f["bytes"] for f in inventory if not f["tag"]}
    assert {name: roots[name] for name in plan.root_files} == plan.root_files
    planned = json.loads((run / "plan.json").read_text())["checkpoint_bytes_estimate"]
    assert abs(planned - plan.checkpoint_bytes) <= plan.tolerance_bytes * len(plan.files)


# -- against real runs: the session's (torch: tp2pp2 fp32, pp2dp2 bf16, tp1pp1dp2 fp32) and one per engine ------


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["tp2pp2", "pp2dp2", "tp1pp1dp2"])
def test_every_file_name_size_and_writer_as_predicted(study_runs, layout):
    proc, run = study_runs[layout]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(run)


@pytest.mark.multirank
@pytest.mark.parametrize("engine", [case[0] for case in ENGINE_CASES])
def test_every_engines_files_as_predicted(engine_runs, engine):
    proc, run = engine_runs(engine)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(run)


def test_every_engine_is_predicted_or_says_why_not():
    assert set(PREDICTORS) | set(NOT_PREDICTED) == set(engines.engine_names())
    assert not set(PREDICTORS) & set(NOT_PREDICTED)
    assert {name for name, p in PREDICTORS.items() if p.tolerance_bytes == 0} >= {"lazy", "torchsnapshot"}


# -- without processes ------------------------------------------------------------------------------------------


def test_names_follow_deepspeeds_rules():
    plan = predict(config("tiny", "tp2pp2dp2", "bf16"))
    names = {f.path.split("/")[1] for f in plan.files}
    layer_writers = {f.rank for f in plan.files if f.kind == "layer"}
    assert layer_writers == {0, 1, 4, 5}  # data-parallel rank 0 of each stage and tensor rank (ranks pipe·4 + dp·2 + tp)
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


def test_cli_prints_files_per_rank_and_totals():
    out = subprocess.run([sys.executable, "-m", "restartbench.plan", "tiny", "tp1pp2dp2", "--engine", "torch",
                          "--dtype", "fp32"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "rank 3: 1 files" in out.stdout and "step2/zero_pp_rank_1_mp_rank_01_optim_states.pt" in out.stdout
    assert "checkpoint:" in out.stdout and "per rank: max" in out.stdout and "within 64 B" in out.stdout
    dcp = subprocess.run([sys.executable, "-m", "restartbench.plan", "tiny", "tp2pp2", "--engine", "dcp", "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert dcp.returncode == 0, dcp.stderr
    plan = json.loads(dcp.stdout)
    assert plan["totals"]["by_kind"] == {"data": {"files": 4, "bytes": plan["totals"]["by_kind"]["data"]["bytes"]},
                                         "metadata": {"files": 1, "bytes": plan["files"][-1]["bytes"]}}
    refused = subprocess.run([sys.executable, "-m", "restartbench.plan", "tiny", "tp2pp2", "--engine", "decoupled"],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 0 and "not predicted" in refused.stdout and "non-leaf" in refused.stdout


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
    plan._cached_bytes.cache_clear()
    cfg = config("tiny", "pp2dp1", "fp32", engine="dcp")
    computed = checkpoint_bytes(cfg)
    assert len(list(tmp_path.glob("*.json"))) == 1
    plan._cached_bytes.cache_clear()
    monkeypatch.setattr(plan, "predict", lambda *a, **k: pytest.fail("the cached prediction was not used"))
    assert checkpoint_bytes(cfg) == computed
    plan._cached_bytes.cache_clear()


def test_docs_plan_md_is_what_the_generator_writes():
    """docs/plan.md is `python -m restartbench.plan --all-presets > docs/plan.md`; its tiny sections and its lazy
    engine section, regenerated here (the rest takes longer), must be in it verbatim: a stale document fails."""
    from restartbench.plan import DOC_LAYOUTS, ENGINE_DOC_CASE, _doc_config, render_markdown

    doc = (ROOT / "docs" / "plan.md").read_text()
    assert "python -m restartbench.plan --all-presets --layouts " + ",".join(DOC_LAYOUTS) in doc
    for layout in ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2"):
        assert render_markdown(predict(config("tiny", layout))) in doc, f"regenerate docs/plan.md ({layout})"
    engines_section = doc[doc.index("## Engines: " + " ".join(ENGINE_DOC_CASE)):]
    assert render_markdown(predict(_doc_config(*ENGINE_DOC_CASE, "bf16", "lazy"))) in engines_section
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

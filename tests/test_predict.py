"""restartbench.plan: every file of a checkpoint predicted without running, held to real runs file by file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from restartbench.config import RunConfig
from restartbench.plan import (SIZE_TOLERANCE_BYTES, materialize, payload_bytes, predict, scaled_preset, setup_for,
                               shard_files, zero_partition)
from restartbench.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent


def config(preset: str, layout: str, dtype: str = "bf16", **train) -> RunConfig:
    cfg = RunConfig()
    cfg.model.preset, cfg.layout.layout, cfg.model.dtype = preset, layout, dtype
    for name, value in train.items():
        setattr(cfg.train, name, value)
    return cfg


# -- against the session's real runs (tp2pp2 fp32, pp2dp2 bf16, tp1pp1dp2 fp32) ------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["tp2pp2", "pp2dp2", "tp1pp1dp2"])
def test_every_file_name_size_and_writer_as_predicted(study_runs, layout):
    proc, run = study_runs[layout]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cfg = RunConfig.load(run / "config.json")
    written = [f for f in json.loads((run / "inventory.json").read_text()) if f["tag"]]
    tags = sorted({f["tag"] for f in written})
    assert tags == ["step2", "step4"]
    for tag in tags:
        plan = predict(cfg, step=int(tag.removeprefix("step")))
        real = {f["path"]: f for f in written if f["tag"] == tag}
        assert sorted(real) == sorted(f.path for f in plan.files)
        for f in plan.files:
            assert real[f.path]["rank"] == f.rank, f.path
            assert abs(real[f.path]["bytes"] - f.bytes) <= SIZE_TOLERANCE_BYTES, (f.path, real[f.path]["bytes"], f.bytes)
        durable = [e for p in (run / "events").glob("train-rank*.jsonl") for e in map(json.loads, p.read_text().splitlines())
                   if e["event"] == "checkpoint.durable" and e["tag"] == tag]
        assert abs(sum(e["bytes"] for e in durable) - plan.checkpoint_bytes) <= SIZE_TOLERANCE_BYTES * len(plan.files)
    roots = {f["path"]: f["bytes"] for f in json.loads((run / "inventory.json").read_text()) if not f["tag"]}
    assert {name: roots[name] for name in plan.root_files} == plan.root_files
    planned = json.loads((run / "plan.json").read_text())["checkpoint_bytes_estimate"]
    assert abs(planned - plan.checkpoint_bytes) <= SIZE_TOLERANCE_BYTES * len(plan.files)


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
    assert "checkpoint:" in out.stdout and "per rank: max" in out.stdout
    refused = subprocess.run([sys.executable, "-m", "restartbench.plan", "tiny", "tp2pp2", "--engine", "dcp"],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 2 and "--engine torch" in refused.stderr


def test_docs_plan_md_is_what_the_generator_writes():
    """docs/plan.md is `python -m restartbench.plan --all-presets > docs/plan.md`; its tiny sections, regenerated here
    (the big presets take longer), must be in it verbatim: a stale document fails."""
    from restartbench.plan import DOC_LAYOUTS, render_markdown

    doc = (ROOT / "docs" / "plan.md").read_text()
    assert "python -m restartbench.plan --all-presets --layouts " + ",".join(DOC_LAYOUTS) in doc
    for layout in ("tp1pp1dp1", "tp2pp2dp1", "tp1pp2dp2"):
        assert render_markdown(predict(config("tiny", layout))) in doc, f"regenerate docs/plan.md ({layout})"


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

"""restartbench.plan: every file of a checkpoint predicted without running, held to real runs file by file."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import STUDY_CASES, run_study
from restartbench import engines
from restartbench.config import RunConfig
from restartbench.plan import (NOT_PREDICTED, PLAN_CACHE, PREDICTORS, CheckpointPlan, _cached_bytes, checkpoint_bytes,
                               materialize, payload_bytes, predict, random_names_as_placeholders, scaled_preset,
                               setup_for, shard_files, zero_partition)
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
                                     "--save-interval", "2", timeout=1200, env={PLAN_CACHE: "off"})
        return runs[engine]

    return run


@pytest.fixture(autouse=True)
def plan_cache_in_tmp(tmp_path, monkeypatch):
    """checkpoint_bytes keeps predictions between processes (``PLAN_CACHE``): here it starts empty, so that no test
    compares a prediction with a stored copy of itself."""
    monkeypatch.setenv(PLAN_CACHE, str(tmp_path / "plan-cache"))
    _cached_bytes.cache_clear()
    yield
    _cached_bytes.cache_clear()


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
    return {"config.json": json.loads((run / "config.json").read_text()),
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
    assert {case[0] for case in REAL_RUN_CASES} == set(PREDICTORS) - {"none"}


@pytest.mark.parametrize("name", STORED_RUNS)
def test_stored_real_runs_files_as_predicted(name):
    assert_files_as_predicted(stored_run(name))


# -- against fresh real runs, today's engines: the session's (torch: tp2pp2 fp32, pp2dp2 bf16, tp1pp1dp2 fp32) and
# one per engine ---------------------------------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["tp2pp2", "pp2dp2", "tp1pp1dp2"])
def test_every_file_name_size_and_writer_as_predicted(study_runs, layout):
    proc, run = study_runs[layout]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(stored_parts(run))


@pytest.mark.multirank
@pytest.mark.parametrize("engine", [case[0] for case in ENGINE_CASES])
def test_every_engines_files_as_predicted(engine_runs, engine):
    proc, run = engine_runs(engine)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_files_as_predicted(stored_parts(run))


def test_every_engine_is_predicted_or_says_why_not():
    assert set(PREDICTORS) | set(NOT_PREDICTED) == set(engines.engine_names())
    assert not set(PREDICTORS) & set(NOT_PREDICTED)
    assert {name: p.tolerance_bytes for name, p in PREDICTORS.items()} == {
        "none": 0, "torch": 64, "fastpersist": 64, "lazy": 0, "dcp": 0, "dcp-async": 0, "torchsnapshot": 0}


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

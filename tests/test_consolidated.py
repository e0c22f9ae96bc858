"""The consolidated digest (``restartbench.consolidated``, issue 19): the training state at full shape, the same for
every parallel layout that holds the same model.

Real DeepSpeed engines on gloo, built as a rank of the study builds them (``runtime.init_distributed``,
``model.build_pipeline_module``, ``deepspeed.initialize`` with the study's DeepSpeed JSON rendered from
``templates/ds_config.json.j2``), in four layouts of 4 ranks from the same seed: tp2pp2dp1, tp1pp2dp2, tp1pp1dp4,
tp2pp1dp2, in fp32, and two of them in bf16. One launch of 4 ranks (``torch.multiprocessing``) builds the engines one
after another (each test's layout in a fresh launch would cost the import of torch and DeepSpeed each time) and
records, for each case, the digests the tests read:

- ``fresh``: before any training step. The model is built full from the seed and sliced, so its fp32 masters are the
  same whatever the layout; Adam has no moments yet (digested as zeros).
- ``flipped``: one bit of one element of one rank's fp32 master partition flipped (the last rank, in a parameter with a
  tensor-parallel dimension it holds a fragment of: a data-parallel fragment, a tp shard but the first, or both).
- ``replica_flipped`` (tp 2 layouts): one bit of a replicated RMSNorm weight's master flipped on tensor-parallel rank 1.
- ``known_moments``: Adam's state over every rank's flat partition set to known functions of the masters
  (exp_avg = -masters, exp_avg_sq = masters², step 3), so that the moments' gathering is proved on values that are
  not all zero, against the same functions of the full weights.
- ``stepped``: after three real training steps (the study's data; WarmupLR gives the first two lr 0), next to the
  same state gathered with DeepSpeed's own ``safe_get_full_fp32_param`` and ``safe_get_full_optimizer_state`` (linked
  by then) and concatenated over tp here.
- ``reloaded`` (tp2pp1dp2, fp32): the stepped state saved with DeepSpeed's ``save_checkpoint`` and loaded into a new
  engine of the same layout, as a restore does (after which DeepSpeed 0.19.8 unlinks the moments'
  fragments that ``safe_get_full_optimizer_state`` reads).
"""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import free_port

from restartbench.consolidated import (
    INCONSISTENT,
    KINDS,
    compare,
    consolidated_path,
    param_key,
    read_consolidated,
    write_consolidated,
)
from restartbench.model import TP_DIM, TensorParallel, layer_specs, parameter_splits
from restartbench.presets import get_preset
from restartbench.verify import tensor_hash

TINY = get_preset("tiny")
SEED = 1234
WORLD = 4
LAYOUTS = ["tp2pp2dp1", "tp1pp2dp2", "tp1pp1dp4", "tp2pp1dp2"]
CASES = [*(f"{layout}/fp32" for layout in LAYOUTS), "tp2pp2dp1/bf16", "tp1pp1dp4/bf16"]
"""layout/dtype: every layout in fp32 (quick on CPUs); in bf16 (the study's precision, slow on CPUs) two layouts that
differ in every degree."""
RELOADED = "tp2pp1dp2/fp32"
"""The case whose stepped state is also saved (DeepSpeed's own checkpoint) and loaded into a new engine."""


def _ds_config(layout, dtype: str) -> dict:
    """The study's DeepSpeed JSON (templates/ds_config.json.j2) for a tiny run on this layout: micro-batch 1,
    grad_accum pp and lr 1e-3 (the study's defaults), the default engine's sections (none). Rendered here rather than
    through ``render.render_ds_config``, which reads the engine registry: this test is about DeepSpeed's state only."""
    import jinja2
    from conftest import ROOT

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "templates"), undefined=jinja2.StrictUndefined)
    text = env.get_template("ds_config.json.j2").render(micro_batch=1, grad_accum=layout.pp, dp=layout.dp,
                                                        dtype=dtype, lr=1e-3, engine_sections={})
    return json.loads(text)


# -- what each rank does ---------------------------------------------------------------------------------------------


def _flip(tensor: torch.Tensor, index: int = 0, bit: int = 0) -> None:
    raw = tensor.data.view(-1).view(torch.int32)
    raw[index] ^= 1 << bit


def _first_fragment(engine, want) -> tuple[str, torch.Tensor] | None:
    """(name, this rank's fp32 master fragment) of the first parameter ``want`` accepts that this rank holds a
    fragment of."""
    for name, param in engine.module.named_parameters():
        if want(name, param) and param._hp_mapping is not None:
            return name, param._hp_mapping.hp_fragment
    return None


def _flipped_digest(engine, holder: int, want) -> tuple[str | None, dict]:
    """The digest with one bit of one master element flipped on global rank ``holder`` (then flipped back); the
    flipped parameter's name, shared with every rank."""
    import torch.distributed as dist

    from restartbench.consolidated import consolidated_digest

    found = _first_fragment(engine, want) if dist.get_rank() == holder else None
    if found:
        _flip(found[1])
    try:
        value = consolidated_digest(engine)
    finally:
        if found:
            _flip(found[1])
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, found[0] if found else None)
    return names[holder], value


def _deepspeeds_gather(engine) -> dict[str, str]:
    """Every parameter's state at full shape through DeepSpeed's utilities (float all-reduce over data-parallel
    ranks), concatenated over tp here: the hashes on tp rank 0, merged over stages."""
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    grid = engine.grid
    group, size = grid.get_slice_parallel_group(), grid.get_slice_parallel_world_size()
    entries = {}
    for name, param in engine.module.named_parameters():
        for kind in KINDS:
            full = safe_get_full_fp32_param(param) if kind == "fp32" else safe_get_full_optimizer_state(param, kind)
            dim = getattr(param, TP_DIM, None)
            if dim is not None and size > 1:
                parts = [torch.empty_like(full) for _ in range(size)]
                dist.all_gather(parts, full.contiguous(), group=group)
                full = torch.cat(parts, dim=dim)
            entries[param_key(name, kind)] = tensor_hash(full)
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, entries if grid.get_slice_parallel_rank() == 0 else {})
    return {key: value for part in parts for key, value in part.items()}


def _one_case(case: str, config: dict, checkpoints: Path) -> dict:
    import deepspeed
    import torch.distributed as dist

    from restartbench.consolidated import consolidated_digest
    from restartbench.data import micro_batches
    from restartbench.layout import validate_layout
    from restartbench.model import build_pipeline_module

    layout = validate_layout(case.partition("/")[0], TINY, WORLD)

    def new_engine():
        module = build_pipeline_module(TINY, layout, seed=SEED)
        return deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)[0]

    engine = new_engine()
    record = {"fresh": consolidated_digest(engine)}

    last = dist.get_world_size() - 1
    record["flipped"] = _flipped_digest(engine, last, lambda _, p: getattr(p, TP_DIM, None) is not None)
    if layout.tp > 1:  # global rank 1 is tp rank 1 of stage 0, data-parallel rank 0
        record["replica_flipped"] = _flipped_digest(engine, 1, lambda n, _: n.endswith("norm"))

    zero = engine.optimizer
    for flat in zero.single_partition_of_fp32_groups:
        zero.optimizer.state[flat] = {"step": torch.tensor(3.0), "exp_avg": -flat.detach(),
                                      "exp_avg_sq": flat.detach() * flat.detach()}
    record["known_moments"] = consolidated_digest(engine)
    for flat in zero.single_partition_of_fp32_groups:
        del zero.optimizer.state[flat]

    for step in (1, 2, 3):  # WarmupLR gives iterations 1 and 2 lr 0: the third is the first to move the masters
        batches = micro_batches(vocab_size=TINY.vocab_size, seq_len=TINY.seq_len, micro_batch=1,
                                grad_accum=engine.gradient_accumulation_steps(), step=step,
                                dp_rank=engine.grid.get_data_parallel_rank(), seed=SEED)
        engine.train_batch(data_iter=iter(batches))
    record["stepped"] = consolidated_digest(engine)
    record["stepped_by_deepspeed"] = _deepspeeds_gather(engine)
    if case == RELOADED:
        engine.save_checkpoint(checkpoints, tag="step3")
        restored = new_engine()
        restored.load_checkpoint(checkpoints, tag="step3")
        record["reloaded"] = consolidated_digest(restored)
        restored.destroy()
    engine.destroy()
    return record


def _rank(rank: int, port: int, cases: list[str], configs: list[dict], out: str, checkpoints: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    from restartbench import runtime

    runtime.skip_shm_comm_build()
    runtime.time_out_new_groups(120)  # a collective left waiting fails in 2 minutes, as a rank of the study would
    runtime.init_distributed("gloo", 120)
    records = {case: _one_case(case, config, Path(checkpoints)) for case, config in zip(cases, configs)}
    if rank == 0:
        Path(out).write_text(json.dumps(records))


@pytest.fixture(scope="module")
def digests(tmp_path_factory) -> dict[str, dict]:
    """layout/dtype -> its records (module docstring), from one launch of 4 ranks."""
    import torch.multiprocessing as mp

    from restartbench.layout import validate_layout

    folder = tmp_path_factory.mktemp("consolidated")
    configs = [_ds_config(validate_layout(layout, TINY, WORLD), dtype)
               for layout, dtype in (case.split("/") for case in CASES)]
    mp.start_processes(_rank, args=(free_port(), CASES, configs, str(folder / "digests.json"), str(folder / "ckpt")),
                       nprocs=WORLD, start_method="spawn")
    return json.loads((folder / "digests.json").read_text())


# -- what the digests must say -------------------------------------------------------------------------------------


def reference_weights(case: str) -> dict[str, torch.Tensor]:
    """Every parameter at full shape, the whole model built in this process (tp 1) from the seed; in bf16 rounded to
    bf16, as DeepSpeed makes the fp32 masters from the bf16 model."""
    layers = [spec.build() for spec in layer_specs(TINY, TensorParallel(1, 0), SEED)]
    dtype = torch.bfloat16 if case.endswith("/bf16") else torch.float32
    return {f"{index}.{name}": param.detach().to(dtype).float() for index, layer in enumerate(layers)
            for name, param in layer.named_parameters()}


COUNTERS = {"global_steps", "global_samples", "optimizer.group0.step", "optimizer.group0.lr",
            "lr_scheduler.last_batch_iteration"}


@pytest.mark.multirank
def test_every_parameter_is_digested_at_full_shape_by_its_global_name(digests):
    """Every layout's digest has an fp32, exp_avg and exp_avg_sq entry for every parameter of the whole model (as
    ``parameter_splits`` names them, whichever stage holds it) and the counters; the fp32 masters are the full
    weights built in one process, the moments zeros, the optimizer not yet stepped."""
    names = {name for name, _, _ in parameter_splits(TINY)}
    for case, record in digests.items():
        weights, fresh = reference_weights(case), record["fresh"]
        assert weights.keys() == names
        assert {key for key in fresh if key.startswith("params.")} == {param_key(n, k) for n in names for k in KINDS}
        assert COUNTERS <= fresh.keys(), case
        for name, weight in weights.items():
            assert fresh[param_key(name, "fp32")] == tensor_hash(weight), (case, name)
            for kind in KINDS[1:]:
                assert fresh[param_key(name, kind)] == tensor_hash(torch.zeros_like(weight)), (case, name, kind)
        assert (fresh["global_steps"], fresh["optimizer.group0.step"]) == ("0", "None"), case
        assert not [value for value in fresh.values() if value.startswith(INCONSISTENT)], case


@pytest.mark.multirank
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_digest_is_the_same_in_every_layout(digests, dtype):
    """tp2pp2dp1, tp1pp2dp2, tp1pp1dp4 and tp2pp1dp2 (bf16: the first and third) from the same seed, before any
    step: every entry equal, the step counters and scheduler state included; and with the known moments."""
    first, *others = [case for case in CASES if case.endswith(f"/{dtype}")]
    assert others
    for case in others:
        for state in ("fresh", "known_moments"):
            assert compare(digests[first][state], digests[case][state]) == [], (case, state)


@pytest.mark.multirank
@pytest.mark.parametrize("case", CASES)
def test_one_flipped_bit_of_one_ranks_master_is_named_alone(digests, case):
    """One bit of one element of the last rank's fp32 master partition (a tp shard past the first, a data-parallel
    fragment past the first, or both) changes exactly that parameter's fp32 entry."""
    name, flipped = digests[case]["flipped"]
    assert name is not None
    assert compare(digests[case]["fresh"], flipped) == [f"consolidated state: {param_key(name, 'fp32')}: differs"]


@pytest.mark.multirank
@pytest.mark.parametrize("case", [case for case in CASES if case.startswith("tp2")])
def test_a_replicated_parameter_that_differs_between_tp_ranks_is_named(digests, case):
    """A replicated RMSNorm weight changed on tp rank 1 only: not one copy chosen, the entry says the copies differ."""
    name, flipped = digests[case]["replica_flipped"]
    key = param_key(name, "fp32")
    assert compare(digests[case]["fresh"], flipped) == [f"consolidated state: {key}: differs"]
    assert flipped[key].startswith(INCONSISTENT)


@pytest.mark.multirank
def test_the_moments_are_gathered_as_the_masters_are(digests):
    """Adam's state set on every rank to exp_avg = -masters and exp_avg_sq = masters² (step 3): in every layout the
    consolidated moments are those functions of the full weights."""
    for case, record in digests.items():
        known = record["known_moments"]
        for name, weight in reference_weights(case).items():
            assert known[param_key(name, "exp_avg")] == tensor_hash(-weight), (case, name)
            assert known[param_key(name, "exp_avg_sq")] == tensor_hash(weight * weight), (case, name)
        assert known["optimizer.group0.step"] == "3.0", case


@pytest.mark.multirank
def test_after_real_steps_the_digest_agrees_with_deepspeeds_own_gathering(digests):
    """After three training steps (WarmupLR gives the first two lr 0), every parameter's masters and moments moved,
    and the digest holds what DeepSpeed's ``safe_get_full_fp32_param`` and ``safe_get_full_optimizer_state``
    gather, concatenated over tp."""
    for case, record in digests.items():
        stepped, by_deepspeed = record["stepped"], record["stepped_by_deepspeed"]
        assert by_deepspeed.keys() == {key for key in stepped if key.startswith("params.")}, case
        assert {key: stepped[key] for key in by_deepspeed} == by_deepspeed, case
        assert stepped["global_steps"] == "3" and stepped["optimizer.group0.step"] == "3.0", case
        assert all(stepped[key] != record["fresh"][key] for key in by_deepspeed), case


@pytest.mark.multirank
def test_a_loaded_checkpoint_has_the_digest_of_the_state_it_saved(digests):
    """DeepSpeed's save of the stepped state (tp2pp1dp2), loaded into a new engine: every entry equal, the moments
    included (read from the optimizer's state as loaded, not through fragments the load left unlinked)."""
    record = digests[RELOADED]
    assert compare(record["stepped"], record["reloaded"]) == []


# -- the records, without processes ----------------------------------------------------------------------------------


def test_a_consolidated_digest_is_recorded_beside_the_per_rank_digests_and_read_back(tmp_path):
    value = {param_key("0.weight", "fp32"): "abc", "global_steps": "4"}
    path = write_consolidated(tmp_path, "step4", value)
    assert path == consolidated_path(tmp_path, "step4") == tmp_path / "digests" / "step4" / "consolidated.json"
    assert read_consolidated(tmp_path, "step4") == value
    with pytest.raises(FileNotFoundError, match=r"no consolidated digest 'step2' recorded .*run with --verify\?"):
        read_consolidated(tmp_path, "step2")


def test_compare_names_each_difference_as_the_consolidated_states():
    saved = {"a": "1", "b": "2"}
    assert compare(saved, {"a": "1", "b": "3", "c": "4"}) == [
        "consolidated state: b: differs", "consolidated state: c: absent at save, present after restore"]

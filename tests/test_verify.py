"""The exact-restore proof on a real DeepSpeed training state: any one changed value is named, nothing else.

The state is a real single-rank DeepSpeed engine in this process (ZeRO-1, torch AdamW and WarmupLR as the
study configures them), stepped once, so the digest sees what ``training_state_digest`` sees in a run: the
module, DeepSpeed's optimizer state_dict with the wrapped AdamW's moments and ZeRO's fp32 partition, the
scheduler and the step counter. Each test on it changes one value in place, takes the digest, and undoes it.
The rest is tested on its own: the hash of a tensor, the digest files in the run folder, the list of problems.
"""

import hashlib
from contextlib import contextmanager
from types import SimpleNamespace

import deepspeed
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from restartbench import runtime, verify
from restartbench.verify import (
    compare,
    digest,
    digest_path,
    module_digest,
    read_digest,
    tensor_hash,
    training_state_digest,
    write_digest,
)

DS_CONFIG = {
    "train_batch_size": 2,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 2}},
}
FIRST_LAYER = "module.0.weight"
OPTIMIZER = "optimizer.base_optimizer_state.state.0:int"
FP32_PARTITION = "optimizer.single_partition_of_fp32_groups[0]"


@pytest.fixture(scope="module")
def engine():
    with pytest.MonkeyPatch.context() as env:
        for name in ("RANK", "LOCAL_RANK"):
            env.setenv(name, "0")
        env.setenv("WORLD_SIZE", "1")
        runtime.skip_shm_comm_build()
        dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
            ds_engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
            ds_engine.backward(ds_engine(torch.randn(2, 8)).square().mean())
            ds_engine.step()
            yield ds_engine
        finally:
            deepspeed.comm.destroy_process_group()  # DeepSpeed's: also drops its cached groups, so a second
            # engine in this process (mutmut runs the tests twice in one) does not use the destroyed one


def _optimizer_state(ds_engine):
    return next(iter(ds_engine.optimizer.optimizer.state.values()))


@contextmanager
def _bit_flipped(tensor, index=0, bit=0):
    """One bit of one element flipped in place (the smallest change a value can have), then flipped back."""
    raw = tensor.data.view(-1).view(torch.int32 if tensor.element_size() == 4 else torch.int64)
    raw[index] ^= 1 << bit
    try:
        yield
    finally:
        raw[index] ^= 1 << bit


@contextmanager
def _attribute_changed(owner, name, change):
    original = getattr(owner, name)
    setattr(owner, name, change(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def test_the_state_holds_every_part_the_proof_must_cover(engine):
    keys = training_state_digest(engine).keys()
    for key in (FIRST_LAYER, f"{OPTIMIZER}.exp_avg", f"{OPTIMIZER}.exp_avg_sq", f"{OPTIMIZER}.step", FP32_PARTITION,
                "lr_scheduler.last_batch_iteration", "global_steps"):
        assert key in keys


def test_an_unchanged_state_has_no_problems(engine):
    assert compare(training_state_digest(engine), training_state_digest(engine)) == []


@pytest.mark.parametrize("key, tensor_of", [
    (FIRST_LAYER, lambda e: e.module[0].weight),
    ("module.2.bias", lambda e: e.module[2].bias),
    (f"{OPTIMIZER}.exp_avg", lambda e: _optimizer_state(e)["exp_avg"]),
    (f"{OPTIMIZER}.exp_avg_sq", lambda e: _optimizer_state(e)["exp_avg_sq"]),
    (FP32_PARTITION, lambda e: e.optimizer.single_partition_of_fp32_groups[0]),
])
def test_one_flipped_bit_of_one_tensor_is_named_alone(engine, key, tensor_of):
    saved = training_state_digest(engine)
    with _bit_flipped(tensor_of(engine)):
        restored = training_state_digest(engine)
    assert compare(saved, restored) == [f"{key}: differs"]


@given(element=st.integers(0, 47), bit=st.integers(0, 31))
def test_any_bit_of_any_element_of_a_weight_is_seen(engine, element, bit):
    saved = training_state_digest(engine)
    with _bit_flipped(engine.module[0].weight, element, bit):
        restored = training_state_digest(engine)
    assert compare(saved, restored) == [f"{FIRST_LAYER}: differs"]


@pytest.mark.parametrize("key, owner_of, name", [
    ("lr_scheduler.last_batch_iteration", lambda e: e.lr_scheduler, "last_batch_iteration"),
    ("global_steps", lambda e: e, "global_steps"),
])
def test_a_changed_counter_is_named_alone(engine, key, owner_of, name):
    saved = training_state_digest(engine)
    with _attribute_changed(owner_of(engine), name, lambda value: value + 1):
        restored = training_state_digest(engine)
    assert compare(saved, restored) == [f"{key}: differs"]


def test_the_optimizer_step_count_is_named_alone(engine):
    saved = training_state_digest(engine)
    step = _optimizer_state(engine)["step"]
    step += 1
    try:
        restored = training_state_digest(engine)
    finally:
        step -= 1
    assert compare(saved, restored) == [f"{OPTIMIZER}.step: differs"]


def test_same_bytes_under_another_dtype_or_shape_differ():
    zeros = torch.zeros(6, dtype=torch.float32)
    hashes = {tensor_hash(t) for t in (zeros, zeros.view(torch.int32), zeros.view(2, 3), zeros.view(3, 2))}
    assert len(hashes) == 4
    assert compare(digest({"w": zeros}), digest({"w": zeros.view(2, 3)})) == ["w: differs"]


def test_a_digest_is_the_same_in_every_process():
    """Phase 2 compares against what phase 1 recorded in another process: a tensor's hash depends only on its
    dtype, shape and bytes (values pinned here; the format is verify.HASH_NAME)."""
    assert tensor_hash(torch.arange(6, dtype=torch.float32).view(2, 3)) == "cd6ce7d68fd041a89c2d7147"
    assert tensor_hash(torch.arange(6, dtype=torch.bfloat16)) == "468bdd305dbfc84d264a9be8"


def _reference_hash(tensor: torch.Tensor) -> str:
    """tensor_hash written out with hashlib alone, from one full host copy of the bytes: SHA-256 of the format, the
    chunk size, dtype, shape and chunk count, then the SHA-256 of every CHUNK_BYTES slice of the bytes in order."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    size = verify.CHUNK_BYTES
    chunks = [data[start:start + size] for start in range(0, len(data), size)]
    whole = hashlib.sha256(f"sha256-chunked-v2 {size} {tensor.dtype}{tuple(tensor.shape)} {len(chunks)}\n".encode())
    for chunk in chunks:
        whole.update(hashlib.sha256(chunk).digest())
    return whole.hexdigest()[:24]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes", [None, 1, 7, 64])
def test_a_tensors_hash_is_the_sha256_of_its_header_and_its_chunks_hashes(monkeypatch, dtype, chunk_bytes):
    """For the study's dtypes, at the real chunk size and at small ones (many chunks, the last one shorter): signed
    zeros (-0.0 and 0.0 differ by one bit), a transposed (non-contiguous) tensor, a scalar and an empty one."""
    if chunk_bytes:
        monkeypatch.setattr(verify, "CHUNK_BYTES", chunk_bytes)
    values = torch.tensor([[-0.0, 0.0, 1.5], [-2.25, float("inf"), 3e-3]], dtype=dtype)
    cases = [values, values.t(), values[0, 0], values[:0], torch.randn(257, 3).to(dtype)]
    assert [tensor_hash(t) for t in cases] == [_reference_hash(t) for t in cases]
    assert [tensor_hash(t, threads=3) for t in cases] == [_reference_hash(t) for t in cases]
    assert tensor_hash(torch.tensor([-0.0], dtype=dtype)) != tensor_hash(torch.tensor([0.0], dtype=dtype))


def test_a_digest_hashed_on_threads_equals_the_one_thread_digest(monkeypatch):
    """A big state is hashed on several threads: the entries, their order and every hash are the one-thread
    digest's, plain values and objects without state included."""
    state = {"w": [torch.randn(300, 7), torch.arange(5, dtype=torch.bfloat16)], 3: {"step": 4, "x": object()},
             "b": torch.zeros(0), "lr": 0.1, "none": None}
    monkeypatch.setattr(verify, "PARALLEL_BYTES", 10**12)
    one_thread = digest(state)
    monkeypatch.setattr(verify, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(verify, "HASH_THREADS", 4)
    threaded = digest(state)
    assert list(threaded.items()) == list(one_thread.items())
    assert list(one_thread) == ["w[0]", "w[1]", "3:int.step", "b", "lr", "none"]
    assert one_thread["w[0]"] == tensor_hash(state["w"][0])


def test_bfloat16_tensors_empty_or_not_are_digested():
    """bf16 is the study's precision, and numpy has no bfloat16: the bytes are hashed, whatever the dtype."""
    ones, empty = torch.ones(3, dtype=torch.bfloat16), torch.empty(0, dtype=torch.bfloat16)
    hashes = {tensor_hash(t) for t in (ones, ones.view(torch.float16), empty, empty.view(torch.float16))}
    assert len(hashes) == 4


def test_a_digest_under_a_prefix_names_every_entry_under_it():
    """consolidated.py digests parts of the state under their place in it (``digest(hyper, "optimizer.group0")``):
    every key, of tensors and plain values alike, starts with the prefix; a bare tensor is the prefix itself."""
    weight = torch.ones(2)
    assert digest({"w": weight, "lr": 0.1, "betas": [0.9, 0.95]}, "optimizer.group0") == {
        "optimizer.group0.w": tensor_hash(weight), "optimizer.group0.lr": "0.1",
        "optimizer.group0.betas[0]": "0.9", "optimizer.group0.betas[1]": "0.95"}
    assert digest(weight, "module.0.weight") == {"module.0.weight": tensor_hash(weight)}


def test_none_is_recorded_and_objects_without_training_state_are_left_out():
    """An object's repr holds its address, which differs in the restoring process: recorded, it would fail
    every restore."""
    class Bookkeeping:
        pass

    assert digest({"clip": None, "hook": Bookkeeping(), "lr": 0.1}) == {"clip": "None", "lr": "0.1"}


def test_an_engine_without_optimizer_or_scheduler_digests_its_module_and_step():
    engine = SimpleNamespace(module=torch.nn.Linear(2, 1), optimizer=None, lr_scheduler=None, global_steps=3)
    assert training_state_digest(engine).keys() == {"module.weight", "module.bias", "global_steps"}


def test_the_engine_digests_record_what_they_cost():
    """The proof's spans (``proof.digest``, ``restore.verify``) get their digest's cost through these two."""
    engine = SimpleNamespace(module=torch.nn.Linear(2, 1), optimizer=None, lr_scheduler=None, global_steps=3)
    for take in (training_state_digest, module_digest):
        cost = verify.DigestCost()
        take(engine, cost)
        assert (cost.tensor_bytes, cost.chunks) == (3 * 4, 2), take.__name__  # weight 2 and bias 1 float32


def test_the_resumed_weights_are_digested_under_the_state_digests_keys(engine):
    state = training_state_digest(engine)
    assert module_digest(engine) == {key: value for key, value in state.items() if key.startswith("module.")}


def test_integer_optimizer_ids_turned_into_strings_are_caught(engine):
    saved = engine.optimizer.state_dict()
    restored = engine.optimizer.state_dict()
    base = restored["base_optimizer_state"]
    base["state"] = {str(key): value for key, value in base["state"].items()}
    problems = compare(digest(saved), digest(restored))
    assert "base_optimizer_state.state.0:int.exp_avg: saved but absent after restore" in problems
    assert "base_optimizer_state.state.0.exp_avg: absent at save, present after restore" in problems


@given(differing=st.integers(0, 30), limit=st.integers(1, 12))
def test_a_long_list_of_problems_is_cut_at_the_limit_and_counts_the_rest(differing, limit):
    saved = {f"k{i:02d}": "a" for i in range(40)}
    restored = {**saved, **{f"k{i:02d}": "b" for i in range(differing)}}
    problems = compare(saved, restored, limit=limit)
    shown = [f"k{i:02d}: differs" for i in range(min(differing, limit))]
    assert problems == (shown + [f"... and {differing - limit} more"] if differing > limit else shown)


def test_by_default_ten_problems_are_listed_and_the_rest_counted():
    saved = {f"k{i:02d}": "a" for i in range(12)}
    problems = compare(saved, {key: "b" for key in saved})
    assert problems == [f"k{i:02d}: differs" for i in range(10)] + ["... and 2 more"]


def test_each_ranks_digest_is_recorded_under_the_run_folder_and_read_back(tmp_path):
    """``digests/<tag>/rank<NNNNN>.json`` as the README's run folder lists it, one file per rank in one folder."""
    run_dir = tmp_path / "run"
    values = {rank: {"module.0.weight": f"hash-of-rank-{rank}", "global_steps": "4"} for rank in (0, 3)}
    for rank, value in values.items():
        write_digest(run_dir, "step4", rank, value)
    assert sorted(path.relative_to(run_dir).as_posix() for path in run_dir.rglob("*.json")) == [
        "digests/step4/rank00000.json", "digests/step4/rank00003.json"]
    assert digest_path(run_dir, "step4", 3) == run_dir / "digests" / "step4" / "rank00003.json"
    assert {rank: read_digest(run_dir, "step4", rank) for rank in values} == values


def test_a_missing_digest_names_the_rank_and_the_likely_cause(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no digest 'step4' recorded for rank 1 .*run with --verify\?"):
        read_digest(tmp_path, "step4", 1)

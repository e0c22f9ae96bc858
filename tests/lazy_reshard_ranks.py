"""The rank program of tests/test_engine_lazy_reshard.py, run by torchrun on 4 gloo ranks: in one launch, for each
scenario ``A:B1,B2`` (dtype ``fp32`` or ``bf16``), build the tiny model in layout A, train 2 iterations, save with
the lazy engine (tag ``<A>``) and record the digest of the training state and iteration 3's loss; then for each B,
build the model in layout B, load tag A (a load in another layout), save it (tag ``<A>-<B>``), run iteration 3;
build A again, load tag ``<A>-<B>`` and compare the digest with A's. The layout-independent digest of the
full-shape state (``restartbench.consolidated``) is compared right after the load in B, too. Writes
``rank<N>.json`` into the output folder: each load's files and bytes read, this rank's coordinates, the digests'
differences and the losses. Then the loads that must be refused (another preset, another dtype), each error's text
recorded.

    torchrun --nproc-per-node 4 tests/lazy_reshard_ranks.py OUT CKPT fp32:tp2pp2dp1:tp1pp2dp2,tp1pp1dp4 ...

Every layout trains on the same global batch (4 micro-batches: gradient accumulation 4 / dp), so iteration 3's loss
is the same computation in every layout, up to the order of floating-point sums.
"""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import deepspeed
import torch.distributed as dist

from restartbench import runtime
from restartbench.config import EngineConfig
from restartbench.consolidated import consolidated_digest
from restartbench.data import micro_batches
from restartbench.engines.lazy.engine import LazyEngine
from restartbench.layout import parse_layout
from restartbench.model import build_pipeline_module
from restartbench.presets import get_preset
from restartbench.verify import compare, training_state_digest

GLOBAL_BATCH = 4
SEED = 1234
TINY = get_preset("tiny")


def ds_config(dp: int, dtype: str) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": GLOBAL_BATCH // dp,
            "train_batch_size": GLOBAL_BATCH, "steps_per_print": 10**9, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 1}, "bf16": {"enabled": dtype == "bf16"},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1, "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3,
                                                         "warmup_num_steps": 2}},
            "wall_clock_breakdown": False}


def build(name: str, dtype: str, preset=TINY):
    layout = parse_layout(name).resolve(dist.get_world_size())
    module = build_pipeline_module(preset, layout, seed=SEED)
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                      config=ds_config(layout.dp, dtype))
    return engine


def iteration(engine, step: int) -> float:
    batches = micro_batches(vocab_size=TINY.vocab_size, seq_len=TINY.seq_len, micro_batch=1,
                            grad_accum=engine.gradient_accumulation_steps(), step=step,
                            dp_rank=engine.grid.get_data_parallel_rank(), seed=SEED)
    return float(engine.train_batch(data_iter=iter(batches)))


def lazy() -> LazyEngine:
    return LazyEngine(EngineConfig(engine="lazy", lazy_chunk_mb=1, lazy_io_threads=2))


def save(engine, ckpt: str, tag: str) -> LazyEngine:
    saver = lazy()
    saver.save(engine, ckpt, tag)
    saver.wait_until_durable()
    dist.barrier()  # every rank's files are on disk before any rank loads them
    return saver


def load(engine, ckpt: str, tag: str) -> list[list]:
    loader = lazy()
    loader.load(engine, ckpt, tag)
    return [[os.path.relpath(r.path, ckpt), r.bytes] for r in loader.read()]


def coords(engine) -> list[int]:
    grid = engine.grid
    return [grid.get_stage_id(), grid.get_slice_parallel_rank(), grid.get_data_parallel_rank()]


def refused(ckpt: str, tag: str, layout: str, dtype: str, preset=TINY) -> str:
    """The error text of a load that must be refused ('' if it went through)."""
    engine = build(layout, dtype, preset)
    try:
        load(engine, ckpt, tag)
    except Exception as error:  # noqa: BLE001 - the test reads the message
        return f"{type(error).__name__}: {error}"
    return ""


def main() -> int:
    out, ckpt, *scenarios = sys.argv[1:]
    runtime.skip_shm_comm_build()
    runtime.init_distributed("gloo", 300)
    rank = dist.get_rank()
    report: dict = {"rank": rank, "scenarios": []}
    for scenario in scenarios:
        dtype, first, others = scenario.split(":")
        engine = build(first, dtype)
        for step in (1, 2):
            iteration(engine, step)
        saver = save(engine, ckpt, first)
        digest, full = training_state_digest(engine), consolidated_digest(engine)
        record = {"a": first, "dtype": dtype, "coords_a": coords(engine), "loss_ref": iteration(engine, 3),
                  "bs": []}
        del saver, engine
        for other in others.split(","):
            engine = build(other, dtype)
            read_a = load(engine, ckpt, first)
            save(engine, ckpt, f"{first}-{other}")
            entry = {"b": other, "coords_b": coords(engine), "read_a": read_a,
                     "full_problems": compare(full, consolidated_digest(engine)), "loss_b": iteration(engine, 3)}
            engine = build(first, dtype)
            entry["read_b"] = load(engine, ckpt, f"{first}-{other}")
            entry["problems"] = compare(digest, training_state_digest(engine))
            record["bs"].append(entry)
        report["scenarios"].append(record)
    first = scenarios[0].split(":")[1]
    other = scenarios[0].split(":")[2].split(",")[0]
    wider = replace(TINY, name="tiny-wider", ffn_hidden=TINY.ffn_hidden + 16)
    report["refused"] = {
        "preset": refused(ckpt, first, other, "fp32", wider),
        "dtype": refused(ckpt, first, other, "bf16"),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""deepspeed.initialize broken into DeepSpeed's own stages and the collectives it waited in
(restartbench.ds_init_timing), on a real single-rank engine of the tiny model; every wrapped function is given back."""

import time

import torch
from test_predict import config

from restartbench import ds_init_timing
from restartbench.ds_init_timing import timed_stages
from restartbench.layout import Layout
from restartbench.plan import setup_for
from restartbench.presets import get_preset


def _attributes() -> dict[tuple[int, str], object]:
    """Every attribute timed_stages wraps, as it is now."""
    return {(id(owner), attribute): vars(owner).get(attribute)
            for owner, attribute, _, _ in ds_init_timing.targets()}


def test_real_initialize_is_broken_into_stages_that_add_up(monkeypatch):
    """tiny tp1pp1dp1 fp32 (a PipelineEngine with ZeRO-1, gloo, world size 1): the configuration, engine, distributed
    model, optimizer, ZeRO and scheduler stages are timed, every figure is non-negative, parts + waits + other is the
    timed block, which is no longer than the call measured around it; afterwards every attribute is the original."""
    import deepspeed
    import torch.distributed as dist

    from restartbench import runtime
    from restartbench.model import build_pipeline_module

    before = _attributes()
    setup = setup_for(config("tiny", "tp1pp1dp1", "fp32"))
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    runtime.skip_shm_comm_build()
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    try:
        deepspeed.init_distributed(dist_backend="gloo")  # PipelineModule's grid needs DeepSpeed's comm backend
        module = build_pipeline_module(get_preset("tiny"), Layout(1, 1, 1), seed=0)
        start = time.perf_counter()
        with timed_stages() as stages:
            engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                              config=setup.ds_config)
        span = time.perf_counter() - start
        assert isinstance(engine, deepspeed.PipelineEngine)
    finally:
        deepspeed.comm.destroy_process_group()
    fields = stages.fields()
    assert {"ds_config", "engine_init", "distributed_model", "configure_optimizer", "basic_optimizer",
            "optimizer_sanity_check", "zero_optimizer", "lr_scheduler", "checkpointing", "pipeline_init"
            } <= set(fields["parts"])
    assert "untimed" not in fields
    figures = [*fields["parts"].values(), fields["collective_wait_s"], fields["other_s"],
               *(entry["s"] for entry in fields["collectives"].values())]
    assert all(value >= 0 for value in figures)
    assert sum(fields["parts"].values()) + fields["collective_wait_s"] + fields["other_s"] <= span + 1e-6
    assert abs(sum(fields["parts"].values()) + fields["collective_wait_s"] + fields["other_s"]
               - fields["timed_s"]) < 1e-4
    assert fields["timed_s"] <= span
    assert _attributes() == before


def test_own_times_exclude_nested_calls_and_the_wrappers_go_even_when_the_block_raises(monkeypatch):
    """A stage calling another stage and a collective: each counted once, as its own time; a raising block still
    restores every attribute."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    before = _attributes()

    def collective(*args, **kwargs):
        time.sleep(0.05)

    def inner(self):
        time.sleep(0.05)
        torch.distributed.barrier()

    def outer(self):
        time.sleep(0.05)
        self._configure_lr_scheduler()

    monkeypatch.setattr(torch.distributed, "barrier", collective)
    monkeypatch.setattr(DeepSpeedEngine, "_configure_optimizer", outer)
    monkeypatch.setattr(DeepSpeedEngine, "_configure_lr_scheduler", inner)
    patched = _attributes()
    try:
        with timed_stages() as stages:
            DeepSpeedEngine._configure_optimizer(DeepSpeedEngine.__new__(DeepSpeedEngine))
            raise KeyError("the block fails")
    except KeyError:
        pass
    assert _attributes() == patched
    fields = stages.fields()
    for name in ("configure_optimizer", "lr_scheduler"):
        assert 0.045 < fields["parts"][name] < 0.09, fields
    assert fields["collectives"]["barrier"]["calls"] == 1 and 0.045 < fields["collective_wait_s"] < 0.09
    assert fields["timed_s"] >= 0.15
    monkeypatch.undo()
    assert _attributes() == before


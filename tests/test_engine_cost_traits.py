"""Each engine's ``CostTraits`` (its registry entry, in its folder): what the what-if model reads of it, and nothing
else. An engine registered with another entry gets the form its traits say, whatever its name."""

from dataclasses import replace

import pytest
from whatif_cases import JOB, h100_raw

from restartbench import engines
from restartbench.engines.base import CostTraits
from restartbench.engines.dcp.predict import dedup_owners
from restartbench.whatif import tensors
from restartbench.whatif.cluster import cluster_from_mapping
from restartbench.whatif.fit import Fit, Limits
from restartbench.whatif.predict import can_prefetch, checkpoint_parts
from restartbench.whatif.terms import GB, Line


def _local() -> dict:
    raw = h100_raw()
    raw["storage"]["value"] = "local"
    return raw


CUDA_LOCAL = cluster_from_mapping(_local(), "test.yaml")  # clusters/h100-pfs.yaml on the node's own disk
LINES = {"stall": Line(0.1, {"files": 0.01, "bytes": 1 / GB}), "durable": Line(0.2, {"files": 0.02, "at_limit": 2.0}),
         "load": Line(0.7, {"files": 0.03, "at_limit": 1.5}), "engine setup": Line(0.05)}
HOST = 0.1 + 0.01 * 3 + 2.0  # JOB's busiest rank: 3 files, 2 GB


@pytest.fixture
def torch_as(request):
    """DeepSpeed's torch engine registered with other ``CostTraits`` for one test, then as it was."""
    original = engines.engine_info("torch")

    def register(**traits: object) -> None:
        engines.register(replace(original, cost=CostTraits(**traits)))

    yield register
    engines.register(original)


def _stall(engine: str = "torch") -> float:
    fit = Fit(Limits(1.0, 2.0, "synthetic"), 64, engines={engine: LINES}, device="cuda")
    return checkpoint_parts(engine, JOB, fit, CUDA_LOCAL)["stall"]["s"]


def test_the_copy_out_of_the_gpu_is_at_the_pageable_rate_where_the_entry_says_so(torch_as):
    pageable = _stall()
    torch_as(pageable_copy=False)
    assert pageable - _stall() == pytest.approx(2 / CUDA_LOCAL.d2h_pageable_GBps - 2 / CUDA_LOCAL.d2h_pinned_GBps)


def test_a_side_stream_entry_blocks_for_its_fixed_costs_only(torch_as):
    torch_as(side_stream=True, asynchronous=True)
    assert _stall() == pytest.approx(0.1 + 0.01 * 3)


def test_an_asynchronous_entry_slows_training_and_a_synchronous_one_does_not(torch_as):
    fit = Fit(Limits(1.0, 2.0, "synthetic"), 64, engines={"torch": LINES}, device="cuda")
    assert checkpoint_parts("torch", JOB, fit, CUDA_LOCAL)["slowdown"]["s"] == 0.0
    torch_as(pageable_copy=True, asynchronous=True)
    assert checkpoint_parts("torch", JOB, fit, CUDA_LOCAL)["slowdown"]["s"] > 0.0


def test_who_writes_the_stage_module_follows_the_entry(torch_as):
    module = (tensors.Tensor(300, 310), tensors.Tensor(200, 210), tensors.Tensor(100, 110))
    whole, nothing = tensors.Share(600, 600, 3), tensors.Share(0, 0, 0)
    assert tensors.module_shares(module, [0, 1], "torch") == [whole, nothing]
    torch_as(pageable_copy=True, every_replica=True)
    assert tensors.module_shares(module, [0, 1], "torch") == [whole, whole]
    torch_as(module_split="restartbench.engines.dcp.predict:dedup_owners")
    assert tensors.module_shares(module, [0, 1], "torch") == [tensors.Share(300, 310, 1), tensors.Share(300, 320, 2)]


def test_an_emulated_run_has_its_engines_traits():
    assert engines.cost_traits("dcp-emulated") == engines.engine_info("dcp").cost
    assert engines.module_split("dcp-emulated") is dedup_owners and engines.module_split("torch") is None


def test_an_emulated_run_is_predicted_as_its_engine():
    assert engines.base_engine("lazy-emulated") == "lazy" and engines.base_engine("dcp-async") == "dcp-async"
    assert can_prefetch("lazy-emulated") and not can_prefetch("torch-emulated")


def test_an_emulated_run_is_listed_apart_from_its_engine_and_back():
    listed = engines.listed_as("dcp-async", emulated=True)
    assert listed == "dcp-async-emulated" and engines.is_emulated(listed)
    assert engines.base_engine(listed) == "dcp-async"
    assert engines.listed_as("dcp-async", emulated=False) == "dcp-async"
    assert not engines.is_emulated("dcp-async")


def test_a_module_is_written_by_every_replica_or_split_among_them_not_both():
    with pytest.raises(ValueError, match="either by every replica or split among them"):
        CostTraits(every_replica=True, module_split="restartbench.engines.dcp.predict:dedup_owners")


def test_dcp_gives_each_tensor_to_the_replica_with_the_fewest_bytes_and_a_tie_in_its_set_order():
    # 100 to the first in set order (a tie at 0), 50 and 60 to the other, 10 back to the first (100 < 110)
    assert dedup_owners([100, 50, 60, 10], [0, 1]) == [0, 1, 1, 0]
    # {1, 9, 17, 25} iterates 1, 25, 9, 17: the fourth tie goes to rank 25 (position 3), not rank 9
    assert dedup_owners([5, 5, 5, 5], [1, 9, 17, 25]) == [0, 3, 1, 2]
    assert dedup_owners([0, 0, 7], [0, 1]) == [0, 1, 0]  # an empty tensor weighs 1

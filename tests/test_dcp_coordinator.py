"""restartbench.engines.dcp.coordinator's plans: the other replicas' plans made from data-parallel rank 1's give the
coordinator DCP's own global plan of every rank's own plans, item by item, and the index the what-if counts."""

import pickle

import pytest
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from restartbench.engines import harness_state
from restartbench.engines.dcp import coordinator
from restartbench.engines.dcp import engine as dcp_engine
from restartbench.layout import Layout
from restartbench.plan import config_named, setup_for
from restartbench.shards import training_states
from restartbench.whatif.predict import job_for, shapes_for
from restartbench.whatif.tensors import index_items, planned_items


def every_rank_planned(preset: str, layout: Layout) -> list[bytes]:
    """Every rank's own local plan, pickled, in rank order (what a real gather receives)."""
    setup = setup_for(config_named(preset, layout.name, "dcp"))
    writer = FileSystemWriter(f"{setup.folder}/{setup.tag}")
    return [pickle.dumps(dcp_engine.rank_save_planner(state, coord, writer.storage_meta(), rank == 0)
                         .create_local_plan()) for rank, coord, state in training_states(setup)]


def every_rank_load_planned(preset: str, layout: Layout, metadata) -> list[list[tuple]]:
    """Every rank's own local load plan of ``metadata``'s checkpoint, in rank order: each item's (destination,
    storage) keys and offsets."""
    setup = setup_for(config_named(preset, layout.name, "dcp"))
    plans = []
    for _, coord, state in training_states(setup):
        live = dcp_engine.flat_state(harness_state.capture(state), coord.pipe, coord.model, coord.data)
        template = dcp_engine.load_template(metadata, live, coord.pipe, coord.model, coord.data)
        plans.append(read_items(create_default_local_load_plan(template, metadata, True)))
    return plans


def read_items(plan) -> list[tuple]:
    """Its items as (destination key, storage key, lengths), in key order: a replica's plan follows the index's
    order, in which its own keys stand elsewhere than rank 1's (the order costs the coordinator nothing)."""
    return sorted(((item.dest_index, item.storage_index, tuple(item.lengths)) for item in plan.items), key=str)


def global_plan(blobs: list[bytes]) -> tuple[list[list[str]], int]:
    """(each rank's items after DCP's deduplication, the index's items) of the gathered plans."""
    planner = dcp_engine.save_planner()
    planner.set_up_planner(state_dict={}, is_coordinator=True)
    plans, metadata = planner.create_global_plan([pickle.loads(blob) for blob in blobs])
    return [[item.index.fqn for item in plan.items] for plan in plans], len(metadata.state_dict_metadata)


@pytest.mark.parametrize(("preset", "layout"), [("tiny", Layout(2, 2, 4)), ("small", Layout(1, 2, 5))])
def test_replicas_made_from_rank_1_give_dcps_own_global_plan(preset, layout):
    made = coordinator.gathered(coordinator.local_plans(setup_for(config_named(preset, layout.name, "dcp"))), layout)
    assert len(made) == layout.world_size
    assert global_plan(made) == global_plan(every_rank_planned(preset, layout))
    assert global_plan(made)[1] == index_items(shapes_for(preset, layout, ["dcp"])["dcp"].tensors, layout.dp)


def test_the_coordinator_counts_every_rank_and_each_item_once():
    layout = Layout(2, 2, 4)
    row = coordinator.measure(setup_for(config_named("tiny", layout.name, "dcp")))
    assert row["ranks"] == 16
    assert row["local_items"] == planned_items(shapes_for("tiny", layout, ["dcp"])["dcp"].tensors, layout.dp, "dcp")
    assert row["written_items"] == row["index_items"] < row["local_items"]  # the replicas' module items, once
    assert row["coordinator_s"] == pytest.approx(row["gather_s"] + row["global_plan_s"] + row["scatter_s"]
                                                 + row["finish_s"])
    assert row["per_item_s"] == pytest.approx(row["coordinator_s"] / row["local_items"])


def test_the_what_if_counts_the_items_the_coordinator_gathers_at_any_dp():
    """The job's items planned, from the plan's tensors at dp 4, are the coordinator's at dp 8 (and 0 for an engine
    whose ranks save alone)."""
    shape = shapes_for("tiny", Layout(2, 2, 4), ["dcp"])["dcp"]
    at_8 = coordinator.measure(setup_for(config_named("tiny", "tp2pp2dp8", "dcp")))
    assert job_for(shape, dp=8, per_node=8).items_planned == at_8["local_items"] == 2 * planned_items(
        shape.tensors, 4, "dcp")
    assert planned_items(shape.tensors, 8, "torch") == 0 and planned_items({}, 8, "dcp") == 0


def test_load_plans_made_from_rank_1_are_every_ranks_own():
    layout = Layout(2, 2, 4)
    setup = setup_for(config_named("tiny", layout.name, "dcp"))
    planner = dcp_engine.save_planner()
    planner.set_up_planner(state_dict={}, is_coordinator=True)
    _, metadata = planner.create_global_plan([pickle.loads(blob) for blob in
                                              coordinator.gathered(coordinator.local_plans(setup), layout)])
    made = coordinator.gathered(coordinator.local_load_plans(setup, metadata), layout)
    assert [read_items(pickle.loads(blob)) for blob in made] == every_rank_load_planned("tiny", layout, metadata)
    row = coordinator.load_coordinator(made)
    assert row["load_items"] == planned_items(shapes_for("tiny", layout, ["dcp"])["dcp"].tensors, 4, "dcp")
    assert row["load_per_item_s"] == pytest.approx(row["load_coordinator_s"] / row["load_items"])

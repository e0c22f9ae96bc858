"""Engines that capture DeepSpeed's state themselves: DCP (save, async_save) and patched TorchSnapshot.

Fast tests of the shared state handling (skeleton/tensor split, DCP keys and file attribution,
real DCP and TorchSnapshot round trips in one process), then one real 4-rank run per engine
(tiny pp2dp2 fp32): relaunch, exact restore, files under the tag folder, no byte counted twice.
"""

import json
import os
from collections import OrderedDict

import pytest
import torch

from restartbench.engines import harness_state
from restartbench.engines.dcp import engine as dcp_engine
from restartbench.events import read_events
from restartbench.layout import parse_layout

# -- pure logic --------------------------------------------------------------------------------------


def nested_state():
    """The shapes a harness state has: an OrderedDict module, int-keyed optimizer state, tuples, None."""
    return {
        "module": OrderedDict([("0.weight", torch.arange(6.0).reshape(2, 3)),
                               ("1.norm", torch.ones(3, dtype=torch.bfloat16))]),
        "optimizer": {"fp32_partitions": [torch.full((4,), 0.5)],
                      "base": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}},
                               "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "foreach": None, "params": [0]}]},
                      "loss_scaler": {"cur_scale": 1.0}, "overflow": False},
        "lr_scheduler": {"last_batch_iteration": 3},
        "counters": {"global_steps": 4, "global_samples": 8, "skipped_steps": 0},
    }


def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)  # same keys, same types (0 is not '0'), same order
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_split_and_join_round_trip_keeps_types_and_shares_tensors():
    state = nested_state()
    skeleton, tensors = harness_state.split(state)
    assert set(tensors) == {"module/0.weight", "module/1.norm", "optimizer/fp32_partitions/0",
                            "optimizer/base/state/0/step", "optimizer/base/state/0/exp_avg"}
    assert tensors["module/0.weight"] is state["module"]["0.weight"], "split copies nothing"
    assert skeleton["optimizer"]["base"]["state"][0]["exp_avg"] == {
        harness_state.TENSOR_SLOT: "optimizer/base/state/0/exp_avg"}
    assert_same(harness_state.join(skeleton, tensors), state)


def test_split_refuses_keys_that_collide_as_strings():
    with pytest.raises(ValueError, match="'state/0'"):
        harness_state.split({"state": {0: torch.zeros(1), "0": torch.ones(1)}})


def test_join_names_a_tensor_that_was_not_loaded():
    skeleton, _ = harness_state.split({"a": torch.zeros(1)})
    with pytest.raises(KeyError, match="'a'"):
        harness_state.join(skeleton, {})


def test_copy_tensors_copies_in_place_and_names_mismatches():
    live = {"w": torch.zeros(3)}
    target = live["w"]
    harness_state.copy_tensors(live, {"w": torch.ones(3)}, "module")
    assert live["w"] is target and torch.equal(target, torch.ones(3))
    with pytest.raises(ValueError, match=r"module: the checkpoint does not match this model: missing \['w'\]"):
        harness_state.copy_tensors(live, {"v": torch.ones(3)}, "module")
    with pytest.raises(ValueError, match=r"module w: checkpoint has torch.float64\(3,\)"):
        harness_state.copy_tensors(live, {"w": torch.ones(3, dtype=torch.float64)}, "module")


def test_records_share_the_call_time_by_bytes(tmp_path):
    records = harness_state.records({"b": 300, "a": 100}, 2.0)
    assert [(r.path, r.bytes, r.seconds) for r in records] == [("a", 100, 0.5), ("b", 300, 1.5)]
    assert [r.seconds for r in harness_state.records({"x": 0, "y": 0}, 1.0)] == [0.5, 0.5]
    (tmp_path / "d" / "e").mkdir(parents=True)
    for name in ("d/e/f", "d/g", ".h"):
        (tmp_path / name).write_text("x")
    assert harness_state.files_under(str(tmp_path)) == [str(tmp_path / n) for n in (".h", "d/e/f", "d/g")]


# -- DCP -------------------------------------------------------------------------------------------------


def test_dcp_keys_share_the_module_between_data_parallel_replicas():
    keys = set(dcp_engine.flat_state(nested_state(), 1, 0, 1))
    assert "pp1-tp0/module/0.weight" in keys and "pp1-tp0-dp1/optimizer/fp32_partitions/0" in keys
    assert "pp1-tp0-dp1/skeleton" in keys
    assert dcp_engine.is_mine("pp1-tp0/module/0.weight", 1, 0, 1)
    assert not dcp_engine.is_mine("pp1-tp0-dp0/optimizer/fp32_partitions/0", 1, 0, 1)
    assert not dcp_engine.is_mine("pp10-tp0/module/0.weight", 1, 0, 1)


def test_dcp_files_belong_to_exactly_one_rank():
    names = [".metadata", "__0_0.distcp", "__1_0.distcp", "__10_0.distcp", "__1_1.distcp", "manifest.json"]
    assert dcp_engine.files_of_rank(names, 0) == [".metadata", "__0_0.distcp"]
    assert dcp_engine.files_of_rank(names, 1) == ["__1_0.distcp", "__1_1.distcp"]
    assert dcp_engine.files_of_rank(names, 10) == ["__10_0.distcp"]


def test_dcp_round_trip_restores_each_rank_its_own_state(tmp_path):
    """Two data-parallel ranks' flat states saved as DCP would see them; each loads back exactly its own."""
    import torch.distributed.checkpoint as dcp

    states = {dp: nested_state() for dp in (0, 1)}
    states[1]["optimizer"]["fp32_partitions"][0] += 1  # the partitions differ, the module is the same
    flat = {**dcp_engine.flat_state(states[0], 0, 0, 0), **dcp_engine.flat_state(states[1], 0, 0, 1)}
    dcp.save(flat, storage_writer=dcp.FileSystemWriter(str(tmp_path)), planner=dcp_engine.save_planner(), no_dist=True)
    metadata = dcp.FileSystemReader(str(tmp_path)).read_metadata()
    for dp, state in states.items():
        live = dcp_engine.flat_state(nested_state(), 0, 0, dp)
        live["pp0-tp0/module/0.weight"].zero_()
        template = dcp_engine.load_template(metadata, live, 0, 0, dp)
        assert template["pp0-tp0/module/0.weight"] is live["pp0-tp0/module/0.weight"], "read in place"
        dcp.load(template, storage_reader=dcp.FileSystemReader(str(tmp_path)), planner=dcp_engine.load_planner(),
                 no_dist=True)
        assert_same(dcp_engine.unflatten(template, 0, 0, dp), state)
    with pytest.raises(FileNotFoundError, match="pipeline stage 1"):
        dcp_engine.load_template(metadata, {}, 1, 0, 0)


# -- TorchSnapshot with the study's patch ----------------------------------------------------------------


class PlainStateful:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def test_patch_makes_torchsnapshot_rank_local(monkeypatch):
    pytest.importorskip("torchsnapshot")
    from restartbench.engines.torchsnapshot.engine import patched_torchsnapshot

    patched_torchsnapshot()
    import torchsnapshot.scheduler as scheduler
    import torchsnapshot.snapshot as snapshot

    wrapper = snapshot.PGWrapper(pg=object())  # any process group: ignored
    assert wrapper.pg is None and wrapper.get_rank() == 0 and wrapper.get_world_size() == 1
    gathered = [None]
    wrapper.all_gather_object(gathered, "mine")
    assert gathered == ["mine"]
    assert snapshot.Snapshot._infer_replicated(["**"], {}) == []
    monkeypatch.delenv("TORCHSNAPSHOT_PER_RANK_MEMORY_BUDGET_BYTES", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = snapshot.get_process_memory_budget_bytes(wrapper)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared = snapshot.get_process_memory_budget_bytes(wrapper)
    assert shared < alone <= scheduler._MAX_PER_RANK_MEMORY_BUDGET_BYTES


def test_torchsnapshot_round_trip_of_a_harness_shaped_state(tmp_path):
    pytest.importorskip("torchsnapshot")
    from restartbench.engines.torchsnapshot.engine import patched_torchsnapshot, rank_folder

    Snapshot = patched_torchsnapshot().Snapshot
    folder = rank_folder(str(tmp_path), "step4", 3)
    assert folder.endswith(os.path.join("step4", "rank00003"))
    Snapshot.take(path=folder, app_state={"harness": PlainStateful(nested_state())})
    target = nested_state()
    target["module"]["0.weight"].zero_()
    weight = target["module"]["0.weight"]
    stateful = PlainStateful(target)
    Snapshot(path=folder).restore(app_state={"harness": stateful})
    assert_same(stateful.state, nested_state())
    assert torch.equal(weight, nested_state()["module"]["0.weight"]), "read into the live tensor"


# -- real runs -------------------------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("engine", ["dcp", "dcp-async", "torchsnapshot"])
def test_engine_restores_exactly_after_a_relaunch(engine_runs, engine):
    """The engine's run of the session (conftest.ENGINE_CASES: data-parallel replicas in each, pipeline stages in
    dcp-async's and torchsnapshot's) restores every rank exactly, and each checkpoint file is recorded by one rank."""
    proc, run_dir = engine_runs(engine)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["engine"] == engine
    ranks = meta["world_size"]
    assert parse_layout(meta["layout"]).dp == 2
    events = read_events(run_dir)
    results = [e for e in events if e["event"] == "restore.result"]
    assert sorted(e["rank"] for e in results) == list(range(ranks))
    assert all(e["exact"] is True and e["tag"] == "step4" for e in results), results

    ckpt = run_dir / "checkpoints"
    for tag in ("step2", "step4"):
        durable = [e for e in events if e["event"] == "checkpoint.durable" and e["tag"] == tag]
        assert sorted(e["rank"] for e in durable) == list(range(ranks)) and all(e["bytes"] > 0 for e in durable)
        recorded = [f["path"] for e in durable for f in e["files"]]
        assert len(recorded) == len(set(recorded)), "a file is attributed to one rank only"
        on_disk = {str(p.relative_to(ckpt)): p.stat().st_size for p in (ckpt / tag).rglob("*")
                   if p.is_file() and p.name != "manifest.json"}
        assert set(recorded) == set(on_disk), "every file under the tag folder is recorded, and only those"
        assert sum(e["bytes"] for e in durable) == sum(on_disk.values())
    loads = [e for e in events if e["event"] == "restore.load"]
    assert len(loads) == ranks and all(e["bytes"] > 0 and e["n_files"] > 0 for e in loads)

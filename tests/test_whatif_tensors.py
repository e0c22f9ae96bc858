"""The what-if model's tensors per rank (restartbench.whatif.tensors) and the per-tensor cost of the engines that
handle one item per tensor (DCP): the count against the decoder's arithmetic, what a rank writes, the terms' form,
and the fit recovering a known per-tensor constant from a synthetic run table."""

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from restartbench.layout import Layout, validate_layout
from restartbench.presets import get_preset
from restartbench.whatif import tensors, terms
from restartbench.whatif.cluster import cluster_from_mapping
from restartbench.whatif.fit import Limits, fit_table
from restartbench.whatif.predict import Shape, job_for
from restartbench.whatif.terms import GB, Job, Line

H100 = Path(__file__).resolve().parent.parent / "clusters" / "h100-pfs.yaml"

#: The study's decoder: 9 tensors a layer (2 norms, q, k, v, o, gate, up, down); the embedding on the first stage, the
#: final norm and the output head on the last; ZeRO-1's flat fp32 partition, Adam's step and two moments.
PER_LAYER, FIRST, LAST, OPTIMIZER = 9, 1, 2, 4


def _arithmetic(preset: str, pp: int, stage: int) -> int:
    layers = get_preset(preset).layers // pp
    return PER_LAYER * layers + (FIRST if stage == 0 else 0) + (LAST if stage == pp - 1 else 0)


@pytest.mark.parametrize("preset, layout", [("tiny", "tp1pp1dp2"), ("tiny", "tp2pp2dp1"), ("small", "tp1pp2dp2"),
                                            ("3B", "tp1pp2dp1"), ("70B", "tp8pp8dp1")])
def test_the_count_on_the_plans_state_is_the_decoders_arithmetic(preset, layout):
    counts = tensors.stage_tensors(preset, layout)
    resolved = validate_layout(layout, get_preset(preset))
    assert set(counts) == {(s, t) for s in range(resolved.pp) for t in range(resolved.tp)}
    for (stage, _tp), (module, optimizer) in counts.items():
        assert (module, optimizer) == (_arithmetic(preset, resolved.pp, stage), OPTIMIZER)


def test_the_count_does_not_depend_on_the_dtype():
    assert tensors.stage_tensors("tiny", "tp1pp2dp2", "fp32") == tensors.stage_tensors("tiny", "tp1pp2dp2", "bf16")


def _write_item(fqn: str, raw: int) -> WriteItem:
    """A tensor write item of ``raw`` bytes (uint8), as DCP weighs items in its deduplication."""
    size = torch.Size([raw])
    return WriteItem(index=MetadataIndex(fqn), type=WriteItemType.TENSOR,
                     tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=torch.Size([0]), sizes=size),
                                                 properties=TensorProperties(dtype=torch.uint8), size=size))


@pytest.mark.parametrize("preset, layout, dp", [("3B", "tp1pp1dp2", 2), ("3B", "tp1pp1dp2", 8),
                                                ("small", "tp1pp2dp2", 3), ("7B", "tp1pp1dp2", 64),
                                                ("small", "tp4pp1dp4", 4), ("70B", "tp8pp1dp2", 4)])
def test_dcps_share_of_the_module_is_what_dcps_own_deduplication_gives_each_replica(preset, layout, dp):
    """Every rank's plan (tp ranks of one stage, ``dp`` replicas each): its stage module's tensors (names shared
    with its replicas, in the state's order) then its own optimizer items; DCP's dedup_save_plans keeps each shared
    item in one plan. With tp above 1 a tp rank's replicas are plans 1, 1 + tp, ...: on a tie DCP takes the first
    in the order CPython iterates that set, not the lowest."""
    stages = tensors.stage_module(preset, layout)
    tp = 1 + max(t for _, t in stages)
    resolved = Layout(tp, 1, dp)
    for (stage, tp_rank), module in stages.items():
        if stage:
            continue
        plans = [SavePlan([]) for _ in range(resolved.world_size)]
        for rank in tensors.replica_ranks(0, tp_rank, resolved):
            plans[rank] = SavePlan([_write_item(f"module/{i}", t.raw) for i, t in enumerate(module)]
                                   + [_write_item(f"{rank}/optimizer/{j}", 10**9) for j in range(4)])
        kept = [[int(item.index.fqn.split("/")[1]) for item in plan.items if item.index.fqn.startswith("module/")]
                for rank, plan in enumerate(dedup_save_plans(plans))
                if rank in tensors.replica_ranks(0, tp_rank, resolved)]
        shares = tensors.module_shares(module, tensors.replica_ranks(0, tp_rank, resolved), "dcp")
        assert [(share.raw, share.written, share.tensors) for share in shares] == [
            (sum(module[i].raw for i in ids), sum(module[i].entry for i in ids), len(ids)) for ids in kept]


def test_the_module_goes_to_the_replica_with_the_fewest_bytes_the_first_in_dcps_set_on_a_tie_for_dcp_only():
    module = (tensors.Tensor(100, 110), tensors.Tensor(30, 40), tensors.Tensor(0, 5), tensors.Tensor(50, 60),
              tensors.Tensor(20, 30))
    # 100 → 0; 30 → 1 (0 planned); the empty one → 2 (weighed 1); 50 → 2 (1 < 30); 20 → 1 (30 < 51)
    assert tensors.module_shares(module, [0, 1, 2], "dcp") == [(100, 110, 1), (50, 70, 2), (50, 65, 2)]
    # CPython iterates {1, 9, 17, 25} as 1, 25, 9, 17: 100 → 1; 30 → 25; the empty one → 9; 50 → 17 (still 0);
    # 20 → 9 (1 planned)
    assert tensors.module_shares(module, [1, 9, 17, 25], "dcp") == [(100, 110, 1), (20, 35, 2), (50, 60, 1),
                                                                    (30, 40, 1)]
    assert tensors.module_shares(module, [0, 1, 2], "dcp-async-emulated") == tensors.module_shares(
        module, [0, 1, 2], "dcp")
    whole = (200, 200, 5)  # the others' file framing is not the tensors': written = raw
    assert tensors.module_shares(module, [0, 1, 2], "torch") == [whole, (0, 0, 0), (0, 0, 0)]
    assert tensors.module_shares(module, [0, 1, 2], "lazy") == [whole, (0, 0, 0), (0, 0, 0)]
    assert tensors.module_shares(module, [0, 1, 2], "torchsnapshot") == [whole] * 3


@pytest.mark.parametrize("raws, ranks", [((0, 1, 5), [0, 1]), ((7, 0, 0, 3, 3, 1), [2, 5, 8]),
                                         ((4, 4, 4, 4, 1, 1), [1, 9, 17, 25])])
def test_ties_and_empty_tensors_go_where_dcps_own_deduplication_puts_them(raws, ranks):
    """DCP weighs an empty tensor as 1 byte: (0, 1, 5) on two replicas puts 5 beside the empty one (1 against 1, the
    first in the set's order); weighed 2, it would go beside the 1-byte one."""
    module = tuple(tensors.Tensor(raw, raw + 10) for raw in raws)
    plans = [SavePlan([]) for _ in range(max(ranks) + 1)]
    for rank in ranks:
        plans[rank] = SavePlan([_write_item(f"module/{i}", raw) for i, raw in enumerate(raws)])
    kept = [len(dedup_save_plans(plans)[rank].items) for rank in ranks]
    assert [share.tensors for share in tensors.module_shares(module, ranks, "dcp")] == kept


def test_a_dcp_rank_reads_beyond_what_it_wrote_the_module_its_replicas_wrote():
    module = {(0, 0): (tensors.Tensor(100, 110), tensors.Tensor(30, 40), tensors.Tensor(20, 30)),
              (1, 0): (tensors.Tensor(10, 20),)}
    # stage 0 on 2 replicas: 100 → 0, 30 → 1, 20 → 1; the busiest by bytes wrote 110 of 180; stage 1: 20 of 20
    assert tensors.read_beyond_written(module, Layout(1, 2, 2), "dcp") == 180 - 110
    assert tensors.read_beyond_written(module, Layout(1, 2, 1), "dcp") == 0
    assert tensors.read_beyond_written(module, Layout(1, 2, 2), "torch") == 0
    assert tensors.read_beyond_written({}, Layout(1, 1, 2), "dcp") == 0


def test_dcp_writes_its_share_of_the_module_the_others_all_they_hold():
    counts = {(0, 0): (3, 4), (1, 0): (2, 4)}
    module = {(0, 0): (tensors.Tensor(100, 1), tensors.Tensor(10, 1), tensors.Tensor(10, 1)),
              (1, 0): (tensors.Tensor(5, 1), tensors.Tensor(5, 1))}
    two, one = Layout(1, 2, 2), Layout(1, 2, 1)
    assert tensors.busiest(counts, module, two, "dcp") == (7, 6)  # stage 0: replica 1 writes two; stage 1: one each
    assert tensors.busiest(counts, module, one, "dcp") == (7, 7)
    assert tensors.busiest(counts, module, two, "torch") == (7, 7)
    assert tensors.busiest(counts, module, two, "torchsnapshot") == (7, 7)
    assert tensors.busiest({}, {}, two, "dcp") == (0, 0)


def test_dcps_index_holds_each_module_tensor_once_and_every_ranks_own_items():
    assert tensors.index_items({(0, 0): (39, 4), (1, 0): (40, 4)}, 3) == 39 + 40 + 2 * 3 * (4 + 1)


def test_the_job_carries_the_tensors_at_its_dp():
    shape = Shape(Layout(1, 2, 2), first={(0, 0): (100, 3), (1, 0): (50, 2)}, other={(0, 0): (0, 1), (1, 0): (0, 1)},
                  optimizer={(0, 0): 40, (1, 0): 40}, params=1000, tensors={(0, 0): (3, 4), (1, 0): (2, 4)},
                  module={(0, 0): (tensors.Tensor(100, 1), tensors.Tensor(10, 1), tensors.Tensor(10, 1)),
                          (1, 0): (tensors.Tensor(5, 1), tensors.Tensor(5, 1))}, engine="dcp")
    job = job_for(shape, dp=4, per_node=4)
    assert (job.tensors_rank, job.tensors_written) == (7, 5)


# -- the terms -------------------------------------------------------------------------------------------------

JOB = Job(ranks=2, nodes=1, concurrency=2, bytes_rank=1 * GB, files_rank=2, bytes_node=2 * GB, files_node=4,
          params_rank=1e9, sequential=3, tensors_rank=300, tensors_written=150)


def _cpu():
    raw = yaml.safe_load(H100.read_text())
    raw["device"]["value"], raw["storage"]["value"] = "cpu", "local"
    return cluster_from_mapping(raw, "test.yaml")


def test_the_per_tensor_cost_enters_the_stall_the_durable_time_and_the_load():
    cluster, t = _cpu(), 0.002
    stall = Line(0.1, {"bytes": 1 / GB, "tensors": t})
    assert terms.stall_s(stall, "dcp", JOB, cluster) == pytest.approx(0.1 + 1.0 + t * 150)  # the tensors written
    durable = Line(0.1, {"at_limit": 1.0, "tensors": t}, intercept_per="in_turn")
    at_limit = 2 * GB / (cluster.local_write_GBps * GB)
    # each of the 3 ranks the process handles in turn pays for its tensors
    assert terms.durable_s(durable, "dcp", JOB, cluster) == pytest.approx(0.1 * 3 + at_limit + t * 150 * 3)
    load = Line(0.1, {"at_limit": 1.0, "tensors": t})
    read = 1 * GB * 2 / (cluster.local_read_GBps * GB)
    assert terms.load_s(load, JOB, cluster) == pytest.approx(0.1 + read + t * 300)  # every tensor the rank holds


def test_a_line_without_a_per_tensor_coefficient_ignores_the_tensors():
    assert terms.stall_s(Line(0.1, {"bytes": 1 / GB}), "torch", JOB, _cpu()) == pytest.approx(1.1)


# -- the fit ---------------------------------------------------------------------------------------------------

LIMITS = Limits(write_GBps=1.0, read_GBps=2.0, source="synthetic")
#: (preset, layout, dp, bytes per rank, tensors written, tensors held): held by the arithmetic above; written as DCP's
#: deduplication gives them at dp 2 (the busiest replica: 3B's second writes 179 of 255 module tensors, the first
#: the embedding and 75 more; 7B's 151 of 291), all a rank holds at dp 1.
RUNS = (("3B", "tp1pp1dp2", 2, 0.6e8, 179 + 4, 9 * 28 + 3 + 4),
        ("3B", "tp1pp1dp2", 2, 2.4e8, 179 + 4, 9 * 28 + 3 + 4),
        ("3B", "tp1pp2dp1", 1, 1.6e8, 9 * 14 + 2 + 4, 9 * 14 + 2 + 4),
        ("33B", "tp1pp2dp1", 1, 0.7e8, 9 * 30 + 2 + 4, 9 * 30 + 2 + 4),
        ("7B", "tp1pp1dp2", 2, 0.9e8, 151 + 4, 9 * 32 + 3 + 4))
STALL = (0.02, 4e-9, 0.0017)  # intercept, s per byte, s per tensor written
DURABLE = (0.03, 1.1, 0.0015)  # intercept, 1/η, s per tensor written
LOAD = (0.05, 3.0, 0.0025)  # intercept, 1/η, s per tensor held


def _dcp_table(engine: str = "dcp") -> pd.DataFrame:
    rows = []
    for i, (preset, layout, dp, size, written, held) in enumerate(RUNS):
        # a DCP rank reads its replicas' module shares too (test_a_dcp_rank_reads_what_it_holds...)
        read = size + tensors.read_beyond_written(tensors.stage_module(preset, layout), Layout(1, 2 // dp, dp), engine)
        common = {"run_id": f"r{i}", "engine": engine, "preset": preset, "layout": layout, "dtype": "bf16",
                  "tp": 1, "pp": 2 // dp, "dp": dp, "ranks": 2, "nodes": 1, "iteration_s": 0.5,
                  "restore_layout": None}
        rows.append({**common, "kind": "checkpoint", "bytes_per_rank_max": size, "files_per_rank_max": 2,
                     "bytes": 2 * size, "files": 3,
                     "stall_max_s": STALL[0] + STALL[1] * size + STALL[2] * written,
                     "durable_rank_max_s": DURABLE[0] + DURABLE[1] * 2 * size / GB + DURABLE[2] * written})
        rows.append({**common, "kind": "restart",
                     "restart_ckpt_load_s": LOAD[0] + LOAD[1] * read * 2 / (2 * GB) + LOAD[2] * held,
                     "restart_launch_s": 0.1, "restart_imports_s": 5.0, "restart_dist_init_s": 0.5,
                     "restart_model_build_s": 0.2, "restart_ds_init_s": 1.0, "restart_engine_setup_s": 0.01,
                     "restart_1st_iter_s": 1.5, "path_gaps_s": 0.05})
    return pd.DataFrame(rows)


def test_the_fit_recovers_a_known_per_tensor_cost_for_dcp():
    lines = fit_table(_dcp_table(), LIMITS).engines["dcp"]
    for term, (a, slope, per_tensor) in {"stall": STALL, "durable": DURABLE, "load": LOAD}.items():
        coefficient = "bytes" if term == "stall" else "at_limit"
        assert lines[term].intercept == pytest.approx(a, rel=1e-6), term
        assert lines[term].coefficients[coefficient] == pytest.approx(slope, rel=1e-6), term
        assert lines[term].coefficients["tensors"] == pytest.approx(per_tensor, rel=1e-6), term


def test_engines_that_do_not_save_per_tensor_get_no_tensor_term():
    lines = fit_table(_dcp_table("torch"), LIMITS).engines["torch"]
    assert all("tensors" not in line.coefficients for line in lines.values())


def test_a_per_tensor_cost_the_runs_cannot_tell_from_the_bytes_is_left_out_with_a_note():
    table = _dcp_table()
    two = table[table["run_id"].isin(["r0", "r3"])]  # two configurations: an intercept and two slopes undetermined
    lines = fit_table(two, LIMITS).engines["dcp"]
    assert "tensors" not in lines["stall"].coefficients and "tensors not fitted" in lines["stall"].note

"""The lazy engine's load in another parallel layout (issue 19, restartbench/engines/lazy/reshard.py).

A per-rank digest proves a restore in the layout it was saved in; across layouts ranks hold different shards, so
the proof is a round trip: train in layout A, save (tag A), load in layout B, save again (tag A-B), load that in
layout A and compare every rank's digest of the training state (module, ZeRO fp32 partitions, Adam moments and step,
scheduler, counters) with A's, bit for bit; in B itself the layout-independent digest of the full-shape state
(restartbench/consolidated.py) must be A's. One launch of 4 gloo ranks (tests/lazy_reshard_ranks.py) runs
tp2pp2dp1 fp32 through tp1pp2dp2 and tp1pp1dp4 (tensor, pipeline and data-parallel sizes each change, both ways),
and tp2pp1dp2 bf16 through tp1pp2dp2. Each load's reads are held to an oracle computed here with numpy from the
two checkpoints' headers, element by element: the files a rank opens are exactly those holding its elements, and
each file's bytes read are its header plus exactly its elements' bytes."""

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, free_port

from restartbench.config import EngineConfig
from restartbench.engines.lazy import format as fmt
from restartbench.engines.lazy import reshard
from restartbench.engines.lazy.engine import LazyEngine
from restartbench.verify import training_state_digest

SCENARIOS = ["fp32:tp2pp2dp1:tp1pp2dp2,tp1pp1dp4", "bf16:tp2pp1dp2:tp1pp2dp2"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """(checkpoint folder, {rank: report}) of one 4-rank launch of tests/lazy_reshard_ranks.py."""
    root = tmp_path_factory.mktemp("reshard")
    out, ckpt = root / "out", root / "ckpt"
    out.mkdir()
    ckpt.mkdir()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
                           str(free_port()), str(ROOT / "tests" / "lazy_reshard_ranks.py"), str(out), str(ckpt),
                           *SCENARIOS], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(reports) == [0, 1, 2, 3]
    return ckpt, reports


def loads(reports):
    """(rank, scenario, B entry) of every round trip."""
    for rank, report in sorted(reports.items()):
        for scenario in report["scenarios"]:
            for entry in scenario["bs"]:
                yield rank, scenario, entry


@pytest.mark.multirank
def test_round_trip_through_another_layout_gives_every_rank_its_state_bit_for_bit(launched):
    _, reports = launched
    trips = [(s["a"], e["b"]) for _, s, e in loads(reports)]
    assert sorted(set(trips)) == [("tp2pp1dp2", "tp1pp2dp2"), ("tp2pp2dp1", "tp1pp1dp4"), ("tp2pp2dp1", "tp1pp2dp2")]
    for rank, scenario, entry in loads(reports):
        assert entry["problems"] == [], (rank, scenario["a"], entry["b"])


@pytest.mark.multirank
def test_the_state_loaded_in_another_layout_is_the_saved_state_at_full_shape(launched):
    """Right after the load in B: every parameter's fp32 weights and Adam moments gathered to full shape, the
    optimizer's step and hyperparameters, the scheduler and the counters (restartbench.consolidated) are A's."""
    _, reports = launched
    for rank, scenario, entry in loads(reports):
        assert entry["full_problems"] == [], (rank, scenario["a"], entry["b"])


@pytest.mark.multirank
def test_the_resharded_state_trains_on_as_the_saved_one(launched):
    """Iteration 3 on the same global batch after the load in B gives A's loss (up to the order of sums)."""
    _, reports = launched
    for _, scenario, entry in loads(reports):
        tolerance = 1e-4 if scenario["dtype"] == "fp32" else 2e-2
        assert entry["loss_b"] == pytest.approx(scenario["loss_ref"], rel=tolerance)


@pytest.mark.multirank
def test_each_rank_reads_exactly_the_files_and_bytes_that_hold_its_elements(launched):
    ckpt, reports = launched
    for rank, scenario, entry in loads(reports):
        a, b = scenario["a"], entry["b"]
        for saved, live, coords, read in ((a, f"{a}-{b}", entry["coords_b"], entry["read_a"]),
                                          (f"{a}-{b}", a, scenario["coords_a"], entry["read_b"])):
            expected = needed_bytes(Checkpoint(ckpt / saved), Checkpoint(ckpt / live), coords)
            got = {Path(path).name: nbytes for path, nbytes in read}
            assert all(Path(path).parent.name == saved for path, _ in read)
            assert sorted(got) == sorted(expected), (rank, saved, live)
            headers = Checkpoint(ckpt / saved).header_bytes
            assert {name: got[name] - headers[name] for name in got} == expected, (rank, saved, live)


@pytest.mark.multirank
def test_no_rank_reads_more_than_the_checkpoint_and_ranks_share_the_optimizer_state(launched):
    ckpt, reports = launched
    for rank, scenario, entry in loads(reports):
        a, b = scenario["a"], entry["b"]
        for saved, read in ((a, entry["read_a"]), (f"{a}-{b}", entry["read_b"])):
            total = sum(f.stat().st_size for f in (ckpt / saved).glob("*.lazy"))
            assert sum(nbytes for _, nbytes in read) < total, (rank, saved)
    # Into a layout of tp 1 every saved optimizer element is read by one rank only: the optimizer files' data read
    # by all ranks together is at most their tensors' bytes (ZeRO's padding is not read).
    for a, b in {(s["a"], e["b"]) for _, s, e in loads(reports)}:
        saved = Checkpoint(ckpt / a)
        read = Counter()
        for _, scenario, entry in loads(reports):
            if (scenario["a"], entry["b"]) == (a, b):
                for path, nbytes in entry["read_a"]:
                    read[Path(path).name] += nbytes - saved.header_bytes[Path(path).name]
        optim = [name for name in saved.headers if name.startswith("optim")]
        assert sum(read[name] for name in optim) <= sum(t["nbytes"] for name in optim
                                                         for t in saved.headers[name]["tensors"]), (a, b)


@pytest.mark.multirank
def test_a_layout_change_that_cannot_be_honoured_is_refused_saying_what_differs(launched):
    _, reports = launched
    for report in reports.values():
        preset, dtype = report["refused"]["preset"], report["refused"]["dtype"]
        assert preset.startswith("LazyRestoreError") and "(tp2pp2dp1) does not fit the model built here (tp1pp2dp2)" \
            in preset and "gate: saved with full shape [176, 64] split along 0, here [192, 64]" in preset, preset
        assert "saved as float32, here torch.bfloat16 (another --dtype?)" in dtype, dtype


# -- the oracle: what a rank needs, element by element, from the headers ----------------------------------------


class Checkpoint:
    """A lazy checkpoint folder's headers."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.headers, self.header_bytes = {}, {}
        for path in sorted(folder.glob("*.lazy")):
            header, _, nbytes = fmt.read_header_counted(path)
            self.headers[path.name], self.header_bytes[path.name] = header, nbytes
        layout = next(iter(self.headers.values()))["layout"]
        self.tp, self.pp, self.dp = layout["tp"], layout["pp"], layout["dp"]
        self.stage_of = {p["name"]: h["pp"] for h in self.headers.values() if h["kind"] == "model" for p in h["params"]}

    def model(self, stage: int, tp: int) -> dict:
        return self.headers[reshard.model_file(stage, tp)]

    def optim(self, stage: int, tp: int, dp: int) -> dict:
        return self.headers[reshard.optim_file(stage, tp, dp)]


def tensor_entry(header: dict, name: str) -> dict:
    return next(t for t in header["tensors"] if t["name"] == name)


def full_indices(param: dict, local_shape: list[int]) -> np.ndarray:
    """The full tensor's flat index of each element of a slice, in the slice's own order."""
    full = np.arange(math.prod(param["shape"])).reshape(param["shape"])
    if param["tp_dim"] is not None:
        index = [slice(None)] * len(param["shape"])
        index[param["tp_dim"]] = slice(param["tp_offset"], param["tp_offset"] + local_shape[param["tp_dim"]])
        full = full[tuple(index)]
    return full.reshape(-1)


def zero_place(header: dict, name: str) -> tuple[int, int]:
    return next((g, offset) for g, group in enumerate(header["zero"]) for n, offset, _ in group["params"] if n == name)


def needed_bytes(saved: Checkpoint, live: Checkpoint, coords: list[int]) -> dict[str, int]:
    """{saved file: data bytes} the rank at ``coords`` of the live layout needs: its module slice from the model files
    (a replicated tensor from the first saved slice overlapping its own), the fp32 weights and Adam moments of its
    partition's elements from the optimizer files holding them, Adam's step from the first of those."""
    stage, tp, dp = coords
    model, optim = live.model(stage, tp), live.optim(stage, tp, dp)
    first_slice = tp * saved.tp // live.tp
    expected: Counter = Counter()
    for param in model["params"]:
        name = param["name"]
        entry = tensor_entry(model, f"module.{name}")
        mine = full_indices(param, entry["shape"])
        where = saved.stage_of[name]
        owner = np.full(math.prod(param["shape"]), -1)
        element = np.zeros_like(owner)
        for j in ([first_slice] if param["tp_dim"] is None else range(saved.tp)):
            held = next(p for p in saved.model(where, j)["params"] if p["name"] == name)
            indices = full_indices(held, tensor_entry(saved.model(where, j), f"module.{name}")["shape"])
            owner[indices], element[indices] = j, np.arange(indices.size)
        size = fmt.torch_dtype(entry["dtype"]).itemsize
        for j, count in zip(*np.unique(owner[mine], return_counts=True)):
            expected[reshard.model_file(where, int(j))] += int(count) * size
        group, offset = zero_place(optim, name)
        start = optim["zero"][group]["partition_start"]
        inside = mine[(offset + np.arange(mine.size) >= start)
                      & (offset + np.arange(mine.size) < start + optim["zero"][group]["partition_numel"])]
        for j in np.unique(owner[inside]):
            saved_model = saved.model(where, int(j))
            saved_group, saved_offset = zero_place(saved_model, name)
            partition = saved_model["zero"][saved_group]["partition_numel"]
            ranks = (saved_offset + element[inside[owner[inside] == j]]) // partition
            for rank, count in zip(*np.unique(ranks, return_counts=True)):
                file = reshard.optim_file(where, int(j), int(rank))
                header = saved.headers[file]
                per_element = sum(fmt.torch_dtype(t["dtype"]).itemsize for key, name_ in
                                  header["zero"][saved_group]["tensors"].items()
                                  for t in [tensor_entry(header, name_)] if t["shape"])
                expected[file] += int(count) * per_element
    first_optim = min(f for f in expected if f.startswith("optim"))
    expected[first_optim] += sum(tensor_entry(saved.headers[first_optim], name)["nbytes"]
                                 for group in saved.headers[first_optim]["zero"]
                                 for name in group["tensors"].values()
                                 if not tensor_entry(saved.headers[first_optim], name)["shape"])
    return dict(expected)


# -- without processes ---------------------------------------------------------------------------------------------


def test_slice_runs_cover_a_slice_from_the_saved_ones():
    full = [4, 6]  # split along dimension 1: tp2 slices of 3 columns, tp3 slices of 2
    assert reshard.slice_runs(full, 1, (0, 3), (0, 6)) == [(0, 0, 3), (3, 6, 3), (6, 12, 3), (9, 18, 3)]
    assert reshard.slice_runs(full, 1, (3, 3), (2, 2)) == [(0, 1, 1), (3, 3, 1), (6, 5, 1), (9, 7, 1)]
    assert reshard.slice_runs(full, 0, (2, 2), (0, 4)) == [(0, 12, 12)]  # rows: one run
    assert reshard.slice_runs(full, 1, (0, 6), (0, 6)) == [(0, 0, 24)]  # whole rows: merged
    assert reshard.slice_runs(full, 1, (0, 3), (3, 3)) == []
    assert reshard.slice_runs(full, None, (0, 0), (0, 0)) == [(0, 0, 24)]
    assert list(reshard.saved_slices(1, 2, 4)) == [2, 3] and list(reshard.saved_slices(3, 4, 2)) == [1]
    assert list(reshard.partition_pieces(5, 10, 4)) == [(1, 1, 3), (2, 0, 4), (3, 0, 3)]


def fake_engine():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    import types
    engine = types.SimpleNamespace(module=module, optimizer=optimizer, lr_scheduler=None, global_steps=1,
                                   global_samples=1, skipped_steps=0)
    module(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    return engine


def rewrite_as_version_1(path: Path) -> None:
    """The file as format version 1 wrote it: no layout, params or zero; the data region where it was."""
    header, data_offset = fmt.read_header(path)
    old = {k: v for k, v in header.items() if k not in ("layout", "params", "zero")} | {"version": 1}
    text = json.dumps(old, separators=(",", ":")).encode()
    head = fmt.PREAMBLE.pack(fmt.MAGIC, len(text), data_offset) + text
    raw = path.read_bytes()
    path.write_bytes(head + bytes(data_offset - len(head)) + raw[data_offset:])


def test_version_1_files_load_in_their_layout_and_are_refused_in_another(tmp_path):
    source, options = fake_engine(), EngineConfig(engine="lazy", lazy_chunk_mb=1, lazy_io_threads=2)
    saver = LazyEngine(options)
    saver.save(source, str(tmp_path), "step1")
    saver.wait_until_durable()
    header, _ = fmt.read_header(tmp_path / "step1" / "optim_pp00_tp00_dp000.lazy")
    assert header["version"] == 2 and header["layout"] == {"tp": 1, "pp": 1, "dp": 1, "rank": 0}
    for path in (tmp_path / "step1").glob("*.lazy"):
        rewrite_as_version_1(path)
    fresh = fake_engine()
    fresh.global_steps = 0
    LazyEngine(options).load(fresh, str(tmp_path), "step1")
    assert training_state_digest(fresh) == training_state_digest(source)
    files = reshard.SavedFiles(tmp_path / "step1", (1, 1, 1))
    with pytest.raises(fmt.LazyRestoreError, match=r"format version 1 does not record what a load in another layout "
                       r"needs; restore checkpoint step1 in the layout it was saved in \(tp1pp1dp1\)"):
        files.header("model_pp00_tp00.lazy")


class _Files:
    """A stand-in for one saved optimizer file's header and entries: piece_runs reads only these."""

    def __init__(self, entries: dict, tensors: dict):
        self._entries, self._header = entries, {"zero": [{"tensors": tensors}]}

    def header(self, file):
        return self._header, 100

    def entries(self, file):
        return self._entries


def test_an_optimizer_piece_reads_its_range_of_each_saved_tensor_and_refuses_one_it_cannot(tmp_path):
    """The read of a saved partition's range lands in the target's elements; a tensor the file lacks or holds in
    another dtype, and a range past the saved tensor's end (a damaged header), are refused naming the file."""
    target = torch.zeros(8, dtype=torch.float32)
    piece = reshard.Piece(file="f.lazy", group=0, element=2, target_group=0, target_element=4, count=3)
    entry = {"name": "exp_avg", "dtype": "float32", "offset": 40, "nbytes": 4 * 6, "shape": [6]}
    files = _Files({"exp_avg": entry}, {"exp_avg": "exp_avg"})
    [run] = reshard.piece_runs(files, tmp_path, piece, {"exp_avg": target})
    assert run.offset == 100 + 40 + 2 * 4 and run.view.nbytes == 3 * 4
    run.view[:] = np.arange(3, dtype=np.float32).tobytes()
    assert target.tolist() == [0, 0, 0, 0, 0, 1, 2, 0]
    with pytest.raises(fmt.LazyRestoreError, match="f.lazy: no exp_avg of group 0 in torch.bfloat16"):
        reshard.piece_runs(files, tmp_path, piece, {"exp_avg": target.to(torch.bfloat16)})
    with pytest.raises(fmt.LazyRestoreError, match="no exp_avg_sq of group 0"):
        reshard.piece_runs(files, tmp_path, piece, {"exp_avg_sq": target})
    short = _Files({"exp_avg": {**entry, "nbytes": 4 * 4}}, {"exp_avg": "exp_avg"})
    with pytest.raises(fmt.LazyRestoreError, match=r"exp_avg holds \[6\] elements, the plan reads up to 5 "
                                                   r"\(a damaged header\?\)"):
        reshard.piece_runs(short, tmp_path, piece, {"exp_avg": target})

"""The lazy engine (``--engine lazy``): its plan and file format (pure functions), a save/restore of a real
torch model and optimizer in one process, and real 2- and 4-rank DeepSpeed runs that restore exactly,
including a rank killed in the middle of the flush."""

import errno
import gc
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import relaunch, run_study

from restartbench import pagecache, results
from restartbench.config import EngineConfig
from restartbench.engines.lazy import copies, flush, restore
from restartbench.engines.lazy import format as fmt
from restartbench.engines.lazy.engine import LazyEngine
from restartbench.events import read_events
from restartbench.verify import training_state_digest

ROOT = Path(__file__).resolve().parent.parent


def spec(name, shape, dtype="float32", device="cpu"):
    return fmt.TensorSpec(name, dtype, tuple(shape), device)


# -- plan ----------------------------------------------------------------------------------------------------


def test_plan_is_aligned_disjoint_and_one_range_per_file():
    groups = [("optim.lazy", "optim", [(spec("a", (3,)), False), (spec("b", (1000, 3)), False)]),
              ("model.lazy", "model", [(spec("w", (5, 7), "bfloat16"), False), (spec("buf", (2,)), True)])]
    plan = fmt.make_plan(groups)
    assert [f.name for f in plan.files] == ["model.lazy", "optim.lazy"], "the file with sync entries comes first"
    assert plan.files[0].entries[0].spec.name == "buf" and plan.sync_bytes == 8
    cursor = 0
    for file in plan.files:
        assert file.buffer_offset == cursor and file.data_bytes % fmt.FILE_ALIGN == 0
        ends = 0
        for entry in file.entries:
            assert entry.offset % fmt.ENTRY_ALIGN == 0 and entry.offset >= ends
            assert entry.buffer_offset == file.buffer_offset + entry.offset
            ends = entry.offset + entry.spec.nbytes
        assert ends <= file.data_bytes
        cursor += file.data_bytes
    assert plan.buffer_bytes == cursor
    assert fmt.make_plan(groups) == plan, "deterministic"
    assert plan.signature == fmt.plan_signature(groups)
    changed = [(n, k, [(spec(s.name, (1001, 3)) if s.name == "b" else s, y) for s, y in g]) for n, k, g in groups]
    assert fmt.plan_signature(changed) != plan.signature


def test_spec_bytes_follow_dtype_and_shape():
    assert spec("x", (4, 5), "bfloat16").nbytes == 40
    assert spec("step", ()).nbytes == 4
    assert spec("e", (0, 3)).nbytes == 0


# -- format ------------------------------------------------------------------------------------------------


def test_header_round_trip_and_damage_is_named(tmp_path):
    plan = fmt.make_plan([("f.lazy", "optim", [(spec("x", (10,)), False)])])
    head, data_offset = fmt.encode_header(plan.files[0], {"tag": "step2"}, {"engine": {"global_steps": 2}})
    assert data_offset % fmt.FILE_ALIGN == 0 and len(head) == data_offset
    header, offset = fmt.decode_header(head)
    assert offset == data_offset and header["tag"] == "step2" and header["kind"] == "optim"
    assert header["tensors"] == [{"name": "x", "dtype": "float32", "shape": [10], "device": "cpu", "offset": 0,
                                  "nbytes": 40}]
    path = tmp_path / "f.lazy"
    path.write_bytes(head + bytes(plan.files[0].data_bytes))
    assert fmt.read_header(path)[0] == header
    path.write_bytes(head + bytes(10))
    with pytest.raises(fmt.LazyFormatError, match="truncated"):
        fmt.read_header(path)
    with pytest.raises(fmt.LazyFormatError, match="not a restartbench-lazy file"):
        fmt.decode_header(b"PK" + head[2:])


def test_values_round_trip_types_tensors_and_objects():
    class Scaler:
        def __init__(self):
            self.cur_scale, self.dynamic = 1.0, False

    import enum

    class Stage(enum.IntEnum):
        one = 1

    tensors = {}
    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0], "foreach": None, "x": math.inf}],
             "loss_scaler": Scaler(), "zero_stage": Stage.one, "flag": True}
    encoded = fmt.encode_value(state, "optimizer", tensors)
    assert set(tensors) == {"optimizer.state.0.step", "optimizer.state.0.exp_avg"}
    decoded = fmt.decode_value(json.loads(json.dumps(encoded, allow_nan=False)))
    assert decoded["state"][0]["step"] == fmt.TensorRef("optimizer.state.0.step")
    group = decoded["param_groups"][0]
    assert group["betas"] == (0.9, 0.95) and group["params"] == [0] and group["foreach"] is None
    assert group["x"] == math.inf and decoded["flag"] is True
    assert decoded["loss_scaler"].attrs == {"cur_scale": 1.0, "dynamic": False}
    assert isinstance(decoded["zero_stage"], fmt.Opaque) and "one" in decoded["zero_stage"].repr


def lazy_file(path, tensors):
    """One lazy file at ``path`` holding ``tensors`` (name -> tensor), as a save lays it out: its header, then its
    data region from the plan's buffer; (its header as read back, its data offset, the region's bytes)."""
    plan = fmt.make_plan([(path.name, "optim", [(fmt.tensor_spec(name, t), False) for name, t in tensors.items()])])
    buffer = torch.zeros(plan.buffer_bytes, dtype=torch.uint8)
    for _, entry in plan.entries():
        copies.typed_slice(buffer, entry.buffer_offset, entry.spec).copy_(tensors[entry.spec.name])
    head, _ = fmt.encode_header(plan.files[0], {}, {})
    path.write_bytes(head + buffer.numpy().tobytes())
    return (*fmt.read_header(path), plan.buffer_bytes)


def test_scatter_reads_fill_targets_and_padding_is_skipped(tmp_path):
    a, b = torch.arange(10, dtype=torch.float32), torch.arange(7, dtype=torch.int64) * 3
    path = tmp_path / "f.lazy"
    header, offset, _ = lazy_file(path, {"a": a, "b": b})
    targets = {"a": torch.empty_like(a), "b": torch.empty_like(b)}
    for chunk in (8, 1 << 20):  # one read per tensor, and one read for both
        records = restore.read_into([(path, offset, header, targets)], 2, chunk, copies.HostBuffer())
        assert torch.equal(targets["a"], a) and torch.equal(targets["b"], b)
        assert records[0].bytes >= a.nbytes + b.nbytes


def test_a_direct_load_that_outgrows_a_pinned_buffer_reads_into_a_pinned_one(tmp_path, monkeypatch):
    """On CUDA O_DIRECT is the default and the engine's pageable buffers are not page-aligned: a load needing more
    than the pinned buffer its set-up made (a data-parallel replica reads the module file it did not save) must
    stay pinned, so page-aligned, or its O_DIRECT reads are refused."""
    cudart = RecordingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    a = torch.arange(3 * copies.PAGE, dtype=torch.float32)
    path = tmp_path / "f.lazy"
    header, offset, region_bytes = lazy_file(path, {"a": a})
    staging = copies.HostBuffer()  # as the engine makes it on CUDA by default: pageable buffers not page-aligned
    staging.get(copies.PAGE, pinned=True)  # the set-up's pinned buffer, smaller than the load
    target = torch.empty_like(a)
    restore.read_into_direct([(path, offset, header, {"a": target})], 2, 1 << 20, staging)
    assert torch.equal(target, a) and staging.pinned and staging.tensor.numel() >= region_bytes
    staging.release()


def test_a_buffered_load_that_outgrows_a_pinned_buffer_keeps_it_pinned(tmp_path, monkeypatch):
    """lazy-buffered on CUDA: a load staging device tensors through a pinned buffer too small for it (a data-parallel
    replica reads the module file it did not save) grew it pageable, so the next save pinned again in its stall.
    The target is on the meta device: a tensor not in host memory, staged as a CUDA one is, with no CUDA here."""
    cudart = RecordingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    a = torch.arange(3 * copies.PAGE, dtype=torch.float32)
    path = tmp_path / "f.lazy"
    header, offset, _ = lazy_file(path, {"a": a})
    staging = copies.HostBuffer()
    staging.get(copies.PAGE, pinned=True)  # the set-up's pinned buffer, smaller than the load
    restore.read_into([(path, offset, header, {"a": torch.empty_like(a, device="meta")})], 2, 1 << 20, staging)
    assert staging.pinned and staging.tensor.numel() >= a.nbytes
    assert torch.equal(staging.tensor[:a.nbytes].view(torch.float32), a), "the bytes were staged in the buffer"
    staging.release()


# -- one process, a real model and optimizer -----------------------------------------------------------------


def fake_engine(seed=0, hidden=16, device="cpu"):
    """A real torch model (with a buffer), AdamW and a scheduler, with the attributes the engine reads."""
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.BatchNorm1d(hidden), torch.nn.Linear(hidden, 4))
    module = module.to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return types.SimpleNamespace(module=module, optimizer=optimizer, lr_scheduler=scheduler, global_steps=0,
                                 global_samples=0, skipped_steps=0)


def train_step(engine, step):
    torch.manual_seed(100 + step)
    loss = engine.module(torch.randn(5, 8).to(next(engine.module.parameters()).device)).pow(2).mean()
    loss.backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad()
    engine.lr_scheduler.step()
    engine.global_steps += 1
    engine.global_samples += 5


def options(**changes):
    return EngineConfig(engine="lazy", lazy_chunk_mb=1, lazy_io_threads=2, **changes)


def test_save_reuses_plan_and_buffer_and_restores_exactly_into_a_fresh_process_state(tmp_path):
    source, saver = fake_engine(), LazyEngine(options())
    digests = {}
    for step in range(1, 5):
        train_step(source, step)
        if step % 2 == 0:
            saver.save(source, str(tmp_path), f"step{step}")
            digests[step] = training_state_digest(source)
            train_step(source, 100 + step)  # the step guard waits for the copies: the checkpoint keeps step's state
            saver.wait_until_durable()
            assert all(r.bytes > 0 for r in saver.written())
    assert saver.plans_made == 1 and saver.buffer.allocations == 1

    fresh = fake_engine(seed=1)  # other weights, no optimizer state yet
    loader = LazyEngine(options())
    loader.load(fresh, str(tmp_path), "step4")
    assert training_state_digest(fresh) == digests[4]
    train_step(fresh, 5)  # and it trains on


def test_direct_io_writes_the_same_files_past_the_page_cache_and_they_restore_exactly(tmp_path):
    """--lazy-direct-io: the data regions go to the device with O_DIRECT from a page-aligned buffer. The files are
    byte for byte the buffered writer's, they restore exactly, and the page cache holds almost none of them (the
    buffered writer's stay resident): O_DIRECT was used, not silently dropped."""
    source = fake_engine(hidden=2**16)  # 12 MB of files: their data regions, not their headers, decide residency
    train_step(source, 1)
    folders = {}
    for direct in (False, True):
        saver = LazyEngine(options(lazy_direct_io=direct))
        saver.save(source, str(tmp_path / str(direct)), "step1")
        saver.wait_until_durable()
        assert saver.buffer.tensor.data_ptr() % 4096 == 0 or not direct
        folders[direct] = sorted((tmp_path / str(direct) / "step1").iterdir())
    resident = {direct: pagecache.measure(paths).resident_fraction for direct, paths in folders.items()}
    assert resident[False] > 0.9 and resident[True] < 0.1, resident
    assert [p.read_bytes() for p in folders[True]] == [p.read_bytes() for p in folders[False]]
    fresh = fake_engine(seed=1, hidden=2**16)
    LazyEngine(options(lazy_direct_io=True)).load(fresh, str(tmp_path / "True"), "step1")
    assert training_state_digest(fresh) == training_state_digest(source)


def test_direct_io_reads_restore_exactly_past_the_page_cache(tmp_path):
    """--lazy-direct-io also reads with O_DIRECT: each data region into the host buffer in 1 MiB pieces here (tensors
    of 256 KiB to 2 MiB straddle them), each tensor copied out once its last piece is in. The state restores
    exactly, and files evicted before the load are still out of the page cache after it, where a buffered load
    brings them in whole: O_DIRECT was used for the reads, not silently dropped."""
    source = fake_engine(hidden=2**16)
    train_step(source, 1)
    train_step(source, 2)
    saver = LazyEngine(options(lazy_direct_io=True))
    saver.save(source, str(tmp_path), "step2")
    saver.wait_until_durable()
    paths = sorted((tmp_path / "step2").iterdir())
    resident = {}
    for direct in (False, True):
        pagecache.evict(paths)
        fresh, loader = fake_engine(seed=1, hidden=2**16), LazyEngine(options(lazy_direct_io=direct))
        loader.load(fresh, str(tmp_path), "step2")
        resident[direct] = pagecache.measure(paths).resident_fraction
        assert training_state_digest(fresh) == training_state_digest(source)
        train_step(fresh, 3)  # and it trains on
    assert resident[False] > 0.9 and resident[True] < 0.1, resident


def test_the_lazy_io_bench_measures_both_modes_restored_exactly(tmp_path):
    """bench/lazy_io.py, small: both modes saved, evicted, restored (each restore proved exact by the bench, which
    raises otherwise), and against a limits result given."""
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"meta": {"date": "2026-11-27", "machine": "cpu2"},
                                  "write": {"best_MBps": 1000.0, "method": "write-direct-libaio-qd16-4M"},
                                  "read": {"best_MBps": 2000.0, "method": "read-direct-libaio-qd32-1M"}}))
    out = tmp_path / "lazy-io.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/lazy_io.py"), "--gib", "0.02", "--repeats", "1",
                           "--dir", str(tmp_path), "--limits", str(limits), "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [m["mode"] for m in result["modes"]] == ["buffered", "direct (O_DIRECT)"]
    direct = result["modes"][1]
    assert direct["durable"]["over_write_limit"] == pytest.approx(direct["durable"]["GBps"])
    assert "÷ disk write" in done.stdout and "write-direct-libaio-qd16-4M" in done.stdout


def test_direct_io_on_a_file_system_without_it_says_what_to_do(tmp_path, monkeypatch):
    def refuse(path, flags, *mode):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *mode)

    real_open = os.open
    monkeypatch.setattr(flush.os, "open", refuse)
    source, saver = fake_engine(), LazyEngine(options(lazy_direct_io=True))
    train_step(source, 1)
    saver.save(source, str(tmp_path), "step1")
    with pytest.raises(OSError, match="refuses O_DIRECT .* run with --no-lazy-direct-io"):
        saver.wait_until_durable()


@pytest.mark.parametrize("amsgrad", [False, True])
def test_buffer_allocated_at_set_up_fits_the_saves_to_come(tmp_path, amsgrad):
    """prepare() runs before the optimizer's first step, when Adam has no moments yet; the buffer it allocates is
    exactly the one the saves need, so no save allocates (pinning, on CUDA, is about 0.5 s per GiB)."""
    engine, saver = fake_engine(), LazyEngine(options())
    engine.optimizer = torch.optim.AdamW(engine.module.parameters(), lr=1e-2, amsgrad=amsgrad)
    engine.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda step: 1.0)
    setup = saver.prepare(engine)
    assert saver.buffer.allocations == 1 and setup["host_buffer_pinned"] is False and setup["direct_io"] is False
    for step in (1, 2):
        train_step(engine, step)
        saver.save(engine, str(tmp_path), f"step{step}")
        saver.wait_until_durable()
    assert saver.buffer.allocations == 1 and setup["host_buffer_bytes"] == saver.plan.buffer_bytes


def test_step_right_after_save_waits_for_the_copies_and_the_wait_is_reported(tmp_path):
    engine, saver = fake_engine(), LazyEngine(options())
    engine.module.append(torch.nn.Linear(4, 1 << 20))  # 20 MB of weights (60 MB with Adam) to copy
    engine.optimizer = torch.optim.AdamW(engine.module.parameters(), lr=1e-2)
    engine.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda step: 1.0)
    train_step(engine, 1)
    engine.module(torch.randn(5, 8)).pow(2).mean().backward()  # gradients ready, state unchanged
    before = training_state_digest(engine)
    seen = []
    saver.on_copy_wait = lambda tag, seconds, at: seen.append((tag, seconds, at))
    saver.save(engine, str(tmp_path), "step1")
    assert engine.optimizer.step._step_guard is saver
    stepped = time.time()
    engine.optimizer.step()  # at once: it must not change what is still being copied
    after_step = time.time()
    saver.wait_until_durable()
    assert [w["tag"] for w in saver.copy_waits] == [tag for tag, _, _ in seen] == ["step1"]
    assert saver.stall_extra_s == seen[0][1] >= 0
    assert stepped <= seen[0][2] <= after_step, "the wait is placed at the step (its iteration), not at the report"

    fresh = fake_engine(seed=1)
    fresh.module.append(torch.nn.Linear(4, 1 << 20))
    fresh.optimizer = torch.optim.AdamW(fresh.module.parameters(), lr=1e-2)
    fresh.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh.optimizer, lambda step: 1.0)
    LazyEngine(options()).load(fresh, str(tmp_path), "step1")
    assert training_state_digest(fresh) == before


# -- host buffer and copy wait (the CUDA side's arithmetic; tests/test_gpu_lazy.py runs it on a GPU) --------------


@pytest.mark.parametrize("nbytes, page, length", [
    (1, 4096, 4096),  # one byte pins a page
    (4096, 4096, 4096),  # whole pages: exactly the request
    (21_000_000_000, 4096, 21_000_003_584),  # 21 GB: 3,584 B more, not the 32 GiB of torch's caching allocator
    (8193, 4096, 12288),
])
def test_a_pinned_buffer_pins_the_request_rounded_to_pages(nbytes, page, length):
    assert copies.pinned_length(nbytes, page) == length


def test_pinned_length_refuses_nothing_to_pin():
    with pytest.raises(ValueError, match="nbytes >= 1"):
        copies.pinned_length(0)


def test_the_pinned_range_starts_where_the_tensors_storage_does(monkeypatch):
    """torch's ``is_pinned`` asks CUDA about the storage's first byte: the range registered must start there (the
    first H100 visit found a buffer locked from its first page boundary inward, and ``is_pinned`` False)."""
    calls = []
    monkeypatch.setattr(copies, "cuda_call", lambda name, *args: calls.append((name, *args)))
    pages = copies.pin_pages(3 * copies.PAGE + 5)
    storage_start = pages.tensor.untyped_storage().data_ptr()
    assert calls == [("cudaHostRegister", storage_start, 4 * copies.PAGE, 0)]
    assert storage_start % copies.PAGE == 0 and pages.tensor.numel() == 3 * copies.PAGE + 5
    pages.tensor.fill_(7)  # writable, all of it
    pages.unpin()
    assert calls[-1] == ("cudaHostUnregister", storage_start) and pages.tensor is None


def mapped_rss(address):
    """Resident bytes of the mapping that starts at ``address`` (its ``Rss`` in /proc/self/smaps: the pages it holds,
    not the shared zero page a read of a hole maps)."""
    with open("/proc/self/smaps") as smaps:
        lines = iter(smaps)
        for line in lines:
            if line.split("-", 1)[0] == f"{address:x}":
                rss = next(field for field in lines if field.startswith("Rss:"))
                return int(rss.split()[1]) * 1024
    raise AssertionError(f"no mapping starts at {address:#x}")


@pytest.mark.parametrize("prefault, threads", [(True, 3), (True, 1), (False, 0)])
def test_a_pinned_buffers_pages_are_faulted_in_before_they_are_registered(monkeypatch, prefault, threads):
    """cudaHostRegister faults a fresh mapping in on one thread (the first H100 visit: 7.7 s of a restart for 21 GB):
    ``fault_in`` does it on several threads first, so that at the register call every page is resident, and zero."""
    resident = {}
    monkeypatch.setattr(copies, "cuda_call", lambda name, at, *rest: resident.setdefault(name, mapped_rss(at)))
    monkeypatch.setattr(copies, "FAULT_SLICE_MIN", copies.PAGE)  # several threads for a small buffer too
    monkeypatch.setattr(copies, "fault_threads", lambda: threads)
    pages = copies.pin_pages(10 * copies.PAGE + 5, prefault=prefault)  # 11 pages: slices of 4, 4 and 3 pages
    assert resident == {"cudaHostRegister": pages.length if prefault else 0} and pages.fault_threads == threads
    assert pages.fault_s >= 0 and pages.register_s >= 0
    assert not pages.tensor.any(), "the buffer reads zero"
    pages.unpin()


def mapping_flags(address):
    """The kernel's VmFlags of the mapping that starts at ``address`` (/proc/self/smaps): ``sh`` shared, ``hg``
    advised for huge pages, ``dc`` not copied on fork."""
    with open("/proc/self/smaps") as smaps:
        lines = iter(smaps)
        for line in lines:
            if line.split("-", 1)[0] == f"{address:x}":
                return set(next(field for field in lines if field.startswith("VmFlags:")).split()[1:])
    raise AssertionError(f"no mapping starts at {address:#x}")


@pytest.mark.parametrize("huge_pages", [False, True])
def test_a_huge_page_buffer_is_private_advised_and_not_forked(monkeypatch, huge_pages):
    """``huge_pages``: private memory advised for transparent huge pages and kept from forked children, faulted in
    and zero like the shared mapping the engine uses by default."""
    monkeypatch.setattr(copies, "cuda_call", lambda *args: None)
    pages = copies.pin_pages(10 * copies.PAGE + 5, huge_pages=huge_pages)
    flags = mapping_flags(pages.address)
    assert ({"hg", "dc"} <= flags and "sh" not in flags) if huge_pages else ("sh" in flags and "hg" not in flags)
    assert mapped_rss(pages.address) == pages.length and not pages.tensor.any()
    pages.unpin()


def test_a_pageable_buffer_pins_nothing_and_is_released():
    buffer = copies.HostBuffer()
    tensor = buffer.get(10_000, pinned=False)
    assert tensor.numel() == 10_000 and not tensor.is_pinned() and buffer.pinned_bytes == 0
    assert buffer.get(5_000, pinned=False) is tensor and buffer.allocations == 1, "reused while large enough"
    buffer.release()
    assert buffer.tensor is None and buffer.pinned_bytes == 0


class RecordingCudart:
    """What HostBuffer asks of torch.cuda.cudart() (no CUDA here; tests/test_gpu_lazy.py pins for real): each call,
    answered with ``error`` (0: cudaSuccess)."""

    def __init__(self, error=0):
        self.calls, self.error = [], error

    def cudaHostRegister(self, address, length, flags):  # noqa: N802 - cudart's names
        self.calls.append(("register", address, length))
        return self.error

    def cudaHostUnregister(self, address):  # noqa: N802
        self.calls.append(("unregister", address))
        return self.error


def test_a_pinned_buffer_registers_its_pages_and_unregisters_them_when_it_grows(monkeypatch):
    cudart = RecordingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    buffer = copies.HostBuffer()
    first = buffer.get(10_000, pinned=True)
    (_, address, length), = cudart.calls
    assert first.data_ptr() == address and address % copies.PAGE == 0 and first.numel() == 10_000
    assert length == buffer.pinned_bytes == -(-10_000 // copies.PAGE) * copies.PAGE
    assert buffer.get(10_000, pinned=False) is first, "a pinned buffer serves a pageable request"
    buffer.get(50_000, pinned=True)
    assert cudart.calls[1] == ("unregister", address), "the old pages are unpinned before the new ones are"
    assert cudart.calls[2][0] == "register" and buffer.allocations == 2
    buffer.release()
    assert cudart.calls[3] == ("unregister", cudart.calls[2][1]) and buffer.pinned_bytes == 0


class MappingCudart(RecordingCudart):
    """RecordingCudart that also records, at each unregister, whether the pages are still mapped."""

    def cudaHostUnregister(self, address):  # noqa: N802 - cudart's names
        try:
            mapped_rss(address)
            self.calls.append(("unregister", address, "mapped"))
        except AssertionError:
            self.calls.append(("unregister", address, "gone"))
        return self.error


def test_a_pinned_buffer_dropped_unreleased_unregisters_its_pages_while_they_are_still_mapped(monkeypatch):
    """An engine dropped without ``release`` (the GPU tests drop one per test): its pages must be unregistered, and
    before they are unmapped. The third H100 visit found a registration outliving its mapping: CUDA took a later
    mapping at the same address for memory it had locked (cudaHostRegister: error 712)."""
    cudart = MappingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    buffer = copies.HostBuffer()
    address = buffer.get(3 * copies.PAGE, pinned=True).data_ptr()
    del buffer
    gc.collect()
    assert cudart.calls[1:] == [("unregister", address, "mapped")]


def test_a_released_buffer_is_unregistered_once(monkeypatch):
    cudart = MappingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    pages = copies.pin_pages(3 * copies.PAGE)
    pages.unpin()
    del pages
    gc.collect()
    assert [call[0] for call in cudart.calls] == ["register", "unregister"]


def test_the_engines_pinned_buffer_is_private_huge_page_memory(monkeypatch):
    """The third H100 visit pinned such memory at 0.05 s/GiB against 0.31 s/GiB for the shared mapping, and copied
    into both at 55 GB/s (bench/results/2026-11-27-h100-gpu-probe)."""
    monkeypatch.setattr(torch.cuda, "cudart", lambda: RecordingCudart())
    buffer = copies.HostBuffer()
    flags = mapping_flags(buffer.get(3 * copies.PAGE, pinned=True).data_ptr())
    assert {"hg", "dc"} <= flags and "sh" not in flags
    buffer.release()


def test_a_failed_pin_says_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "cudart", lambda: RecordingCudart(error=2))
    with pytest.raises(fmt.LazyRestoreError, match=r"cudaHostRegister of 12288 bytes failed with CUDA error 2.*ulimit"):
        copies.HostBuffer().get(3 * copies.PAGE, pinned=True)


class PassedWait:
    """A GpuWait's answers without a GPU: whether the GPU has passed the wait, its seconds, the step's wall time."""

    def __init__(self, done, seconds, at):
        self._done, self._seconds, self.at = done, seconds, at

    def done(self):
        return self._done

    def seconds(self):
        self._done = True
        return self._seconds


def test_gpu_waits_are_reported_once_the_gpu_passed_them_at_their_steps_time():
    """A CUDA wait is read later than it happened, without stalling: background_done (asked every iteration after
    a save) reports the waits already passed, stall_extra_s and wait_until_durable all of them; each with the wall
    time of its step, which places it in its iteration (results._step_times)."""
    saver, seen = LazyEngine(options()), []
    saver.on_copy_wait = lambda tag, seconds, at: seen.append((tag, seconds, at))
    saver.gpu_waits = [("step2", PassedWait(True, 0.25, 100.0)), ("step4", PassedWait(False, 0.5, 200.0))]
    assert saver.background_done() and seen == [("step2", 0.25, 100.0)]
    assert saver.stall_extra_s == 0  # the last save's tag (none here) waited for nothing; both are reported now
    assert seen == [("step2", 0.25, 100.0), ("step4", 0.5, 200.0)] and saver.gpu_waits == []
    assert [w["seconds"] for w in saver.copy_waits] == [0.25, 0.5]


@pytest.mark.parametrize("elapsed_ms, seconds", [(0.0, 0.0), (12.5, 0.0125), (-0.0005, 0.0)])
def test_the_gpu_wait_is_the_compute_streams_stand_still_never_negative(elapsed_ms, seconds):
    assert copies.gpu_wait_s(elapsed_ms) == seconds


def test_restore_refuses_a_different_model(tmp_path):
    engine, saver = fake_engine(), LazyEngine(options())
    train_step(engine, 1)
    saver.save(engine, str(tmp_path), "step1")
    saver.wait_until_durable()
    other = fake_engine()
    other.module = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(fmt.LazyRestoreError, match="module state differs"):
        LazyEngine(options()).load(other, str(tmp_path), "step1")


# -- real runs (gloo, tiny preset) ---------------------------------------------------------------------------

BASE = ("tiny", "--dtype", "fp32", "--iters", "4", "--save-interval", "2", "--engine", "lazy", "--baseline-mib", "0")


def restore_result(run_dir):
    return [e for e in read_events(run_dir) if e["event"] == "restore.result"][-1]


@pytest.mark.multirank
def test_two_data_parallel_ranks_restore_exactly(tmp_path):
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", *BASE[1:])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert restore_result(run_dir)["exact"] is True
    step4 = run_dir / "checkpoints" / "step4"
    names = sorted(p.name for p in step4.glob("*.lazy"))
    assert names == ["model_pp00_tp00.lazy", "optim_pp00_tp00_dp000.lazy", "optim_pp00_tp00_dp001.lazy"]
    header, _ = fmt.read_header(step4 / "optim_pp00_tp00_dp001.lazy")
    assert header["values"]["engine"]["global_steps"] == 4 and header["dp"] == 1
    loads = [e for e in read_events(run_dir) if e["event"] == "restore.load"]
    assert all(e["bytes"] > 0 for e in loads)
    # Training went on after the last save until its background work had ended on both ranks, then 2 clean
    # iterations: that save's slowdown is measured like any other's.
    steps = [e for e in read_events(run_dir, "train", 0) if e["event"] == "train.iteration"]
    assert [e["step"] for e in steps] == list(range(1, len(steps) + 1)) and steps[4].get("reference") is True
    tail = [("after_save" if e.get("after_save") else "clean" if e.get("clean") else None) for e in steps[5:]]
    assert tail == ["after_save"] * (len(tail) - 2) + ["clean", "clean"], tail
    assert results.interference(read_events(run_dir))["step4"]["background_seen"] is True
    # The host buffer is allocated at engine set-up, in every launch, large enough for every save (the
    # optimizer state DeepSpeed creates at initialisation is already there): no save allocates it.
    setups = {(e["phase"], e["rank"]): e for e in read_events(run_dir) if e["event"] == "startup.engine"}
    assert set(setups) == {(phase, rank) for phase in ("train", "restore") for rank in (0, 1)}
    durable = {e["rank"]: e["bytes"] for e in read_events(run_dir)
               if e["event"] == "checkpoint.durable" and e["tag"] == "step4"}
    for rank, written in durable.items():
        assert 0.9 * written <= setups["train", rank]["host_buffer_bytes"] <= written
        assert setups["train", rank]["host_buffer_pinned"] is False  # CPU
        assert setups["train", rank]["direct_io"] is False  # the CPU's default: buffered


@pytest.mark.multirank
def test_pipeline_with_dp_read_once_restores_exactly_and_replicas_skip_the_module_file(tmp_path):
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "pp2dp2", *BASE[1:], "--dp-read-once")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert restore_result(run_dir)["exact"] is True
    loads = {e["rank"]: e for e in read_events(run_dir) if e["event"] == "restore.load"}
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world_size"] == 4
    by_dp = sorted((e["n_files"], rank) for rank, e in loads.items())
    assert [n for n, _ in by_dp] == [1, 1, 2, 2], "data-parallel rank 0 of each stage reads the module file, alone"


@pytest.mark.multirank
def test_rank_killed_mid_flush_keeps_the_previous_checkpoint(tmp_path):
    proc, run_dir = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", *BASE[1:],
                              env={"RESTARTBENCH_FAULT": "kill-in-save:tag=step4:rank=1"})
    assert proc.returncode == 1
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "failed" and [c["tag"] for c in meta["failed_checkpoints"]] == ["step4"]
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "step2" and not (ckpt / "step4" / "manifest.json").exists()
    with pytest.raises(fmt.LazyFormatError, match="truncated"):
        fmt.read_header(ckpt / "step4" / "optim_pp00_tp00_dp001.lazy")
    again = relaunch(run_dir)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    result = restore_result(run_dir)
    assert result["tag"] == "step2" and result["exact"] is True

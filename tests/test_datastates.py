"""DataStates-LLM, the study's third named engine (issue 25 item 3): its vendored source, its CUDA-only build script,
the skip on a machine without CUDA, and the adapter that gives DeepSpeed 0.19.8 its ``datastates.CheckpointEngine``.
The GPU tests at the end build it (unless built at /tmp/site) and run it for real on CUDA; they skip without a GPU."""

import collections
import concurrent.futures
import gc
import hashlib
import importlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import weakref
from pathlib import Path

import pytest
import torch
from conftest import ROOT, free_port, run_study
from deepspeed.runtime.config import DeepSpeedConfig

from restartbench import engines
from restartbench.config import EngineConfig
from restartbench.engines import deepspeed as ds_folder
from restartbench.engines.deepspeed import datastates_adapter as adapter
from restartbench.engines.deepspeed.engine import DataStatesEngine, DeepSpeedEngine
from restartbench.events import read_events
from restartbench.rundir import RunPlan

VENDORED = ROOT / "third_party" / "datastates-llm"
BUILD = ROOT / "scripts" / "build-datastates.sh"


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_vendored_source_is_upstreams_commit_unchanged_with_its_licence():
    notes = (VENDORED / "VENDORED.md").read_text()
    assert re.search(r"Commit: `[0-9a-f]{40}`", notes)
    assert "MIT License" in (VENDORED / "LICENSE").read_text()
    listed = dict(line.split("  ")[::-1] for line in notes.split("```")[1].strip().splitlines())
    present = {str(p.relative_to(VENDORED)) for p in VENDORED.rglob("*") if p.is_file()} - {"VENDORED.md"}
    assert present == set(listed), "a file added to or missing from the vendored tree (build outputs stay out)"
    changed = [path for path, blob in listed.items() if _git_blob_id((VENDORED / path).read_bytes()) != blob]
    assert changed == [], "the vendored files must stay as upstream wrote them; adapt outside third_party"


def test_the_build_script_refuses_a_python_without_torch(tmp_path):
    no_torch = tmp_path / "python-without-site"
    no_torch.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_torch.chmod(0o755)
    proc = subprocess.run(["bash", str(BUILD), str(tmp_path / "site")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(no_torch)}, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "DataStates-LLM is CUDA only" in proc.stderr and "cannot import torch" in proc.stderr
    assert "bash scripts/build-datastates.sh /tmp/site" in proc.stderr
    assert not (tmp_path / "site").exists()


def test_the_build_script_refuses_a_machine_without_cuda(tmp_path):
    """With this Python's torch: a CPU build here, refused as such; with a CUDA torch, nvcc is hidden (PATH without it,
    CUDA_HOME elsewhere) and that is refused."""
    env = {**os.environ, "PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no-cuda")}
    proc = subprocess.run(["bash", str(BUILD), str(tmp_path / "site")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "DataStates-LLM is CUDA only" in proc.stderr
    assert ("is a CPU build" if torch.version.cuda is None else "no nvcc") in proc.stderr
    assert not (tmp_path / "site").exists()


FAKE_PYTHON = """#!/bin/bash
# A CUDA torch and a pip as the build script sees them: pip compiles what GCC 15's libstdc++ no longer gives
# DataStates' mem_region.hpp (uint64_t before any header), with the CPPFLAGS the script gave it.
case "$1" in
    -c) case "$2" in *torch.version.cuda*) echo 13.0 ;; *) echo "torch 2.11.0+cu130" ;; esac ;;
    -m) printf '%s' "$CPPFLAGS" > "$RECORD"
        echo 'const uint64_t id = 1;' | g++ $CPPFLAGS -fsyntax-only -x c++ - ;;
    -) cat > /dev/null ;;
esac
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_build_compiles_their_uint64_t_without_cstdint_and_leaves_their_source_unchanged(tmp_path):
    """The H100 image's g++ stopped at DataStates' "'uint64_t' does not name a type" (2026-11-27): the script has
    every file include <cstdint> first, through CPPFLAGS (kept from the caller), and changes no file of theirs."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda_runtime.h").write_text("")
    (cuda / "bin").mkdir()
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Build cuda_13.0 (fake)'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    record, site = tmp_path / "cppflags", tmp_path / "site"
    env = {**os.environ, "PYTHON": str(fake), "CUDA_HOME": str(cuda), "RECORD": str(record), "CPPFLAGS": "-DKEPT"}
    proc = subprocess.run(["bash", str(BUILD), str(site)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert record.read_text() == "-include cstdint -DKEPT" and "CPPFLAGS=-include cstdint -DKEPT" in proc.stdout
    assert (site / "datastates" / "BUILT").is_file() and (site / "datastates" / "llm").is_dir()
    test_the_vendored_source_is_upstreams_commit_unchanged_with_its_licence()


def test_without_a_gpu_the_engine_is_skipped_as_cuda_only(monkeypatch):
    monkeypatch.setattr(ds_folder, "gpu_count", lambda: 0)
    [reason] = engines.missing_requirements("datastates")
    assert "DataStates-LLM is CUDA only" in reason and "no GPU is visible" in reason
    assert "bash scripts/build-datastates.sh /tmp/site" in reason and "PYTHONPATH=/tmp/site" in reason
    assert engines.engine_info("datastates").skip_when_missing


def test_with_a_gpu_but_no_build_the_reason_is_to_run_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setattr(ds_folder, "gpu_count", lambda: 1)
    monkeypatch.delitem(sys.modules, "datastates", raising=False)
    site = tmp_path / "site"
    (site / "datastates" / "ckpt").mkdir(parents=True)
    (site / "datastates" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    [reason] = engines.missing_requirements("datastates")
    assert "not built" in reason and "bash scripts/build-datastates.sh /tmp/site" in reason
    (site / "datastates" / "ckpt" / "src.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    importlib.invalidate_caches()
    assert engines.missing_requirements("datastates") == []


def test_a_run_without_cuda_is_recorded_skipped_with_the_reason_and_nothing_else(tmp_path):
    """The real launcher on a machine where nvidia-smi finds no GPU (a stand-in nvidia-smi that fails makes a GPU
    machine one too): the run folder holds its config and a metadata.json that says skipped and why; no events, no
    checkpoint, no launch script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    proc, run = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", "--engine", "datastates",
                          env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SKIPPED" in proc.stdout and "CUDA only" in proc.stdout
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "skipped"
    assert "DataStates-LLM is CUDA only" in meta["error"] and "scripts/build-datastates.sh" in meta["error"]
    assert "not installed" not in meta["error"] and "needs the Python module" not in meta["error"]
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "metadata.json"]


def test_the_registry_predicts_datastates_and_says_why_it_is_not_resharded():
    info = engines.engine_info("datastates")
    assert info.predictor.endswith(":DATASTATES") and not info.not_predicted
    assert "ds_to_universal.py" in info.not_resharded and "not installed" not in info.not_resharded


# --- the adapter's logic ---------------------------------------------------------------------------------------------


def _ds_config(block):
    return DeepSpeedConfig({"train_batch_size": 1, **({} if block is None else {"datastates_ckpt": block})})


def test_the_host_cache_is_read_from_deepspeeds_datastates_block_in_datastates_bytes():
    assert adapter.host_cache_bytes(_ds_config({"host_cache_size": 2})) == 2 * 2**30
    assert adapter.host_cache_bytes(_ds_config({"host_cache_size": 0.25})) == 2**28


@pytest.mark.parametrize("block, words", [(None, "no datastates_ckpt block"), ({}, "host_cache_size is None"),
                                          ({"host_cache_size": 0}, "above 0"), ({"host_cache_size": -1}, "above 0"),
                                          ({"host_cache_size": "4"}, "'4'"), ({"host_cache_size": True}, "True")])
def test_a_host_cache_datastates_would_abort_on_is_refused_in_words(block, words):
    with pytest.raises(adapter.DataStatesConfigError, match=re.escape(words)) as refused:
        adapter.host_cache_bytes(_ds_config(block))
    assert "--host-cache-gb" in str(refused.value)


def test_the_largest_tensor_is_found_as_datastates_walks_the_state():
    state = {"module": {"w": torch.zeros(10, dtype=torch.bfloat16)},
             "optimizer": {"state": [{"exp_avg": torch.zeros(30)}, {"exp_avg": torch.zeros(3, dtype=torch.float64)}]},
             "opaque": (torch.zeros(1000),), "step": 7}
    assert adapter.largest_tensor(state) == ("optimizer|state|0|exp_avg", 120)
    assert adapter.largest_tensor({"n": 1}) == ("", 0)
    adapter.check_fits(state, 120, "f.pt")
    with pytest.raises(adapter.DataStatesConfigError, match=r"f.pt: tensor 'optimizer\|state\|0\|exp_avg' is 120 "):
        adapter.check_fits(state, 119, "f.pt")


def _datastates_like_job(state, path, fail, done):
    """What Checkpointing.save_background does on error: log, then sys.exit(-1) in the pool's thread."""
    time.sleep(0.05)
    if fail:
        print(f"[DataStates.llm][ERROR] From DataStates save_background, generated exception: {path}")
        sys.exit(-1)
    done.append(path)


def test_the_future_keeper_waits_for_every_queued_job_and_reports_the_failed_ones():
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    keeper = adapter.FutureKeeper(pool)
    done = []
    for i in range(4):
        keeper.submit(_datastates_like_job, {}, f"file{i}.pt", False, done)
    keeper.wait_all()
    assert sorted(done) == [f"file{i}.pt" for i in range(4)]
    keeper.submit(_datastates_like_job, {}, "good.pt", False, done)
    keeper.submit(_datastates_like_job, {}, "bad.pt", True, done)
    with pytest.raises(RuntimeError, match=r"failed for bad.pt \(SystemExit: -1\)") as failed:
        keeper.wait_all()
    assert "good.pt" not in str(failed.value) and "good.pt" in done
    keeper.wait_all()  # reported once
    keeper.shutdown(wait=True)  # the pool's own, as Checkpointing.__del__ calls it
    assert pool._shutdown


class _HostTierLike:
    """DataStates' compiled engine as its host tier behaves (tiers/host_tier.cpp): what ``ckpt_tensor`` hands it is
    written later, in order, on one thread, each write taking ``write_s``; the tensor's memory is read when written.
    ``at_once``: written as it is handed over, as an idle host tier may write it before ``ckpt_tensor``'s caller goes
    on (host_tier.cpp lines 38-54: the file created if missing, opened without truncation, seek, write).
    ``address_only``: as the compiled engine, it keeps no reference to the tensor (a ``mem_region_t`` holds its
    ``data_ptr()``, engine.cpp lines 25 and 29); one freed before its write is written as freed memory reads (0xdd).
    ``gate``: a host tier that is behind, writing nothing until the event is set (then all, in order). ``handed``
    lists the (path, offset) of each tensor handed over, ``done`` those written, once written."""

    def __init__(self, write_s: float = 0.05, at_once: bool = False, address_only: bool = False,
                 gate: threading.Event | None = None):
        self.queue: queue.Queue = queue.Queue()
        self.write_s, self.at_once, self.address_only, self.gate = write_s, at_once, address_only, gate
        self.handed: list[tuple[str, int]] = []
        self.done: list[tuple[str, int]] = []
        threading.Thread(target=self._write, daemon=True).start()

    def ckpt_tensor(self, version, tensor, size, offset, path):
        self.handed.append((path, offset))
        if self.at_once:
            self._write_one(tensor, size, offset, path)
            self.done.append((path, offset))
        elif self.address_only:
            self.queue.put((weakref.ref(tensor), size, offset, path))
        else:
            self.queue.put((tensor, size, offset, path))

    def wait(self):
        """The handle's wait: the GPU tier's queue, empty without a GPU."""

    def shutdown(self):
        """The handle's shutdown, which ``CkptEngine.__del__`` calls."""
        self.shut_down = True

    def _write(self):
        while True:
            tensor, size, offset, path = self.queue.get()
            if self.gate is not None:
                self.gate.wait()
            time.sleep(self.write_s)
            if isinstance(tensor, weakref.ref):
                tensor = tensor()
            self._write_one(tensor, size, offset, path)
            self.done.append((path, offset))

    @staticmethod
    def _write_one(tensor, size, offset, path):
        mode = "r+b" if os.path.exists(path) else "wb"
        with open(path, mode) as f:
            f.seek(offset)
            f.write(b"\xdd" * size if tensor is None else tensor.reshape(-1).view(torch.uint8).numpy().tobytes()[:size])


class _CheckpointingLike:
    """``datastates.llm.Checkpointing`` as the adapter uses it: ``save`` hands each tensor to the compiled engine,
    ``wait`` returns at once (nothing on a GPU to wait for)."""

    def __init__(self, host):
        self.ckpt_engine = type("CkptEngine", (), {"ckpt_engine": host})()
        self.saved = []

    def save(self, state, path):
        self.saved.append(state)
        offset = 0
        for tensor in (v for v in state.values() if torch.is_tensor(v)):
            size = tensor.numel() * tensor.element_size()
            self.ckpt_engine.ckpt_engine.ckpt_tensor(0, tensor, size, offset, path)
            offset += size
        return True

    def wait(self):
        return None


def _adapter_over(inner, rank=0):
    """The adapter around ``inner``, made as its __init__ would make it after importing DataStates."""
    engine = object.__new__(adapter.CheckpointEngine)
    engine.cache_bytes, engine.rank, engine.inner, engine.last_path = 1 << 30, rank, inner, None
    engine.handoff = adapter.HandOverAfterOpen(inner.ckpt_engine)  # not installed: the stand-in calls ckpt_tensor
    engine.jobs = adapter.FutureKeeper(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    return engine


def test_waiting_for_the_writes_returns_only_once_every_queued_file_is_written(tmp_path):
    inner = _CheckpointingLike(_HostTierLike())
    engine = _adapter_over(inner, rank=3)
    engine.wait_for_writes()  # nothing saved yet: nothing to wait for
    folder = tmp_path / "global_step2"
    folder.mkdir()
    tensors = {f"layer{i}": torch.full((1000,), float(i)) for i in range(4)}
    for name, tensor in tensors.items():
        engine.save({"w": tensor}, str(folder / f"{name}.pt"))
    engine.wait_for_writes()
    for name, tensor in tensors.items():
        assert (folder / f"{name}.pt").read_bytes() == tensor.numpy().tobytes(), name
    assert sorted(os.listdir(tmp_path)) == ["global_step2"]  # the marker's file, beside the folder, is removed
    engine.jobs.submit(time.sleep, 0.01)  # the pool's worker thread, not a daemon
    engine.close()  # at the phase's end: no worker left to make the process end through the teardown
    assert engine.jobs.pool._shutdown and not any(t.name.startswith("ThreadPoolExecutor") and t.is_alive()
                                                  and t in engine.jobs.pool._threads for t in threading.enumerate())
    with pytest.raises(TimeoutError, match="did not write"):
        adapter.wait_for_file(str(tmp_path / "never"), 1, timeout_s=0.05)


def test_a_save_hands_datastates_copies_of_its_cpu_tensors_and_leaves_the_state_alone(tmp_path):
    step, moment = torch.tensor(7.0), torch.empty(3, device="meta")  # meta stands in for a device tensor
    state = {"optimizer": {"state": {0: {"step": step, "exp_avg": moment}}}, "list": [step], "n": 5}
    copied = adapter.with_cpu_copies(state)
    inner_state = copied["optimizer"]["state"][0]
    assert inner_state["step"] is not step and torch.equal(inner_state["step"], step)
    assert inner_state["exp_avg"] is moment and copied["list"][0] is not step and copied["n"] == 5
    step += 1  # the next optimizer step, in place
    assert inner_state["step"].item() == 7.0 and copied["list"][0].item() == 7.0
    assert state["optimizer"]["state"][0]["step"] is step  # DeepSpeed's state is not changed
    assert isinstance(adapter.with_cpu_copies(collections.OrderedDict(a=1)), collections.OrderedDict)
    inner = _CheckpointingLike(_HostTierLike())
    engine = _adapter_over(inner)
    engine.save({"step": step}, str(tmp_path / "f.pt"))
    assert inner.saved[0]["step"] is not step and engine.last_path == str(tmp_path / "f.pt")


@pytest.fixture
def vendored_datastates(monkeypatch):
    """DataStates-LLM's Python from the vendored source (``Checkpointing``, ``CkptEngine``), its compiled handle a
    ``_HostTierLike`` (``hosts`` lists them; ``options``, as the test sets them before making the adapter: by default
    one that writes each tensor as it is handed over), and CUDA said to be there
    for ``Checkpointing.__init__``: the adapter is made as DeepSpeed makes it. The modules it imported are forgotten
    afterwards, so that a later import finds the build's ``datastates``."""
    def loaded():
        return [name for name in sys.modules if name == "datastates" or name.startswith("datastates.")]
    for name in loaded():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(VENDORED))
    made = types.SimpleNamespace(hosts=[], options={"write_s": 0, "at_once": True})
    monkeypatch.setitem(sys.modules, "datastates.ckpt.src", types.SimpleNamespace(
        handle=lambda cache_bytes, gpu, rank: made.hosts.append(_HostTierLike(**made.options)) or made.hosts[-1]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    yield made
    for name in loaded():
        del sys.modules[name]


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")  # DataStates' load, torch.frombuffer
def test_no_tensor_is_written_before_save_backgrounds_truncating_open(tmp_path, vendored_datastates):
    """DataStates' ``save_background`` hands the tensors over (checkpointing.py line 93) before it opens the file with
    ``'wb'`` (line 95); a host tier that writes one at once (a CPU tensor goes straight to it, engine.cpp lines 29-30)
    would have it truncated away, zeros in its place. Through the adapter, its own code and the same bytes: every
    tensor loads back equal."""
    config = _ds_config({"host_cache_size": 0.01})
    engine = adapter.CheckpointEngine(config, 0)
    assert len(vendored_datastates.hosts) == 1  # DataStates' CkptEngine made its handle
    state = {"module": {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.bfloat16)},
             "optimizer": {"state": [{"step": torch.tensor(5.0)}]}, "iteration": 5}
    folder = tmp_path / "global_step5"
    folder.mkdir()
    for name in ("mp_rank_00_model_states.pt", "layer_01-model_states.pt"):
        engine.save(state, str(folder / name))
    engine.wait(persist=True)
    engine.wait_for_writes()
    for name in ("mp_rank_00_model_states.pt", "layer_01-model_states.pt"):
        loaded = engine.load(str(folder / name))
        assert loaded["iteration"] == 5
        assert torch.equal(loaded["module"]["w"], state["module"]["w"]), name
        assert torch.equal(loaded["module"]["b"], state["module"]["b"]), name
        assert torch.equal(loaded["optimizer"]["state"][0]["step"], state["optimizer"]["state"][0]["step"]), name
    assert isinstance(engine.inner.ckpt_engine, adapter.HandOverAfterOpen)
    engine.close()


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")  # DataStates' load, torch.frombuffer
def test_what_datastates_was_handed_is_kept_alive_until_its_writes_are_waited_for(tmp_path, vendored_datastates):
    """The compiled engine keeps a tensor's address only, and the host tier writes a CPU tensor from it when it gets
    there, maybe long after the job that handed it over returned and dropped it (the adapter's copy of Adam's
    ``step``; a busy host tier, 0.2 s behind here): the adapter keeps what it handed over until ``wait_for_writes``
    has seen the writes done, then lets it go."""
    vendored_datastates.options = {"write_s": 0.2, "address_only": True}
    engine = adapter.CheckpointEngine(_ds_config({"host_cache_size": 0.01}), 0)
    step = torch.tensor(5.0)
    folder = tmp_path / "global_step5"
    folder.mkdir()
    path = str(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    engine.save({"optimizer_state_dict": {"state": {0: {"step": step}}}}, path)
    engine.wait(persist=True)  # the job has returned: its state, the adapter's copies, dropped
    gc.collect()
    engine.wait_for_writes()
    assert torch.equal(engine.load(path)["optimizer_state_dict"]["state"][0]["step"], step)
    assert engine.handoff.handed == []  # let go once written
    engine.close()


def test_datastates_objects_end_when_the_adapter_is_dropped_not_in_a_later_collection(vendored_datastates):
    """DataStates' ``__del__``s (``Checkpointing``'s, and ``CkptEngine``'s, which shuts its compiled engine down) run
    as the adapter is dropped: no reference cycle leaves them to a garbage collection at some later time, or to the
    interpreter's teardown, where the compiled engine's tiers would be deleted under their running threads."""
    engine = adapter.CheckpointEngine(_ds_config({"host_cache_size": 0.01}), 0)
    inner = weakref.ref(engine.inner)
    engine.close()
    gc.disable()
    try:
        del engine
        assert inner() is None
        assert getattr(vendored_datastates.hosts[0], "shut_down", False)
    finally:
        gc.enable()


def _deepspeed_engine_over(datastates, calls):
    """A DeepSpeed engine as ``DataStatesEngine`` reaches it: its ``checkpoint_engine`` is DeepSpeed's
    ``DataStatesCheckpointEngine`` (a save's ``commit_info`` pending, ``commit`` recorded in ``calls``), whose
    ``ckpt_engine`` is the adapter, ``datastates``; no optimizer, so no step to guard."""
    checkpoint_engine = types.SimpleNamespace(ckpt_engine=datastates, commit_info="info",
                                              commit=lambda info: calls.append("commit"))
    return types.SimpleNamespace(optimizer=None, checkpoint_engine=checkpoint_engine)


def test_datastates_durability_waits_for_the_writes_and_a_failed_save_for_what_it_queued(monkeypatch):
    calls = []

    class Adapter:
        def wait_for_writes(self, timeout_s=3600.0):
            calls.append(("writes", timeout_s))

        def close(self):
            calls.append("close")

    monkeypatch.setattr(DeepSpeedEngine, "save", lambda self, ds_engine, save_dir, tag: None)  # queued, returned
    monkeypatch.setattr(DeepSpeedEngine, "wait_until_durable", lambda self: calls.append("fsync") or 1.0)
    engine = DataStatesEngine(EngineConfig(engine="datastates"))
    engine.save(_deepspeed_engine_over(Adapter(), calls), "/nowhere", "step1")
    assert engine.wait_until_durable() == 1.0
    assert calls == ["commit", ("writes", 3600.0), "fsync"]
    calls.clear()
    engine.close()
    assert calls == ["close"]
    calls.clear()
    DataStatesEngine(EngineConfig(engine="datastates")).close()  # a phase without a save (the restore's): no close
    assert calls == []

    def failing_save(self, ds_engine, save_dir, tag):
        raise adapter.DataStatesConfigError("too big")
    monkeypatch.setattr(DeepSpeedEngine, "save", failing_save)
    engine = DataStatesEngine(EngineConfig(engine="datastates"))
    with pytest.raises(adapter.DataStatesConfigError, match="too big"):
        engine.save(_deepspeed_engine_over(Adapter(), calls), "/nowhere", "step1")
    assert calls == [("writes", 600.0)]


def test_the_build_script_installs_this_adapter_as_datastates_and_every_save_names_it():
    script = BUILD.read_text()
    module = re.search(r"from (restartbench\.[\w.]+) import CheckpointEngine", script)[1]
    assert importlib.import_module(module).CheckpointEngine is adapter.CheckpointEngine
    assert "restartbench/engines/deepspeed/datastates_adapter.py" in adapter.ADAPTER_NOTE
    assert Path(ROOT, "restartbench/engines/deepspeed/datastates_adapter.py").exists()
    assert "get_commit_info" in DataStatesEngine.STEP_GUARD_NOTE and DataStatesEngine.asynchronous


# --- the GPU run's chain, rehearsed on the CPU -----------------------------------------------------------------------


def _lay_out_as_the_build_does(site: Path) -> None:
    """``site`` as scripts/build-datastates.sh leaves it, less the compiled engine: the script's own two lines, run
    here, copy DataStates' Python modules (from the vendored tree, of which the build copies a copy) and write its
    ``datastates/__init__.py`` (the adapter's import)."""
    script = BUILD.read_text()
    copy = re.search(r'^\(cd "\$WORK/datastates-llm" && find .*?\\;\)$', script, re.M | re.S)[0]
    init = re.search(r"""^cat > "\$TARGET/datastates/__init__.py" <<'EOF'$.*?^EOF$""", script, re.M | re.S)[0]
    proc = subprocess.run(["bash", "-euc", f'mkdir -p "$TARGET"\n{copy}\n{init}\n'], capture_output=True, text=True,
                          env={**os.environ, "WORK": str(VENDORED.parent), "TARGET": str(site)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (site / "datastates" / "llm" / "checkpointing.py").is_file()


class _TorchWithCuda:
    """``torch`` as DataStates' ``checkpointing`` module sees it in the rehearsal: CUDA there, device 0 current
    (what ``Checkpointing.__init__`` asks, lines 21 and 27); everything else is torch's."""

    cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0)

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture
def built_datastates(tmp_path, monkeypatch):
    """The ``datastates`` package as the build makes it (``_lay_out_as_the_build_does``, first on sys.path), its
    compiled handle (``datastates.ckpt.src``) a ``_HostTierLike`` per engine made (``hosts``; ``options`` as the test
    sets them), and CUDA said to be there for DataStates' ``Checkpointing`` alone: its module's ``torch`` is a
    ``_TorchWithCuda``, so DeepSpeed and torch still see this CPU. The modules imported are forgotten afterwards."""
    def loaded():
        return [name for name in sys.modules if name == "datastates" or name.startswith("datastates.")]
    for name in loaded():
        monkeypatch.delitem(sys.modules, name)
    site = tmp_path / "site"
    _lay_out_as_the_build_does(site)
    monkeypatch.syspath_prepend(str(site))
    made = types.SimpleNamespace(hosts=[], options={})
    monkeypatch.setitem(sys.modules, "datastates.ckpt.src", types.SimpleNamespace(
        handle=lambda cache_bytes, gpu, rank: made.hosts.append(_HostTierLike(**made.options)) or made.hosts[-1]))
    checkpointing = importlib.import_module("datastates.llm.checkpointing")
    assert Path(checkpointing.__file__).is_relative_to(site)
    monkeypatch.setattr(checkpointing, "torch", _TorchWithCuda())
    yield made
    for name in loaded():
        del sys.modules[name]


SEED = 1234
"""The rehearsal's run seed (model and data)."""


def _study_deepspeed_engine(setup):
    """A DeepSpeed engine as a rank of the study builds one (train.py: ``build_pipeline_module`` from the run's seed,
    ``deepspeed.initialize`` with the run's DeepSpeed JSON)."""
    import deepspeed

    from restartbench.model import build_pipeline_module

    module = build_pipeline_module(setup.preset, setup.layout, seed=SEED)
    return deepspeed.initialize(model=module, model_parameters=module.parameters(), config=setup.ds_config)[0]


def _train_iteration(engine, preset, step) -> float:
    """One iteration as train.py's ``_iteration`` runs it: the study's data for ``step``, ``train_batch``."""
    from restartbench.data import micro_batches

    batches = micro_batches(vocab_size=preset.vocab_size, seq_len=preset.seq_len, micro_batch=1,
                            grad_accum=engine.gradient_accumulation_steps(), step=step, dp_rank=0, seed=SEED)
    return float(engine.train_batch(data_iter=iter(batches)))


def _restored_parts(engine) -> dict[str, torch.Tensor]:
    """What the restore must give back, copied: the module's weights, ZeRO-1's fp32 partitions and, per partition,
    AdamW's moments and step."""
    zero = engine.optimizer
    parts = {f"module.{name}": value for name, value in engine.module.state_dict().items()}
    for i, flat in enumerate(zero.single_partition_of_fp32_groups):
        parts[f"fp32_partition.{i}"] = flat
        for key, value in zero.optimizer.state[flat].items():
            parts[f"adam.{i}.{key}"] = value
    return {name: value.detach().clone() for name, value in parts.items()}


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")  # DataStates' load, torch.frombuffer
@pytest.mark.parametrize("host_tier", ["behind", "idle"])
def test_a_cpu_rehearsal_of_the_gpu_run_restores_real_deepspeeds_state_exactly(tmp_path, monkeypatch,
                                                                                built_datastates, host_tier):
    """The GPU run's chain on this CPU, but for the compiled engine and the device. The ``datastates`` package is laid
    out as scripts/build-datastates.sh lays it out (the adapter as ``datastates/__init__.py``, DataStates' Python
    unchanged); its compiled handle is a host tier that writes each tensor at its offset (``_HostTierLike``), either
    ``behind``: from its own thread, in order, keeping the tensor's address only (``address_only``) and writing
    nothing until the iteration after the save has run (what the adapter's copies and keep-alive are for), or
    ``idle``: each tensor written as it is handed over (what the hand-over after save_background's truncating open is
    for). A real DeepSpeed 0.19.8 engine of the study's tiny model (a PipelineEngine, tp1pp1dp1, ZeRO-1, fp32, the
    study's AdamW and WarmupLR, its DeepSpeed JSON rendered with the engine's ``datastates_ckpt`` block) runs on
    gloo, world size 1, in this process: DeepSpeed makes its own DataStatesCheckpointEngine, which imports
    ``datastates.CheckpointEngine`` and makes the adapter over DataStates' ``Checkpointing``. The harness's engine
    (``create_engine``, as train.py makes it) then goes through a phase as train.py does: 3 iterations (WarmupLR
    gives the first two lr 0: a save after one could not tell a load of the weights from none), the state the
    study's proof digests, ``save`` of step3, one more iteration (its optimizer step guarded: DeepSpeed's commit
    first, reported as the copy wait), ``wait_until_durable`` (every tensor written by then), ``close``. A fresh
    engine built the same way, with a fresh harness engine, ``load``s step3: the weights, ZeRO's fp32 partitions,
    AdamW's moments and step equal those at the save exactly, and so does the study's proof digest (model,
    optimizer, scheduler, step counter); its next iteration, the restore phase's first, gives the uninterrupted
    run's loss and state.

    Two things differ from the GPU, each the narrowest way round the CPU: DataStates' ``Checkpointing`` alone is told
    CUDA is there (its module's ``torch``, ``_TorchWithCuda``; DeepSpeed and torch see the CPU), and every tensor of
    the state is a CPU tensor, so the adapter hands DataStates copies of all of them (on a GPU only Adam's step is
    one; the device tensors' copies are the GPU tier's, taken before ``wait`` returns)."""
    import deepspeed

    from restartbench import runtime
    from restartbench.config import RunConfig
    from restartbench.engines import create_engine
    from restartbench.plan import setup_for
    from restartbench.verify import compare, training_state_digest

    cfg = RunConfig()
    cfg.model.preset, cfg.layout.layout, cfg.model.dtype, cfg.engine.engine = "tiny", "tp1pp1dp1", "fp32", "datastates"
    cfg.engine.host_cache_gb, cfg.train.seed = 2.0, SEED
    setup = setup_for(cfg)
    assert setup.ds_config["datastates_ckpt"] == {"host_cache_size": 2.0}
    assert setup.ds_config["zero_optimization"]["stage"] == 1 and not setup.ds_config["bf16"]["enabled"]
    behind = threading.Event()
    built_datastates.options = ({"write_s": 0.001, "address_only": True, "gate": behind} if host_tier == "behind"
                                else {"at_once": True})
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                        ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    runtime.skip_shm_comm_build()
    runtime.init_distributed("gloo", 120)
    checkpoints = tmp_path / "checkpoints"
    try:
        engine = _study_deepspeed_engine(setup)
        made = engine.checkpoint_engine
        assert type(made).__name__ == "DataStatesCheckpointEngine"
        assert isinstance(made.ckpt_engine, adapter.CheckpointEngine) and len(built_datastates.hosts) == 1
        saver = create_engine(cfg.engine)
        assert isinstance(saver, DataStatesEngine)
        saver.prepare(engine)
        copy_waits = []
        saver.on_copy_wait = lambda tag, seconds, at: copy_waits.append(tag)
        for step in (1, 2, 3):
            _train_iteration(engine, setup.preset, step)
        at_save, digest_at_save = _restored_parts(engine), training_state_digest(engine)
        saver.save(engine, str(checkpoints), "step3")
        assert copy_waits == [] and made.commit_info is not None
        loss = _train_iteration(engine, setup.preset, 4)
        assert copy_waits == ["step3"] and made.commit_info is None  # committed before the optimizer step
        host = built_datastates.hosts[0]
        assert host.handed and sorted(host.done) == ([] if host_tier == "behind" else sorted(host.handed))
        changed = _restored_parts(engine)
        assert [name for name in at_save if torch.equal(at_save[name], changed[name])] == []  # in place, all moved
        behind.set()
        saver.wait_until_durable()
        checkpoint_writes = sorted(write for write in host.handed if "drain" not in write[0])
        assert sorted(write for write in host.done if "drain" not in write[0]) == checkpoint_writes
        written = saver.written()
        assert {Path(record.path).name for record in written} >= {
            "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            *(f"layer_{i:02}-model_00-model_states.pt" for i in range(7))}
        assert all(record.bytes > 0 for record in written)
        for record in written:  # DataStates' format under DeepSpeed's names: 8-byte length, a JSON header
            with open(record.path, "rb") as f:
                assert "datastates_metadata" in json.loads(f.read(int.from_bytes(f.read(8), "little"))), record.path
        saver.close()

        restored = _study_deepspeed_engine(setup)
        fresh = _restored_parts(restored)
        assert [name for name in fresh if torch.equal(fresh[name], at_save[name])] == []
        assert not [name for name in fresh if name.startswith("adam.")]  # no optimizer step yet: no Adam state
        loader = create_engine(cfg.engine)
        loader.load(restored, str(checkpoints), "step3")
        assert {Path(r.path).name for r in loader.read()} >= {Path(r.path).name for r in written}
        back = _restored_parts(restored)
        assert list(back) == list(at_save)
        assert [name for name in at_save if not torch.equal(back[name], at_save[name])] == []
        assert compare(digest_at_save, training_state_digest(restored)) == []
        assert _train_iteration(restored, setup.preset, 4) == loss  # the restore phase's first iteration
        resumed = _restored_parts(restored)
        assert [name for name in changed if not torch.equal(resumed[name], changed[name])] == []
        loader.close()
    finally:
        deepspeed.comm.destroy_process_group()
    assert not [name for name in os.listdir(checkpoints) if "drain" in name]  # the adapter's marker file is gone


# --- on a CUDA GPU ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def datastates_site(tmp_path_factory):
    """Where DataStates-LLM is built: /tmp/site when scripts/build-datastates.sh built it there, else a build here."""
    site = Path(os.environ.get("DATASTATES_SITE", "/tmp/site"))
    if not list(site.glob("datastates/ckpt/src*.so")):
        site = tmp_path_factory.mktemp("datastates-site")
        proc = subprocess.run(["bash", str(BUILD), str(site)], capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return site


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_state_saved_through_the_adapter_loads_back_equal(datastates_site, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(datastates_site))
    from datastates import CheckpointEngine

    state = {"w": torch.randn(1000, 7, device="cuda"), "opt": [{"m": torch.randn(33, device="cuda")}],
             "cpu": torch.arange(5), "step": 3}
    expected = {"w": state["w"].cpu(), "m": state["opt"][0]["m"].cpu(), "cpu": state["cpu"].clone()}
    engine = CheckpointEngine(_ds_config({"host_cache_size": 0.25}), 0)
    path = str(tmp_path / "global_step3" / "file.pt")
    os.makedirs(os.path.dirname(path))
    engine.save(state, path)
    engine.wait(persist=True)
    state["cpu"] += 100  # training goes on (Adam's step, in place): the file holds the value at the save
    engine.wait_for_writes()  # the files are written before the engine is destroyed
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert set(header) == {"w", "opt|0|m", "cpu", "datastates_metadata"}
    loaded = CheckpointEngine(_ds_config({"host_cache_size": 0.25}), 0).load(path)
    assert loaded["step"] == 3
    assert torch.equal(loaded["w"], expected["w"]) and torch.equal(loaded["opt"][0]["m"], expected["m"])
    assert torch.equal(loaded["cpu"], expected["cpu"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_study_restores_datastates_exactly_and_records_the_adapter(datastates_site, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(datastates_site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc, run = run_study(tmp_path / "logs", "small", "tp1pp1", "--device", "cuda", "--dtype", "bf16", "--iters", "4",
                          "--save-interval", "2", "--engine", "datastates", "--host-cache-gb", "2",
                          "--baseline-mib", "0", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((run / "metadata.json").read_text())["status"] == "complete"
    events = read_events(run)
    notes = {e["note"] for e in events if e["event"] == "checkpoint.workaround"}
    assert {adapter.ADAPTER_NOTE, DataStatesEngine.STEP_GUARD_NOTE} <= notes
    results = [e for e in events if e["event"] == "restore.result"]
    assert results and all(e["exact"] for e in results)
    model_files = sorted(Path(RunPlan.load(run).checkpoint_dir).rglob("*.pt"))
    assert model_files
    with open(model_files[0], "rb") as f:  # DataStates' format under DeepSpeed's name: 8-byte length, JSON header
        assert "datastates_metadata" in json.loads(f.read(int.from_bytes(f.read(8), "little")))
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)

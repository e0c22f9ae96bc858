"""Checkpoint I/O of a big preset and layout, emulated on CPU processes: no model, no training, the same files.

This module is the program every emulating process runs (``python -m restartbench.emulate``, as real ranks run
``restartbench.train``); ``restartbench.emulated_study`` plans, renders and launches an emulated run.

    python config-n-run.py 70B tp8pp8 --emulate --emulate-scale 0.016 --ranks-per-process 32 --dtype bf16
    python config-n-run.py 70B tp8pp4dp2 --emulate --engine lazy --emulate-scale 0.016 --ranks-per-process 32

What is real and what is emulated (also written into the run's ``metadata.json`` under ``emulation``):

- real: the files and the engine's own I/O code. Every emulated rank holds the state its rank would hold at the
  save (``restartbench.plan``'s per-rank training state, which the tests hold to real runs file by file: the same
  tensors with the same shapes and dtypes, the same plain values), with random data, and saves it through the
  chosen engine (``EMULATORS``): DeepSpeed's default engine's files with ``torch.save`` (what its
  TorchCheckpointEngine calls), then fsync; the lazy engine's own save (file plan, headers, host buffer, copies,
  streamed flush, fsync); DCP's ``save``/``async_save`` of the engine's flat state. Then the harness's manifest and
  atomic ``latest``; a cold (evicted) page cache before the restore; the engine's own read of the files; the
  restored tensors and values compared with what was saved; the event records (same schema as
  ``restartbench.train``), so the analysis reads the run folder like any other.
- emulated: there is no model, optimizer or training step (no ``train.iteration``, so no iteration time and no
  restart total); the state is built from random numbers just before each rank's save, outside the timed span, as
  training would have left it in memory. The restore reads into tensors allocated before it as a fresh process
  holds them, and compares plain values instead of setting them on a live engine; each rank reads its own
  files once (DeepSpeed 0.19.8's own load reads each layer and model file twice and re-partitions ZeRO state). The
  lazy engine's next optimizer step comes at once: it waits for all of the save's copies (``checkpoint.copy_wait``,
  part of the stall), where a real step would come after a forward and backward pass.
- ``--ranks-per-process K``: each process emulates K ranks one after another (world size / K processes), so the
  per-rank save and load times are each rank's own but K ranks never write at the same time: the aggregate
  bandwidth is that of world size / K writers. DCP saves collectively, so it takes K = 1.
- ``--emulate-scale s``: the model's hidden, ffn and vocabulary widths times s (layers, heads and so the file
  count and names unchanged; bytes about s² times), so a wide layout fits a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

PROCESS_START = time.time()

from restartbench.config import RunConfig  # noqa: E402  (stdlib-only modules: imports are a measured phase)
from restartbench.events import EventLog  # noqa: E402
from restartbench.launchers import die_with_launcher, placement  # noqa: E402
from restartbench.progress import say  # noqa: E402

WHAT_IS_EMULATED = __doc__.split("What is real and what is emulated", 1)[1].split(":", 1)[1].strip()
"""The part of this docstring that says what is real and what is emulated (kept in metadata.json)."""


# --- in every process --------------------------------------------------------------------------


class EmulatedRanks:
    """The ranks one process emulates, their event logs, and their training states (on meta tensors)."""

    def __init__(self, run_dir: Path, phase: str):
        self.run_dir, self.phase = run_dir, phase
        self.cfg = RunConfig.load(run_dir / "config.json")
        self.plan = json.loads((run_dir / "plan.json").read_text())
        self.ckpt_dir = self.plan["checkpoint_dir"]
        self.engine = self.cfg.engine.engine
        self.process = int(os.environ.get("RANK", "0"))
        k = self.cfg.emulation.ranks_per_process
        self.ranks = list(range(self.process * k, (self.process + 1) * k))
        self.logs = {rank: EventLog(run_dir, phase, rank) for rank in self.ranks}
        self._setup: tuple[int, Any] | None = None
        self._states: tuple[int, dict[int, tuple[Any, Any]]] | None = None

    @contextmanager
    def span_all(self, event: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """One timed span recorded on every rank of this process (process-wide work such as imports)."""
        extra: dict[str, Any] = {}
        start_wall, start = time.time(), time.perf_counter()
        yield extra
        for log in self.logs.values():
            log.emit(event, start=start_wall, duration_s=time.perf_counter() - start, **fields, **extra)

    def start(self) -> "Emulator":
        """Process start-up, as restartbench.train records it; returns the engine's emulator, set up."""
        launch_t0 = float(os.environ.get("RB_LAUNCH_T0", PROCESS_START))
        for log in self.logs.values():
            log.emit("process.start", start=launch_t0, duration_s=PROCESS_START - launch_t0, **placement(),
                     emulated=True)
        with self.span_all("startup.imports"):
            import torch  # noqa: F401

            from restartbench import plan  # noqa: F401  (torch, DeepSpeed's naming code)
            from restartbench import runtime
        note = runtime.time_out_new_groups(self.cfg.launch.collective_timeout_s)  # dcp-async's own gloo group too
        for log in self.logs.values():
            log.emit("startup.workaround", note=note)
        with self.span_all("startup.dist_init", backend="gloo"):
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.cfg.launch.collective_timeout_s))
        with self.span_all("startup.engine", engine=self.engine):  # imports, process groups
            return EMULATORS[self.engine](self)

    def setup(self, step: int) -> Any:
        """The plan's ShardSetup of the checkpoint after iteration ``step``, at the emulation's scale."""
        from restartbench.plan import setup_for

        if self._setup is None or self._setup[0] != step:
            self._setup = step, setup_for(self.cfg, step, scale=self.cfg.emulation.emulate_scale)
        return self._setup[1]

    def state(self, rank: int, step: int) -> tuple[Any, Any]:
        """(DeepSpeed topology coordinates, the plan's training state on meta tensors) of one of this process's
        ranks at ``step``."""
        from restartbench.plan import training_states

        if self._states is None or self._states[0] != step:
            self._states = step, {r: (coord, state) for r, coord, state in training_states(self.setup(step),
                                                                                              set(self.ranks))}
        return self._states[1][rank]

    def finish(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        for log in self.logs.values():
            log.emit("phase.end")
            log.close()
        dist.destroy_process_group()

    def say(self, message: str) -> None:
        if self.process == 0:
            say(message)


def random_tensor(shape: Any, dtype: Any, *key: Any) -> Any:
    """A tensor of random data, the same for the same key in every process (saved, then compared after the
    restore; a tensor that data-parallel replicas share has a key without the data-parallel rank)."""
    import torch

    from restartbench.data import stable_seed

    generator = torch.Generator().manual_seed(stable_seed("emulate", *key))
    return torch.empty(tuple(shape), dtype=dtype).uniform_(-1.0, 1.0, generator=generator)


def differences(want: Any, got: Any, where: str) -> list[str]:
    """Where ``got`` (restored) differs from ``want`` (saved): tensors by value, dtype and shape, the rest by repr."""
    import torch

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return a.dtype == b.dtype and torch.equal(a, b)
        return a == b

    return [f"{where}: {name} differs after the restore" for name, (a, b) in _pairs(want, got) if not same(a, b)]


def _pairs(want: Any, got: Any, name: str = "") -> Iterator[tuple[str, tuple[Any, Any]]]:
    import torch

    if isinstance(want, dict) and isinstance(got, dict) and want.keys() == got.keys():
        for key in want:
            yield from _pairs(want[key], got[key], f"{name}.{key}" if name else str(key))
    elif isinstance(want, (list, tuple)) and not isinstance(want, torch.Size) and type(want) is type(got) \
            and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            yield from _pairs(a, b, f"{name}[{i}]")
    elif isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor) or type(want) is not type(got):
        yield name or "state", (want, got)
    else:
        yield name or "state", (repr(want), repr(got))


# --- the engines: how an emulated rank saves and restores through each ----------------------------


class Emulator:
    """One process's emulated ranks going through one engine. ``stage`` builds what training leaves in memory and
    ``hold`` what a fresh process holds before its load (both outside the timed spans); ``save`` is the stall,
    ``next_step`` what the next optimizer step waits for, ``load`` the restore."""

    how = ""
    """What of the engine runs, for metadata.json."""

    def __init__(self, ranks: EmulatedRanks):
        self.ranks = ranks

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        """Why this engine cannot emulate ``cfg`` (None: it can)."""
        return None

    def stage(self, rank: int, step: int) -> Any:
        raise NotImplementedError

    def save(self, rank: int, staged: Any, tag: str) -> None:
        raise NotImplementedError

    def next_step(self, rank: int, tag: str) -> None:
        """Nothing to wait for: the engine's save returned with the state taken."""

    def wait_until_durable(self, rank: int) -> float:
        raise NotImplementedError

    def written(self, rank: int) -> list[Any]:
        raise NotImplementedError

    def hold(self, rank: int, step: int) -> Any:
        raise NotImplementedError

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        """(FileRecords of what was read, what was restored)."""
        raise NotImplementedError

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        raise NotImplementedError


class TorchFiles(Emulator):
    how = ("DeepSpeed's default engine: every file of the rank (DeepSpeed's names and state dicts) torch.save'd, "
           "then fsync'd; rank 0 copies DeepSpeed's recovery scripts; restored with torch.load")

    def __init__(self, ranks: EmulatedRanks):
        super().__init__(ranks)
        self._files: dict[int, dict[int, list[Any]]] = {}
        self._written: list[Any] = []

    def files(self, step: int) -> dict[int, list[Any]]:
        """rank -> the ShardFiles it writes at ``step`` (every rank of the layout)."""
        from restartbench.plan import shard_files

        if step not in self._files:
            files: dict[int, list[Any]] = {rank: [] for rank in range(self.ranks.plan["world_size"])}
            for shard in shard_files(self.ranks.setup(step)):
                files[shard.rank].append(shard)
            self._files = {step: files}
        return self._files[step]

    def stage(self, rank: int, step: int) -> Any:
        return [(shard, state_of(shard, self.ranks.cfg.train.seed)) for shard in self.files(step)[rank]]

    def save(self, rank: int, staged: Any, tag: str) -> None:
        """torch.save of each file; global rank 0 also copies DeepSpeed's recovery scripts into the checkpoint
        folder's root, as save_checkpoint does."""
        import torch

        from restartbench.engines.deepspeed_engines import FileRecord
        from restartbench.plan import copy_recovery_scripts

        self._written = []
        os.makedirs(os.path.join(self.ranks.ckpt_dir, tag), exist_ok=True)
        for shard, state in staged:
            path = os.path.join(self.ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            torch.save(state, path)
            self._written.append(FileRecord(path, os.path.getsize(path), time.perf_counter() - start))
        if rank == 0:
            copy_recovery_scripts(self.ranks.ckpt_dir)

    def wait_until_durable(self, rank: int) -> float:
        from restartbench.engines import durable_now

        return durable_now(self._written)

    def written(self, rank: int) -> list[Any]:
        return self._written

    def hold(self, rank: int, step: int) -> Any:
        """The files the rank needs: its stage's layer and model files (written by data-parallel rank 0 of the same
        stage and tensor rank) and its own optimizer file."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        layout, files = self.ranks.plan["layout"], self.files(step)
        topology = PipeModelDataParallelTopology(num_pp=layout["pp"], num_mp=layout["tp"], num_dp=layout["dp"])
        coord = topology.get_coord(rank)
        writer = topology.get_rank(pipe=coord.pipe, data=0, model=coord.model)
        return ([f for f in files[writer] if f.kind != "optimizer"]
                + [f for f in files[rank] if f.kind == "optimizer"])

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        """torch.load of each file (read + deserialize), as DeepSpeed's TorchCheckpointEngine.load does."""
        import torch

        from restartbench.engines.deepspeed_engines import FileRecord

        records, loaded = [], []
        for shard in held:
            path = os.path.join(self.ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            loaded.append(torch.load(path, map_location="cpu", weights_only=False))
            records.append(FileRecord(path, os.path.getsize(path), time.perf_counter() - start))
        return records, loaded

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        return [problem for shard, got in zip(held, restored)
                for problem in differences(state_of(shard, self.ranks.cfg.train.seed), got, shard.path)]


def state_of(shard: Any, seed: int) -> Any:
    """The shard's state dict with random data, the same for the same file and seed (saved, then compared)."""
    import torch

    from restartbench.data import stable_seed
    from restartbench.plan import materialize

    generator = torch.Generator().manual_seed(stable_seed("emulate", seed, shard.path))

    def random(numel: int, dtype: Any) -> Any:
        return torch.empty(numel, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)

    return materialize(shard.state, random)


class LazyFiles(Emulator):
    """restartbench's lazy engine, one ``LazyEngine`` per emulated rank (its host buffer kept from save to save, as
    a rank's is)."""

    how = ("restartbench's lazy engine: its capture of the rank's state (random data), its file plan, headers, host "
           "buffer, background copies and streamed, fsync'd flush (LazyEngine.save_captured); the next optimizer "
           "step's wait for the copies comes right after the save; restored with its own header checks and scatter "
           "reads (LazyEngine.load_into) into tensors allocated before the load, plain values compared")

    def __init__(self, ranks: EmulatedRanks):
        from restartbench.engines import create_engine

        super().__init__(ranks)
        self.engines = {rank: create_engine(ranks.cfg.engine) for rank in ranks.ranks}
        for rank, engine in self.engines.items():
            engine.on_copy_wait = lambda tag, seconds, log=ranks.logs[rank]: log.emit(
                "checkpoint.copy_wait", tag=tag, step=int(tag.removeprefix("step")), duration_s=seconds,
                emulated=True)

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        if cfg.engine.dp_read_once:
            return ("--dp-read-once is not emulated (its broadcast needs every data-parallel replica in a process of "
                    "its own, reading at once); leave it out: each emulated rank then reads its module file itself")
        return None

    def _capture(self, rank: int, step: int) -> tuple[Any, Any]:
        from restartbench.plan import lazy_capture

        coord, state = self.ranks.state(rank, step)
        return lazy_capture(self.ranks.setup(step), rank, coord, state)

    def _random(self, file: str, name: str, like: Any, step: int) -> Any:
        """Random data for a tensor of a file: the model file's tensors are the same for every replica that reads
        them."""
        return random_tensor(like.shape, like.dtype, self.ranks.cfg.train.seed, step, file, name)

    def stage(self, rank: int, step: int) -> Any:
        from dataclasses import replace

        layout, captured = self._capture(rank, step)
        tensors = {spec.name: self._random(file, spec.name, captured.tensors[spec.name], step)
                   for file, _, specs in captured.groups for spec, _ in specs}
        return layout, replace(captured, tensors=tensors)

    def save(self, rank: int, staged: Any, tag: str) -> None:
        layout, captured = staged
        self.engines[rank].save_captured(captured, layout, self.ranks.ckpt_dir, tag)

    def next_step(self, rank: int, tag: str) -> None:
        """The optimizer step right after the save: it waits for the copies (recorded as checkpoint.copy_wait)."""
        self.engines[rank].wait_for_copies()

    def wait_until_durable(self, rank: int) -> float:
        return self.engines[rank].wait_until_durable()

    def written(self, rank: int) -> list[Any]:
        return self.engines[rank].written()

    def hold(self, rank: int, step: int) -> Any:
        """The rank's module tensors (by saved name) and optimizer tensors as a fresh process holds them, and the
        plain values the save recorded."""
        import torch

        layout, captured = self._capture(rank, step)
        _, state = self.ranks.state(rank, step)
        module = {f"module.{k}": torch.empty(t.shape, dtype=t.dtype) for k, t in state.module.state_dict().items()}
        optim = {spec.name: torch.empty(captured.tensors[spec.name].shape, dtype=captured.tensors[spec.name].dtype)
                 for _, kind, specs in captured.groups if kind == "optim" for spec, _ in specs}
        return layout, module, optim, json.loads(json.dumps(captured.values))

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        from restartbench.engines.lazy_engine import LazyRestoreError

        layout, module, optim, _ = held
        seen: dict[str, Any] = {}

        def optim_targets(header: dict[str, Any]) -> dict[str, Any]:
            saved = sorted(t["name"] for t in header["tensors"])
            if saved != sorted(optim):
                raise LazyRestoreError(f"{layout.optim_file} holds tensors {saved[:5]}..., rank {rank} expects "
                                       f"{sorted(optim)[:5]}...: not this layout's checkpoint")
            seen["values"] = header["values"]
            return optim

        engine = self.engines[rank]
        engine.load_into(layout, self.ranks.ckpt_dir, tag, module, optim_targets)
        return engine.read(), seen["values"]

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        layout, module, optim, values = held
        problems = [f"{layout.optim_file}: the plain values differ after the restore"] if restored != values else []
        for file, tensors in ((layout.model_file, module), (layout.optim_file, optim)):
            for name, got in tensors.items():
                problems += differences({name: self._random(file, name, got, step)}, {name: got}, file)
        return problems


class DCPFlat(Emulator):
    """PyTorch DCP (``dcp``, ``dcp-async``): the rank's harness state in dcp_engine's flat form, saved collectively."""

    how = ("PyTorch DCP: the rank's harness state (module, ZeRO-1 fp32 partition and Adam moments, scheduler, "
           "counters; random data) in dcp_engine's flat form, saved by every process at once through the engine's "
           "dcp.save or async_save (DCPEngine.save_flat) and loaded back with dcp.load (DCPEngine.load_flat) into "
           "tensors allocated before the load")

    def __init__(self, ranks: EmulatedRanks):
        from restartbench.engines import create_engine

        super().__init__(ranks)
        self.engine = create_engine(ranks.cfg.engine)  # dcp-async: its own gloo group, on every process at once

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        k = cfg.emulation.ranks_per_process
        if k != 1:
            return (f"--engine {cfg.engine.engine} under --emulate needs --ranks-per-process 1 (got {k}): DCP's save "
                    "is collective (every rank of the process group takes part at once), so a process can emulate "
                    "one rank only")
        return None

    def _flat(self, rank: int, step: int) -> tuple[tuple[int, int, int], dict[str, Any]]:
        """(coordinates, the rank's flat state on meta tensors)."""
        from restartbench.engines import dcp_engine, harness_state

        coord, state = self.ranks.state(rank, step)
        coords = (coord.pipe, coord.model, coord.data)
        return coords, dcp_engine.flat_state(harness_state.capture(state), *coords)

    def stage(self, rank: int, step: int) -> Any:
        """Random data keyed by DCP's key: a module entry's key is the same on every data-parallel replica (DCP
        writes it once and every replica reads it)."""
        import torch

        _, flat = self._flat(rank, step)
        return {key: random_tensor(value.shape, value.dtype, self.ranks.cfg.train.seed, step, key)
                if isinstance(value, torch.Tensor) else value for key, value in flat.items()}

    def save(self, rank: int, staged: Any, tag: str) -> None:
        self.engine.save_flat(staged, self.ranks.ckpt_dir, tag)

    def wait_until_durable(self, rank: int) -> float:
        return self.engine.wait_until_durable()

    def written(self, rank: int) -> list[Any]:
        return self.engine.written()

    def hold(self, rank: int, step: int) -> Any:
        import torch

        coords, flat = self._flat(rank, step)
        return coords, {key: torch.empty(value.shape, dtype=value.dtype) for key, value in flat.items()
                        if isinstance(value, torch.Tensor)}

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        coords, live = held
        restored = self.engine.load_flat(live, coords, self.ranks.ckpt_dir, tag)
        return self.engine.read(), restored

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        want = self.stage(rank, step)
        if want.keys() != restored.keys():
            return [f"rank {rank}: DCP restored entries {sorted(restored)[:5]}..., saved {sorted(want)[:5]}..."]
        return differences(want, restored, f"rank {rank} (DCP)")


#: The engines an emulated run can go through, by --engine name.
EMULATORS: dict[str, type[Emulator]] = {"torch": TorchFiles, "lazy": LazyFiles, "dcp": DCPFlat, "dcp-async": DCPFlat}


# --- phase 1: save ------------------------------------------------------------------------------


def train_phase(ranks: EmulatedRanks, emulator: Emulator) -> None:
    train = ranks.cfg.train
    steps = [s for s in range(1, train.iters + 1) if s % train.save_interval == 0 or s == train.iters]
    ranks.say(f"train (emulated, {ranks.engine}): {len(ranks.ranks)} rank(s) per process; checkpoints after "
              f"iterations {steps}")
    for step in steps:
        _checkpoint(ranks, emulator, step)


def _checkpoint(ranks: EmulatedRanks, emulator: Emulator, step: int) -> None:
    import torch.distributed as dist

    from restartbench.integrity import write_manifest
    from restartbench.storage import LocalStore

    tag = f"step{step}"
    dist.barrier()
    mine, commit_start = [], None
    for rank in ranks.ranks:
        save_start = _save_rank(ranks, emulator, rank, step, tag)
        commit_start = commit_start if commit_start is not None else save_start
        mine += _make_durable(ranks, emulator, rank, step, tag, save_start)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if 0 in ranks.ranks:
        write_manifest(ranks.ckpt_dir, tag, [f for share in everyone for f in share])
        LocalStore(ranks.ckpt_dir).write_durably("latest", tag)
        ranks.logs[0].emit("checkpoint.commit", step=step, tag=tag,
                           since_save_start_s=time.perf_counter() - commit_start)
    _record_resources(ranks, tag)
    dist.barrier()
    ranks.say(f"train (emulated): checkpoint {tag} durable on every rank and committed")


def _save_rank(ranks: EmulatedRanks, emulator: Emulator, rank: int, step: int, tag: str) -> float:
    """The rank's save (the stall) and, for an engine that leaves its copies running, the next step's wait."""
    staged = emulator.stage(rank, step)  # what training left in memory
    log = ranks.logs[rank]
    log.emit("checkpoint.begin", step=step, tag=tag, engine=ranks.engine, emulated=True)
    save_start = time.perf_counter()
    with log.span("checkpoint.save", step=step, tag=tag, engine=ranks.engine, emulated=True):
        emulator.save(rank, staged, tag)
    emulator.next_step(rank, tag)
    return save_start


def _make_durable(ranks: EmulatedRanks, emulator: Emulator, rank: int, step: int, tag: str,
                  save_start: float) -> list:
    from restartbench.engines.deepspeed_engines import records_as_dicts
    from restartbench.integrity import sha256_of

    log = ranks.logs[rank]
    with log.span("checkpoint.wait_durable", step=step, tag=tag):
        durable_at = emulator.wait_until_durable(rank)
    files = records_as_dicts(emulator.written(rank), ranks.ckpt_dir)
    log.emit("checkpoint.durable", step=step, tag=tag, since_save_start_s=durable_at - save_start, files=files,
             bytes=sum(f["bytes"] for f in files), n_files=len(files))
    with log.span("checkpoint.checksum", step=step, tag=tag):
        return [{**f, "rank": rank, "sha256": sha256_of(os.path.join(ranks.ckpt_dir, f["path"]))} for f in files]


def _record_resources(ranks: EmulatedRanks, tag: str) -> None:
    import psutil

    me = psutil.Process()
    for log in ranks.logs.values():
        log.emit("rank.resources", tag=tag, open_fds=me.num_fds(), rss_bytes=me.memory_info().rss,
                 threads=me.num_threads(), children=len(me.children(recursive=True)), per_process=True)


# --- phase 2: restore ---------------------------------------------------------------------------


def restore_phase(ranks: EmulatedRanks, emulator: Emulator) -> None:
    latest = Path(ranks.ckpt_dir) / "latest"
    if not latest.is_file():
        raise FileNotFoundError(f"no committed checkpoint in {ranks.ckpt_dir}: 'latest' is missing")
    tag = latest.read_text().strip()
    step = int(tag.removeprefix("step"))
    _check_files(ranks, tag)
    cache = _page_cache(ranks, tag)
    ranks.say(f"restore (emulated, {ranks.engine}): loading {tag} ({cache['cache']} page cache)")
    problems_seen = []
    for rank in ranks.ranks:
        held = emulator.hold(rank, step)  # what the fresh process holds before its load
        with ranks.logs[rank].span("restore.load", tag=tag, engine=ranks.engine, emulated=True, **cache) as extra:
            read, restored = emulator.load(rank, tag, held)
            extra.update(n_files=len(read), bytes=sum(r.bytes for r in read),
                         read_deserialize_s=sum(r.seconds for r in read))
        problems = emulator.compare(rank, step, held, restored)
        ranks.logs[rank].emit("restore.result", tag=tag, exact=not problems, verified=True, problems=problems,
                              loss=None, emulated=True)
        problems_seen += problems
    if problems_seen:
        raise RuntimeError("emulated restore is not exact:\n  " + "\n  ".join(problems_seen))
    ranks.say(f"restore (emulated): {tag} loaded and equal to what was saved on every rank")


def _check_files(ranks: EmulatedRanks, tag: str) -> None:
    import torch.distributed as dist

    from restartbench.integrity import check_share

    if not ranks.cfg.launch.check_files:
        return
    with ranks.span_all("restore.check_files", tag=tag) as extra:
        mine = check_share(ranks.ckpt_dir, tag, dist.get_rank(), dist.get_world_size())
        shares: list = [None] * dist.get_world_size()
        dist.all_gather_object(shares, mine)
        extra["problems"] = sorted({p for share in shares for p in share})
    if extra["problems"]:
        raise RuntimeError(f"checkpoint {tag} fails its manifest check:\n  " + "\n  ".join(extra["problems"]))


def _page_cache(ranks: EmulatedRanks, tag: str) -> dict[str, Any]:
    """Evict (cold restore) and measure the checkpoint's files, one process per node, as restartbench.train does."""
    from restartbench import pagecache

    return pagecache.before_restore(ranks.ckpt_dir, tag, ranks.cfg.launch.restore_cache)


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a process must not outlive a killed torchrun
    parser = argparse.ArgumentParser(description="One process of an emulated checkpoint run (see the module doc).")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--phase", required=True, choices=("train", "restore"))
    args = parser.parse_args(argv)
    ranks = EmulatedRanks(args.run_dir, args.phase)
    try:
        emulator = ranks.start()
        train_phase(ranks, emulator) if args.phase == "train" else restore_phase(ranks, emulator)
        ranks.finish()
    except BaseException as error:
        for log in ranks.logs.values():
            log.emit("phase.error", error=f"{type(error).__name__}: {error}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoint I/O of a big preset and layout, emulated on CPU processes: no model, no training, the same files.

This module is the program every emulating process runs (``python -m restartbench.emulate``, as real ranks run
``restartbench.train``); ``restartbench.emulated_study`` plans, renders and launches an emulated run.

    python config-n-run.py 70B tp8pp8 --emulate --emulate-scale 0.016 --ranks-per-process 32 --dtype bf16
    python config-n-run.py 70B tp8pp4dp2 --emulate --engine lazy --emulate-scale 0.016 --ranks-per-process 32

What is real and what is emulated (also written into the run's ``metadata.json`` under ``emulation``):

- real: the files and the engine's own I/O code. Every emulated rank holds the state its rank would hold at the save
  (``restartbench.shards``' per-rank training state, which the tests hold to real runs file by file: the same tensors
  with the same shapes and dtypes, the same plain values), with random data, and saves it through the chosen engine
  (its folder's ``emulate.py``, named in its registry entry): DeepSpeed's default engine's files with ``torch.save``
  (what its TorchCheckpointEngine calls), then fsync; the lazy engine's own save (file plan, headers, host buffer,
  copies, streamed flush, fsync); DCP's ``save``/``async_save`` of the engine's flat state. Then the harness's
  manifest and atomic ``latest``; a cold (evicted) page cache before the restore; the engine's own read of the files;
  the restored tensors and values compared with what was saved; the event records (same schema as
  ``restartbench.train``), so the analysis reads the run folder like any other.
- emulated: there is no model, optimizer or training step (no ``train.iteration``, so no iteration time and no restart
  total); the state is built from random numbers, as training would have left it in memory, for all of a process's
  ranks before the checkpoint's barrier: no timed span holds it, nor does the checkpoint's durable time (first save's
  start to the last rank durable), which a state built between two ranks' saves would lengthen. The restore reads into
  tensors allocated before it as a fresh process holds them, and compares plain values instead of setting them on a
  live engine; each rank reads its own files once (DeepSpeed 0.19.8's own load reads each layer and model file twice
  and re-partitions ZeRO state). The lazy engine's next optimizer step comes at once: it waits for all of the save's
  copies (``checkpoint.copy_wait``, part of the stall), where a real step would come after a forward and backward
  pass.
- ``--ranks-per-process K``: each process emulates K ranks one after another (world size / K processes), so the
  per-rank save and load times are each rank's own but K ranks never write at the same time: the aggregate
  bandwidth is that of world size / K writers. DCP saves collectively, so it takes K = 1.
- ``--emulate-scale s``: the model's hidden, ffn and vocabulary widths times s (layers, heads and so the file
  count and names unchanged; bytes about s² times), so a wide layout fits a small machine.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

PROCESS_START = time.time()

from restartbench import harness, rundir  # noqa: E402
from restartbench.config import RunConfig  # noqa: E402  (stdlib-only modules: imports are a measured phase)
from restartbench.errors import RankRefusal, refuse  # noqa: E402
from restartbench.events import Event, EventLog, RecordsExistError  # noqa: E402
from restartbench.launchers import die_with_launcher, end_process, placement  # noqa: E402
from restartbench.memwatch import MemoryWatch  # noqa: E402
from restartbench.progress import say  # noqa: E402
from restartbench.rank_args import RankArgs, parse_rank_args  # noqa: E402

if TYPE_CHECKING:
    from restartbench.emulator import Emulator

WHAT_IS_EMULATED = __doc__.split("What is real and what is emulated", 1)[1].split(":", 1)[1].strip()
"""The part of this docstring that says what is real and what is emulated (kept in metadata.json)."""


# --- in every process --------------------------------------------------------------------------


class EmulatedRanks:
    """The ranks one process emulates, their event logs, and their training states (on meta tensors)."""

    def __init__(self, args: RankArgs, watch: MemoryWatch | None = None):
        run_dir = self.run_dir = args.run_dir
        self.phase, self.requested_tag = args.phase, args.tag
        self.cfg = args.attempt_config(RunConfig.load(run_dir / rundir.CONFIG))
        self.plan = rundir.RunPlan.load(run_dir)
        self.ckpt_dir = self.plan.checkpoint_dir
        self.engine = self.cfg.engine.engine
        self.process = int(os.environ.get("RANK", "0"))
        k = self.cfg.emulation.ranks_per_process
        self.ranks = list(range(self.process * k, (self.process + 1) * k))
        self.watch = watch
        """The process's memory, shared by its ranks' spans (None: not watched)."""
        self.logs = {rank: EventLog(run_dir, args.phase, rank, args.attempt, watch=watch) for rank in self.ranks}
        from restartbench.storage import open_store

        self.store = open_store(self.ckpt_dir, self.plan.remote)
        self._setup: tuple[int, Any] | None = None
        self._states: tuple[int, dict[int, tuple[Any, Any]]] | None = None

    def start(self) -> Emulator:
        """Process start-up, as restartbench.train records it; returns the engine's emulator, set up."""
        launch_t0 = float(os.environ.get("RB_LAUNCH_T0", PROCESS_START))
        for log in self.logs.values():
            log.emit(Event.PROCESS_START, start=launch_t0, duration_s=PROCESS_START - launch_t0, **placement(),
                     emulated=True)
        with harness.span_all(self.logs, Event.STARTUP_IMPORTS):
            import torch  # noqa: F401

            from restartbench import plan, runtime  # noqa: F401  (plan: the states' shapes and DeepSpeed's names)
        note = runtime.time_out_new_groups(self.cfg.launch.collective_timeout_s)  # dcp-async's own gloo group too
        for log in self.logs.values():
            log.emit(Event.STARTUP_WORKAROUND, note=note)
        with harness.span_all(self.logs, Event.STARTUP_DIST_INIT, backend="gloo"):
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.cfg.launch.collective_timeout_s))
        with harness.span_all(self.logs, Event.STARTUP_ENGINE, engine=self.engine):  # imports, process groups
            from restartbench import engines

            return engines.emulator_class(self.engine)(self)

    def setup(self, step: int) -> Any:
        """The plan's ShardSetup of the checkpoint after iteration ``step``, at the emulation's scale."""
        from restartbench.plan import setup_for

        if self._setup is None or self._setup[0] != step:
            self._setup = step, setup_for(self.cfg, step, scale=self.cfg.emulation.emulate_scale)
        return self._setup[1]

    def state(self, rank: int, step: int) -> tuple[Any, Any]:
        """(DeepSpeed topology coordinates, the plan's training state on meta tensors) of one of this process's
        ranks at ``step``."""
        from restartbench.shards import training_states

        if self._states is None or self._states[0] != step:
            self._states = step, {r: (coord, state) for r, coord, state in training_states(self.setup(step),
                                                                                              set(self.ranks))}
        return self._states[1][rank]

    def finish(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        for log in self.logs.values():
            log.emit(Event.PHASE_END)
        dist.destroy_process_group()

    def close(self) -> None:
        """The phase's memory over time on every rank (``rank.memory``), then the logs closed."""
        if self.watch is not None:
            harness.record_memory(self.logs, self.watch, PROCESS_START)
            self.watch.stop()
        for log in self.logs.values():
            log.close()

    def say(self, message: str) -> None:
        if self.process == 0:
            say(message)


# --- phase 1: save ------------------------------------------------------------------------------


def train_phase(ranks: EmulatedRanks, emulator: Emulator) -> None:
    train = ranks.cfg.train
    steps = [s for s in range(1, train.iters + 1) if s % train.save_interval == 0 or s == train.iters]
    ranks.say(f"train (emulated, {ranks.engine}): {len(ranks.ranks)} rank(s) per process; checkpoints after "
              f"iterations {steps}")
    for step in steps:
        _checkpoint(ranks, emulator, step)


def _checkpoint(ranks: EmulatedRanks, emulator: Emulator, step: int) -> None:
    """Each of the process's ranks saves and is made durable in turn (never two at once); then the harness settles
    the checkpoint with every process. Every rank's state is staged before the barrier, so that all processes start
    their saves together and none of it is timed."""
    import torch.distributed as dist

    tag = f"step{step}"
    staged = {rank: emulator.stage(rank, step) for rank in ranks.ranks}  # what training left in memory
    dist.barrier()
    shares = [_save_rank(ranks, emulator, rank, step, tag, staged.pop(rank)) for rank in ranks.ranks]
    errors = harness.settle(ranks.logs, ranks.store, shares, step, tag, ranks.plan.checkpoint_bytes_estimate,
                            per_process=True, keep=ranks.cfg.storage.keep_checkpoints)
    ranks.say(f"train (emulated): checkpoint {tag} " + ("FAILED, previous checkpoint kept: " + "; ".join(errors)
                                                        if errors else "durable on every rank and committed"))


def _save_rank(ranks: EmulatedRanks, emulator: Emulator, rank: int, step: int, tag: str,
               staged: Any) -> harness.Share:
    """The rank's save of its ``staged`` state (the stall) and, for an engine that leaves its copies running, the
    next step's wait; then its files made durable."""
    log = ranks.logs[rank]
    save_start = harness.begin_save(log, step, tag, engine=ranks.engine, emulated=True)
    with log.span(Event.CHECKPOINT_SAVE, step=step, tag=tag, engine=ranks.engine, emulated=True):
        emulator.save(rank, staged, tag)
    emulator.next_step(rank, tag)
    return harness.durable_share(log, ranks.store, rank, step, tag, save_start,
                                 partial(emulator.wait_until_durable, rank), partial(emulator.written, rank))


# --- phase 2: restore ---------------------------------------------------------------------------


def restore_phase(ranks: EmulatedRanks, emulator: Emulator) -> None:
    from restartbench.integrity import tag_step

    tag = harness.restore_tag(ranks.logs, ranks.store, ranks.cfg.launch, ranks.requested_tag, ranks.say)
    step = tag_step(tag)
    cache = harness.page_cache_before_load(ranks.logs, ranks.store, tag, ranks.cfg.launch.restore_cache)
    ranks.say(f"restore (emulated, {ranks.engine}): loading {tag} ({cache['cache']} page cache)")
    problems_seen = []
    for rank in ranks.ranks:
        held = emulator.hold(rank, step)  # what the fresh process holds before its load
        restored = harness.timed_load(ranks.logs[rank], tag, cache, partial(emulator.load, rank, tag, held),
                                      engine=ranks.engine, emulated=True)
        problems = emulator.compare(rank, step, held, restored)
        harness.record_result(ranks.logs[rank], tag, problems, None, verified=True, emulated=True)
        problems_seen += problems
    if problems_seen:
        raise RuntimeError("emulated restore is not exact:\n  " + "\n  ".join(problems_seen))
    ranks.say(f"restore (emulated): {tag} loaded and equal to what was saved on every rank")


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a process must not outlive a killed torchrun
    watch = MemoryWatch().start()  # every span records the process's peak memory, the imports' included
    args = parse_rank_args(argv, "One process of an emulated checkpoint run (see the module doc).")
    process = int(os.environ.get("RANK", "0"))
    try:
        ranks = EmulatedRanks(args, watch)
    except RecordsExistError as refusal:
        watch.stop()
        return refuse(process, refusal)
    try:
        emulator = ranks.start()
        train_phase(ranks, emulator) if args.phase == "train" else restore_phase(ranks, emulator)
        ranks.finish()
    except BaseException as error:
        for log in ranks.logs.values():
            log.emit(Event.PHASE_ERROR, error=f"{type(error).__name__}: {error}",
                     **({"refused": True} if isinstance(error, RankRefusal) else {}))
        if isinstance(error, RankRefusal):
            return refuse(process, error)
        raise
    finally:
        ranks.close()
    return 0


if __name__ == "__main__":
    end_process(main())

"""The program every rank runs: ``python -m restartbench.train --run-dir DIR --phase train|restore``.

Phase ``train`` trains K iterations, checkpointing every I, then runs iteration K+1 (the
uninterrupted run's next step) and records its loss and the state it leaves. It trains on while
the last save's background work runs on some rank, then ``clean_iters`` iterations more: every
save's slowdown of training is measured against clean iterations, the last one's included.
Phase ``restore`` is a fresh launch: it restores the latest committed checkpoint, proves the
state equal to what was saved, runs iteration K+1 and proves loss and state equal to phase 1's.
On another layout (``--restore-layout``) the engine restores by its offline conversion (timed as
``restore.convert``) or at load; the proof is then on the consolidated state (``restartbench.consolidated``),
and iteration K+1's loss is recorded against phase 1's (reduction order changes with tp and dp).

Only the standard library is imported at module level: the time to import torch and
DeepSpeed is one of the restart phases measured here.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PROCESS_START = time.time()

from restartbench import crashes, harness, rundir  # noqa: E402  (stdlib-only modules)
from restartbench.config import RunConfig  # noqa: E402  (stdlib-only module)
from restartbench.errors import RankRefusal, refuse  # noqa: E402
from restartbench.events import Event, EventLog, RecordsExistError, read_events  # noqa: E402
from restartbench.launchers import die_with_launcher, end_process, placement  # noqa: E402
from restartbench.memwatch import MemoryWatch  # noqa: E402
from restartbench.progress import say  # noqa: E402
from restartbench.rank_args import RankArgs, parse_rank_args  # noqa: E402
from restartbench.rankwatch import RankWatch  # noqa: E402  (stdlib-only at import)


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a rank must not outlive a killed torchrun
    crashes.enable()  # a rank killed by a signal still says where (its phase's stderr log; the run's error)
    watch = RankWatch(MemoryWatch().start())  # every span records its peak memory, the imports' included
    args = parse_rank_args(argv, __doc__.splitlines()[0])
    rank = int(os.environ.get("RANK", "0"))
    try:
        log = EventLog(args.run_dir, args.phase, rank, args.attempt, watch=watch)
    except RecordsExistError as refusal:
        watch.host.stop()
        return refuse(rank, refusal)
    launch_t0 = float(os.environ.get("RB_LAUNCH_T0", PROCESS_START))
    log.emit(Event.PROCESS_START, start=launch_t0, duration_s=PROCESS_START - launch_t0, **placement())
    try:
        rank_run = RankRun(args, rank, log, watch)
        rank_run.start()
        if args.phase == "train":
            rank_run.train_phase()
        else:
            rank_run.restore_phase()
        rank_run.finish()
    except RankRefusal as refusal:
        log.emit(Event.PHASE_ERROR, error=_error_text(refusal), refused=True)
        return refuse(rank, refusal)
    except BaseException as error:
        log.emit(Event.PHASE_ERROR, error=_error_text(error))
        raise
    finally:
        harness.record_memory({rank: log}, watch.host, PROCESS_START)
        watch.host.stop()
        log.close()
    return 0


class RankRun:
    """One rank's state across the steps of a phase."""

    def __init__(self, args: RankArgs, rank: int, log: EventLog, watch: RankWatch):
        self.cfg = args.attempt_config(RunConfig.load(args.run_dir / rundir.CONFIG))
        self.run_dir, self.rank, self.log, self.watch = args.run_dir, rank, log, watch
        self.phase, self.requested_tag = log.phase, args.tag
        self.launch_dir = rundir.launch_folder(self.run_dir, args.restore_layout)
        self.plan = rundir.RunPlan.load(self.launch_dir)
        self.saved_layout = rundir.RunPlan.load(self.run_dir).layout_name
        """The layout phase 1 trained and saved on; ``self.plan``'s is this launch's."""
        self.ckpt_dir = self.plan.checkpoint_dir
        from restartbench.storage import open_store

        self.store = open_store(self.ckpt_dir, self.plan.remote)
        """The checkpoint's own files (manifest, latest, hashes): a folder or an object-store prefix."""
        self.chosen: tuple[str, dict[str, Any]] | None = None
        """A relaunch's checkpoint and page-cache state, chosen before the model is built."""
        self.prefetched: Any = None
        """What the engine's prefetcher started (``_prefetch_checkpoint``), for its ``prepare``; None: nothing."""

    # -- start-up: each part is a restart phase -----------------------------------------

    def start(self) -> None:
        """Start-up as a relaunch after a failure does it, each part its own span: imports, distributed init, the
        model, deepspeed.initialize and the checkpoint engine's set-up; a relaunch chooses and checks its checkpoint
        before the model (and starts a prefetching engine's read)."""
        with self.log.span(Event.STARTUP_IMPORTS):
            import deepspeed  # noqa: F401
            import torch  # noqa: F401

            from restartbench import runtime
        if self.plan.device == "cuda":
            self.watch.watch_cuda(int(os.environ.get("LOCAL_RANK", "0")))
        self._note_workarounds(runtime)
        from restartbench.faults import hang_before_init

        hang_before_init(self.log)
        with self.log.span(Event.STARTUP_DIST_INIT, backend=self.plan.backend):
            runtime.init_distributed(self.plan.backend, self.cfg.launch.collective_timeout_s)
        self._say(f"{self.phase}: {self.plan.world_size} ranks up ({self.plan.backend})")
        self._choose_before_start_up()
        module = self._build_model(runtime)
        self._say(f"{self.phase}: model built; deepspeed.initialize")
        self._initialize(module)
        self._say(f"{self.phase}: DeepSpeed ready; setting up the {self.cfg.engine.engine} engine")
        self._set_up_engine()
        self.pending: tuple[int, str, harness.SaveStart, str | None] | None = None
        self.dp_rank = self.engine.grid.get_data_parallel_rank()
        if self.rank == 0 and self.phase == "train":
            runtime.write_runtime_info(self.run_dir, self.plan.world_size)

    def _note_workarounds(self, runtime: Any) -> None:
        """What the harness changes in the environment before DeepSpeed starts, each recorded as a workaround."""
        runtime.skip_shm_comm_build()
        arch_note = runtime.make_cuda_arch_list_parsable()
        if arch_note:
            self.log.emit(Event.STARTUP_WORKAROUND, note=arch_note)
            self._say(f"{self.phase}: {arch_note}")
        proof_note = runtime.prepare_deterministic_proof(self.plan.device)
        if proof_note:
            self.log.emit(Event.STARTUP_WORKAROUND, note=proof_note)
        self.log.emit(Event.STARTUP_WORKAROUND, note=runtime.time_out_new_groups(self.cfg.launch.collective_timeout_s))

    def _build_model(self, runtime: Any) -> Any:
        with self.log.span(Event.STARTUP_MODEL_BUILD):
            from restartbench.layout import Layout
            from restartbench.model import build_pipeline_module, release_draw_threads

            layout = Layout(**self.plan.layout)
            module = build_pipeline_module(runtime.preset_for(self.cfg), layout, seed=self.cfg.train.seed,
                                           activation_checkpoint_interval=self.cfg.model.activation_checkpoint_interval)
            release_draw_threads()
            return module

    def _initialize(self, module: Any) -> None:
        """deepspeed.initialize, its stages and collectives timed (restartbench.ds_init_timing)."""
        import deepspeed

        with self.log.span(Event.STARTUP_DS_INITIALIZE) as initialized:
            from restartbench.ds_init_timing import timed_stages

            ds_config = rundir.read_json(self.launch_dir / rundir.DS_CONFIG)
            with timed_stages() as stages:
                self.engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                                       config=ds_config)
                self._settle_device()
            initialized.update(stages.fields())

    def _set_up_engine(self) -> None:
        """The checkpoint engine, set up outside the first stall (imports, groups, buffers)."""
        from restartbench.engines import create_engine, engine_for_target

        with self.log.span(Event.STARTUP_ENGINE, engine=self.cfg.engine.engine) as setup:
            self.ckpt_engine = engine_for_target(create_engine(self.cfg.engine), self.store)
            setup.update(self.ckpt_engine.prepare(self.engine, self.prefetched))
            setup.update(self._pinned())
        # called by an engine that made training wait for a save's copies after its save() returned; ``at``: when the
        # wait began (a CUDA wait is reported once the GPU has passed it, later: its time places it in its iteration)
        self.ckpt_engine.on_copy_wait = lambda tag, seconds, at: self.log.emit(
            Event.CHECKPOINT_COPY_WAIT, tag=tag, step=_step_of(tag), duration_s=seconds, time=at)

    def _choose_before_start_up(self) -> None:
        """On a relaunch of an engine that restores state: choose the checkpoint (its files checked against its
        manifest) and evict it from the page cache now, before the model is built, so that a missing or damaged
        checkpoint is refused before the start-up is spent (minutes at scale); then start a prefetching engine's
        read (``_prefetch_checkpoint``). Nothing in the start-up reads the checkpoint, so the load still finds it
        as chosen (cold, or as ``--restore-cache`` left it)."""
        if self.phase != "restore" or not self.saves_state:
            return
        self.chosen = self._choose_checkpoint()
        self._prefetch_checkpoint(self.chosen[0])

    def _prefetch_checkpoint(self, tag: str) -> None:
        """In the layout that saved, with an engine whose prefetcher the run enables (``EngineInfo.prefetcher``):
        start the engine's read of checkpoint ``tag`` (the ``restore.prefetch`` span), which goes on while the model
        is built and DeepSpeed initializes."""
        from restartbench.engines import prefetcher

        early = prefetcher(self.cfg.engine.engine)
        if early is None or not early.enabled(self.cfg.engine) or self.relayout or self.store.remote:
            return
        from restartbench.engines.base import RankPlace
        from restartbench.layout import Layout
        from restartbench.model import rank_coordinates

        layout = Layout(**self.plan.layout)
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if self.plan.device == "cuda" else "cpu"
        place = RankPlace(*rank_coordinates(layout, self.rank), dp_size=layout.dp, device=device)
        with self.log.span(Event.RESTORE_PREFETCH, tag=tag) as started:
            self.prefetched = early.start(self.cfg.engine, self.ckpt_dir, tag, place)
            started.update(self.prefetched.fields())

    def _choose_checkpoint(self) -> tuple[str, dict[str, Any]]:
        """The checkpoint to restore (its files checked against its manifest) and the page cache's state once it is
        evicted (or not: ``--restore-cache``). Collectives."""
        tag = harness.restore_tag({self.rank: self.log}, self.store, self.cfg.launch, self.requested_tag, self._say)
        return tag, harness.page_cache_before_load({self.rank: self.log}, self.store, tag,
                                                   self.cfg.launch.restore_cache)

    # -- phase 1 -------------------------------------------------------------------------

    def train_phase(self) -> None:
        train = self.cfg.train
        for step in range(1, train.iters + 1):
            loss = self._iteration(step)
            self._say(f"train: iteration {step}/{train.iters} loss {loss:.4f}")
            if self.saves_state and (step % train.save_interval == 0 or step == train.iters):
                self._checkpoint(step)
        self._reference_step(train.iters + 1)
        self._train_after_last_save(train.iters + 2)

    def _train_after_last_save(self, step: int) -> None:
        """Iterations from ``step`` on while the last save's background work runs on some rank (``after_save``; at
        most K of them, then the harness waits for it and the analysis marks that save's slowdown unseen), its
        commit, then ``clean_iters`` iterations (``clean``) that overlap no save."""
        train, overlapped = self.cfg.train, 0
        while overlapped < train.iters and self.pending is not None and not self._background_done_everywhere():
            self._iteration(step + overlapped, after_save=True)
            overlapped += 1
        self._commit_pending()
        for clean in range(train.clean_iters):
            self._iteration(step + overlapped + clean, clean=True)
        self._say(f"train: {overlapped} iteration(s) while the last save's background work ran, then "
                  f"{train.clean_iters} clean")

    def _background_done_everywhere(self) -> bool:
        """Whether the pending save's background work has ended on every rank, or an engine cannot tell without
        waiting (``background_done`` None: training stops and the harness waits). A collective."""
        import torch
        import torch.distributed as dist

        done = self.ckpt_engine.background_done()
        flag = torch.tensor([0 if done is False else 1], dtype=torch.int32, device=self.engine.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _checkpoint(self, step: int) -> None:
        """Save (the stall); a synchronous engine is then made durable and committed at once,
        an asynchronous one before its next save or at the end of training."""
        import torch.distributed as dist

        from restartbench.faults import arm_save_fault, bit_flipped_while_saving, hang_before_save, segfault_in_save

        self._commit_pending()
        tag = f"step{step}"
        hang_before_save(self.log, tag)
        self._say(f"train: checkpoint {tag} -> {self.ckpt_dir} ({self.cfg.engine.engine})"
                  + ("; the proof's digest first (the harness's, not timed as the save)" if self.cfg.launch.verify
                     else ""))
        arm_save_fault(self.log, tag)
        if self.cfg.launch.verify:  # the state the save writes, digested before it: outside its spans and its window
            self._digest_saved_state(tag)
        save_start = harness.begin_save(self.log, step, tag, engine=self.cfg.engine.engine)
        error = None
        try:
            with bit_flipped_while_saving(self.log, tag, self.engine), \
                    self.log.span(Event.CHECKPOINT_SAVE, step=step, tag=tag, engine=self.cfg.engine.engine) as saved:
                segfault_in_save(self.log, tag)
                self.ckpt_engine.save(self.engine, self.ckpt_dir, tag)
                saved.update(self._pinned())
            for note in self.ckpt_engine.workarounds:
                self.log.emit(Event.CHECKPOINT_WORKAROUND, step=step, tag=tag, note=note)
        except Exception as failure:  # noqa: BLE001 - every rank must learn of it, whatever it is
            error = f"{type(failure).__name__}: {failure}"
            dist.barrier()  # the healthy ranks are in DeepSpeed's closing barrier of save_checkpoint
        self.pending = (step, tag, save_start, error)
        if not self.ckpt_engine.asynchronous or error is not None:
            self._commit_pending()

    @contextmanager
    def _digest_span(self, event: str, **fields: Any) -> Iterator[Any]:
        """A span of the exactness proof's digest (``event``), with what the digest computed in its body cost
        (``verify.DigestCost``, given to the body) added to the span's record."""
        from restartbench.verify import DigestCost

        with self.log.span(event, **fields) as span:
            cost = DigestCost()
            yield cost
            span.update(cost.fields())

    def _digest_saved_state(self, tag: str) -> None:
        """This rank's digest of ``tag``'s state and, with ``--consolidated-digest``, the consolidated one (a
        collective; rank 0 writes it): the proofs of a restore on this layout and on another."""
        from restartbench.verify import training_state_digest, write_digest

        with self._digest_span(Event.PROOF_DIGEST, tag=tag, kind="state") as cost:
            write_digest(self.run_dir, tag, self.rank, training_state_digest(self.engine, cost))
        if self.cfg.launch.consolidated_digest:
            from restartbench.consolidated import consolidated_digest, write_consolidated

            whole = consolidated_digest(self.engine)
            if self.rank == 0:
                write_consolidated(self.run_dir, tag, whole)

    def _commit_pending(self) -> None:
        """Wait until the pending save is durable on this rank; if it is on every rank, write the manifest
        and commit, else remove the partial checkpoint. Training state in memory is untouched either way."""
        if self.pending is None:
            return
        step, tag, save_start, error = self.pending
        self.pending = None
        if error is None:
            self._say(f"train: checkpoint {tag}: waiting until durable, then its files' checksums for its manifest")
            share = harness.durable_share(self.log, self.store, self.rank, step, tag, save_start,
                                          self.ckpt_engine.wait_until_durable, self.ckpt_engine.written,
                                          background_done=self.ckpt_engine.background_done())
        else:
            share = harness.failed_share(self.rank, save_start, error)
        errors = harness.settle({self.rank: self.log}, self.store, [share], step, tag,
                                self.plan.checkpoint_bytes_estimate, keep=self.cfg.storage.keep_checkpoints)
        self._say(f"train: checkpoint {tag} " + ("FAILED, previous checkpoint kept: " + "; ".join(errors)
                                                 if errors else "durable on every rank and committed"))

    def _reference_step(self, step: int) -> None:
        """Iteration K+1 of the uninterrupted run: the restore phase must reproduce it exactly."""
        loss = self._iteration(step, reference=True)
        self._say(f"train: iteration {step} (reference for the restore) loss {loss:.6f}")
        if self.cfg.launch.verify:
            from restartbench.verify import module_digest, write_digest

            name = f"after-step{step}"
            with self._digest_span(Event.PROOF_DIGEST, tag=name, kind="module") as cost:
                write_digest(self.run_dir, name, self.rank, module_digest(self.engine, cost))

    # -- phase 2 -------------------------------------------------------------------------

    def restore_phase(self) -> None:
        if not self.saves_state:
            return self._restart_without_checkpoint()
        from restartbench.faults import kill_in_load

        tag, cache = self.chosen
        step = _step_of(tag)
        self._say(f"restore: loading {tag} from {self.ckpt_dir} ({self.cfg.engine.engine}, {cache['cache']} page "
                  "cache)" + (f", saved on {self.saved_layout}, onto {self.plan.layout_name}" if self.relayout else ""))
        kill_in_load(self.log)
        if self.relayout:
            return self._restore_on_another_layout(tag, cache)
        harness.timed_load(self.log, tag, cache, lambda: self._load(tag), self.ckpt_engine.load_fields,
                           engine=self.cfg.engine.engine)
        problems = []
        if self.cfg.launch.verify:
            self._say(f"restore: {tag} loaded; the proof's digest of the restored state")
            problems = self._verify_restored(tag)
        loss = self._iteration(step + 1, first_after_restore=True)
        if self.cfg.launch.verify:
            problems += self._verify_resumed(step + 1, loss)
        self._end_restore(tag, problems, loss, self.cfg.launch.verify,
                          f"restore: resumed at iteration {step + 1}, loss {loss:.6f}"
                          + (" (equal to the uninterrupted run's; state verified)" if self.cfg.launch.verify else ""))

    @functools.cached_property
    def saves_state(self) -> bool:
        """The run's engine saves and restores state (every engine but ``none``)."""
        from restartbench.engines import engine_info

        return engine_info(self.cfg.engine.engine).saves_state

    @property
    def relayout(self) -> bool:
        """This launch restores on another layout than phase 1 saved on."""
        return self.plan.layout_name != self.saved_layout

    def _restore_on_another_layout(self, tag: str, cache: dict) -> None:
        """Convert (the engine's offline pass, if it has one), load, prove on the consolidated state, and run
        iteration K+1, whose loss is recorded against the uninterrupted run's (not required equal: the reduction
        order changes with tp and dp)."""
        from restartbench.engines import converter

        step, conversion, load_tag = _step_of(tag), converter(self.cfg.engine.engine), tag
        if conversion:
            self._say(f"restore: converting {tag} for {self.plan.layout_name} (the engine's offline pass)")
            load_tag = harness.convert(self.log, conversion, self.ckpt_dir, tag)
            cache = {**cache, "cache": "converted", "resident_fraction": None}  # the load reads what it just wrote
        harness.timed_load(self.log, tag, cache, lambda: self._load(load_tag), engine=self.cfg.engine.engine,
                           restore_layout=self.plan.layout_name, saved_layout=self.saved_layout)
        problems, verified = self._verify_consolidated(tag)
        loss = self._iteration(step + 1, first_after_restore=True)
        reference = self._reference_loss(step + 1, rank=0)  # every rank has the loss; this layout's ranks are others
        proof = "consolidated state verified" if verified else "state not verified"
        self._end_restore(tag, problems, loss, verified,
                          f"restore: resumed on {self.plan.layout_name} at iteration {step + 1}, loss {loss:.6f} "
                          f"({loss - reference:+.2e} from the uninterrupted run's on {self.saved_layout}; {proof})",
                          restore_layout=self.plan.layout_name, saved_layout=self.saved_layout,
                          reference_loss=reference, loss_diff=loss - reference)

    def _verify_consolidated(self, tag: str) -> tuple[list[str], bool]:
        """The consolidated state after the load against phase 1's at the save (a collective); not verified where
        verification is off or phase 1 recorded none (``--consolidated-digest``)."""
        from restartbench.consolidated import compare, consolidated_digest, consolidated_path, read_consolidated

        if not self.cfg.launch.verify:
            return [], False
        if not consolidated_path(self.run_dir, tag).exists():
            self._say(f"restore: {tag} is not verified on {self.plan.layout_name}: phase 1 recorded no consolidated "
                      "digest (run it with --consolidated-digest)")
            return [], False
        self._say(f"restore: {tag} loaded on {self.plan.layout_name}; the proof's consolidated digest")
        with self.log.span(Event.RESTORE_VERIFY, tag=tag, consolidated=True):
            return compare(read_consolidated(self.run_dir, tag), consolidated_digest(self.engine)), True

    def _end_restore(self, tag: str, problems: list[str], loss: float, verified: bool, said: str,
                     **fields: Any) -> None:
        """Record the restore's result (``fields``: what a restore on another layout adds) and say ``said``; raise if
        not exact."""
        harness.record_result(self.log, tag, problems, loss, verified, **fields)
        if problems:
            raise RestoreMismatch(f"rank {self.rank}: restore of {tag} is not exact:\n  " + "\n  ".join(problems))
        self._say(said)

    def _load(self, tag: str) -> tuple[list, None]:
        """The engine's load into the live engine: the files it read; nothing to hand back."""
        self.ckpt_engine.load(self.engine, self.ckpt_dir, tag)
        self._settle_device()
        return self.ckpt_engine.read(), None

    def _restart_without_checkpoint(self) -> None:
        """Engine ``none``: the relaunch's start-up and a first iteration from fresh weights, no load."""
        loss = self._iteration(1, first_after_restore=True)
        harness.record_result(self.log, None, [], loss, verified=False,
                              note="engine none: nothing was saved, nothing restored")
        self._say("restore: relaunched without a checkpoint (engine none): start-up cost only")

    def _verify_restored(self, tag: str) -> list[str]:
        from restartbench.verify import compare, read_digest, training_state_digest

        with self._digest_span(Event.RESTORE_VERIFY, tag=tag) as cost:
            return compare(read_digest(self.run_dir, tag, self.rank), training_state_digest(self.engine, cost))

    def _verify_resumed(self, step: int, loss: float) -> list[str]:
        """The resumed iteration against the uninterrupted run: its loss always, and the weights it leaves
        where phase 1 recorded them (after iteration K+1; a fallback restore resumes earlier)."""
        from restartbench.verify import compare, digest_path, module_digest, read_digest

        reference = self._reference_loss(step)
        problems = [] if loss == reference else [
            f"loss of iteration {step}: {loss!r} resumed vs {reference!r} uninterrupted"]
        name = f"after-step{step}"
        if digest_path(self.run_dir, name, self.rank).exists():
            problems += compare(read_digest(self.run_dir, name, self.rank), module_digest(self.engine))
        return problems

    def _reference_loss(self, step: int, rank: int | None = None) -> float:
        """Phase 1's loss of iteration ``step`` on ``rank`` (default: this rank)."""
        rank = self.rank if rank is None else rank
        for record in read_events(self.run_dir, "train", rank):
            if record["event"] == Event.TRAIN_ITERATION and record.get("step") == step:
                return record["loss"]
        raise RestoreMismatch(f"phase 1 recorded no iteration {step} on rank {rank}")

    # -- shared --------------------------------------------------------------------------

    def _iteration(self, step: int, **flags: bool) -> float:
        from restartbench.data import micro_batches
        from restartbench.faults import hang_before_iteration
        from restartbench.runtime import preset_for, proof_kernels

        hang_before_iteration(self.log, step)
        preset = preset_for(self.cfg)
        batches = micro_batches(vocab_size=preset.vocab_size, seq_len=preset.seq_len,
                                micro_batch=self.cfg.train.micro_batch,
                                grad_accum=self.engine.gradient_accumulation_steps(),
                                step=step, dp_rank=self.dp_rank, seed=self.cfg.train.seed)
        proof = self.plan.device == "cuda" and (flags.get("reference") or flags.get("first_after_restore"))
        with self.log.span(Event.TRAIN_ITERATION, step=step, **flags) as extra, proof_kernels(bool(proof)):
            loss = float(self.engine.train_batch(data_iter=iter(batches)))
            if flags.get("first_after_restore"):  # a restart part: all of its GPU work (other iterations: the
                self._settle_device()            # loss's read waits for the compute stream, not for a save's copies)
            extra["loss"] = loss
        return loss

    def _settle_device(self) -> None:
        """On CUDA, wait for every stream's queued work, so that the span closing next counts the GPU work it
        started, not only its launch (deepspeed.initialize, the load, the first iteration after it); nothing on
        CPU."""
        if self.plan.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def finish(self) -> None:
        import torch.distributed as dist

        self.ckpt_engine.close()
        dist.barrier()
        self.log.emit(Event.PHASE_END)
        dist.destroy_process_group()

    def _pinned(self) -> dict[str, int]:
        """``pinned_bytes``: the page-locked host memory the checkpoint engine holds, where it says."""
        pinned = self.ckpt_engine.pinned_host_bytes()
        return {} if pinned is None else {"pinned_bytes": pinned}

    def _say(self, message: str) -> None:
        if self.rank == 0:
            say(message)


class RestoreMismatch(RuntimeError):
    pass


def _error_text(error: BaseException) -> str:
    """The error, with the one it was raised while handling: after a collective timed out, the next collective
    fails with gloo's 'Application timeout caused pair closure', which alone would hide the timeout."""
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return text if cause is None else f"{text} (raised while handling {type(cause).__name__}: {cause})"


def _step_of(tag: str) -> int:
    from restartbench.integrity import tag_step

    return tag_step(tag)


if __name__ == "__main__":
    end_process(main())

"""The program every rank runs: ``python -m restartbench.train --run-dir DIR --phase train|restore``.

Phase ``train`` trains K iterations, checkpointing every I, then runs iteration K+1 (the
uninterrupted run's next step) and records its loss and the state it leaves.
Phase ``restore`` is a fresh launch: it restores the latest committed checkpoint, proves the
state equal to what was saved, runs iteration K+1 and proves loss and state equal to phase 1's.

Only the standard library is imported at module level: the time to import torch and
DeepSpeed is one of the restart phases measured here.
"""

from __future__ import annotations

import os
import sys
import time

PROCESS_START = time.time()

from restartbench import rundir  # noqa: E402  (stdlib-only module)
from restartbench.config import RunConfig  # noqa: E402  (stdlib-only module)
from restartbench.errors import RankRefusal, refuse  # noqa: E402
from restartbench.events import Event, EventLog, RecordsExistError, rank_errors, read_events  # noqa: E402
from restartbench.launchers import die_with_launcher, placement  # noqa: E402
from restartbench.progress import say  # noqa: E402
from restartbench.rank_args import RankArgs, parse_rank_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a rank must not outlive a killed torchrun
    args = parse_rank_args(argv, __doc__.splitlines()[0])
    rank = int(os.environ.get("RANK", "0"))
    try:
        log = EventLog(args.run_dir, args.phase, rank, args.attempt)
    except RecordsExistError as refusal:
        return refuse(rank, refusal)
    launch_t0 = float(os.environ.get("RB_LAUNCH_T0", PROCESS_START))
    log.emit(Event.PROCESS_START, start=launch_t0, duration_s=PROCESS_START - launch_t0, **placement())
    try:
        rank_run = RankRun(args, rank, log)
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
        log.close()
    return 0


class RankRun:
    """One rank's state across the steps of a phase."""

    def __init__(self, args: RankArgs, rank: int, log: EventLog):
        self.cfg = args.attempt_config(RunConfig.load(args.run_dir / rundir.CONFIG))
        self.run_dir, self.rank, self.log = args.run_dir, rank, log
        self.phase, self.requested_tag = log.phase, args.tag
        self.plan = rundir.RunPlan.load(self.run_dir)
        self.ckpt_dir = self.plan.checkpoint_dir
        from restartbench.storage import open_store

        self.store = open_store(self.ckpt_dir, self.plan.remote)
        """The checkpoint's own files (manifest, latest, hashes): a folder or an object-store prefix."""

    # -- start-up: each part is a restart phase -----------------------------------------

    def start(self) -> None:
        with self.log.span(Event.STARTUP_IMPORTS):
            import deepspeed  # noqa: F401
            import torch  # noqa: F401

            from restartbench import runtime
        from restartbench.faults import hang_before_init

        runtime.skip_shm_comm_build()
        arch_note = runtime.make_cuda_arch_list_parsable()
        if arch_note:
            self.log.emit(Event.STARTUP_WORKAROUND, note=arch_note)
            self._say(f"{self.phase}: {arch_note}")
        self.log.emit(Event.STARTUP_WORKAROUND, note=runtime.time_out_new_groups(self.cfg.launch.collective_timeout_s))
        hang_before_init(self.log)
        with self.log.span(Event.STARTUP_DIST_INIT, backend=self.plan.backend):
            runtime.init_distributed(self.plan.backend, self.cfg.launch.collective_timeout_s)
        self._say(f"{self.phase}: {self.plan.world_size} ranks up ({self.plan.backend}); building the model")
        with self.log.span(Event.STARTUP_MODEL_BUILD):
            from restartbench.layout import Layout
            from restartbench.model import build_pipeline_module

            layout = Layout(**self.plan.layout)
            module = build_pipeline_module(runtime.preset_for(self.cfg), layout, seed=self.cfg.train.seed,
                                           activation_checkpoint_interval=self.cfg.model.activation_checkpoint_interval)
        with self.log.span(Event.STARTUP_DS_INITIALIZE):
            ds_config = rundir.read_json(self.run_dir / rundir.DS_CONFIG)
            self.engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=ds_config)
        from restartbench.engines import create_engine, engine_for_target

        with self.log.span(Event.STARTUP_ENGINE, engine=self.cfg.engine.engine) as setup:  # imports, groups, buffers
            self.ckpt_engine = engine_for_target(create_engine(self.cfg.engine), self.store)
            setup.update(self.ckpt_engine.prepare(self.engine))
        # called by an engine that made training wait for a save's copies after its save() returned
        self.ckpt_engine.on_copy_wait = lambda tag, seconds: self.log.emit(
            Event.CHECKPOINT_COPY_WAIT, tag=tag, step=_step_of(tag), duration_s=seconds)
        self.pending: tuple[int, str, float, str | None] | None = None
        self.dp_rank = self.engine.grid.get_data_parallel_rank()
        if self.rank == 0 and self.phase == "train":
            runtime.write_runtime_info(self.run_dir, self.plan.world_size)

    # -- phase 1 -------------------------------------------------------------------------

    def train_phase(self) -> None:
        train = self.cfg.train
        for step in range(1, train.iters + 1):
            loss = self._iteration(step)
            self._say(f"train: iteration {step}/{train.iters} loss {loss:.4f}")
            if self.ckpt_engine.saves_state and (step % train.save_interval == 0 or step == train.iters):
                self._checkpoint(step)
        self._commit_pending()
        self._reference_step(train.iters + 1)

    def _checkpoint(self, step: int) -> None:
        """Save (the stall); a synchronous engine is then made durable and committed at once,
        an asynchronous one before its next save or at the end of training."""
        import torch.distributed as dist

        from restartbench.faults import arm_save_fault, bit_flipped_while_saving, hang_before_save

        self._commit_pending()
        tag = f"step{step}"
        hang_before_save(self.log, tag)
        self._say(f"train: checkpoint {tag} -> {self.ckpt_dir} ({self.cfg.engine.engine})")
        arm_save_fault(self.log, tag)
        self.log.emit(Event.CHECKPOINT_BEGIN, step=step, tag=tag, engine=self.cfg.engine.engine)
        save_start = time.perf_counter()
        error = None
        try:
            with bit_flipped_while_saving(self.log, tag, self.engine), \
                    self.log.span(Event.CHECKPOINT_SAVE, step=step, tag=tag, engine=self.cfg.engine.engine):
                self.ckpt_engine.save(self.engine, self.ckpt_dir, tag)
            for note in self.ckpt_engine.workarounds:
                self.log.emit(Event.CHECKPOINT_WORKAROUND, step=step, tag=tag, note=note)
        except Exception as failure:  # noqa: BLE001 - every rank must learn of it, whatever it is
            error = f"{type(failure).__name__}: {failure}"
            dist.barrier()  # the healthy ranks are in DeepSpeed's closing barrier of save_checkpoint
        self.pending = (step, tag, save_start, error)
        if self.cfg.launch.verify and error is None:  # the state as saved; taken outside the timed spans
            from restartbench.verify import training_state_digest, write_digest

            write_digest(self.run_dir, tag, self.rank, training_state_digest(self.engine))
        if not self.ckpt_engine.asynchronous or error is not None:
            self._commit_pending()

    def _commit_pending(self) -> None:
        """Wait until the pending save is durable on this rank; if it is on every rank, write the manifest
        and commit, else remove the partial checkpoint. Training state in memory is untouched either way."""
        if self.pending is None:
            return
        import torch.distributed as dist

        step, tag, save_start, error = self.pending
        self.pending = None
        files: list[dict] = []
        if error is None:
            try:
                files = self._make_durable(step, tag, save_start)
            except Exception as failure:  # noqa: BLE001
                error = f"{type(failure).__name__}: {failure}"
        outcomes: list = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, {"rank": self.rank, "error": error, "files": files})
        errors = rank_errors(outcomes)
        if self.rank == 0:
            self._commit_or_discard(step, tag, save_start, outcomes, errors)
        self._record_resources(tag)
        dist.barrier()
        self._say(f"train: checkpoint {tag} " + ("FAILED, previous checkpoint kept: " + "; ".join(errors)
                                                 if errors else "durable on every rank and committed"))

    def _record_resources(self, tag: str) -> None:
        """Open files, memory, threads and child processes of this rank: growth across checkpoints is a leak."""
        import psutil

        me = psutil.Process()
        self.log.emit(Event.RANK_RESOURCES, tag=tag, open_fds=me.num_fds(), rss_bytes=me.memory_info().rss,
                      threads=me.num_threads(), children=len(me.children(recursive=True)))

    def _make_durable(self, step: int, tag: str, save_start: float) -> list[dict]:
        from restartbench.engines.base import records_as_dicts

        with self.log.span(Event.CHECKPOINT_WAIT_DURABLE, step=step, tag=tag):
            durable_at = self.ckpt_engine.wait_until_durable()
        written = records_as_dicts(self.ckpt_engine.written(), self.ckpt_dir)
        self.log.emit(Event.CHECKPOINT_DURABLE, step=step, tag=tag, since_save_start_s=durable_at - save_start,
                      files=written, bytes=sum(f["bytes"] for f in written), n_files=len(written))
        with self.log.span(Event.CHECKPOINT_CHECKSUM, step=step, tag=tag):
            return [{**f, "rank": self.rank, "sha256": self.store.sha256(f["path"])} for f in written]

    def _commit_or_discard(self, step: int, tag: str, save_start: float, outcomes: list, errors: list[str]) -> None:
        from restartbench.integrity import write_manifest

        if errors:
            free = self.store.free_bytes()  # before the partial files are removed; None for an object store
            needed = self.plan.checkpoint_bytes_estimate
            if free is not None and free < needed:
                errors.insert(0, f"the checkpoint folder {self.ckpt_dir} is full: {free / 1e6:.1f} MB free after the "
                                 f"failed save, the checkpoint needs about {needed / 1e6:.1f} MB (no space left on "
                                 "device)")
            self.store.remove_tree(tag)
            self.log.emit(Event.CHECKPOINT_FAILED, step=step, tag=tag, errors=errors, target=self.ckpt_dir,
                          free_bytes=free, needed_bytes_estimate=needed)
            return
        write_manifest(self.store, tag, [f for o in outcomes for f in o["files"]])
        self.store.write_durably("latest", tag)  # atomic: a rename on a file system, one PUT in S3
        self.log.emit(Event.CHECKPOINT_COMMIT, step=step, tag=tag, since_save_start_s=time.perf_counter() - save_start)

    def _reference_step(self, step: int) -> None:
        """Iteration K+1 of the uninterrupted run: the restore phase must reproduce it exactly."""
        loss = self._iteration(step, reference=True)
        self._say(f"train: iteration {step} (reference for the restore) loss {loss:.6f}")
        if self.cfg.launch.verify:
            from restartbench.verify import module_digest, write_digest

            write_digest(self.run_dir, f"after-step{step}", self.rank, module_digest(self.engine))

    # -- phase 2 -------------------------------------------------------------------------

    def restore_phase(self) -> None:
        if not self.ckpt_engine.saves_state:
            return self._restart_without_checkpoint()
        from restartbench.faults import kill_in_load

        tag = self._checked_tag(self._wanted_tag())
        step = _step_of(tag)
        cache = self._page_cache_before_load(tag)
        self._say(f"restore: loading {tag} from {self.ckpt_dir} ({self.cfg.engine.engine}, {cache['cache']} page "
                  "cache)")
        kill_in_load(self.log)
        with self.log.span(Event.RESTORE_LOAD, tag=tag, engine=self.cfg.engine.engine, **cache) as extra:
            self.ckpt_engine.load(self.engine, self.ckpt_dir, tag)
            read = self.ckpt_engine.read()
            extra.update(n_files=len(read), bytes=sum(r.bytes for r in read),
                         read_deserialize_s=sum(r.seconds for r in read))
        problems = self._verify_restored(tag) if self.cfg.launch.verify else []
        loss = self._iteration(step + 1, first_after_restore=True)
        if self.cfg.launch.verify:
            problems += self._verify_resumed(step + 1, loss)
        self.log.emit(Event.RESTORE_RESULT, tag=tag, exact=not problems if self.cfg.launch.verify else None,
                      verified=self.cfg.launch.verify, problems=problems, loss=loss)
        if problems:
            raise RestoreMismatch(f"rank {self.rank}: restore of {tag} is not exact:\n  " + "\n  ".join(problems))
        self._say(f"restore: resumed at iteration {step + 1}, loss {loss:.6f}"
                  + (" (equal to the uninterrupted run's; state verified)" if self.cfg.launch.verify else ""))

    def _page_cache_before_load(self, tag: str) -> dict:
        """The checkpoint's page-cache state when the load begins: evicted first for a cold restore
        (``pagecache.before_restore``); ``remote`` for an object store, where no page cache applies."""
        from restartbench import pagecache

        if self.store.remote:  # every byte comes over the network: no page cache to evict or measure
            return {"cache": "remote", "resident_fraction": None, "cache_requested": self.cfg.launch.restore_cache}
        return pagecache.before_restore(self.ckpt_dir, tag, self.cfg.launch.restore_cache)

    def _checked_tag(self, tag: str) -> str:
        """``tag`` if its files match its manifest on every rank's share; else refuse, or fall back
        to the newest earlier committed checkpoint that checks out (``--on-corrupt fallback``)."""
        import torch.distributed as dist

        from restartbench.integrity import check_share, committed_tags

        if not self.cfg.launch.check_files:
            return tag
        committed = committed_tags(self.store)
        candidates = [tag] + [t for t in committed if _step_of(t) < _step_of(tag)]
        damaged: list[str] = []
        for candidate in candidates:
            with self.log.span(Event.RESTORE_CHECK_FILES, tag=candidate) as extra:
                try:
                    mine = check_share(self.store, candidate, self.rank, dist.get_world_size())
                except FileNotFoundError as missing:
                    mine = [str(missing)]
                shares: list = [None] * dist.get_world_size()
                dist.all_gather_object(shares, mine)
                problems = sorted({p for share in shares for p in share})
                extra["problems"] = problems
            if not problems:
                if candidate != tag:
                    self.log.emit(Event.RESTORE_FALLBACK, wanted=tag, restored=candidate)
                    self._say(f"restore: {tag} is damaged ({damaged[0]}); falling back to {candidate}")
                return candidate
            damaged += problems
            if self.cfg.launch.on_corrupt == "refuse":
                raise CorruptCheckpoint(f"checkpoint {candidate} in {self.ckpt_dir} fails its manifest check:\n  "
                                        + "\n  ".join(problems) + f"\n{_committed_here(committed)}; rerun "
                                        "with --on-corrupt fallback to restore the newest earlier checkpoint that "
                                        "checks out")
        raise CorruptCheckpoint(f"no committed checkpoint in {self.ckpt_dir} passes its manifest check "
                                f"({_committed_here(committed)})")

    def _wanted_tag(self) -> str:
        """The checkpoint this attempt asked for (``--tag``), else the one ``latest`` names. ``latest`` is a pointer,
        not the only truth: without it, the newest committed checkpoint (a tag with its manifest) under
        ``--on-corrupt fallback``; else a refusal naming them."""
        from restartbench.integrity import committed_tags

        if self.requested_tag is not None:
            return self._requested_tag(committed_tags(self.store))
        if self.store.exists("latest"):
            return self.store.read_text("latest").strip()
        committed = committed_tags(self.store)
        if not committed:
            raise NoCheckpoint(f"no complete checkpoint in {self.store.location}: 'latest' is missing and no "
                                    "checkpoint has its manifest (phase 1 never committed one); rerun phase 1 or "
                                    "point --checkpoint-dir elsewhere")
        if self.cfg.launch.on_corrupt != "fallback":
            raise CorruptCheckpoint(f"'latest' is missing in {self.store.location}, but {_committed_here(committed)}; "
                                    "rerun with --on-corrupt fallback to restore the newest that checks out")
        self._say(f"restore: 'latest' is missing; trying the newest committed checkpoint, {committed[0]}")
        return committed[0]

    def _requested_tag(self, committed: list[str]) -> str:
        if self.requested_tag not in committed:
            raise NoCheckpoint(f"--tag {self.requested_tag} is not a committed checkpoint in {self.store.location} "
                               f"({_committed_here(committed)})")
        return self.requested_tag

    def _restart_without_checkpoint(self) -> None:
        """Engine ``none``: the relaunch's start-up and a first iteration from fresh weights, no load."""
        loss = self._iteration(1, first_after_restore=True)
        self.log.emit(Event.RESTORE_RESULT, tag=None, exact=None, verified=False, loss=loss,
                      problems=[], note="engine none: nothing was saved, nothing restored")
        self._say("restore: relaunched without a checkpoint (engine none): start-up cost only")

    def _verify_restored(self, tag: str) -> list[str]:
        from restartbench.verify import compare, read_digest, training_state_digest

        with self.log.span(Event.RESTORE_VERIFY, tag=tag):
            return compare(read_digest(self.run_dir, tag, self.rank), training_state_digest(self.engine))

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

    def _reference_loss(self, step: int) -> float:
        for record in read_events(self.run_dir, "train", self.rank):
            if record["event"] == Event.TRAIN_ITERATION and record.get("step") == step:
                return record["loss"]
        raise RestoreMismatch(f"phase 1 recorded no iteration {step} on rank {self.rank}")

    # -- shared --------------------------------------------------------------------------

    def _iteration(self, step: int, **flags: bool) -> float:
        from restartbench.data import micro_batches
        from restartbench.faults import hang_before_iteration
        from restartbench.runtime import preset_for

        hang_before_iteration(self.log, step)
        preset = preset_for(self.cfg)
        batches = micro_batches(vocab_size=preset.vocab_size, seq_len=preset.seq_len,
                                micro_batch=self.cfg.train.micro_batch,
                                grad_accum=self.engine.gradient_accumulation_steps(),
                                step=step, dp_rank=self.dp_rank, seed=self.cfg.train.seed)
        with self.log.span(Event.TRAIN_ITERATION, step=step, **flags) as extra:
            loss = float(self.engine.train_batch(data_iter=iter(batches)))
            extra["loss"] = loss
        return loss

    def finish(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        self.log.emit(Event.PHASE_END)
        dist.destroy_process_group()

    def _say(self, message: str) -> None:
        if self.rank == 0:
            say(message)


class RestoreMismatch(RuntimeError):
    pass


class CorruptCheckpoint(RankRefusal):
    pass


class NoCheckpoint(RankRefusal):
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


def _committed_here(committed: list[str]) -> str:
    return (f"the committed checkpoints here are {', '.join(committed)}" if committed
            else "no checkpoint here has a manifest")


if __name__ == "__main__":
    sys.exit(main())

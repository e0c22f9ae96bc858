"""The per-rank harness around a checkpoint engine, one set of rules for real ranks (``restartbench.train``) and
emulated ones (``restartbench.emulate``, several ranks per process).

Saving: ``begin_save`` starts a rank's save on both clocks; ``durable_share`` waits until the rank's files are
durable and hashes them; ``settle`` gathers every rank's share, records each rank's ``checkpoint.durable`` and, on
rank 0, commits (manifest, then ``latest``) or discards the checkpoint, then records the ranks' resources.
Restoring: ``restore_tag`` chooses the checkpoint and checks its files against the manifest, ``page_cache_before_load``
evicts and measures the page cache (``restore.cache``), ``timed_load`` times the load and ``record_result`` records
what it gave.

One clock per checkpoint: a checkpoint starts when its first rank began its save (wall clock, gathered at
``settle``); every rank's durable time (``since_checkpoint_start_s``) and the commit are measured from that start,
so the commit, written after every rank was durable, is never earlier than any of them. Ranks on several nodes
read their own wall clocks: the figures assume the nodes' clocks agree (NTP), as the run's other wall times do.

A function takes the event logs of the ranks a process runs (``{rank: EventLog}``: one for a real rank, K for an
emulating process) and the checkpoint's store; collectives (``torch.distributed``) run once per process. torch,
the engines and the storage modules are imported inside the functions: a rank's imports are a measured phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from restartbench.errors import RankRefusal
from restartbench.events import Event, EventLog, rank_errors, span_on

if TYPE_CHECKING:
    from restartbench.config import LaunchConfig
    from restartbench.engines.base import Converter, FileRecord
    from restartbench.integrity import Store
    from restartbench.memwatch import MemoryWatch

Logs = Mapping[int, EventLog]
"""The event logs of the ranks one process runs, by rank."""


class CorruptCheckpoint(RankRefusal):
    pass


class NoCheckpoint(RankRefusal):
    pass


class ConversionFailed(RuntimeError):
    pass


def span_all(logs: Logs, event: str, **fields: Any) -> AbstractContextManager[dict[str, Any]]:
    """One timed span recorded on every rank of ``logs`` (work the process does once for all of them)."""
    return span_on(logs.values(), event, **fields)


# -- saving --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveStart:
    """When a rank began its save: ``wall`` (time.time(), comparable across ranks) and ``perf``
    (time.perf_counter(), the clock of an engine's durable time)."""

    wall: float
    perf: float

    def wall_of(self, perf: float) -> float:
        """A ``time.perf_counter()`` reading of this rank, on the wall clock."""
        return self.wall + (perf - self.perf)


def begin_save(log: EventLog, step: int, tag: str, **fields: Any) -> SaveStart:
    """Record that the rank's save of ``tag`` begins (``checkpoint.begin``: begun, never committed is a lost
    checkpoint) and return its start."""
    log.emit(Event.CHECKPOINT_BEGIN, step=step, tag=tag, **fields)
    return SaveStart(time.time(), time.perf_counter())


@dataclass
class Share:
    """One rank's part of a checkpoint, as every rank learns it when the checkpoint settles."""

    rank: int
    started: SaveStart
    error: str | None = None
    durable_at: float | None = None
    """perf_counter() at which the rank's files were durable (None: they never were)."""
    written: list[dict[str, Any]] = field(default_factory=list)
    """The rank's files as the engine reported them (path relative to the store, bytes, seconds)."""
    hashed: list[dict[str, Any]] = field(default_factory=list)
    """``written`` with rank and hash (``filehash.FORMAT``): the rank's manifest entries."""


def failed_share(rank: int, started: SaveStart, error: str) -> Share:
    """The share of a rank whose save itself failed."""
    return Share(rank, started, error)


def durable_share(log: EventLog, store: Store, rank: int, step: int, tag: str, started: SaveStart,
                  wait_until_durable: Callable[[], float], written: Callable[[], list[FileRecord]],
                  **wait_fields: Any) -> Share:
    """Wait until the rank's files of ``tag`` are durable (``checkpoint.wait_durable``, with ``wait_fields``: what
    the engine said of its background work as the wait began), then hash them for the manifest
    (``checkpoint.checksum``). What fails is the share's error: every rank must learn of it."""
    from restartbench.engines.base import records_as_dicts
    from restartbench.integrity import hash_each

    share = Share(rank, started)
    try:
        with log.span(Event.CHECKPOINT_WAIT_DURABLE, step=step, tag=tag, **wait_fields):
            share.durable_at = wait_until_durable()
        share.written = records_as_dicts(written(), store.location)
        with log.span(Event.CHECKPOINT_CHECKSUM, step=step, tag=tag):
            hashes = hash_each([f["path"] for f in share.written], store.file_hash)  # the rank's files at once
            share.hashed = [{**f, "rank": rank, "hash": digest} for f, digest in zip(share.written, hashes)]
    except Exception as failure:  # noqa: BLE001
        share.error = f"{type(failure).__name__}: {failure}"
    return share


def settle(logs: Logs, store: Store, shares: list[Share], step: int, tag: str, needed_bytes: int,
           per_process: bool = False, keep: int = 0) -> list[str]:
    """Gather every rank's share (``shares``: this process's); record each durable rank's ``checkpoint.durable``
    on the checkpoint's clock; on rank 0, commit if every rank is durable, else discard, and after a commit remove
    the committed checkpoints older than the newest ``keep`` (``--keep-checkpoints``; 0: none); record resources
    (``per_process``: one process's figures on each of its ranks). Returns the errors, one per distinct message
    (empty: committed). A collective: every process calls it once per checkpoint."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, shares)
    everyone = [share for process in gathered for share in process]
    checkpoint_start = min(share.started.wall for share in everyone)
    for share in shares:
        if share.error is None:
            _record_durable(logs[share.rank], share, step, tag, checkpoint_start)
    errors = rank_errors({"rank": share.rank, "error": share.error} for share in everyone)
    if 0 in logs:
        if errors:
            _discard(logs[0], store, step, tag, errors, needed_bytes)
        else:
            _commit(logs[0], store, everyone, step, tag, checkpoint_start)
            if keep:
                remove_older(logs[0], store, tag, keep)
    record_resources(logs, tag, per_process)
    dist.barrier()
    return errors


def _record_durable(log: EventLog, share: Share, step: int, tag: str, checkpoint_start: float) -> None:
    durable_at = share.durable_at
    log.emit(Event.CHECKPOINT_DURABLE, step=step, tag=tag, since_save_start_s=durable_at - share.started.perf,
             since_checkpoint_start_s=share.started.wall_of(durable_at) - checkpoint_start, files=share.written,
             bytes=sum(f["bytes"] for f in share.written), n_files=len(share.written))


def _commit(log: EventLog, store: Store, everyone: list[Share], step: int, tag: str,
            checkpoint_start: float) -> None:
    """The manifest of every rank's files, then ``latest`` (atomic: a rename on a file system, one PUT in S3)."""
    from restartbench.integrity import write_manifest

    write_manifest(store, tag, [f for share in everyone for f in share.hashed])
    store.write_durably("latest", tag)
    mine = next(share for share in everyone if share.rank == log.rank)
    log.emit(Event.CHECKPOINT_COMMIT, step=step, tag=tag, since_save_start_s=time.perf_counter() - mine.started.perf,
             since_checkpoint_start_s=time.time() - checkpoint_start)


def remove_older(log: EventLog, store: Store, committed: str, keep: int) -> None:
    """Remove every committed checkpoint but the newest ``keep`` (``committed``, just committed, among them): its
    manifest first, so that a removal cut short leaves files no restore takes for a checkpoint, then its files; each
    recorded as ``checkpoint.removed`` with what it held, a span (removing a 1B rank's 21 GB from a local disk took
    7 s on the H100 machine, on the training's path: the kernel drops the files' cached pages as it unlinks them)."""
    from restartbench.integrity import MANIFEST, committed_tags, read_manifest, tag_step

    for old in committed_tags(store)[keep:]:
        files = read_manifest(store, old)
        with log.span(Event.CHECKPOINT_REMOVED, step=tag_step(old), tag=old, committed=committed, keep=keep,
                      bytes=sum(f["bytes"] for f in files), n_files=len(files)):
            store.delete(f"{old}/{MANIFEST}")
            store.remove_tree(old)


def _discard(log: EventLog, store: Store, step: int, tag: str, errors: list[str], needed_bytes: int) -> None:
    """Remove the partial checkpoint (``latest`` keeps naming the previous one); a full folder is named first."""
    free = store.free_bytes()  # before the partial files are removed; None for an object store
    if free is not None and free < needed_bytes:
        errors.insert(0, f"the checkpoint folder {store.location} is full: {free / 1e6:.1f} MB free after the failed "
                         f"save, the checkpoint needs about {needed_bytes / 1e6:.1f} MB (no space left on device)")
    store.remove_tree(tag)
    log.emit(Event.CHECKPOINT_FAILED, step=step, tag=tag, errors=errors, target=store.location, free_bytes=free,
             needed_bytes_estimate=needed_bytes)


def record_resources(logs: Logs, tag: str, per_process: bool = False) -> None:
    """Open files, memory, threads and child processes of this process, on each of its ranks: growth across
    checkpoints is a leak."""
    import psutil

    me = psutil.Process()
    figures = {"open_fds": me.num_fds(), "rss_bytes": me.memory_info().rss, "threads": me.num_threads(),
               "children": len(me.children(recursive=True))}
    for log in logs.values():
        log.emit(Event.RANK_RESOURCES, tag=tag, **figures, **({"per_process": True} if per_process else {}))


def record_memory(logs: Logs, watch: MemoryWatch, process_start: float) -> None:
    """``rank.memory`` on each rank of the process, at the end of a phase: its RSS over time since the process
    started (the timeline the report draws, thinned) and the phase's peak, unthinned."""
    figures = {"process_start": process_start, "timeline": watch.timeline(process_start),
               "peak_rss_bytes": watch.peak_since(process_start), "resolution_s": watch.interval_s}
    for log in logs.values():
        log.emit(Event.RANK_MEMORY, **figures)


# -- restoring -----------------------------------------------------------------------------------------------------


def restore_tag(logs: Logs, store: Store, launch: LaunchConfig, requested: str | None,
                say: Callable[[str], None]) -> str:
    """The checkpoint to restore: the one asked for (``--tag``) or named by ``latest``, if its files match its
    manifest (``--check-files``); else, under ``--on-corrupt fallback``, the newest earlier one that does."""
    return _checked_tag(logs, store, launch, _wanted_tag(store, launch, requested, say), say)


def _wanted_tag(store: Store, launch: LaunchConfig, requested: str | None, say: Callable[[str], None]) -> str:
    """The checkpoint this attempt asked for (``--tag``), else the one ``latest`` names. ``latest`` is a pointer,
    not the only truth: without it, the newest committed checkpoint (a tag with its manifest) under
    ``--on-corrupt fallback``; else a refusal naming them."""
    from restartbench.integrity import committed_tags

    if requested is not None:
        committed = committed_tags(store)
        if requested not in committed:
            raise NoCheckpoint(f"--tag {requested} is not a committed checkpoint in {store.location} "
                               f"({_committed_here(committed)})")
        return requested
    if store.exists("latest"):
        return store.read_text("latest").strip()
    committed = committed_tags(store)
    if not committed:
        raise NoCheckpoint(f"no complete checkpoint in {store.location}: 'latest' is missing and no checkpoint has "
                           "its manifest (phase 1 never committed one); rerun phase 1 or point --checkpoint-dir "
                           "elsewhere")
    if launch.on_corrupt != "fallback":
        raise CorruptCheckpoint(f"'latest' is missing in {store.location}, but {_committed_here(committed)}; rerun "
                                "with --on-corrupt fallback to restore the newest that checks out")
    say(f"restore: 'latest' is missing; trying the newest committed checkpoint, {committed[0]}")
    return committed[0]


def _checked_tag(logs: Logs, store: Store, launch: LaunchConfig, tag: str, say: Callable[[str], None]) -> str:
    """``tag`` if its files match its manifest on every rank's share; else refuse, or fall back to the newest
    earlier committed checkpoint that checks out (``--on-corrupt fallback``)."""
    from restartbench.integrity import committed_tags, tag_step

    if not launch.check_files:
        return tag
    committed = committed_tags(store)
    damaged: list[str] = []
    for candidate in [tag] + [t for t in committed if tag_step(t) < tag_step(tag)]:
        say(f"restore: checking {candidate}'s files against its manifest")
        problems = check_files(logs, store, candidate)
        if not problems:
            if candidate != tag:
                for log in logs.values():
                    log.emit(Event.RESTORE_FALLBACK, wanted=tag, restored=candidate)
                say(f"restore: {tag} is damaged ({damaged[0]}); falling back to {candidate}")
            return candidate
        damaged += problems
        if launch.on_corrupt == "refuse":
            raise CorruptCheckpoint(f"checkpoint {candidate} in {store.location} fails its manifest check:\n  "
                                    + "\n  ".join(problems) + f"\n{_committed_here(committed)}; rerun with "
                                    "--on-corrupt fallback to restore the newest earlier checkpoint that checks out")
    raise CorruptCheckpoint(f"no committed checkpoint in {store.location} passes its manifest check "
                            f"({_committed_here(committed)})")


def check_files(logs: Logs, store: Store, tag: str) -> list[str]:
    """``tag``'s files against its manifest (``restore.check_files``), shared between the processes: a line per
    problem found by any of them (empty: every file checks out). A collective."""
    import torch.distributed as dist

    from restartbench.integrity import check_share

    with span_all(logs, Event.RESTORE_CHECK_FILES, tag=tag) as extra:
        try:
            mine = check_share(store, tag, dist.get_rank(), dist.get_world_size())
        except FileNotFoundError as missing:
            mine = [str(missing)]
        shares: list = [None] * dist.get_world_size()
        dist.all_gather_object(shares, mine)
        extra["problems"] = sorted({p for share in shares for p in share})
    return extra["problems"]


def _committed_here(committed: list[str]) -> str:
    return (f"the committed checkpoints here are {', '.join(committed)}" if committed
            else "no checkpoint here has a manifest")


def page_cache_before_load(logs: Logs, store: Store, tag: str, wanted: str) -> dict[str, Any]:
    """The checkpoint's page-cache state when the load begins, evicted first for a cold restore
    (``pagecache.before_restore``, a collective), as the ``restore.cache`` span on every rank of ``logs`` (the
    harness's own work, which a restart figure can then leave out); ``remote`` for an object store, where no page
    cache applies."""
    from restartbench import pagecache

    with span_all(logs, Event.RESTORE_CACHE, tag=tag) as extra:
        if store.remote:  # every byte comes over the network: no page cache to evict or measure
            extra.update(cache="remote", resident_fraction=None, cache_requested=wanted)
        else:
            extra.update(pagecache.before_restore(store.location, tag, wanted))
    return dict(extra)


def convert(log: EventLog, converter: Converter, load_dir: str, tag: str) -> str:
    """The engine's offline conversion of ``tag`` for another layout, run once by rank 0 while the others wait, as
    the ``restore.convert`` span on every rank with what it read and wrote; returns the tag to load. A collective."""
    import dataclasses

    import torch.distributed as dist

    with log.span(Event.RESTORE_CONVERT, tag=tag) as extra:
        outcome: list[Any] = [None]
        if dist.get_rank() == 0:
            try:
                outcome = [dataclasses.asdict(converter.convert(load_dir, tag))]
            except Exception as failure:  # noqa: BLE001 - every rank must learn of it
                outcome = [f"{type(failure).__name__}: {failure}"]
        dist.broadcast_object_list(outcome, src=0)
        if isinstance(outcome[0], str):
            raise ConversionFailed(f"the conversion of {tag} for another layout failed on rank 0: {outcome[0]}")
        converted = dict(outcome[0])
        extra.update(converted_tag=converted.pop("tag"), **converted)
    return extra["converted_tag"]


def timed_load(log: EventLog, tag: str, cache: dict[str, Any], load: Callable[[], tuple[list[FileRecord], Any]],
               engine_fields: Callable[[], dict[str, Any]] = dict, **fields: Any) -> Any:
    """Run ``load`` (the rank's load: the files it read, what it restored) as the ``restore.load`` span, with
    what was read: as the engine reports it (``bytes``, ``n_files``) and as the kernel counted the process's reads
    (``process_read_bytes``: every read DeepSpeed's universal load makes with torch.load too, outside the file hooks
    the engine reports through; not a prefetch's, made before the span), and what the engine adds
    (``engine_fields``: ``CheckpointEngine.load_fields``); returns what it restored."""
    before = process_read_bytes()
    with log.span(Event.RESTORE_LOAD, tag=tag, **fields, **cache) as extra:
        read, restored = load()
        after = process_read_bytes()
        extra.update(n_files=len(read), bytes=sum(r.bytes for r in read),
                     read_deserialize_s=sum(r.seconds for r in read),
                     process_read_bytes=None if before is None or after is None else after - before,
                     **engine_fields())
    return restored


def process_read_bytes() -> int | None:
    """Bytes this process has read through read system calls (``rchar`` of /proc/self/io: files, page cache hits
    included, and the sockets of any collective in between); None where the kernel does not say (not Linux)."""
    try:
        with open("/proc/self/io") as counters:
            return next(int(line.split()[1]) for line in counters if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return None


def record_result(log: EventLog, tag: str | None, problems: list[str], loss: float | None, verified: bool,
                  **fields: Any) -> None:
    """``restore.result``: exact when verified and nothing differs (None: not verified)."""
    log.emit(Event.RESTORE_RESULT, tag=tag, exact=not problems if verified else None, verified=verified,
             problems=problems, loss=loss, **fields)

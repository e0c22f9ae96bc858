"""The contract between the harness (``restartbench.train``) and a checkpoint engine, as code.

An engine is registered with an ``EngineInfo`` (the ``ENGINES`` of its folder, ``restartbench/engines/<folder>/``):
its name, its class, what it adds to the DeepSpeed JSON and the environment, and where its predictor and its
emulator are. Every engine registered in ``restartbench.engines`` is a ``CheckpointEngine``: the harness creates it
once per launch on every rank (``create_engine``, which refuses any other class), gives it the store
it writes to (``for_store``), lets it set up (``prepare``), then drives it through ``save`` →
``wait_until_durable`` → ``written`` while training and ``load`` → ``read`` → ``load_fields`` on restore. An engine
registered with a ``Prefetcher`` may start reading a relaunch's checkpoint before the model is built; what it
started reaches the engine through ``prepare``. After every
rank is durable the harness commits the checkpoint (writes ``latest`` through its store), so a
checkpoint is named ``latest`` only once all of its files are on disk.

Not to be confused with DeepSpeed's own checkpoint engines (``ds_engine.checkpoint_engine``: one
``save``/``load`` per file), which some of these engines wrap.

No torch here: the registry imports this module, and the launcher and ``--dry-run`` read it without torch.
"""

from __future__ import annotations

import abc
import importlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from restartbench.durability import fsync_files
from restartbench.storage import StorageError


class EngineOptions(Protocol):
    """What the registry reads of the run's engine options (``restartbench.config.EngineConfig``, which this package
    may not import: config imports the registry to gather the engine folders' options)."""

    engine: str


class ModuleSplit(Protocol):
    """How an engine's save shares a stage module's tensors out among the data-parallel replicas that hold them
    (``CostTraits.module_split``)."""

    def __call__(self, sizes: Sequence[int], ranks: Sequence[int]) -> list[int]:
        """For each tensor of the module (its bytes, in the state's order), the position in ``ranks`` (the replicas'
        global ranks, in data-parallel order) of the replica whose files hold it."""


@dataclass(frozen=True)
class CostTraits:
    """How an engine spends its save and load beyond its files: what the what-if model (``restartbench.whatif.terms``)
    gives it terms for. Its files themselves come from its predictor."""

    pageable_copy: bool = False
    """On cuda its save copies device tensors into pageable host memory (torch.save of CUDA tensors, DCP's sync save),
    at the pageable D2H rate; the others stage into a pinned buffer they reuse."""
    collective: bool = False
    """Its save is a collective: every rank of the group takes part at once (DCP's save plans and gathers), so a rank
    that arrives first waits for the last."""
    asynchronous: bool = False
    """Its durable write runs in the background while training goes on (slowdown: σ of that time)."""
    side_stream: bool = False
    """On cuda it copies device tensors into its pinned host buffer on a side stream beside training: its save blocks
    for its fixed host-side cost only, and the copy is slowdown."""
    pins_at_setup: bool = False
    """On cuda it pins a host buffer as large as the rank's checkpoint when it sets up (at the cluster's pinning
    rate), or on its prefetch's thread."""
    per_tensor: bool = False
    """Its save and load handle one item per tensor (DCP: a WriteItem and a ``torch.save`` entry each at a save, a
    ReadItem and a ``torch.load`` each at a load), so its lines have a cost per tensor; the others' per-item costs
    are per file: DeepSpeed's engines write a file per layer, whose tensors go through one ``torch.save``; the lazy
    engine writes each rank's tensors as one stream. (On this study's CPU calibration a tensor term improves none of
    the torch and lazy lines left out in turn but torch's emulated load, whose tensors follow its layer files.)"""
    every_replica: bool = False
    """Every data-parallel replica writes (and reads back) its own copy of the stage module (torchsnapshot: each rank
    takes its own snapshot of its whole state); else, without a ``module_split``, replica 0 writes it."""
    module_split: str | None = None
    """``module:attribute`` of its ``ModuleSplit``, where the save spreads the stage module over the replicas (DCP's
    deduplication); each rank then reads at a load the module tensors its replicas wrote too."""

    def __post_init__(self) -> None:
        if self.every_replica and self.module_split is not None:
            raise ValueError("CostTraits: a stage module is written either by every replica or split among them")


@dataclass(frozen=True)
class EngineInfo:
    name: str
    module: str
    """Module that defines the engine class (imported only on the ranks)."""
    cls: str
    summary: str
    ds_config: Callable[[Any], dict[str, Any]] = lambda options: {}
    """Top-level sections this engine adds to the DeepSpeed JSON, built from the engine options (the run's
    ``EngineConfig``)."""
    launch_env: Callable[[str], dict[str, str]] = lambda device: {}
    """Device ("cpu", "cuda") -> environment variables the engine needs in every rank (exported by the launch
    script)."""
    requires: tuple[tuple[str, str], ...] = ()
    """(importable module, how to install it) pairs the engine cannot run without."""
    system_check: Callable[[], list[str]] = lambda: []
    """Problems with non-Python components the engine needs (system libraries), each with how to fix it."""
    skip_when_missing: bool = False
    """A missing requirement marks the run skipped (the engine is optional to the study), not failed."""
    known_issues: dict[str, str] = field(default_factory=dict)
    """Device ("cpu", "cuda") -> how the engine as shipped is known to fail there. The run still goes
    ahead (the study measures engines as they are, failures included); the note is printed and kept
    in metadata.json so that a failure is read with its known cause."""
    object_store: bool = False
    """The engine can checkpoint to an object-store location (s3://, gs://): its class overrides
    ``CheckpointEngine.for_store``; ``none`` writes nothing, so any location will do."""
    predictor: str | None = None
    """``module:attribute`` of the engine's ``restartbench.sizes.EnginePredictor`` (how ``restartbench.plan``
    predicts its files), or None with ``not_predicted`` saying why."""
    not_predicted: str = ""
    emulator: str | None = None
    """``module:Class`` of the engine's ``restartbench.emulator.Emulator`` (how ``--emulate`` goes through it), or
    None with ``not_emulated`` saying why."""
    not_emulated: str = ""
    converter: str | None = None
    """``module:attribute`` of the engine's offline conversion (a ``Converter``): how a restart on another parallel
    layout (``--restore-layout``) makes the checkpoint loadable there before the load, as DeepSpeed's universal
    checkpoints do. None where ``reshards_at_load``, or ``not_resharded`` says why not."""
    reshards_at_load: bool = False
    """The engine's ``load`` itself restores a checkpoint written on another layout, each new rank reading what it
    needs, with no offline pass."""
    not_resharded: str = ""
    """Why a restart of this engine's checkpoints on another layout is skipped (recorded with the attempt)."""
    saves_state: bool = True
    """False only for ``none``: the harness then never calls ``save`` or ``load``, and its relaunch chooses no
    checkpoint."""
    prefetcher: str | None = None
    """``module:attribute`` of the engine's ``Prefetcher``: how, on a relaunch in the layout that saved, it starts
    reading the checkpoint as soon as the checkpoint is chosen, while the model is built and DeepSpeed initializes;
    None where the engine reads only in ``load``."""
    cost: CostTraits = CostTraits()
    """How its save and load spend their time beyond its files (the what-if model's terms for it)."""
    options: tuple[str, ...] = ()
    """The engine options it reads: fields of its folder's ``options.py`` (``--lazy-chunk-mb``'s ``lazy_chunk_mb``).
    Another engine's option set away from its default is refused before a launch (``engines.ignored_options``): the
    run would ignore it while its config.json said it was set."""

    def __post_init__(self) -> None:
        for ref, reason, why in (("predictor", "not_predicted", self.not_predicted),
                                 ("emulator", "not_emulated", self.not_emulated)):
            if (getattr(self, ref) is None) == (not why):
                raise ValueError(f"engine {self.name!r}: give either a {ref} or, in {reason}, the reason it has "
                                 "none (not both, not neither)")
        if [self.converter is not None, self.reshards_at_load, bool(self.not_resharded)].count(True) != 1:
            raise ValueError(f"engine {self.name!r}: say how it restarts on another layout: a converter, "
                             "reshards_at_load, or in not_resharded the reason it cannot (exactly one)")

    @property
    def reshards(self) -> bool:
        """A restart on another layout is measured (by conversion, or at load); else skipped (``not_resharded``)."""
        return not self.not_resharded


@dataclass(frozen=True)
class Conversion:
    """What an offline conversion did: the tag to load on the new layout, and what it read and wrote."""

    tag: str
    files_read: int
    bytes_read: int
    files_written: int
    bytes_written: int
    command: list[str]
    """The converter's command line, as it ran."""


class Converter(Protocol):
    """An engine's offline conversion for a restart on another layout (``EngineInfo.converter``)."""

    ds_config: dict[str, Any]
    """Sections the DeepSpeed JSON of the new layout gains (such as ``{"checkpoint": {"load_universal": true}}``)."""

    def convert(self, load_dir: str, tag: str) -> Conversion:
        """Convert ``<load_dir>/<tag>`` for any layout; one process runs it, while the others wait."""


@dataclass(frozen=True)
class RankPlace:
    """A rank's place in the parallel layout, known before the model exists (``restartbench.model.rank_coordinates``:
    the topology the pipeline module is built with): what a ``Prefetcher`` needs to name the rank's files."""

    pp: int
    tp: int
    dp: int
    dp_size: int
    device: str
    """"cpu", or "cuda:N" for the rank's GPU."""


class Prefetcher(Protocol):
    """An engine's early read on a relaunch (``EngineInfo.prefetcher``). The harness chooses the checkpoint and evicts
    it from the page cache right after the process group is up, when ``enabled`` says so, then calls ``start``; what
    it returns goes to the engine's ``prepare`` (``prefetched``), and ``load`` takes what was read from it. The reads
    run in the background: the restart's parts then show the load as the wait for them and what is left to do."""

    def enabled(self, options: Any) -> bool:
        """Whether the run's engine options (``restartbench.config.EngineConfig``) ask for the early read."""

    def start(self, options: Any, folder: str, tag: str, place: RankPlace) -> Any:
        """Start reading this rank's files of ``<folder>/<tag>`` in the background and return at once; the returned
        object's ``fields()`` is recorded with the ``restore.prefetch`` span."""


def load(ref: str) -> Any:
    """The attribute named by ``module:attribute`` (a registry entry's predictor or emulator), imported."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass
class FileRecord:
    path: str
    bytes: int
    seconds: float
    """Time inside the engine's save (serialize + write) or load (read + deserialize) of this file."""


def records_as_dicts(records: list[FileRecord], root: str) -> list[dict[str, Any]]:
    """File records with paths relative to the checkpoint root (as the run folder stores them)."""
    return [{**asdict(r), "path": os.path.relpath(r.path, root)} for r in records]


def guard_optimizer_step(ds_engine: Any, owner: object, before_step: Callable[[], None]) -> None:
    """Wrap ``ds_engine``'s optimizer step (an instance attribute, once per ``owner``) so that it first calls
    ``before_step``: an asynchronous engine's copies must be done before the step, the first thing after a save that
    modifies what is being copied (the lazy engine, and the DataStates engine's commit)."""
    optimizer = ds_engine.optimizer
    if optimizer is None or getattr(optimizer.step, "_step_guard", None) is owner:
        return
    original = optimizer.step

    def guarded_step(*args: Any, **kwargs: Any) -> Any:
        before_step()
        return original(*args, **kwargs)

    guarded_step._step_guard = owner  # type: ignore[attr-defined]
    optimizer.step = guarded_step


def durable_now(records: list[Any]) -> float:
    """fsync the files of these records (anything with a ``path``) and their folders; return the
    ``time.perf_counter()`` at which they were durable (what ``wait_until_durable`` returns)."""
    fsync_files([record.path for record in records])
    return time.perf_counter()


class CheckpointEngine(abc.ABC):
    """One rank's checkpoint engine; subclasses are constructed with the run's ``EngineConfig``."""

    asynchronous: bool = False
    """False: the harness waits for durability right after ``save``. True: only before the next save or at
    the end of training, so that the background write overlaps training as it would in a real job."""

    workarounds: Sequence[str] = ()
    """What the harness changed for the engine's last save, read after each ``save`` and recorded with it
    as ``checkpoint.workaround`` events (empty: nothing)."""

    on_copy_wait: Callable[[str, float, float], None] | None = None
    """Set by the harness before the first save. An engine whose ``save`` returns before its copies of the
    state are taken, and which therefore makes training wait later (at the optimizer step), calls it
    ``(tag, seconds, at)`` after each such wait (``at``: the wall time the wait began; a wait timed on the GPU is
    reported later): the harness records it as ``checkpoint.copy_wait`` and counts it in the stall. Other engines
    never call it."""

    @abc.abstractmethod
    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        """Checkpoint the rank's training state as ``<save_dir>/<tag>``; return when training may continue
        (the time in here is the *stall*). Not ``latest``: the harness commits."""

    @abc.abstractmethod
    def wait_until_durable(self) -> float:
        """Block until this rank's bytes of the last save are on stable storage (fsync'd, or uploaded); return
        the ``time.perf_counter()`` at which they were. Raises what went wrong in the save's background work."""

    def background_done(self) -> bool | None:
        """Whether the last save's background work (copies, writes) has ended, asked without waiting: phase 1 runs
        iterations after its last save until it has on every rank. A synchronous engine's ``save`` leaves none (True);
        an asynchronous engine that cannot tell without waiting answers None, and the harness then waits for it."""
        return None if self.asynchronous else True

    @abc.abstractmethod
    def written(self) -> list[FileRecord]:
        """The files this rank wrote for the last save, with their sizes (final once durable)."""

    @abc.abstractmethod
    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        """Restore model, optimizer and scheduler state of ``<load_dir>/<tag>`` into ``ds_engine``."""

    @abc.abstractmethod
    def read(self) -> list[FileRecord]:
        """The files this rank read in the last ``load``, with the bytes it read from each."""

    def prepare(self, ds_engine: Any, prefetched: Any = None) -> dict[str, Any]:
        """Called once per launch right after the engine is created (inside the ``startup.engine`` span, a restart
        part): set-up that would otherwise land in the first save's stall, such as a pinned host buffer. Returns
        what it set up, recorded with that span. ``prefetched``: what this engine's ``Prefetcher`` started on this
        relaunch (None: nothing was), for the ``load`` to come."""
        return {}

    def load_fields(self) -> dict[str, Any]:
        """What the last ``load`` adds to its ``restore.load`` record, such as how much of its read ran before it
        (a prefetch); none by default."""
        return {}

    def close(self) -> None:
        """At the end of a phase, its last save durable: stop what the engine keeps running (a thread pool), so that
        the process ends without the interpreter's teardown (``launchers.end_process``); nothing by default."""
        return None

    def pinned_host_bytes(self) -> int | None:
        """Bytes of page-locked (pinned) host memory this engine holds now, such as a host buffer it pinned for its
        copies; None when the engine does not say. The harness records it as ``pinned_bytes`` with the
        ``startup.engine`` span (after ``prepare``) and with each ``checkpoint.save``."""
        return None

    def for_store(self, store: Any) -> CheckpointEngine:
        """The engine that checkpoints to the object store ``store`` (``restartbench.storage``). Overridden by the
        engines registered with ``object_store=True``; this default refuses, naming those engines."""
        from restartbench.engines import object_store_engines  # the registry imports this module

        raise StorageError(f"engine {type(self).__name__} cannot write to {store.location}; use --engine "
                           f"{', '.join(object_store_engines())}")

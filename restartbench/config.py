"""The run configuration: one typed tree, saved as ``config.json`` in every run folder.

Each leaf field carries its documentation in ``metadata["doc"]`` and the values it accepts (``Allowed``: a
numeric range, a pattern); the command line of ``config-n-run.py`` is generated from the tree
(``--save-interval`` sets ``train.save_interval``), so a field added here is an option there, with its help.
Every value is checked here, once, whether it comes from the command line, a sweep file or a ``config.json``:
the message names the option and what it accepts.

The fields are made with ``restartbench.config_fields.opt``. An engine's own options are not declared here but in
its folder (``restartbench/engines/<folder>/options.py``): ``EngineConfig`` is made of them, in the registry's
order, so an engine brings its options with its folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restartbench.config_fields import AT_LEAST_0, AT_LEAST_1, Allowed, flag, opt
from restartbench.engines import engine_names, engine_options  # the registry: see pyproject's [tool.importlinter]


@dataclass
class ModelConfig:
    preset: str = opt("tiny", "Model preset: tiny, small (CPU shapes) or 1B, 3B, 7B, 13B, 33B, 70B.", positional=True)
    dtype: str = opt(
        "bf16",
        "Training precision. bf16 is the study's setting; fp32 is much faster on CPUs without bf16 units.",
        choices=("bf16", "fp32"),
    )
    seq_len: int | None = opt(None, "Sequence length; default: the preset's.", allowed=AT_LEAST_1)
    activation_checkpoint_interval: int = opt(
        0, "Recompute activations every N decoder layers (0 = off); needed for the big presets.", allowed=AT_LEAST_0
    )


@dataclass
class LayoutConfig:
    layout: str = opt(
        "tp2pp2", "Parallel layout such as tp2pp4, tp2pp4dp2, dp4; dp is inferred from --nproc-per-node x --nnodes.",
        positional=True,
    )
    nproc_per_node: int | None = opt(None, "Ranks per node; default: the layout's tp·pp·dp on one node.",
                                     allowed=AT_LEAST_1)
    nnodes: int = opt(1, "Number of nodes.", allowed=AT_LEAST_1)


@dataclass
class TrainConfig:
    iters: int = opt(4, "Iterations of phase 1 (train and checkpoint) before the restart.", allowed=AT_LEAST_1)
    save_interval: int = opt(2, "Checkpoint every N iterations (and always after the last one).", allowed=AT_LEAST_1)
    clean_iters: int = opt(2, "Iterations phase 1 runs after iteration K+1 once its last save's background work "
                           "(copies, writes) has ended on every rank: the last save's slowdown is then measured as the "
                           "others' are, against clean iterations.", allowed=AT_LEAST_0)
    micro_batch: int = opt(1, "Micro-batch size per rank.", allowed=AT_LEAST_1)
    grad_accum: int | None = opt(None, "Micro-batches per iteration; default: pp (each pipeline stage busy).",
                                 allowed=AT_LEAST_1)
    seed: int = opt(1234, "Seed of the weights and of the synthetic token stream.", allowed=AT_LEAST_0)
    lr: float = opt(1e-3, "Peak learning rate of AdamW (reached after a 2-iteration warm-up).", allowed=AT_LEAST_0)


@dataclass
class EngineChoice:
    engine: str = opt("torch", f"Checkpoint engine: {', '.join(engine_names())}.")


def engine_config_class(options: dict[str, type]) -> type:
    """The ``EngineConfig`` dataclass: ``EngineChoice``'s field, then each engine folder's options (``options``:
    folder -> its options dataclass, in the registry's order), as one flat section. It inherits them all, so an
    engine's options are read as ``cfg.engine.<option>``. Two declarations of one name are refused, naming both:
    the section and the command line have one namespace."""
    declared = {leaf.name: "restartbench/config.py (EngineChoice)" for leaf in dataclasses.fields(EngineChoice)}
    for folder, owner in options.items():
        for leaf in dataclasses.fields(owner):
            where = f"restartbench/engines/{folder}/options.py ({owner.__name__})"
            if leaf.name in declared:
                raise TypeError(f"the engine option {leaf.name!r} is declared twice, in {declared[leaf.name]} and in "
                                f"{where}: rename one of them")
            declared[leaf.name] = where
    bases = (*reversed(options.values()), EngineChoice)  # a dataclass's fields come in reverse MRO order
    namespace = {"__module__": __name__, "__doc__": "The checkpoint engine and every engine's options."}
    return dataclass(type("EngineConfig", bases, namespace))


EngineConfig = engine_config_class(engine_options())


@dataclass
class StorageConfig:
    checkpoint_dir: str | None = opt(
        None, "Where checkpoints are written: a folder (local disk, parallel file system, /dev/shm) or "
        "s3://BUCKET/PREFIX (credentials from the AWS variables or profile, never an option) or gs://BUCKET/PREFIX "
        "(through fsspec's gcsfs; credentials from Google's default chain); default: <run folder>/checkpoints.")
    object_client: str | None = opt(
        None, "The client s3:// checkpoints go through: s3torchconnector (AWS's CRT client; DCP's S3StorageWriter) "
        "or fsspec (s3fs; DCP's FsspecWriter), the route seed 002 compares a connector with; default: "
        "s3torchconnector. gs:// always goes through fsspec.", choices=("s3torchconnector", "fsspec"))
    s3_endpoint: str | None = opt(
        None, "S3 endpoint URL (MinIO, SeaweedFS, Ceph...); default: AWS_ENDPOINT_URL, else AWS.")
    s3_region: str | None = opt(None, "S3 region; default: AWS_REGION, else us-east-1.")
    s3_path_style: bool | None = opt(
        None, "S3 path-style addressing (bucket in the path, not the host name); default: on with a custom endpoint.")
    gcs_endpoint: str | None = opt(
        None, "GCS endpoint URL (an emulator, a private endpoint); default: STORAGE_EMULATOR_HOST, else Google.")
    reuse_checkpoint_dir: bool = opt(
        False, "Write into a --checkpoint-dir that already holds another run's committed checkpoints (refused "
        "otherwise): the new run's tags and 'latest' replace those of the same names, the others stay.")
    keep_checkpoints: int = opt(
        0, "Keep only this many committed checkpoints, the newest: once a checkpoint commits, rank 0 removes the older "
        "committed ones (manifest first, each recorded as a checkpoint.removed event), so a disk holds this many plus "
        "the one being written; 0 = keep every checkpoint.", allowed=AT_LEAST_0)
    baseline_mib: int = opt(
        64, "Before phase 1, measure the checkpoint folder's raw write (with fsync) and read bandwidth with fio "
        "on a file of this many MiB, into baseline.json; 0 = skip. Skipped with a note when fio is not installed.",
        allowed=AT_LEAST_0)


@dataclass
class PathsConfig:
    logs: str = opt("logs", "Root of the run folders: <logs>/<preset>/<layout>/<engine>/<timestamp>/.",
                    allowed=Allowed(pattern=r".*\S.*", says="a folder, not empty"))
    run_dir: str | None = opt(None, "This run's folder; default: made under --logs.")


@dataclass
class LaunchConfig:
    launcher: str = opt(
        "auto", "local, slurm or pbs; auto: the batch system whose allocation this runs in, else local.",
        choices=("auto", "local", "slurm", "pbs"),
    )
    submit: bool = opt(False, "slurm/pbs: submit the rendered job script (sbatch/qsub) and print the job id.")
    gpus_per_node: int | None = opt(
        None, "GPUs per node of the cluster (default 8 for cuda); checked against the layout.", allowed=AT_LEAST_1)
    account: str | None = opt(None, "slurm/pbs: account (project) to charge.")
    partition: str | None = opt(None, "slurm partition or pbs queue.")
    walltime: str = opt("01:00:00", "slurm/pbs: wall-clock limit of the job, HH:MM:SS.",
                        allowed=Allowed(pattern=r"\d+:[0-5]\d:[0-5]\d",
                                        says="HH:MM:SS, such as 02:30:00 (hours may pass 24)"))
    setup: str | None = opt(
        None, "slurm/pbs: shell lines run at the start of the job (modules, env), separated by ';'.")
    device: str = opt(
        "auto", "cpu (gloo), cuda (NCCL), or auto: cuda when a GPU is visible.", choices=("auto", "cpu", "cuda"))
    master_port: int = opt(0, "Rendezvous port; 0 = a free port on one node, 29500 across nodes.",
                           allowed=Allowed(low=0, high=65535))
    verify: bool = opt(True, "Prove the restore: checksums at save vs load, resumed loss vs uninterrupted loss.")
    consolidated_digest: bool = opt(
        False, "With --verify, record at each save the digest of the consolidated state (every parameter's fp32 "
        "weights and Adam moments at full shape, by name; gathered over the ranks, so it costs collectives): the "
        "proof of a restart on another layout (./submit-job.sh --restore RUN --restore-layout LAYOUT).")
    restore_layout: str | None = opt(
        None, "Run the restore phase on this layout instead of the run's own (such as pp2dp2 or dp4; the global "
        "batch is kept): DeepSpeed's universal checkpoint for torch, a reshard at load for lazy, a skipped restart "
        "with the reason for engines that cannot. Turns on --consolidated-digest, the proof.")
    memory_check: bool = opt(True, "Refuse to launch when the estimated memory per rank exceeds what the machine has.")
    phase_timeout_s: int = opt(3600, "Give up on a phase (and mark the run failed) after this many seconds.",
                               allowed=AT_LEAST_1)
    collective_timeout_s: int = opt(
        600, "Fail a rank whose distributed init or collective waits longer than this (a dead or missing peer).",
        allowed=AT_LEAST_1,
    )
    check_files: bool = opt(
        True,
        "Before a restore, check every file against the checkpoint's manifest (size, SHA-256); not timed as restart.",
    )
    on_corrupt: str = opt(
        "refuse", "A checkpoint that fails its manifest check: refuse to restore, or fall back to the newest good one.",
        choices=("refuse", "fallback"),
    )
    restore_cache: str = opt(
        "cold", "Page cache of the checkpoint before a restore: cold (evicted on every node, then measured) or warm "
        "(as left). Every restore figure says which it measured.", choices=("cold", "warm"),
    )
    disk_check: bool = opt(True, "Refuse to launch when the checkpoint folder lacks room for every planned checkpoint.")
    dry_run: bool = opt(False, "Print the rendered DeepSpeed JSON and launch script, and launch nothing.")


@dataclass
class EmulationConfig:
    emulate: bool = opt(
        False, "Emulate the checkpoint I/O of the preset and layout without training: gloo processes on CPU write, "
        "fsync, commit and restore every rank's files through the engine's own code (engines torch, lazy, dcp, "
        "dcp-async; the predicted files, random data; restartbench/emulate.py).",
    )
    emulate_scale: float = opt(
        1.0, "--emulate: multiply the model's hidden, ffn and vocabulary widths by this (0 < s <= 1; layers, heads "
        "and files unchanged, bytes about s² times), so a wide layout fits a small machine.",
        allowed=Allowed(low=0, low_open=True, high=1),
    )
    ranks_per_process: int = opt(1, "--emulate: ranks each process emulates, one after another (world size / K "
                                    "processes).", allowed=AT_LEAST_1)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a (possibly partial) nested dict; unknown keys are an error naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"a run configuration is a JSON object of sections, got {type(data).__name__}")
        sections = {}
        for section in dataclasses.fields(cls):
            values = data.get(section.name, {})
            if not isinstance(values, dict):
                raise ValueError(f"config section {section.name!r} must be an object of its options, got {values!r} "
                                 f"({type(values).__name__})")
            known = {f.name: f for f in dataclasses.fields(section.default_factory)}
            unknown = set(values) - set(known)
            if unknown:
                raise ValueError(f"unknown key(s) in config section {section.name!r}: {sorted(unknown)}")
            for name, value in values.items():
                check_type(section.name, known[name], value)
                check_allowed(known[name], value)
            sections[section.name] = section.default_factory(**values)
        unknown_sections = set(data) - set(sections)
        if unknown_sections:
            raise ValueError(f"unknown config section(s): {sorted(unknown_sections)}")
        return cls(**sections)

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        """A config.json; one that is not valid JSON or not a run configuration is refused naming the file. A run
        folder's config names the folder relatively (``paths.run_dir`` "."): it is made absolute where the file is
        now, so a moved folder's configuration names its new place."""
        try:
            cfg = cls.from_dict(json.loads(Path(path).read_text()))
        except ValueError as error:  # json.JSONDecodeError included
            raise ValueError(f"{path}: {error}") from None
        if cfg.paths.run_dir and not Path(cfg.paths.run_dir).is_absolute():
            cfg.paths.run_dir = str((Path(path).parent / cfg.paths.run_dir).resolve())
        return cfg


# --- command line, generated from the tree ----------------------------------------------


def leaf_fields():
    """(section name, field) for every leaf of RunConfig, in declaration order."""
    for section in dataclasses.fields(RunConfig):
        for leaf in dataclasses.fields(section.default_factory):
            yield section.name, leaf


def allowed_types(section: str, leaf: dataclasses.Field) -> tuple[type, ...]:
    """The Python types a field accepts (None for optional fields; an int where a float is asked)."""
    owner = next(f.default_factory for f in dataclasses.fields(RunConfig) if f.name == section)
    hint = _type_hints(owner)[leaf.name]
    types = typing.get_args(hint) or (hint,)
    return types + ((int,) if float in types else ())


def check_type(section: str, leaf: dataclasses.Field, value: Any) -> None:
    """Raise ValueError naming the field, the expected type and the value when they do not fit."""
    types = allowed_types(section, leaf)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ValueError(f"{section}.{leaf.name} ({leaf.name!r}) must be {names}, "
                         f"got {value!r} ({type(value).__name__})")


def check_allowed(leaf: dataclasses.Field, value: Any) -> None:
    """Raise ValueError naming the option, what it accepts and the value, when the value is out of its range."""
    allowed = leaf.metadata.get("allowed")
    if allowed is not None and not allowed.accepts(value):
        finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
        raise ValueError(f"{flag(leaf.name)} must be {finite}{allowed.describe()} (got {value!r})")


@functools.cache
def _type_hints(owner: type) -> dict[str, Any]:
    """A config section's resolved annotations: resolving them is slow, and the analysis reads thousands of
    run folders' config.json."""
    return typing.get_type_hints(owner)


def _leaf_type(leaf: dataclasses.Field, owner: type) -> type:
    hint = _type_hints(owner)[leaf.name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def build_parser(prog: str = "config-n-run.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Render the DeepSpeed config and launch script for a checkpoint/restart study run, then run it: "
        "train and checkpoint, end the job, relaunch, restore, resume, measuring every phase on every rank.",
    )
    for section_name, leaf in leaf_fields():
        owner = next(f.default_factory for f in dataclasses.fields(RunConfig) if f.name == section_name)
        kind = _leaf_type(leaf, owner)
        meta = leaf.metadata
        dest = f"{section_name}.{leaf.name}"
        if meta["positional"]:
            parser.add_argument(dest, metavar=leaf.name.upper(), nargs="?", default=leaf.default,
                                help=f"{meta['doc']} (default: {leaf.default})")
        elif kind is bool:
            parser.add_argument(flag(leaf.name), dest=dest, default=leaf.default,
                                action=argparse.BooleanOptionalAction, help=meta["doc"])
        else:
            parser.add_argument(flag(leaf.name), dest=dest, type=kind, default=leaf.default,
                                choices=meta["choices"], metavar=None if meta["choices"] else kind.__name__.upper(),
                                help=f"{meta['doc']} (default: {leaf.default})")
    return parser


def config_from_args(argv: list[str] | None = None) -> RunConfig:
    """The run configuration from the command line."""
    parser = build_parser()
    return config_from_parsed(parser, vars(parser.parse_args(argv)))


def config_from_parsed(parser: argparse.ArgumentParser, args: dict[str, Any]) -> RunConfig:
    """The run configuration from ``build_parser``'s options as parsed (``section.name`` -> value); a value out of
    range ends the program as argparse does (the usage, the message, exit code 2)."""
    nested: dict[str, dict[str, Any]] = {}
    for dest, value in args.items():
        section, name = dest.split(".")
        nested.setdefault(section, {})[name] = value
    try:
        return RunConfig.from_dict(nested)
    except ValueError as error:
        parser.error(str(error))

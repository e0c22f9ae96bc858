"""Checkpoint I/O of a big preset and layout, emulated on CPU processes: no model, no training, the same files.

    python config-n-run.py 70B tp8pp8 --emulate --emulate-scale 0.016 --ranks-per-process 32 --dtype bf16

What is real and what is emulated (also written into the run's ``metadata.json`` under ``emulation``):

- real: the files. Every emulated rank writes exactly the files DeepSpeed's default engine writes for its rank —
  DeepSpeed's names, the same state dicts with tensors of the same shapes, dtypes and storage layout (from
  ``restartbench.plan``, which the tests hold to real runs byte for byte), holding random data — with ``torch.save``
  (what DeepSpeed's TorchCheckpointEngine calls), then fsyncs them; the harness's manifest and atomic ``latest``;
  a cold (evicted) page cache before the restore; ``torch.load`` of the files; the restored tensors compared with
  what was saved; the event records (same schema as ``restartbench.train``), so the analysis reads the run folder
  like any other.
- emulated: there is no model, optimizer or training step (no ``train.iteration``, so no iteration time and no
  restart total); the state is built from random numbers just before each rank's save, outside the timed span, as
  training would have left it in memory. A rank restores the files DeepSpeed needs for it (its stage's layer files
  and model file, written by data-parallel rank 0, and its own optimizer file), each read once; DeepSpeed 0.19.8's
  own load reads more (each layer and model file twice, and re-partitions ZeRO state), and copies into the model.
- ``--ranks-per-process K``: each process emulates K ranks one after another (world size / K processes), so the
  per-rank save and load times are each rank's own but K ranks never write at the same time: the aggregate
  bandwidth is that of world size / K writers.
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

#: The engine an emulated run is listed under (metadata.json, run folder), so that no table mixes it with real runs.
ENGINE_LABEL = "torch-emulated"
WHAT_IS_EMULATED = __doc__.split("What is real and what is emulated", 1)[1].split(":", 1)[1].strip()


# --- launching: a run folder like any other --------------------------------------------------


def run_emulation(cfg: RunConfig) -> int:
    """Plan, write the run folder and run both phases (train: save; restore: a fresh launch that loads)."""
    from restartbench import study

    plan = plan_emulation(cfg)
    rendered = render(cfg, plan)
    if cfg.launch.dry_run:
        print(f"# run folder (not created): {plan.run_dir}")
        print(f"# emulation: {plan.world_size} ranks in {plan.nproc_per_node * plan.nnodes} processes; "
              f"one checkpoint {plan.checkpoint_bytes_estimate / 2**30:.3f} GiB")
        print(rendered.launch_script, end="")
        if rendered.job_script:
            print(f"# --- {study.LAUNCHERS[plan.launcher].job_file} ---\n{rendered.job_script}", end="")
        return 0
    launcher = study.LAUNCHERS[plan.launcher]
    missing = launcher.missing_submit_command(cfg.launch.submit)
    if missing:
        raise study.StudyError(missing)
    run_dir = study._prepare_run_dir(cfg, plan, rendered)
    meta = study._metadata(cfg, plan) | {"engine": ENGINE_LABEL, "emulation": emulation_metadata(cfg, plan)}
    study._write_json(run_dir / "metadata.json", meta)
    say(f"run folder {run_dir} (emulated checkpoint I/O, no training)")
    if launcher.job_template and not launcher.inside_allocation():  # a Slurm/PBS job runs the phases
        return study._hand_to_batch_system(cfg, launcher, run_dir, rendered, meta)
    return study.execute(run_dir)


def plan_emulation(cfg: RunConfig):
    """study.plan_run for gloo processes on CPU: K ranks per process, memory checked against the emulated shards."""
    from restartbench import study
    from restartbench.plan import predict

    options = cfg.emulation
    if options.ranks_per_process < 1:
        raise study.StudyError(f"--ranks-per-process must be at least 1 (got {options.ranks_per_process})")
    if not 0 < options.emulate_scale <= 1:
        raise study.StudyError(f"--emulate-scale must be in (0, 1] (got {options.emulate_scale})")
    if cfg.engine.engine != "torch":
        raise study.StudyError(f"--emulate writes DeepSpeed's default engine's files; use --engine torch "
                               f"(got {cfg.engine.engine})")
    cfg.launch.device = "cpu"  # whatever the preset: these are gloo processes on CPUs
    probe = RunConfig.from_dict(cfg.to_dict())
    probe.launch.memory_check, probe.layout.nproc_per_node, probe.layout.nnodes = False, None, 1
    if not probe.paths.run_dir:  # <logs>/<preset>/<layout>/torch-emulated/<time>: apart from real torch runs
        labelled = RunConfig.from_dict(probe.to_dict())
        labelled.engine.engine = ENGINE_LABEL
        probe.paths.run_dir = str(study._new_run_dir(labelled, _layout_name(probe)))
    plan = study.plan_run(probe)
    if plan.remote:
        raise study.StudyError("--emulate writes its files to a local folder; give --checkpoint-dir a path, not an "
                               "s3:// or gs:// location")
    processes = _processes(plan.world_size, options.ranks_per_process, cfg.layout.nnodes)
    plan.nnodes, plan.nproc_per_node = cfg.layout.nnodes, processes // cfg.layout.nnodes
    if plan.nnodes > 1 and not cfg.launch.master_port:  # the probe planned one node, on a port free here only
        plan.master_port = 29500  # --master-port's documented default across nodes
    if not cfg.launch.dry_run and cfg.launch.memory_check:
        shards = predict(probe, scale=options.emulate_scale).per_rank_bytes()
        need = 2 * max(shards.values()) * options.ranks_per_process  # the state, and its copy read back on restore
        have, what = study._memory_per_rank_available(plan)
        if need > have:
            raise study.StudyError(f"emulating {options.ranks_per_process} rank(s) per process needs about "
                                   f"{need / 2**30:.2f} GiB per process, but {what} gives {have / 2**30:.2f} GiB; "
                                   "lower --emulate-scale or --ranks-per-process, or add --no-memory-check")
    return plan


def _layout_name(cfg: RunConfig) -> str:
    from restartbench import study
    from restartbench.layout import LayoutError, validate_layout
    from restartbench.presets import UnknownPresetError, get_preset

    try:
        return validate_layout(cfg.layout.layout, get_preset(cfg.model.preset)).name
    except (LayoutError, UnknownPresetError) as error:
        raise study.StudyError(str(error)) from None


def _processes(world_size: int, per_process: int, nnodes: int) -> int:
    from restartbench.study import StudyError

    if world_size % per_process or (world_size // per_process) % nnodes:
        raise StudyError(f"{world_size} ranks do not split into processes of --ranks-per-process {per_process} "
                         f"over {nnodes} node(s); choose K dividing {world_size} with world size / K a multiple of "
                         "--nnodes")
    return world_size // per_process


def render(cfg: RunConfig, plan: Any):
    """The study's launch script, running this module instead of restartbench.train in every process."""
    from restartbench import study

    rendered = study.render(cfg, plan)
    entry = "-m restartbench.train "
    if rendered.launch_script.count(entry) != 1:
        raise study.StudyError("templates/launch.sh.j2 no longer launches '-m restartbench.train' once; "
                               "update restartbench/emulate.py's render")
    rendered.launch_script = rendered.launch_script.replace(entry, "-m restartbench.emulate ")
    return rendered


def emulation_metadata(cfg: RunConfig, plan: Any) -> dict[str, Any]:
    from restartbench.plan import checkpoint_bytes, scaled_preset
    from restartbench.presets import get_preset

    options = cfg.emulation
    full = RunConfig.from_dict(cfg.to_dict())
    full.emulation.emulate = False
    preset = scaled_preset(get_preset(cfg.model.preset), options.emulate_scale, plan.layout["tp"])
    return {"emulated": True, "what": WHAT_IS_EMULATED, "scale": options.emulate_scale,
            "ranks_per_process": options.ranks_per_process, "processes": plan.nnodes * plan.nproc_per_node,
            "emulated_model": {k: getattr(preset, k) for k in ("hidden", "ffn_hidden", "vocab_size", "layers",
                                                                "heads", "kv_heads")},
            "checkpoint_bytes": plan.checkpoint_bytes_estimate,
            "full_scale_checkpoint_bytes": checkpoint_bytes(full)}


# --- in every process --------------------------------------------------------------------------


class EmulatedRanks:
    """The ranks one process emulates, their event logs, and the checkpoint's files."""

    def __init__(self, run_dir: Path, phase: str):
        self.run_dir, self.phase = run_dir, phase
        self.cfg = RunConfig.load(run_dir / "config.json")
        self.plan = json.loads((run_dir / "plan.json").read_text())
        self.ckpt_dir = self.plan["checkpoint_dir"]
        self.process = int(os.environ.get("RANK", "0"))
        k = self.cfg.emulation.ranks_per_process
        self.ranks = list(range(self.process * k, (self.process + 1) * k))
        self.logs = {rank: EventLog(run_dir, phase, rank) for rank in self.ranks}

    @contextmanager
    def span_all(self, event: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """One timed span recorded on every rank of this process (process-wide work such as imports)."""
        extra: dict[str, Any] = {}
        start_wall, start = time.time(), time.perf_counter()
        yield extra
        for log in self.logs.values():
            log.emit(event, start=start_wall, duration_s=time.perf_counter() - start, **fields, **extra)

    def start(self) -> None:
        launch_t0 = float(os.environ.get("RB_LAUNCH_T0", PROCESS_START))
        for log in self.logs.values():
            log.emit("process.start", start=launch_t0, duration_s=PROCESS_START - launch_t0, **placement(),
                     emulated=True)
        with self.span_all("startup.imports"):
            import torch  # noqa: F401

            from restartbench import plan  # noqa: F401  (torch, DeepSpeed's naming code)
        with self.span_all("startup.dist_init", backend="gloo"):
            import datetime

            import torch.distributed as dist

            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.cfg.launch.collective_timeout_s))

    def files_of(self, step: int) -> dict[int, list[Any]]:
        """rank -> the ShardFiles it writes at ``step`` (every rank of the layout)."""
        from restartbench.plan import setup_for, shard_files

        setup = setup_for(self.cfg, step, scale=self.cfg.emulation.emulate_scale)
        files: dict[int, list[Any]] = {rank: [] for rank in range(setup.layout.world_size)}
        for shard in shard_files(setup):
            files[shard.rank].append(shard)
        return files

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


def state_of(shard: Any, seed: int) -> Any:
    """The shard's state dict with random data, the same for the same file and seed (saved, then compared)."""
    import torch

    from restartbench.data import stable_seed
    from restartbench.plan import materialize

    generator = torch.Generator().manual_seed(stable_seed("emulate", seed, shard.path))

    def random(numel: int, dtype: Any) -> Any:
        return torch.empty(numel, dtype=dtype).uniform_(-1.0, 1.0, generator=generator)

    return materialize(shard.state, random)


# --- phase 1: save ------------------------------------------------------------------------------


def train_phase(ranks: EmulatedRanks) -> None:
    train = ranks.cfg.train
    steps = [s for s in range(1, train.iters + 1) if s % train.save_interval == 0 or s == train.iters]
    ranks.say(f"train (emulated): {len(ranks.ranks)} rank(s) per process; checkpoints after iterations {steps}")
    for step in steps:
        _checkpoint(ranks, step)


def _checkpoint(ranks: EmulatedRanks, step: int) -> None:
    import torch.distributed as dist

    from restartbench.integrity import write_manifest
    from restartbench.storage import LocalStore

    tag = f"step{step}"
    files_by_rank = ranks.files_of(step)
    dist.barrier()
    mine, commit_start = [], None
    for rank in ranks.ranks:
        save_start, written = _save_rank(ranks, rank, step, tag, files_by_rank[rank])
        commit_start = commit_start if commit_start is not None else save_start
        mine += _make_durable(ranks, rank, step, tag, save_start, written)
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


def _save_rank(ranks: EmulatedRanks, rank: int, step: int, tag: str, shards: list[Any]) -> tuple[float, list]:
    """torch.save of each of the rank's files (the stall); global rank 0 also copies DeepSpeed's recovery scripts
    into the checkpoint folder's root, as save_checkpoint does."""
    import torch

    from restartbench.engines.deepspeed_engines import FileRecord
    from restartbench.plan import copy_recovery_scripts

    states = [state_of(shard, ranks.cfg.train.seed) for shard in shards]  # what training left in memory
    log = ranks.logs[rank]
    log.emit("checkpoint.begin", step=step, tag=tag, engine="torch", emulated=True)
    save_start = time.perf_counter()
    written = []
    with log.span("checkpoint.save", step=step, tag=tag, engine="torch", emulated=True):
        os.makedirs(os.path.join(ranks.ckpt_dir, tag), exist_ok=True)
        for shard, state in zip(shards, states):
            path = os.path.join(ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            torch.save(state, path)
            written.append(FileRecord(path, os.path.getsize(path), time.perf_counter() - start))
        if rank == 0:
            copy_recovery_scripts(ranks.ckpt_dir)
    return save_start, written


def _make_durable(ranks: EmulatedRanks, rank: int, step: int, tag: str, save_start: float, written: list) -> list:
    from restartbench.engines import durable_now
    from restartbench.engines.deepspeed_engines import records_as_dicts
    from restartbench.integrity import sha256_of

    log = ranks.logs[rank]
    with log.span("checkpoint.wait_durable", step=step, tag=tag):
        durable_at = durable_now(written)
    files = records_as_dicts(written, ranks.ckpt_dir)
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


def restore_phase(ranks: EmulatedRanks) -> None:
    latest = Path(ranks.ckpt_dir) / "latest"
    if not latest.is_file():
        raise FileNotFoundError(f"no committed checkpoint in {ranks.ckpt_dir}: 'latest' is missing")
    tag = latest.read_text().strip()
    step = int(tag.removeprefix("step"))
    _check_files(ranks, tag)
    cache = _page_cache(ranks, tag)
    files_by_rank = ranks.files_of(step)
    ranks.say(f"restore (emulated): loading {tag} ({cache['cache']} page cache)")
    problems_seen = []
    for rank in ranks.ranks:
        shards = reads_of(ranks, rank, files_by_rank)
        loaded = _load_rank(ranks, rank, tag, shards, cache)
        problems = _compare(shards, loaded, ranks.cfg.train.seed)
        ranks.logs[rank].emit("restore.result", tag=tag, exact=not problems, verified=True, problems=problems,
                              loss=None, emulated=True)
        problems_seen += problems
    if problems_seen:
        raise RuntimeError("emulated restore is not exact:\n  " + "\n  ".join(problems_seen))
    ranks.say(f"restore (emulated): {tag} loaded and equal to what was saved on every rank")


def reads_of(ranks: EmulatedRanks, rank: int, files_by_rank: dict[int, list[Any]]) -> list[Any]:
    """The files a rank needs: its stage's layer and model files (written by data-parallel rank 0 of the same
    stage and tensor rank) and its own optimizer file."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layout = ranks.plan["layout"]
    topology = PipeModelDataParallelTopology(num_pp=layout["pp"], num_mp=layout["tp"], num_dp=layout["dp"])
    coord = topology.get_coord(rank)
    writer = topology.get_rank(pipe=coord.pipe, data=0, model=coord.model)
    return ([f for f in files_by_rank[writer] if f.kind != "optimizer"]
            + [f for f in files_by_rank[rank] if f.kind == "optimizer"])


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


def _load_rank(ranks: EmulatedRanks, rank: int, tag: str, shards: list[Any], cache: dict[str, Any]) -> list[Any]:
    """torch.load of each file (read + deserialize), as DeepSpeed's TorchCheckpointEngine.load does."""
    import torch

    loaded, seconds, nbytes = [], 0.0, 0
    with ranks.logs[rank].span("restore.load", tag=tag, engine="torch", emulated=True, **cache) as extra:
        for shard in shards:
            path = os.path.join(ranks.ckpt_dir, shard.path)
            start = time.perf_counter()
            loaded.append(torch.load(path, map_location="cpu", weights_only=False))
            seconds += time.perf_counter() - start
            nbytes += os.path.getsize(path)
        extra.update(n_files=len(shards), bytes=nbytes, read_deserialize_s=seconds)
    return loaded


def _compare(shards: list[Any], loaded: list[Any], seed: int) -> list[str]:
    """Every restored tensor equal to the one saved (regenerated from its seed), and nothing else changed."""
    import torch

    problems = []
    for shard, got in zip(shards, loaded):
        want = state_of(shard, seed)
        for name, (a, b) in _pairs(want, got):
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b
            if not same:
                problems.append(f"{shard.path}: {name} differs after the restore")
    return problems


def _pairs(want: Any, got: Any, name: str = "") -> Iterator[tuple[str, tuple[Any, Any]]]:
    import torch

    if isinstance(want, dict) and isinstance(got, dict) and want.keys() == got.keys():
        for key in want:
            yield from _pairs(want[key], got[key], f"{name}.{key}")
    elif isinstance(want, (list, tuple)) and not isinstance(want, torch.Size) and type(want) is type(got) \
            and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            yield from _pairs(a, b, f"{name}[{i}]")
    elif isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor) or type(want) is not type(got):
        yield name or "state", (want, got)
    else:
        yield name or "state", (repr(want), repr(got))


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a process must not outlive a killed torchrun
    parser = argparse.ArgumentParser(description="One process of an emulated checkpoint run (see the module doc).")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--phase", required=True, choices=("train", "restore"))
    args = parser.parse_args(argv)
    ranks = EmulatedRanks(args.run_dir, args.phase)
    try:
        ranks.start()
        train_phase(ranks) if args.phase == "train" else restore_phase(ranks)
        ranks.finish()
    except BaseException as error:
        for log in ranks.logs.values():
            log.emit("phase.error", error=f"{type(error).__name__}: {error}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

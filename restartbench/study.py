"""Plan, render and run one study run: phase 1 (train + checkpoint), then a fresh launch (restore + resume).

Three roles, in order:

- check and plan: ``restartbench.run_plan`` (``plan_run``) checks every input before anything is written or
  launched and raises ``StudyError`` with what was wrong and what to do; the result is a ``rundir.RunPlan`` (saved
  as plan.json);
- render: ``restartbench.render`` fills the Jinja templates and parses the DeepSpeed JSON back;
- execute: ``run_study`` writes the run folder, then ``execute`` launches each phase and marks the run
  ``complete`` or ``failed`` in ``metadata.json`` (here, or inside a batch job).

An emulated run (``restartbench.emulate``) goes through the same functions with its own rank program.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from restartbench import crashes, engines, rundir, storage
from restartbench.baseline import record_for_run
from restartbench.config import RunConfig
from restartbench.errors import StudyError
from restartbench.estimate import GiB
from restartbench.events import Event, by_message, phase_record, ranks_label, read_events
from restartbench.integrity import committed_tags
from restartbench.launchers import LAUNCHERS, Launcher, set_parent_death_signal
from restartbench.progress import PREFIX, say
from restartbench.render import REPO_ROOT, Rendered, render
from restartbench.results import failed_checkpoints, restart, summarize_run, write_inventory
from restartbench.run_plan import plan_layout_restart, plan_run
from restartbench.rundir import RunPlan

PHASES = ("train", "restore")


def prepare_layout_restart(changed: RunConfig, layout_plan: RunPlan) -> None:
    """Write the plan, DeepSpeed JSON (with what the engine's converter adds, such as ``load_universal``) and launch
    script of a restart on another layout (``plan_layout_restart``) into ``layouts/<layout>/`` of the run folder."""
    converter = engines.converter(changed.engine.engine)
    folder = rundir.launch_folder(layout_plan.run_dir, layout_plan.layout_name)
    rendered = render(changed, layout_plan, extra_sections=converter.ds_config if converter else None,
                      launch_dir=folder)
    folder.mkdir(parents=True, exist_ok=True)
    layout_plan.save(folder)
    (folder / rundir.DS_CONFIG).write_text(rendered.ds_config_text)
    (folder / rundir.LAUNCH_SCRIPT).write_text(rendered.launch_script)
    (folder / rundir.LAUNCH_SCRIPT).chmod(0o755)


def _optional_engine_missing(cfg: RunConfig, plan: RunPlan) -> bool:
    """An optional engine (datastates) whose package is absent: record the run as skipped, with the reason."""
    missing = engines.missing_requirements(cfg.engine.engine)
    if not missing:
        return False
    run_dir = Path(plan.run_dir)
    rundir.create_run_folder(run_dir)
    cfg.paths.run_dir = str(run_dir)
    save_config(cfg, plan)
    reason = "; ".join(missing)
    meta = run_metadata(cfg, plan) | {"status": "skipped", "error": reason, "end": time.time()}
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"SKIPPED: {reason}")
    say(f"run marked skipped: {run_dir}")
    return True


# --- running ------------------------------------------------------------------------------


def dry_run(cfg: RunConfig) -> int:
    plan = plan_run(cfg)
    relayout = _own_restart_layout(cfg, plan)
    rendered = render(cfg, plan)
    print(f"# run folder (not created): {plan.run_dir}")
    print(f"# {plan.world_size} ranks = {plan.nnodes} node(s) x {plan.nproc_per_node}, {plan.device}/{plan.backend}")
    print(f"# estimated memory per rank: {plan.memory_per_rank_estimate}")
    print(f"# estimated checkpoint size: {plan.checkpoint_bytes_estimate / GiB:.2f} GiB")
    if cfg.launch.restore_layout:
        print(f"# restore phase on {cfg.launch.restore_layout}: " + (
            f"{relayout[1].world_size} ranks, layouts/{cfg.launch.restore_layout}/" if relayout else
            f"skipped, engine {cfg.engine.engine} {engines.engine_info(cfg.engine.engine).not_resharded}"))
    print("# --- ds_config.json ---")
    print(rendered.ds_config_text, end="")
    print("# --- launch.sh ---")
    print(rendered.launch_script, end="")
    if rendered.job_script:
        print(f"# --- {LAUNCHERS[plan.launcher].job_file} ---")
        print(rendered.job_script, end="")
    return 0


def run_study(cfg: RunConfig) -> int:
    """Plan, write the run folder, then run the phases here, or hand them to a batch job."""
    if cfg.launch.dry_run:
        return dry_run(cfg)
    plan = plan_run(cfg)
    launcher = check_launcher(cfg, plan)
    if _optional_engine_missing(cfg, plan):
        return 0
    relayout = _own_restart_layout(cfg, plan)
    rendered = render(cfg, plan)
    run_dir = prepare_run_dir(cfg, plan, rendered)
    if relayout is not None:
        prepare_layout_restart(*relayout)
    meta = run_metadata(cfg, plan)
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"run folder {run_dir}")
    if launcher.job_template and not launcher.inside_allocation():
        return hand_to_batch_system(cfg, launcher, run_dir, rendered, meta)
    return execute(run_dir)


def _own_restart_layout(cfg: RunConfig, plan: RunPlan) -> tuple[RunConfig, RunPlan] | None:
    """With ``--restore-layout``: the config and plan of the run's restore on that layout (checked before the run
    folder exists; None where the engine cannot restart there and the restore is skipped), the layout's name made
    canonical and the consolidated digest, its proof, turned on in ``cfg``."""
    if cfg.launch.restore_layout is None:
        return None
    changed, layout_plan = plan_layout_restart(cfg, plan, cfg.launch.restore_layout)
    cfg.launch.restore_layout, cfg.launch.consolidated_digest = layout_plan.layout_name, True
    return (changed, layout_plan) if engines.engine_info(cfg.engine.engine).reshards else None


def check_launcher(cfg: RunConfig, plan: RunPlan) -> Launcher:
    """The run's launcher, once it is known to start every node of the run: a batch launcher starts them all; the
    local launcher starts this machine's ranks only, so a run over several nodes is refused (it would wait for the
    others until its rendezvous timed out)."""
    launcher = LAUNCHERS[plan.launcher]
    missing = launcher.missing_submit_command(cfg.launch.submit)
    if missing:
        raise StudyError(missing)
    if plan.nnodes > 1 and not launcher.job_template:
        raise StudyError(f"--nnodes {plan.nnodes} with the local launcher would start this machine's ranks only and "
                         "wait for the other nodes; use --launcher slurm or pbs (add --submit), or --dry-run and run "
                         "the printed launch.sh on every node with NODE_RANK and MASTER_ADDR set")
    return launcher


def execute(run_dir: Path) -> int:
    """Run the phases of a prepared run folder, each a fresh launch, and mark the run complete or failed."""
    run_dir = Path(run_dir)
    refuse_if_moved(run_dir)
    cfg = RunConfig.load(run_dir / rundir.CONFIG)
    plan = RunPlan.load(run_dir)
    launcher = LAUNCHERS[plan.launcher]
    meta = rundir.read_metadata(run_dir)
    _check_not_executed(run_dir, meta)
    meta.update(status="running", start=time.time(), host=socket.gethostname(),
                job_id=os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or meta.get("job_id"))
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"{cfg.model.preset} {plan.layout_name} engine={cfg.engine.engine}: {plan.world_size} ranks on "
        f"{plan.nnodes} node(s), {plan.device}/{plan.backend}, launcher {launcher.name}; "
        f"{cfg.train.iters} iterations, checkpoint every {cfg.train.save_interval}")
    issue = engines.known_issue(cfg.engine.engine, plan.device)
    if issue:
        say(f"note: engine {cfg.engine.engine} {issue}")
        meta["engine_known_issue"] = issue
    _measure_storage(run_dir, cfg, plan)
    status, error = _run_phases(run_dir, cfg, plan, launcher, meta)
    return 0 if _finalize(run_dir, meta, status, error) == "complete" else 1


def _measure_storage(run_dir: Path, cfg: RunConfig, plan: RunPlan) -> None:
    """The storage baseline the run's throughput is judged against (none with --baseline-mib 0)."""
    if cfg.storage.baseline_mib > 0 and plan.remote:
        storage.record_remote_baseline(run_dir, plan.checkpoint_dir, plan.remote, cfg.storage.baseline_mib)
    elif cfg.storage.baseline_mib > 0:
        record_for_run(run_dir, plan, cfg.storage.baseline_mib)


def _run_phases(run_dir: Path, cfg: RunConfig, plan: RunPlan, launcher: Launcher,
                meta: dict[str, Any]) -> tuple[str, str | None]:
    """Train, then restore (each recorded in ``meta`` as it ends); the run's status and its error. The restore is
    skipped where it is on another layout and the engine cannot reshard, and not launched after a failed train or
    one that committed no checkpoint."""
    relayout = {"restore_layout": cfg.launch.restore_layout} if cfg.launch.restore_layout else {}
    for phase in PHASES:
        if phase == "restore" and relayout and not engines.engine_info(cfg.engine.engine).reshards:
            meta["restarts"] = [skipped_restart(1, relayout, engines.engine_info(cfg.engine.engine).not_resharded)]
            say(f"restore on {cfg.launch.restore_layout}: skipped, engine {cfg.engine.engine} "
                f"{meta['restarts'][0]['reason']}")
            break
        launch_dir, nnodes, rank_args = _phase_launch(run_dir, plan, phase, relayout)
        result = run_phase(run_dir, phase, launcher.phase_command(launch_dir, phase, nnodes, rank_args),
                           cfg.launch.phase_timeout_s)
        meta["phases"][phase] = result
        if phase == "restore":
            meta["restarts"] = [restart_record(run_dir, 1, result, relayout)]
        if result["exit_code"] != 0:
            return "failed", f"phase {phase} failed: {result['error']}"
        if phase == "train" and _nothing_committed(cfg, plan):
            return "failed", "phase train committed no checkpoint, so the restore phase was not launched"
    return "complete", None


def _phase_launch(run_dir: Path, plan: RunPlan, phase: str, relayout: dict[str, str]
                  ) -> tuple[Path, int, tuple[str, ...]]:
    """Where a phase's launch script is, on how many nodes it runs, and the rank arguments it passes: the restore on
    another layout (``relayout``) from ``layouts/<layout>/``."""
    if phase != "restore" or not relayout:
        return run_dir, plan.nnodes, ()
    layout = relayout["restore_layout"]
    folder = rundir.launch_folder(run_dir, layout)
    return folder, RunPlan.load(folder).nnodes, ("--restore-layout", layout)


def skipped_restart(attempt: int, chosen: dict[str, Any], reason: str) -> dict[str, Any]:
    """A restore attempt the engine cannot make (on another layout): its entry in ``restarts``, nothing launched."""
    return {"attempt": attempt, "record": None, **chosen, "verdict": "skipped", "reason": reason}


def refuse_if_moved(run_dir: Path) -> None:
    """A run folder written before run folders could move, no longer where it was written, is refused: its
    launch.sh names its old place, and launched from here it would read and write there."""
    origin = rundir.moved_from(run_dir)
    if origin is not None:
        raise StudyError(f"run folder {run_dir} was written at {origin} by an earlier version of restartbench, whose "
                         f"launch.sh names that place: launched from here it would write into {origin}. Launch it "
                         "where it was written (move it back); its records still read where it is now")


def _check_not_executed(run_dir: Path, meta: dict[str, Any]) -> None:
    """A run folder runs its phases once: executed again (a resubmitted job, a second ``restartbench.execute``), it
    would append to its records and keep saying complete. Restarts are measured again as attempts of their own."""
    if meta.get("phases") or read_events(run_dir):
        raise StudyError(f"run folder {run_dir} was executed before (status {meta.get('status')!r}), and a run "
                         "folder's records are never appended to: to measure the restart again from its kept "
                         f"checkpoints run ./submit-job.sh --restore {run_dir}; to run the study again, launch a new "
                         "run")


def restart_record(run_dir: Path, attempt: int, result: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    """A restore attempt's entry in metadata.json's ``restarts``: how its launch ended (``run_phase``), the options
    it chose (``chosen``: tag, as ``requested_tag``, on_corrupt, restore_cache; the rest as config.json says), the
    checkpoint it restored, whether it fell back, and its verdict (``restartbench.results.verdict``)."""
    info = restart(read_events(run_dir), attempt) or {}
    options = {("requested_tag" if name == "tag" else name): value for name, value in chosen.items()}
    return {"attempt": attempt, "record": phase_record("restore", attempt), **options, **result,
            "end": result["start"] + result["wall_s"], "tag": info.get("tag"), "cache": info.get("cache"),
            "fell_back_from": info.get("fell_back_from"), "restart_s": info.get("total_s"),
            "verdict": info.get("verdict", "failed")}


def hand_to_batch_system(cfg: RunConfig, launcher: Launcher, run_dir: Path, rendered: Rendered,
                          meta: dict[str, Any]) -> int:
    job_file = run_dir / launcher.job_file
    if not cfg.launch.submit:
        meta["status"] = "prepared"
        rundir.write_json(run_dir / rundir.METADATA, meta)
        say(f"wrote {job_file}; submit it from its run folder (the job runs the folder it was submitted from): "
            f"cd {shlex.quote(str(run_dir))} && {launcher.submit_command} {launcher.job_file}")
        return 0
    submitted = subprocess.run([launcher.submit_command, launcher.job_file], capture_output=True, text=True,
                               cwd=run_dir)
    if submitted.returncode != 0:
        meta.update(status="failed", error=f"{launcher.submit_command} refused the job: {submitted.stderr.strip()}")
        rundir.write_json(run_dir / rundir.METADATA, meta)
        raise StudyError(meta["error"])
    job_id = submitted.stdout.strip().split(";")[0].split()[-1]
    meta.update(status="submitted", job_id=job_id)
    rundir.write_json(run_dir / rundir.METADATA, meta)
    say(f"submitted job {job_id} ({launcher.name}); the run folder fills in as it runs: {run_dir}")
    print(job_id)
    return 0


def prepare_run_dir(cfg: RunConfig, plan: RunPlan, rendered: Rendered) -> Path:
    """Check the target folders, then create the run folder; nothing is left behind when a check fails, and a folder
    another launch created is never touched."""
    run_dir = Path(plan.run_dir)
    if run_dir.exists():
        raise StudyError(_run_folder_exists(cfg, run_dir))
    _check_target(cfg, plan)
    try:
        rundir.create_run_folder(run_dir)
    except FileExistsError:
        raise StudyError(_run_folder_exists(cfg, run_dir)) from None
    except OSError as error:
        raise StudyError(f"cannot create the run folder {run_dir}: {error}; choose a writable --logs") from None
    try:
        if not plan.remote:  # an object-store prefix needs no creating
            Path(plan.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        shutil.rmtree(run_dir, ignore_errors=True)  # created just above, by this launch
        raise StudyError(f"cannot create the checkpoint folder: {error}; choose a writable --checkpoint-dir") from None
    cfg.paths.run_dir = str(run_dir)
    save_config(cfg, plan)
    plan.save(run_dir)
    (run_dir / rundir.DS_CONFIG).write_text(rendered.ds_config_text)
    (run_dir / rundir.LAUNCH_SCRIPT).write_text(rendered.launch_script)
    (run_dir / rundir.LAUNCH_SCRIPT).chmod(0o755)
    if rendered.job_script:
        (run_dir / LAUNCHERS[plan.launcher].job_file).write_text(rendered.job_script)
    return run_dir


def save_config(cfg: RunConfig, plan: RunPlan) -> None:
    """Write config.json into the run folder with its paths relative to it, as plan.json's are: the run folder is
    ``.``, the checkpoint folder is left out (the run folder's own) unless it is outside the run folder (then by
    absolute path or URL, as plan.json names it)."""
    external = plan.checkpoint_dir if plan.checkpoint_external else None
    replace(cfg, paths=replace(cfg.paths, run_dir="."), storage=replace(cfg.storage, checkpoint_dir=external)
            ).save(Path(plan.run_dir) / rundir.CONFIG)


def _check_target(cfg: RunConfig, plan: RunPlan) -> None:
    """The checkpoint folder can be made, and (unless --no-disk-check) holds every planned checkpoint;
    an object-store location answers a lookup, a write, a read and a delete (missing bucket, refused credentials
    and an unreachable endpoint are each said in words, before anything is written or launched); neither holds
    another run's committed checkpoints unless --reuse-checkpoint-dir."""
    if plan.remote:
        try:
            store = storage.open_store(plan.checkpoint_dir, plan.remote)
            storage.probe(store)
        except storage.StorageError as error:
            raise StudyError(str(error)) from None
        return _check_not_another_runs(cfg, store)
    if Path(plan.checkpoint_dir).is_dir():
        _check_not_another_runs(cfg, storage.LocalStore(plan.checkpoint_dir))
    target = _nearest_existing(Path(plan.checkpoint_dir))
    if not target.is_dir() or not os.access(target, os.W_OK):
        raise StudyError(f"checkpoint folder {plan.checkpoint_dir} cannot be created ({target} is not a writable "
                         "folder); choose a writable --checkpoint-dir / --logs")
    saves = checkpoints_saved(cfg.train.iters, cfg.train.save_interval)
    if cfg.storage.keep_checkpoints:  # the kept ones and the one being written
        saves = min(saves, cfg.storage.keep_checkpoints + 1)
    need = saves * plan.checkpoint_bytes_estimate
    free = shutil.disk_usage(target).free
    if cfg.launch.disk_check and need > free:
        raise StudyError(f"checkpoint folder {plan.checkpoint_dir} has {free / GiB:.2f} GiB free, but {saves} "
                         f"checkpoint(s) of about {plan.checkpoint_bytes_estimate / GiB:.2f} GiB need "
                         f"{need / GiB:.2f} GiB; "
                         "free space, point --checkpoint-dir elsewhere, or raise --save-interval")


def _run_folder_exists(cfg: RunConfig, run_dir: Path) -> str:
    if cfg.paths.run_dir:
        return f"run folder {run_dir} already exists; choose another --run-dir or leave it out"
    return (f"run folder {run_dir} was created by another launch (its random suffix is the same as this one's); "
            "launch again")


def checkpoints_saved(iters: int, save_interval: int) -> int:
    """Checkpoints phase 1 saves: after every ``save_interval`` iterations, and after the last one."""
    return iters // save_interval + (1 if iters % save_interval else 0)


def _check_not_another_runs(cfg: RunConfig, store: storage.LocalStore | storage.ObjectStore) -> None:
    """A checkpoint location holding committed checkpoints (``latest``, or tags with their manifests) is another
    run's: writing there would mix the two runs' tags and ``latest``."""
    committed = committed_tags(store)
    if (committed or store.exists("latest")) and not cfg.storage.reuse_checkpoint_dir:
        found = f"committed checkpoints ({', '.join(committed)})" if committed else "a 'latest'"
        raise StudyError(f"--checkpoint-dir {store.location} already holds {found} of another run; choose an empty "
                         "location, or add --reuse-checkpoint-dir to write there anyway (tags of the same names and "
                         "'latest' are replaced)")


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def run_metadata(cfg: RunConfig, plan: RunPlan) -> dict[str, Any]:
    return {
        "status": "running",
        "error": None,
        "start": time.time(),
        "end": None,
        "host": socket.gethostname(),
        "command": sys.argv,
        "versions": {name: _version(name) for name in ("torch", "deepspeed", "restartbench")}
        | {"python": sys.version.split()[0]},
        "preset": cfg.model.preset,
        "layout": plan.layout_name,
        "engine": cfg.engine.engine,
        "world_size": plan.world_size,
        "device": plan.device,
        "phases": {},
    }


def _version(package: str) -> str | None:
    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return None


def run_phase(run_dir: Path, phase: str, command: list[str], timeout_s: float,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Launch one phase record (``train``, ``restore``, ``restore-2``...: a fresh torchrun on every node), with
    ``env`` added to ours, stream its progress lines, keep its output."""
    say(f"phase {phase}: launching")
    start = time.time()
    # Same process group as ours: a Ctrl-C or a kill of the whole job reaches every rank too. If this process
    # alone is killed, the phase gets SIGTERM (torchrun then stops its ranks; srun cancels its step).
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                               env={**os.environ, **(env or {})},
                               preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM))
    pumps = [
        threading.Thread(target=_pump, args=(process.stdout, rundir.phase_log(run_dir, phase, "stdout"), True)),
        threading.Thread(target=_pump, args=(process.stderr, rundir.phase_log(run_dir, phase, "stderr"), False)),
    ]
    for pump in pumps:
        pump.start()
    error = None
    try:
        exit_code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(process)
        exit_code, error = -9, f"timed out after {timeout_s:.0f} s (--phase-timeout-s); the ranks were killed"
    except KeyboardInterrupt:
        _kill_tree(process)
        exit_code, error = -2, "interrupted by the user"
    for pump in pumps:  # the logs whole before the error summary reads them
        pump.join()
    if exit_code != 0 and error is None:
        error = error_summary(run_dir, phase, exit_code)
    if error:
        say(f"phase {phase}: FAILED: {error}")
    return {"exit_code": exit_code, "wall_s": time.time() - start, "start": start, "error": error}


def _pump(stream, path: Path, echo_progress: bool) -> None:
    with path.open("w") as out:
        for line in stream:
            out.write(line)
            if echo_progress and line.startswith(PREFIX):
                print(line, end="", flush=True)


def _kill_tree(process: subprocess.Popen) -> None:
    """Terminate the phase and every process under it (launcher, torchrun, ranks), then kill what is left."""
    import psutil

    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in tree:
        member.terminate()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for member in alive:
        member.kill()
    process.wait()


def error_summary(run_dir: Path, phase: str, exit_code: int) -> str:
    """What ended the phase. A rank's crash (a signal, reported by Python's fault handler) first where a rank crashed
    without recording why, since the other ranks' errors follow from it (gloo's 'Connection closed by peer'); where
    every rank had recorded its end or its error, the first error recorded, the crash after it (a compiled library's
    abort once the error was raised: DataStates' host tier, NCCL's watchdog); else the last lines of stderr."""
    events = read_events(run_dir, phase)
    stderr = rundir.phase_log(run_dir, phase, "stderr").read_text()
    crash = crashes.crash_report(stderr)
    spoke = {r["rank"] for r in events if r["event"] in (Event.PHASE_ERROR, Event.PHASE_END)}
    silent = sorted({r["rank"] for r in events if r["event"] == Event.PROCESS_START} - spoke)
    recorded = next((r for r in events if r["event"] == Event.PHASE_ERROR), None)
    if crash and (silent or recorded is None):
        who = ranks_label(silent) if silent else "a rank"
        return f"{who} crashed: {crash} (exit code {exit_code}; every thread's frames are in {phase}.stderr.log)"
    if recorded is not None:
        then = f"; then a rank crashed: {crash} (its frames are in {phase}.stderr.log)" if crash else ""
        return f"rank {recorded['rank']}: {recorded['error']}{then} (exit code {exit_code})"
    tail = stderr.strip().splitlines()[-5:]
    return f"exit code {exit_code}; last lines of {phase}.stderr.log:\n    " + "\n    ".join(tail)


def _nothing_committed(cfg: RunConfig, plan: RunPlan) -> bool:
    """Every save of phase 1 failed: there is nothing to restore (engine none saves nothing by design)."""
    return cfg.engine.engine != "none" and not storage.open_store(plan.checkpoint_dir, plan.remote).exists("latest")


def _finalize(run_dir: Path, meta: dict[str, Any], status: str, error: str | None) -> str:
    """Record how the run ended (a failed checkpoint fails the run) and print its summary; return the status."""
    runtime = run_dir / rundir.RUNTIME
    if runtime.exists():
        meta["runtime"] = rundir.read_json(runtime)
    meta["failed_checkpoints"] = failed_checkpoints(run_dir, phase_failed=status != "complete")
    if meta["failed_checkpoints"]:
        grouped = by_message((c["tag"], c["error"]) for c in meta["failed_checkpoints"])
        lost = "; ".join(f"{', '.join(tags)}: {message}" for message, tags in grouped.items())
        status, error = "failed", "; ".join(filter(None, [error, f"checkpoint(s) failed, earlier ones kept: {lost}"]))
    if status == "complete":
        write_inventory(run_dir)
    meta.update(status=status, error=error, end=time.time())
    rundir.write_json(run_dir / rundir.METADATA, meta)
    if status == "complete":
        for line in summarize_run(run_dir):
            say(line)
    else:
        say(f"error: {error}")
    say(f"run {status}: {run_dir}")
    return status

"""``python -m restartbench.whatif --calibrate --out FILE``: fit the what-if model on this machine (issue 26, item 4).

    python -m restartbench.whatif --calibrate --out clusters/mine.yaml                  # runs, probes, fit, write
    python -m restartbench.whatif --calibrate --out clusters/mine.yaml --dry-run        # the steps, nothing run
    python -m restartbench.whatif --calibrate --out clusters/mine.yaml --logs /scratch/cal --engines torch,lazy

A short, fixed set of steps (``plan_steps``), each printed with how long it took:

1. probes: the storage limits of the run folder's file system at the checkpoint's concurrency
   (``restartbench.whatif.limits.storage_limits``: fio and threaded buffered I/O, best method, min/median/max over
   the repeats), the host copy (``limits.host_copy_MBps``), and, where torch sees a CUDA device, its pinned and
   pageable device-to-host copies and the cost of pinning (``limits.d2h_probe``; on a CPU machine skipped, with why);
2. real runs (``CALIBRATION`` by ``calibration_cases``): tiny and small on tp1pp1dp2 through each engine, tiny on
   tp1pp1dp4 (a second world size: distributed init's slope in ranks); each a whole study run (train, checkpoint,
   end, relaunch, restore, resume) through ``restartbench.cli``, as ``config-n-run.py`` runs it;
3. emulated big checkpoints: 3B on tp1pp1dp2 at two ``--emulate-scale`` values through each engine that has an
   emulator (the byte slope of the stall, durable and load lines at the checkpoint's real file count);
4. the fit (``restartbench.whatif.fit.fit_table`` on ``restartbench.analysis``'s table of those runs);
5. the files: ``<out>`` (a cluster file ``restartbench.whatif.cluster.load_cluster`` reads, every measured field's
   basis ``calibration``), ``<stem>-fit.json`` beside it (the fit, as ``clusters/cpu2-fit.json``) and
   ``<stem>-calibration.json`` (what ran, how long each step took, the probes' figures). They are checked by
   loading them back, then renamed into place together at the end; a calibration that fails writes none of them.

Resumable: a run folder under ``--logs`` that already holds a complete run of a step's case is reused, not run again
(rerun the same command after a failure or an interruption). Bad input (an ``--out`` that is not a new ``.yaml``
file in an existing folder, an unknown engine, ``--logs`` that is a file) is refused before anything runs.
Calibration under Slurm (1 and 2 nodes, ``--slurm``) is not built: it is refused with that reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restartbench.layout import LayoutError, parse_layout
from restartbench.progress import say
from restartbench.whatif import cluster as clusters
from restartbench.whatif import fit as fitting
from restartbench.whatif import limits as probes

#: Options of every real run: fp32 (much faster than bf16 on CPUs without bf16 units), two checkpoints (the second's
#: background work seen by the first's clean iterations: the slowdown fraction).
REAL = ("--dtype", "fp32", "--iters", "4", "--save-interval", "2")
#: Options of every emulated run: one checkpoint of the big preset's files, saved and restored.
EMULATED = ("--dtype", "bf16", "--iters", "1", "--save-interval", "1")
DEFAULT_ENGINES = ("torch", "lazy", "dcp")
#: The emulated preset and its two scales: 3B on tp1pp1dp2 writes the real layout's files at a few hundred MB per
#: rank, so the two points give the lines' byte slope at one file count in seconds each.
EMULATED_PRESET, EMULATED_LAYOUT, EMULATED_SCALES = "3B", "tp1pp1dp2", (0.02, 0.05)
#: Storage probe: one file per writer of this size, each method this many times (limits.storage_limits).
PROBE_MIB, PROBE_REPEATS = 256, 2
#: Host copy and D2H probe sizes.
HOST_COPY_BYTES, D2H_BYTES, D2H_REPEATS = 128 * 2**20, 2**30, 3
CLUSTER_EXAMPLE = Path(__file__).resolve().parents[2] / "clusters" / "h100-pfs.yaml"
#: Seconds each step takes on the study's 2-CPU machine at a load average of about 2 (the --dry-run's estimate):
#: tiny runs 29-33 s measured at load 2-3 (2026-11-26); small 86-114 s and 3B emulated 31-55 s from
#: bench/whatif_validation.py's runs as the load fell to 3. Other work on the machine stretches every run: at a load
#: average of 20 each run took about 7 times as long (docs/calibrate.md).
EXPECTED_S = {"storage limits": 60.0, "host copy": 2.0, "d2h": 2.0, "fit": 15.0, "write": 1.0,
              ("tiny", "tp1pp1dp2"): 32.0, ("small", "tp1pp1dp2"): 90.0, ("tiny", "tp1pp1dp4"): 60.0,
              (EMULATED_PRESET, EMULATED_LAYOUT): 35.0}
SLURM_NOT_BUILT = ("--slurm: calibration under Slurm (runs on 1 and 2 nodes, the shared file system's per-client and "
                   "aggregate bandwidth) is not built yet; --calibrate calibrates the node it runs on (its local "
                   "disk, or the file system --logs is on, as one node sees it). Run it inside an allocation on one "
                   "node for now; the shared file system's aggregate figures stay cited (clusters/h100-pfs.yaml)")


class CalibrationError(ValueError):
    """A calibration that cannot run or cannot be fitted; the message says why and what would fix it."""


# -- the cases -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One run of a calibration: a real run, or an emulated big checkpoint (bench/whatif_validation.py's shape)."""

    preset: str
    layout: str
    engine: str
    scale: float | None = None
    """--emulate-scale for an emulated case; None: a real run."""
    ranks_per_process: int = 1
    """--ranks-per-process of an emulated case."""
    nodes: int = 1
    """Slurm nodes (--nnodes): above 1 the case is submitted to Slurm (``SLURM_CONF``), one torchrun per node."""

    @property
    def key(self) -> tuple[str, str, str, bool]:
        """What tells configurations apart: preset, layout, engine, emulated."""
        return (self.preset, self.layout, self.engine, self.scale is not None)

    @property
    def label(self) -> str:
        kind = "real" if self.scale is None else f"emulated at scale {self.scale:g}"
        return f"{self.preset} {self.layout} {self.engine} ({kind}{f', {self.nodes} nodes' if self.nodes > 1 else ''})"

    @property
    def ranks(self) -> int:
        spec = parse_layout(self.layout)
        return spec.tp * spec.pp * (spec.dp or 1)

    @property
    def concurrency(self) -> int:
        """Processes of the node doing checkpoint I/O at once."""
        return max(1, self.ranks // self.ranks_per_process)

    def argv(self, logs: Path) -> list[str]:
        common = [self.preset, self.layout, "--engine", self.engine, "--logs", str(logs), "--baseline-mib", "0"]
        if self.nodes > 1:
            common += ["--nnodes", str(self.nodes), "--launcher", "slurm", "--submit", "--master-port",
                       str(free_port())]
        if self.scale is None:
            return [*common, *REAL]
        return [*common, *EMULATED, "--emulate", "--emulate-scale", str(self.scale),
                "--ranks-per-process", str(self.ranks_per_process)]


def free_port() -> int:
    """A TCP port free on this host now (a submitted job's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def calibration_cases(engines: tuple[str, ...] = DEFAULT_ENGINES,
                      emulated_engines: tuple[str, ...] | None = None) -> tuple[Case, ...]:
    """The runs a calibration fits on. Real: tiny and small on tp1pp1dp2 per engine (two presets: the byte and
    parameter slopes), tiny on tp1pp1dp4 through the first engine (a second world size: dist init's slope).
    Emulated: 3B tp1pp1dp2 at two scales per engine that has an emulator (``emulated_engines``; None: all)."""
    emulated = engines if emulated_engines is None else tuple(e for e in engines if e in emulated_engines)
    real = [Case(preset, "tp1pp1dp2", engine) for engine in engines for preset in ("tiny", "small")]
    real.append(Case("tiny", "tp1pp1dp4", engines[0]))
    return (*real, *(Case(EMULATED_PRESET, EMULATED_LAYOUT, engine, scale) for engine in emulated
                     for scale in EMULATED_SCALES))


def probe_jobs(cases: tuple[Case, ...]) -> int:
    """The checkpoint's concurrency the storage probe runs at: the writers per node of most calibration runs."""
    return Counter(case.concurrency for case in cases).most_common(1)[0][0]


# -- the steps ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a calibration: a probe, a run, the fit or the write."""

    name: str
    kind: str
    """probe, run, fit or write."""
    expected_s: float
    """How long it took on the study's 2-CPU machine (EXPECTED_S)."""
    case: Case | None = None
    skip: str = ""
    """Why the step does nothing here (a D2H probe without a GPU)."""


@dataclass(frozen=True)
class Options:
    out: Path
    logs: Path
    engines: tuple[str, ...] = DEFAULT_ENGINES
    timeout_s: int = 900
    gpus_per_node: int | None = None
    name: str | None = None
    force: bool = False
    slurm: bool = False
    run_device: str = "auto"
    """config-n-run.py's --device for the runs (auto: cuda where there are enough GPUs for a case)."""

    @property
    def fit_path(self) -> Path:
        return self.out.with_name(f"{self.out.stem}-fit.json")

    @property
    def record_path(self) -> Path:
        return self.out.with_name(f"{self.out.stem}-calibration.json")


def gpu_visible() -> str:
    """'' where torch sees a CUDA device, else why the D2H probe is skipped."""
    import torch

    if torch.cuda.is_available():
        return ""
    return ("no CUDA device visible (torch.cuda.is_available() is False): a CPU rank's state is in host memory "
            "already; the host copy stands in for the D2H and pinning rates, and the model adds no D2H on cpu")


def plan_steps(options: Options, gpu_skip: str | None = None) -> list[Step]:
    """Every step, in the order it runs: probes, runs (real, then emulated), the fit, the write."""
    check_options(options)
    cases = calibration_cases(options.engines, emulated_engines=_emulated_engines())
    gpu_skip = gpu_visible() if gpu_skip is None else gpu_skip
    steps = [Step(f"storage limits ({probe_jobs(cases)} writers x {PROBE_MIB} MiB, {PROBE_REPEATS} repeats)",
                  "probe", EXPECTED_S["storage limits"]),
             Step("host copy", "probe", EXPECTED_S["host copy"]),
             Step("d2h", "probe", EXPECTED_S["d2h"] if not gpu_skip else 0.0, skip=gpu_skip)]
    steps += [Step(case.label, "run", EXPECTED_S.get((case.preset, case.layout), 60.0), case) for case in cases]
    return [*steps, Step("fit", "fit", EXPECTED_S["fit"]), Step("write", "write", EXPECTED_S["write"])]


def _emulated_engines() -> tuple[str, ...]:
    from restartbench.engines import emulated_engines

    return tuple(emulated_engines())


def check_options(options: Options) -> None:
    """Refuses bad input before anything runs or is written (CalibrationError)."""
    if options.slurm:
        raise CalibrationError(SLURM_NOT_BUILT)
    out = options.out
    if out.suffix not in (".yaml", ".yml"):
        raise CalibrationError(f"--out {out}: a cluster file is YAML; name it <something>.yaml")
    if not out.parent.is_dir():
        raise CalibrationError(f"--out {out}: its folder {out.parent} does not exist; create it first")
    for path in (out, options.fit_path, options.record_path):
        if path.exists() and not options.force:
            raise CalibrationError(f"{path} exists; pass --force to replace it (after the calibration succeeds: "
                                   "a failed one leaves it as it is)")
    if options.logs.exists() and not options.logs.is_dir():
        raise CalibrationError(f"--logs {options.logs} is a file; name a folder for the calibration's runs")
    if not options.engines:
        raise CalibrationError("--engines names no engine")
    from restartbench.engines import UnknownEngineError, engine_info, missing_requirements

    for engine in options.engines:
        try:
            engine_info(engine)
        except UnknownEngineError as error:
            raise CalibrationError(str(error)) from None
        if engine == "none":
            raise CalibrationError("--engines: 'none' saves no checkpoint, so there is nothing to fit")
        missing = missing_requirements(engine)
        if missing:
            raise CalibrationError("; ".join(missing))
    if len(set(options.engines)) != len(options.engines):
        raise CalibrationError(f"--engines names an engine twice: {','.join(options.engines)}")
    if options.timeout_s <= 0:
        raise CalibrationError(f"--timeout must be above 0 seconds, got {options.timeout_s}")
    if options.gpus_per_node is not None and options.gpus_per_node < 1:
        raise CalibrationError(f"--gpus-per-node must be at least 1, got {options.gpus_per_node}")
    try:
        for case in calibration_cases(options.engines):
            case.ranks  # noqa: B018 (the layout parses)
    except LayoutError as error:
        raise CalibrationError(str(error)) from None


# -- the runner (bench/whatif_validation.py's shape: completed, run_case) -------------------------------------------


def _run_config(meta_path: Path) -> tuple[dict, dict] | None:
    try:
        return json.loads(meta_path.read_text()), json.loads((meta_path.parent / "config.json").read_text())
    except (OSError, ValueError):
        return None


def matches(meta: dict, config: dict, case: Case) -> bool:
    """Whether a run's metadata.json and config.json are a run of ``case``."""
    emulation = config.get("emulation") or {}
    scale = emulation.get("emulate_scale") if emulation.get("emulate") else None
    per_process = int(emulation.get("ranks_per_process") or 1) if emulation.get("emulate") else 1
    return (meta.get("preset") == case.preset and meta.get("engine") in (case.engine, f"{case.engine}-emulated")
            and scale == case.scale and per_process == case.ranks_per_process
            and (config.get("layout") or {}).get("layout") == case.layout
            and int((config.get("layout") or {}).get("nnodes") or 1) == case.nodes)


def completed(folder: Path, case: Case) -> Path | None:
    """The run folder under ``folder`` that holds a complete run of ``case``, or None."""
    for meta_path in sorted(Path(folder).rglob("metadata.json")):
        found = _run_config(meta_path)
        if found and found[0].get("status") == "complete" and matches(*found, case):
            return meta_path.parent
    return None


#: The run's command: restartbench.cli (config-n-run.py's main) in a fresh interpreter.
RUN_PROGRAM = "import sys; from restartbench.cli import main; sys.exit(main(sys.argv[1:]))"


def run_case(case: Case, folder: Path, timeout: int, extra: tuple[str, ...] = (),
             log_dir: Path | None = None) -> dict[str, Any]:
    """Run ``case`` into ``folder`` unless a complete run of it is there already. The run's output goes to
    ``log_dir/<case>.log`` (default: ``folder/calibrate-logs``); a run past ``timeout`` seconds is stopped with its
    whole process group. Returns {case, exit, wall_s, tail, log} (exit 0 and note 'already complete' when reused)."""
    found = completed(folder, case)
    if found is not None:
        return {"case": dataclasses.asdict(case), "exit": 0, "wall_s": None, "note": "already complete",
                "run": str(found)}
    log_dir = log_dir or folder / "calibrate-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / (case.label.replace(" ", "-").replace("(", "").replace(")", "") + ".log")
    argv = [sys.executable, "-c", RUN_PROGRAM, *case.argv(folder), *extra]
    start = time.perf_counter()
    with open(log, "w") as output:
        proc = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:  # the timeout, or an interrupt: the launcher and its ranks go too
            _stop_group(proc)
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
            code = None
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    result = {"case": dataclasses.asdict(case), "exit": code, "wall_s": wall, "tail": tail, "log": str(log)}
    if code is None:
        result["note"] = f"stopped after {timeout} s (--timeout)"
    found = completed(folder, case) if code == 0 else None
    if found is not None:
        result["run"] = str(found)
    elif code == 0:
        result |= {"exit": 1, "note": "exited 0 but left no complete run folder"}
    return result


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def per_process(collected) -> dict[str, int]:
    """run_id → --ranks-per-process of each emulated run (config.json), which the tidy table does not carry."""
    out = {}
    for run_id, run in collected.table()[["run_id", "run"]].drop_duplicates().itertuples(index=False):
        emulation = json.loads((Path(run) / "config.json").read_text()).get("emulation") or {}
        out[run_id] = int(emulation.get("ranks_per_process") or 1) if emulation.get("emulate") else 1
    return out


# -- the cluster file ------------------------------------------------------------------------------------------


def calibrated_cluster(options: Options, limits: dict[str, Any], d2h: dict[str, Any] | None,
                       when: str) -> clusters.Cluster:
    """The calibrated machine as a cluster: its limits and copies as measured (basis ``calibration``, each source
    saying how), the fit file beside it; the constants no single machine measures (dist init at thousands of ranks,
    the GPU's peak and MFU, the slowdown during an asynchronous save) cited, from clusters/h100-pfs.yaml."""
    storage, copy = limits["storage"], limits["host_copy"]
    write, read = storage["write"], storage["read"]
    made = f"calibration ({when}, python -m restartbench.whatif --calibrate)"
    measured = (f"{storage['jobs']} writers at once (the calibration runs' checkpoint concurrency), "
                f"{storage['size_mib_per_job']} MiB each, {storage['repeats']} repeats on {storage['target']}")
    fields: dict[str, tuple[Any, str, str]] = {
        "name": (options.name or f"{platform.node()}: {os.cpu_count()}-CPU {platform.machine()}"
                 + (f", {d2h['gpus']}x {d2h['gpu']}" if d2h else ", no GPU"), "calibration", made),
        "device": ("cuda" if d2h else "cpu", "calibration",
                   f"{made}: {'torch sees ' + d2h['gpu'] if d2h else 'no CUDA device visible'}"),
        "nodes": (1, "calibration", f"{made}: one node (calibration under Slurm is not built)"),
        "local_write_GBps": (write["MBps"]["median"] / 1e3, "calibration",
                             f"{made}: best of {', '.join(write['methods'])}: {write['best']}, median of "
                             f"{write['MBps']['min']:.0f}-{write['MBps']['max']:.0f} MB/s; {measured}"),
        "local_read_GBps": (read["MBps"]["median"] / 1e3, "calibration",
                            f"{made}: best of {', '.join(read['methods'])}: {read['best']}, median of "
                            f"{read['MBps']['min']:.0f}-{read['MBps']['max']:.0f} MB/s; {measured}"),
        "storage": ("local", "calibration", f"{made}: the file system of {storage['target']}, as one node sees it"),
        "shared_write_GBps": (0.0, "calibration", f"{made}: not measured (one node; no shared file system figure)"),
        "shared_read_GBps": (0.0, "calibration", f"{made}: not measured (one node; no shared file system figure)"),
        "shared_per_client_GBps": (0.0, "calibration", f"{made}: not measured (one node)"),
        "nic_GBps": (0.0, "calibration", f"{made}: not measured (one node)"),
        "calibration": (options.fit_path.name, "calibration", f"{made}: the fit of its runs"),
    }
    if d2h:
        gpus = options.gpus_per_node or d2h["gpus"]
        fields["gpus_per_node"] = (gpus, "calibration", f"{made}: " + (
            "--gpus-per-node" if options.gpus_per_node else "torch.cuda.device_count()"))
        how = f"{made}: {d2h['method']}; {d2h['bytes'] / 1e9:.2g} GB, {d2h['gpu']}"
        for name in ("d2h_pinned_GBps", "d2h_pageable_GBps", "pin_GBps"):
            fields[name] = (d2h[name], "calibration", how)
    else:
        gpus = options.gpus_per_node or 8
        fields["gpus_per_node"] = (gpus, "calibration", f"{made}: " + (
            "--gpus-per-node" if options.gpus_per_node else "the most ranks the study runs on one CPU machine "
            "(FACTS.md: 8 ranks as a slow smoke test on 2 cores); the calibration ran 2 and 4"))
        rate = copy["MBps"]["median"] / 1e3
        how = (f"{made}: host memcpy, {copy['jobs']} at once ({copy['method']}), median of "
               f"{copy['MBps']['min']:.0f}-{copy['MBps']['max']:.0f} MB/s; no GPU: the term is 0 on cpu")
        for name in ("d2h_pinned_GBps", "d2h_pageable_GBps", "pin_GBps"):
            fields[name] = (rate, "calibration", how)
    cited = clusters.load_cluster(CLUSTER_EXAMPLE)
    for name in ("dist_init_anchor_ranks", "dist_init_anchor_s", "async_slowdown_fraction", "gpu_peak_tflops", "mfu"):
        basis, source = cited.sources[name]
        fields[name] = (getattr(cited, name), basis, source if name not in ("gpu_peak_tflops", "mfu") else
                        f"clusters/h100-pfs.yaml's ({source}): not calibrated; give --iteration-s, or edit it for "
                        "this machine's GPU")
    return clusters.cluster_from_mapping({k: {"value": v, "basis": b, "source": s}
                                          for k, (v, b, s) in fields.items()}, str(options.out))


def write_atomically(files: dict[Path, str], check: Callable[[dict[Path, Path]], None] | None = None) -> None:
    """Write every file under a temporary name beside it (fsync'd), call ``check`` with {final: temporary}, then
    rename each into place in the order given (the last one, the cluster file, names the others) and fsync the
    folders. On any failure before the renames the temporaries are removed and no final path is touched."""
    temporaries: dict[Path, Path] = {}
    try:
        for path, text in files.items():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporaries[path] = tmp
            with open(tmp, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        if check is not None:
            check(dict(temporaries))
    except BaseException:
        for tmp in temporaries.values():
            tmp.unlink(missing_ok=True)
        raise
    for path, tmp in temporaries.items():
        os.replace(tmp, path)
    for folder in {path.parent for path in files}:
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _check_written(options: Options) -> Callable[[dict[Path, Path]], None]:
    """Loads the temporaries back as what they will be: the cluster file through load_cluster, the fit through
    read_fit (each error a CalibrationError: nothing is renamed)."""
    def check(temporaries: dict[Path, Path]) -> None:
        try:
            fitting.read_fit(temporaries[options.fit_path])
            cluster = clusters.load_cluster(temporaries[options.out])
        except (clusters.ClusterError, fitting.FitError) as error:
            raise CalibrationError(f"the calibration's own files do not load back: {error}") from error
        if cluster.calibration != options.fit_path.name:
            raise CalibrationError(f"the cluster file names {cluster.calibration}, not {options.fit_path.name}")
    return check


# -- the calibration -----------------------------------------------------------------------------------------


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def calibrate(options: Options, steps: list[Step] | None = None) -> dict[str, Any]:
    """Every step of ``plan_steps(options)`` in order, each announced and timed; writes the three files at the end
    (``write_atomically``) and returns the record. CalibrationError (nothing written) where a run failed, the fit
    cannot fit a term, or an engine asked for was not fitted."""
    steps = plan_steps(options) if steps is None else steps
    start, when = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs_folder = options.logs / "runs"
    record: dict[str, Any] = {"started": when, "load_average_at_start": _load_average(), "steps": [],
                              "options": {k: list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v
                                          for k, v in dataclasses.asdict(options).items()}}
    cases = tuple(s.case for s in steps if s.case is not None)
    jobs = probe_jobs(cases) if cases else 2
    figures: dict[str, Any] = {}
    say(f"calibrate: {len(steps)} steps, about {sum(s.expected_s for s in steps) / 60:.0f} min on the study's "
        f"2-CPU machine; runs in {runs_folder}, files {options.out}, {options.fit_path.name}, "
        f"{options.record_path.name}")
    for number, step in enumerate(steps, 1):
        head = f"step {number}/{len(steps)} {step.kind} {step.name}"
        if step.skip:
            say(f"{head}: skipped: {step.skip}")
            record["steps"].append({"step": step.name, "kind": step.kind, "skipped": step.skip, "wall_s": 0.0})
            continue
        say(f"{head} ...")
        began = time.perf_counter()
        entry: dict[str, Any] = {"step": step.name, "kind": step.kind}
        if step.kind == "run":
            result = run_case(step.case, runs_folder, options.timeout_s,
                              () if options.run_device == "auto" else ("--device", options.run_device),
                              log_dir=options.logs / "calibrate-logs")
            entry |= result
            status = result.get("note") or f"exit {result['exit']}"
        elif step.kind == "probe":
            figures[step.name] = entry["figures"] = _probe(step, options, jobs)
            status = "done"
        elif step.kind == "fit":
            entry |= _fit(runs_folder, cases, record["steps"], options)
            figures["fit"] = entry.pop("fit")
            status = f"{len(entry['runs'])} runs fitted"
        else:
            limits = {"storage": _find(figures, "storage limits"), "host_copy": _find(figures, "host copy")}
            d2h = _find(figures, "d2h", required=False)
            cluster = calibrated_cluster(options, limits, d2h, when)
            record |= {"limits": limits, "d2h": d2h, "wall_s": time.perf_counter() - start}
            entry["wall_s"] = time.perf_counter() - began
            record["steps"].append(entry)
            header = (f"{cluster.name}, written by python -m restartbench.whatif --calibrate ({when}): its limits "
                      f"as measured,\nthe engines' and start-up constants in {options.fit_path.name}, what ran in "
                      f"{options.record_path.name}.")
            write_atomically({options.fit_path: json.dumps(fitting.to_json(figures["fit"]), indent=1) + "\n",
                              options.record_path: json.dumps(record, indent=1, default=str) + "\n",
                              options.out: clusters.cluster_text(cluster, header)}, _check_written(options))
            say(f"{head}: {options.out}, {options.fit_path.name}, {options.record_path.name} written")
            continue
        entry["wall_s"] = time.perf_counter() - began
        record["steps"].append(entry)
        say(f"{head}: {status} in {entry['wall_s']:.0f} s (total {time.perf_counter() - start:.0f} s)")
        if step.kind == "run" and result["exit"] != 0:
            say(f"  {step.case.label} failed; its output: {result['log']}")
    say(f"calibrate: done in {time.perf_counter() - start:.0f} s")
    return record


def _find(figures: dict[str, Any], prefix: str, required: bool = True) -> Any:
    for name, value in figures.items():
        if name.startswith(prefix):
            return value
    if required:
        raise CalibrationError(f"the calibration's steps have no {prefix!r} probe, which the cluster file needs")
    return None


def _probe(step: Step, options: Options, jobs: int) -> dict[str, Any]:
    if step.name.startswith("storage limits"):
        return probes.storage_limits(options.logs / "probe", jobs=jobs, size_mib=PROBE_MIB, repeats=PROBE_REPEATS)
    if step.name == "host copy":
        return probes.host_copy_MBps(HOST_COPY_BYTES, jobs=jobs)
    if step.name == "d2h":
        try:
            return probes.d2h_probe(D2H_BYTES, D2H_REPEATS)
        except probes.ProbeError as error:
            raise CalibrationError(f"the d2h probe: {error}") from error
    raise CalibrationError(f"unknown probe {step.name!r}")


def _fit(runs_folder: Path, cases: tuple[Case, ...], done: list[dict], options: Options) -> dict[str, Any]:
    """The fit on the complete runs of the planned cases; refused (naming the runs, or the term and the runs that
    would fit it) where a run failed or a term cannot be fitted."""
    from restartbench.analysis import collect

    failed = [s for s in done if s.get("kind") == "run" and s.get("exit") != 0]
    if failed:
        raise CalibrationError(
            f"{len(failed)} calibration run(s) did not complete, so nothing is written: "
            + "; ".join(f"{s['step']} ({s.get('note') or 'exit ' + str(s['exit'])}, output in {s.get('log')})"
                        for s in failed)
            + f". Rerun the same command: the {len(done) - len(failed)} complete run(s) in {runs_folder} are reused")
    if not runs_folder.is_dir():
        raise CalibrationError(f"{runs_folder} holds no runs: the calibration's steps ran none")
    collected = collect(runs_folder)
    table = collected.table()
    planned = {str(found.resolve()) for case in cases if (found := completed(runs_folder, case)) is not None}
    table = table[[str(Path(run).resolve()) in planned for run in table["run"]]]
    limits = fitting.Limits(_find_storage(done, "write"), _find_storage(done, "read"),
                            f"calibration: storage limits of {runs_folder.parent / 'probe'}")
    try:
        fit = fitting.fit_table(table, limits, per_process(collected))
    except fitting.FitError as error:
        raise CalibrationError(f"the fit refused: {error}") from error
    problems = [f"{engine}: {why}" for engine, why in fit.unfitted.items()]
    asked = {c.engine if c.scale is None else f"{c.engine}-emulated" for c in cases}
    problems += [f"{engine}: no complete run was fitted; runs that would fit it: "
                 + ", ".join(c.label for c in cases if (c.engine if c.scale is None else f"{c.engine}-emulated")
                             == engine)
                 for engine in sorted(asked - set(fit.engines) - set(fit.unfitted))]
    if problems:
        raise CalibrationError("too few runs to fit the model, so nothing is written: " + "; ".join(problems))
    return {"fit": fit, "runs": sorted(planned), "notes": {f"{engine} {term}": line.note
                                                          for engine, terms in fit.engines.items()
                                                          for term, line in terms.items() if line.note}}


def _find_storage(done: list[dict], side: str) -> float:
    for step in done:
        if step["step"].startswith("storage limits") and "figures" in step:
            return step["figures"][side]["MBps"]["median"] / 1e3
    raise CalibrationError("the fit needs the storage limits probe, which did not run")

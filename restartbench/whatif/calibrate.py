"""``python -m restartbench.whatif --calibrate --out FILE``: fit the what-if model on this machine (issue 26, item 4).

    python -m restartbench.whatif --calibrate --out clusters/mine.yaml                  # runs, probes, fit, write
    python -m restartbench.whatif --calibrate --out clusters/mine.yaml --dry-run        # the steps, nothing run
    python -m restartbench.whatif --calibrate --out clusters/mine.yaml --logs /scratch/cal --engines torch,lazy

A short, fixed set of steps (``plan_steps``), each printed with how long it took:

1. probes: the storage limits of the run folder's file system at the checkpoint's concurrency
   (``restartbench.whatif.limits.storage_limits``: fio and threaded buffered I/O, best method, min/median/max over
   the repeats), the host copy (``limits.host_copy_MBps``), and, where torch sees a CUDA device, its pinned and
   pageable device-to-host copies and the cost of pinning (``limits.d2h_probe``; on a CPU machine skipped, with why),
   and the seconds a collective engine's coordinator spends per item planned at a save and at a load
   (``restartbench.engines.dcp.coordinator``: DCP's, on every rank's plans of 70B tp8pp8dp32; skipped without dcp or
   dcp-async);
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

With ``--slurm`` (calibration under Slurm, 1 and 2 nodes) three kinds of step are added:

- shared storage: the write and read probe on two Slurm nodes at once and on the first alone (``srun``, one task
  per node; ``limits.shared_storage_limits``) against the file system ``--logs`` is on: its aggregate over the nodes
  and one client's figure, the cluster file's ``shared_*`` fields (storage ``shared``);
- 2-node runs (``sbatch`` through ``config-n-run.py --launcher slurm --nnodes 2 --submit``, waited for): tiny on
  tp1pp1dp2 through the first engine, the emulated big checkpoint at its larger scale through each emulated engine,
  beside the 1-node runs in the fit (their durable and load times across nodes);
- nodes that are one host (two slurmd on one machine, one boot id) are said so, and fitted as one node of all their
  processes (``restartbench.whatif.slurm``). Without a usable Slurm (no ``sinfo``, ``sinfo`` failing, fewer than 2
  idle nodes) ``--slurm`` is refused before anything runs, saying what to do (``slurm_nodes``).

Resumable: a run folder under ``--logs`` that already holds a complete run of a step's case is reused, not run again
(rerun the same command after a failure or an interruption). Bad input (an ``--out`` that is not a new ``.yaml``
file in an existing folder, an unknown engine, ``--logs`` that is a file) is refused before anything runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restartbench.engines import cost_traits
from restartbench.engines.dcp import coordinator
from restartbench.layout import LayoutError
from restartbench.plan import config_named, setup_for
from restartbench.progress import say
from restartbench.whatif import cluster as clusters
from restartbench.whatif import fit as fitting
from restartbench.whatif import limits as probes
from restartbench.whatif.calibration_runs import Case, completed, emulate_scales, per_process, run_case
from restartbench.whatif.slurm import (
    SLURM_HOWTO,
    SLURM_NODES,
    SlurmNodes,
    one_host_as_one_node,
    parse_sinfo,
    shared_fields,
    shared_summary,
)

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
#: average of 20 each run took about 7 times as long (docs/calibrate.md). The --slurm steps, from the first --slurm
#: calibration (2026-11-26, two slurmd on this host, load 16 falling to 7): the shared probe 13 s; the 2-node tiny run
#: 156 s and 2-node emulated 3B 136 s, each about 0.9 times its 1-node neighbour run minutes before it (179 s, 149 s)
#: as the load fell, so taken as the 1-node figure plus a few seconds of sbatch and polling.
EXPECTED_S = {"storage limits": 60.0, "host copy": 2.0, "d2h": 2.0, "collective planner": 25.0, "fit": 15.0,
              "write": 1.0,
              "shared storage": 13.0,
              ("tiny", "tp1pp1dp2"): 32.0, ("small", "tp1pp1dp2"): 90.0, ("tiny", "tp1pp1dp4"): 60.0,
              (EMULATED_PRESET, EMULATED_LAYOUT): 35.0,
              ("tiny", "tp1pp1dp2", 2): 35.0, (EMULATED_PRESET, EMULATED_LAYOUT, 2): 40.0}


class CalibrationError(ValueError):
    """A calibration that cannot run or cannot be fitted; the message says why and what would fix it."""


# -- the cases -------------------------------------------------------------------------------------------------


def calibration_cases(engines: tuple[str, ...] = DEFAULT_ENGINES,
                      emulated_engines: tuple[str, ...] | None = None, slurm: bool = False) -> tuple[Case, ...]:
    """The runs a calibration fits on. Real: tiny and small on tp1pp1dp2 per engine (two presets: the byte and
    parameter slopes), tiny on tp1pp1dp4 through the first engine (a second world size: dist init's slope).
    Emulated: 3B tp1pp1dp2 at two scales per engine that has an emulator (``emulated_engines``; None: all).
    With ``slurm``, then on ``SLURM_NODES`` nodes: tiny tp1pp1dp2 through the first engine and the emulated case at
    its larger scale per emulated engine (one rank, or emulating process, per node)."""
    emulated = engines if emulated_engines is None else tuple(e for e in engines if e in emulated_engines)
    real = [Case(preset, "tp1pp1dp2", engine) for engine in engines for preset in ("tiny", "small")]
    real.append(Case("tiny", "tp1pp1dp4", engines[0]))
    cases = (*real, *(Case(EMULATED_PRESET, EMULATED_LAYOUT, engine, scale) for engine in emulated
                      for scale in EMULATED_SCALES))
    if not slurm:
        return cases
    return (*cases, Case("tiny", "tp1pp1dp2", engines[0], nodes=SLURM_NODES),
            *(Case(EMULATED_PRESET, EMULATED_LAYOUT, engine, EMULATED_SCALES[-1], nodes=SLURM_NODES)
              for engine in emulated))


def probe_jobs(cases: tuple[Case, ...]) -> int:
    """The checkpoint's concurrency the storage probe runs at: the writers per node of most calibration runs."""
    return Counter(case.concurrency for case in cases).most_common(1)[0][0]


# -- Slurm -------------------------------------------------------------------------------------------------------


def run_sinfo() -> str:
    """``sinfo -h -N -o %N|%T|%o`` (node, state, NodeAddr per line); CalibrationError where it cannot run.
    Public: tests replace it."""
    missing = [name for name in ("sinfo", "sbatch", "srun") if shutil.which(name) is None]
    if missing:
        raise CalibrationError(f"--slurm: no usable Slurm here ({', '.join(missing)} not on PATH); {SLURM_HOWTO}")
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T|%o"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"--slurm: sinfo did not answer in 30 s; {SLURM_HOWTO}") from None
    if proc.returncode != 0:
        conf = "" if os.environ.get("SLURM_CONF") else " (SLURM_CONF is not set)"
        raise CalibrationError(f"--slurm: no usable Slurm here: sinfo exited {proc.returncode}{conf}: "
                               f"{(proc.stderr.strip().splitlines() or [''])[-1][-300:]}; {SLURM_HOWTO}")
    return proc.stdout


def slurm_nodes(text: str | None = None) -> SlurmNodes:
    """The Slurm the calibration's --slurm steps run on; CalibrationError (saying what to do) where there is none
    usable: sinfo missing or failing, or fewer than ``SLURM_NODES`` idle nodes."""
    found = parse_sinfo(run_sinfo() if text is None else text)
    if len(found.idle) < SLURM_NODES:
        listed = ", ".join(found.nodes) or "none"
        raise CalibrationError(f"--slurm: Slurm has {len(found.idle)} idle node(s) (nodes: {listed}), the "
                               f"calibration's 2-node steps need {SLURM_NODES}; wait for them, or {SLURM_HOWTO}")
    return found


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
    via: str = ""
    """How a Slurm step runs (srun or sbatch, its nodes); '' for a step of this node."""


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
    cases = calibration_cases(options.engines, emulated_engines=_emulated_engines(), slurm=options.slurm)
    gpu_skip = gpu_visible() if gpu_skip is None else gpu_skip
    one_node = tuple(case for case in cases if case.nodes == 1)
    steps = [Step(f"storage limits ({probe_jobs(one_node)} writers x {PROBE_MIB} MiB, {PROBE_REPEATS} repeats)",
                  "probe", EXPECTED_S["storage limits"]),
             Step("host copy", "probe", EXPECTED_S["host copy"]),
             Step("d2h", "probe", EXPECTED_S["d2h"] if not gpu_skip else 0.0, skip=gpu_skip),
             _planner_step(options.engines)]
    multi = tuple(case for case in cases if case.nodes > 1)
    if multi:
        steps.append(Step(f"shared storage ({SLURM_NODES} nodes at once and one alone, {probe_jobs(multi)} writer(s) "
                          f"per node x {PROBE_MIB} MiB, {PROBE_REPEATS} repeats)", "probe",
                          EXPECTED_S["shared storage"],
                          via=f"srun --nodes {SLURM_NODES} --ntasks-per-node 1"))
    steps += [Step(case.label, "run", EXPECTED_S.get((case.preset, case.layout, case.nodes) if case.nodes > 1
                                                     else (case.preset, case.layout), 60.0), case,
                   via=f"sbatch --nodes {case.nodes} (--launcher slurm --submit), waited for" if case.nodes > 1
                   else "")
              for case in cases]
    return [*steps, Step("fit", "fit", EXPECTED_S["fit"]), Step("write", "write", EXPECTED_S["write"])]


def _planner_step(engines: tuple[str, ...]) -> Step:
    """The probe of a collective engine's coordinator (``coordinator.PROBE``), skipped where no engine
    calibrated is collective (nothing would use it)."""
    if any(cost_traits(engine).collective for engine in engines):
        return Step("collective planner", "probe", EXPECTED_S["collective planner"])
    return Step("collective planner", "probe", 0.0, skip="no collective engine (dcp, dcp-async) among the engines "
                                                         "calibrated: none predicted needs its coordinator's rate")


def _emulated_engines() -> tuple[str, ...]:
    from restartbench.engines import emulated_engines

    return tuple(emulated_engines())


def check_options(options: Options) -> None:
    """Refuses bad input before anything runs or is written (CalibrationError)."""
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
        if not engine_info(engine).saves_state:
            raise CalibrationError(f"--engines: {engine!r} saves no checkpoint, so there is nothing to fit")
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


# -- the cluster file ------------------------------------------------------------------------------------------


def _storage_fields(storage: dict[str, Any], made: str) -> dict[str, tuple[Any, str, str]]:
    """The node's own disk as the calibration's storage probe measured it; no shared file system (one node)."""
    write, read = storage["write"], storage["read"]
    measured = (f"{storage['jobs']} writers at once (the calibration runs' checkpoint concurrency), "
                f"{storage['size_mib_per_job']} MiB each, {storage['repeats']} repeats on {storage['target']}")
    return {
        "local_write_GBps": (write["MBps"]["median"] / 1e3, "calibration",
                             f"{made}: best of {', '.join(write['methods'])}: {write['best']}, "
                             f"{probes.spread_text(write['MBps'])}; {measured}"),
        "local_read_GBps": (read["MBps"]["median"] / 1e3, "calibration",
                            f"{made}: best of {', '.join(read['methods'])}: {read['best']}, "
                            f"{probes.spread_text(read['MBps'])}; {measured}"),
        "storage": ("local", "calibration", f"{made}: the file system of {storage['target']}, as one node sees it"),
        "shared_write_GBps": (0.0, "calibration", f"{made}: not measured (one node; no shared file system figure)"),
        "shared_read_GBps": (0.0, "calibration", f"{made}: not measured (one node; no shared file system figure)"),
        "shared_per_client_GBps": (0.0, "calibration", f"{made}: not measured (one node)"),
        "nic_GBps": (0.0, "calibration", f"{made}: not measured (one node)"),
    }


def calibrated_cluster(options: Options, limits: dict[str, Any], d2h: dict[str, Any] | None,
                       when: str, shared: dict[str, Any] | None = None,
                       slurm: SlurmNodes | None = None) -> clusters.Cluster:
    """The calibrated machine as a cluster: its limits and copies as measured (basis ``calibration``, each source
    saying how), the fit file beside it; the constants no single machine measures (dist init at thousands of ranks,
    the GPU's peak and MFU, the slowdown during an asynchronous save) cited, from clusters/h100-pfs.yaml. With the
    shared probe's figures (``--slurm``): storage ``shared``, its aggregate and one client's figure as measured from
    the Slurm nodes, and the nodes Slurm has."""
    made = f"calibration ({when}, python -m restartbench.whatif --calibrate)"
    fields: dict[str, tuple[Any, str, str]] = {
        "name": (options.name or f"{platform.node()}: {os.cpu_count()}-CPU {platform.machine()}"
                 + (f", {d2h['gpus']}x {d2h['gpu']}" if d2h else ", no GPU"), "calibration", made),
        "device": ("cuda" if d2h else "cpu", "calibration",
                   f"{made}: {'torch sees ' + d2h['gpu'] if d2h else 'no CUDA device visible'}"),
        "nodes": (1, "calibration", f"{made}: one node (without --slurm)"),
        "cpu_cores_per_node": (os.cpu_count(), "calibration", f"{made}: os.cpu_count() where the calibration ran, "
                               "by which its runs' CPU share was taken in the fit"),
        **_storage_fields(limits["storage"], made),
        "calibration": (options.fit_path.name, "calibration", f"{made}: the fit of its runs"),
    }
    if shared:
        fields |= shared_fields(shared, slurm, made)
        if shared["one_host"]:  # the nodes share this host's cores, as they share its disk
            nodes = len(shared["nodes"])
            fields["cpu_cores_per_node"] = (max(1, (os.cpu_count() or 1) // nodes), "calibration",
                                            f"{made}: os.cpu_count() where the calibration ran ({os.cpu_count()}) "
                                            f"over its {nodes} Slurm nodes, which are that one host")
    fields |= _copy_fields(options, d2h, limits["host_copy"], made) | _cited_fields()
    return clusters.cluster_from_mapping({k: {"value": v, "basis": b, "source": s}
                                          for k, (v, b, s) in fields.items()}, str(options.out))


def _copy_fields(options: Options, d2h: dict[str, Any] | None, copy: dict[str, Any],
                 made: str) -> dict[str, tuple[Any, str, str]]:
    """GPUs per node and the device-to-host and pinning rates: the D2H probe's where a GPU was visible, else the
    host copy's (the term is 0 on cpu)."""
    if d2h:
        how = f"{made}: {d2h['method']}; {d2h['bytes'] / 1e9:.2g} GB, {d2h['gpu']}"
        return {"gpus_per_node": (options.gpus_per_node or d2h["gpus"], "calibration", f"{made}: " + (
                    "--gpus-per-node" if options.gpus_per_node else "torch.cuda.device_count()")),
                **{name: (d2h[name], "calibration", how) for name in ("d2h_pinned_GBps", "d2h_pageable_GBps",
                                                                      "pin_GBps")}}
    how = (f"{made}: host memcpy, {copy['jobs']} at once ({copy['method']}), "
           f"{probes.spread_text(copy['MBps'])}; no GPU: the term is 0 on cpu")
    return {"gpus_per_node": (options.gpus_per_node or 8, "calibration", f"{made}: " + (
                "--gpus-per-node" if options.gpus_per_node else "the most ranks the study runs on one CPU machine "
                "(FACTS.md: 8 ranks as a slow smoke test on 2 cores); the calibration ran 2 and 4")),
            **{name: (copy["MBps"]["median"] / 1e3, "calibration", how) for name in ("d2h_pinned_GBps",
                                                                                   "d2h_pageable_GBps", "pin_GBps")}}


def _cited_fields() -> dict[str, tuple[Any, str, str]]:
    """The constants no single machine measures, cited from clusters/h100-pfs.yaml."""
    cited, fields = clusters.load_cluster(CLUSTER_EXAMPLE), {}
    for name in ("dist_init_anchor_ranks", "dist_init_anchor_s", "async_slowdown_fraction", "gpu_peak_tflops", "mfu"):
        basis, source = cited.sources[name]
        fields[name] = (getattr(cited, name), basis, source if name not in ("gpu_peak_tflops", "mfu") else
                        f"clusters/h100-pfs.yaml's ({source}): not calibrated; give --iteration-s, or edit it for "
                        "this machine's GPU")
    return fields


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


def check_written(options: Options) -> Callable[[dict[Path, Path]], None]:
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


def calibrate(options: Options, steps: list[Step] | None = None, slurm: SlurmNodes | None = None) -> dict[str, Any]:
    """Every step of ``plan_steps(options)`` in order, each announced and timed; writes the three files at the end
    (``write_atomically``) and returns the record. CalibrationError (nothing written) where a run failed, the fit
    cannot fit a term, or an engine asked for was not fitted; with ``options.slurm``, before anything runs, where
    there is no usable Slurm (``slurm_nodes``; ``slurm``: what it found, given)."""
    if options.slurm and slurm is None:
        slurm = slurm_nodes()
    calibration = _Calibration(options, plan_steps(options) if steps is None else steps, slurm)
    calibration.announce()
    for number, step in enumerate(calibration.steps, 1):
        calibration.take(f"step {number}/{len(calibration.steps)} {step.kind} {step.name}", step)
    say(f"calibrate: done in {calibration.elapsed():.0f} s")
    return calibration.record


class _Calibration:
    """One calibration as its steps go: the record it writes (``record``) and what its probes and fit found
    (``figures``), each step kind a method of its own (``take``)."""

    def __init__(self, options: Options, steps: list[Step], slurm: SlurmNodes | None):
        self.options, self.steps, self.slurm = options, steps, slurm
        self.start, self.when = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.runs_folder = options.logs / "runs"
        self.record: dict[str, Any] = {
            "started": self.when, "load_average_at_start": _load_average(), "steps": [],
            "options": {k: list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v
                        for k, v in dataclasses.asdict(options).items()}}
        if slurm is not None:
            self.record["slurm"] = {k: list(v) if isinstance(v, tuple) else v
                                    for k, v in dataclasses.asdict(slurm).items()}
        self.cases = tuple(s.case for s in steps if s.case is not None)
        one_node = tuple(c for c in self.cases if c.nodes == 1)
        multi = tuple(c for c in self.cases if c.nodes > 1)
        self.jobs, self.jobs_shared = probe_jobs(one_node) if one_node else 2, probe_jobs(multi) if multi else 1
        self.figures: dict[str, Any] = {}
        self.cluster: clusters.Cluster | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def announce(self) -> None:
        options = self.options
        say(f"calibrate: {len(self.steps)} steps, about {sum(s.expected_s for s in self.steps) / 60:.0f} min on the "
            f"study's 2-CPU machine; runs in {self.runs_folder}, files {options.out}, {options.fit_path.name}, "
            f"{options.record_path.name}")
        if self.slurm is not None:
            say(f"calibrate: {self.slurm.line()}")

    def take(self, head: str, step: Step) -> None:
        """Do ``step`` (announced as ``head``), timed, and record it; the write step writes the files last."""
        if step.skip:
            say(f"{head}: skipped: {step.skip}")
            self.record["steps"].append({"step": step.name, "kind": step.kind, "skipped": step.skip, "wall_s": 0.0})
            return
        say(f"{head} ...")
        began = time.perf_counter()
        entry: dict[str, Any] = {"step": step.name, "kind": step.kind}
        status = {"run": self.run, "probe": self.probe, "fit": self.fit, "write": self.conclude}[step.kind](step, entry)
        entry["wall_s"] = time.perf_counter() - began
        self.record["steps"].append(entry)
        if step.kind == "write":
            self.write_files()
            say(f"{head}: {status}")
            return
        say(f"{head}: {status} in {entry['wall_s']:.0f} s (total {self.elapsed():.0f} s)")
        if step.kind == "run" and entry["exit"] != 0:
            say(f"  {step.case.label} failed; its output: {entry['log']}")

    def run(self, step: Step, entry: dict[str, Any]) -> str:
        """A whole study run of the step's case (reused where --logs holds a complete one)."""
        options = self.options
        entry |= run_case(step.case, self.runs_folder, options.timeout_s,
                          () if options.run_device == "auto" else ("--device", options.run_device),
                          log_dir=options.logs / "calibrate-logs")
        return entry.get("note") or f"exit {entry['exit']}"

    def probe(self, step: Step, entry: dict[str, Any]) -> str:
        self.figures[step.name] = entry["figures"] = run_probe(step, self.options,
                                                               self.jobs_shared if step.via else self.jobs)
        return shared_summary(entry["figures"]) if step.name.startswith("shared storage") else "done"

    def fit(self, step: Step, entry: dict[str, Any]) -> str:
        shared = _find(self.figures, "shared storage", required=False)
        entry |= fit_runs(self.runs_folder, self.cases, self.record["steps"], self.options,
                          one_host=bool(shared and shared["one_host"]))
        planner = _find(self.figures, "collective planner", required=False) or {}
        self.figures["fit"] = dataclasses.replace(entry.pop("fit"),
                                                  collective_plan_s_per_item=planner.get("per_item_s"),
                                                  collective_load_plan_s_per_item=planner.get("load_per_item_s"))
        return f"{len(entry['runs'])} runs fitted"

    def conclude(self, step: Step, entry: dict[str, Any]) -> str:
        """The cluster file's contents from the probes' limits; the files are written once the step is recorded."""
        limits = {"storage": _find(self.figures, "storage limits"), "host_copy": _find(self.figures, "host copy")}
        d2h = _find(self.figures, "d2h", required=False)
        shared = _find(self.figures, "shared storage", required=False)
        self.cluster = calibrated_cluster(self.options, limits, d2h, self.when, shared, self.slurm)
        self.record |= {"limits": limits, "d2h": d2h, "shared_storage": shared, "wall_s": self.elapsed()}
        options = self.options
        return f"{options.out}, {options.fit_path.name}, {options.record_path.name} written"

    def write_files(self) -> None:
        options = self.options
        header = (f"{self.cluster.name}, written by python -m restartbench.whatif --calibrate ({self.when}): its "
                  f"limits as measured,\nthe engines' and start-up constants in {options.fit_path.name}, what ran in "
                  f"{options.record_path.name}.")
        write_atomically({options.fit_path: json.dumps(fitting.to_json(self.figures["fit"]), indent=1) + "\n",
                          options.record_path: json.dumps(self.record, indent=1, default=str) + "\n",
                          options.out: clusters.cluster_text(self.cluster, header)}, check_written(options))


def _find(figures: dict[str, Any], prefix: str, required: bool = True) -> Any:
    for name, value in figures.items():
        if name.startswith(prefix):
            return value
    if required:
        raise CalibrationError(f"the calibration's steps have no {prefix!r} probe, which the cluster file needs")
    return None


def run_probe(step: Step, options: Options, jobs: int) -> dict[str, Any]:
    """The figures of one probe step, measured with ``jobs`` writers. Public: tests replace it."""
    if step.name.startswith("storage limits"):
        return probes.storage_limits(options.logs / "probe", jobs=jobs, size_mib=PROBE_MIB, repeats=PROBE_REPEATS)
    if step.name == "host copy":
        return probes.host_copy_MBps(HOST_COPY_BYTES, jobs=jobs)
    if step.name == "collective planner":  # DCP's coordinator on this machine's CPU: per item planned
        preset, layout, dtype = coordinator.PROBE
        return coordinator.measure(setup_for(config_named(preset, layout, "dcp", dtype)))
    if step.name == "d2h":
        try:
            return probes.d2h_probe(D2H_BYTES, D2H_REPEATS)
        except probes.ProbeError as error:
            raise CalibrationError(f"the d2h probe: {error}") from error
    if step.name.startswith("shared storage"):
        try:
            return probes.shared_storage_limits(options.logs / "probe-shared", SLURM_NODES, jobs, PROBE_MIB,
                                                PROBE_REPEATS, timeout=options.timeout_s)
        except probes.ProbeError as error:
            raise CalibrationError(f"the shared storage probe: {error}; nothing is written. Rerun the same command "
                                   "(complete runs are reused)") from error
    raise CalibrationError(f"unknown probe {step.name!r}")


def fit_runs(runs_folder: Path, cases: tuple[Case, ...], done: list[dict], options: Options,
             one_host: bool = False) -> dict[str, Any]:
    """The fit on the complete runs of the planned cases; refused (naming the runs, or the term and the runs that
    would fit it) where a run failed or a term cannot be fitted. With ``one_host`` (the Slurm nodes are one machine)
    a multi-node run enters the fit as one node (``one_host_as_one_node``). Public: tests replace it."""
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
    notes = {}
    if one_host:
        table, notes = one_host_as_one_node(table)
    limits = fitting.Limits(_find_storage(done, "write"), _find_storage(done, "read"),
                            f"calibration: storage limits of {runs_folder.parent / 'probe'}")
    try:
        fit = fitting.fit_table(table, limits, per_process(collected), cores_per_node=os.cpu_count(),
                                scales=emulate_scales(collected))
    except fitting.FitError as error:
        raise CalibrationError(f"the fit refused: {error}") from error
    problems = [f"{engine}: {why}" for engine, why in fit.unfitted.items()]
    asked = {c.listed_engine for c in cases}
    problems += [f"{engine}: no complete run was fitted; runs that would fit it: "
                 + ", ".join(c.label for c in cases if c.listed_engine == engine)
                 for engine in sorted(asked - set(fit.engines) - set(fit.unfitted))]
    if problems:
        raise CalibrationError("too few runs to fit the model, so nothing is written: " + "; ".join(problems))
    return {"fit": fit, "runs": sorted(planned), "notes": {**notes, **{f"{engine} {term}": line.note
                                                                     for engine, terms in fit.engines.items()
                                                                     for term, line in terms.items() if line.note}}}


def _find_storage(done: list[dict], side: str) -> float:
    for step in done:
        if step["step"].startswith("storage limits") and "figures" in step:
            return step["figures"][side]["MBps"]["median"] / 1e3
    raise CalibrationError("the fit needs the storage limits probe, which did not run")

"""The calibration's cases and their runs (``python -m restartbench.whatif --calibrate``, and
bench/whatif_validation.py's): a case found complete under the runs folder is reused, else run through
``restartbench.cli`` in a fresh interpreter with its output in a log, stopped with its process group past its
timeout; a case on several nodes is submitted to Slurm and waited for on its run folder."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restartbench.engines import listed_as
from restartbench.layout import parse_layout

#: Options of every real run: fp32 (much faster than bf16 on CPUs without bf16 units), two checkpoints (the second's
#: background work seen by the first's clean iterations: the slowdown fraction).
REAL = ("--dtype", "fp32", "--iters", "4", "--save-interval", "2")
#: Options of every emulated run: one checkpoint of the big preset's files, saved and restored.
EMULATED = ("--dtype", "bf16", "--iters", "1", "--save-interval", "1")


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
    def listed_engine(self) -> str:
        """The engine its run is listed under (``engines.listed_as``)."""
        return listed_as(self.engine, emulated=self.scale is not None)

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
        """Processes of one node doing checkpoint I/O at once."""
        return max(1, self.ranks // self.nodes // self.ranks_per_process)

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
    return (meta.get("preset") == case.preset and meta.get("engine") == case.listed_engine
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
    whole process group. A case on several nodes is submitted to Slurm (``--launcher slurm --submit``) and waited for
    until its run folder says complete or failed (``wait_for_job``; cancelled past ``timeout``). Returns {case, exit,
    wall_s, tail, log} (exit 0 and note 'already complete' when reused)."""
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
    job = ""
    if case.nodes > 1 and code == 0:
        job, code, job_log = wait_for_job(folder, log.read_text(errors="replace"), start + timeout)
        log = job_log or log
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
    result = {"case": dataclasses.asdict(case), "exit": code, "wall_s": wall, "tail": tail, "log": str(log)}
    if job:
        result["job"] = job
    if code is None:
        result["note"] = f"stopped after {timeout} s (--timeout)" + (f", job {job} cancelled" if job else "")
    found = completed(folder, case) if code == 0 else None
    if found is not None:
        result["run"] = str(found)
    elif code == 0:
        result |= {"exit": 1, "note": "exited 0 but left no complete run folder"}
    return result


def submitted_job(printed: str) -> str:
    """The job id a ``--submit`` run printed: its last line that is a number ('' where none)."""
    for line in reversed(printed.strip().splitlines()):
        if line.strip().isdigit():
            return line.strip()
    return ""


def wait_for_job(folder: Path, printed: str, deadline: float,
                 poll_s: float = 2.0) -> tuple[str, int | None, Path | None]:
    """A submitted case (bench/whatif_validation.py's wait): (job id, 0 complete or 1 failed, the job's output file)
    once the run folder under ``folder`` whose metadata names the job says so; past ``deadline`` (perf_counter) or on
    an interrupt the job is cancelled (exit None)."""
    job = submitted_job(printed)
    if not job:
        return "", 1, None
    try:
        while time.perf_counter() < deadline:
            for meta_path in Path(folder).rglob("metadata.json"):
                try:
                    meta = json.loads(meta_path.read_text())
                except (OSError, ValueError):
                    continue
                if str(meta.get("job_id")) == job and meta.get("status") in ("complete", "failed"):
                    return job, 0 if meta["status"] == "complete" else 1, meta_path.parent / f"slurm-{job}.out"
            time.sleep(poll_s)
    except BaseException:
        subprocess.run(["scancel", "--full", job], check=False, capture_output=True)
        raise
    subprocess.run(["scancel", "--full", job], check=False, capture_output=True)
    return job, None, None


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
    return {run_id: int(emulation.get("ranks_per_process") or 1) if emulation.get("emulate") else 1
            for run_id, emulation in _emulations(collected)}


def emulate_scales(collected) -> dict[str, float]:
    """run_id → --emulate-scale of each emulated run (config.json; 1.0 for a real run), which the tidy table does not
    carry."""
    return {run_id: float(emulation.get("emulate_scale") or 1.0) if emulation.get("emulate") else 1.0
            for run_id, emulation in _emulations(collected)}


def _emulations(collected) -> Iterator[tuple[str, dict]]:
    for run_id, run in collected.table()[["run_id", "run"]].drop_duplicates().itertuples(index=False):
        yield run_id, json.loads((Path(run) / "config.json").read_text()).get("emulation") or {}

"""Shared fixtures: real tiny-preset study runs, made once per test session and read by several tests."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from restartbench.memo import forget_memoised

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on the loopback now (a rendezvous's MASTER_PORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

# The property tests check logic, not speed: a per-example deadline only fails them on a loaded machine.
settings.register_profile("restartbench", deadline=None)
settings.load_profile("restartbench")

# A skip hides a guarantee that was not checked: only the GPU tests may skip (on a machine without a GPU).
# Where a tool cannot be installed (no root for fio, Slurm or a tmpfs), RESTARTBENCH_ALLOW_SKIPS=1 lets the
# run pass with its skips listed; CI never sets it.
ALLOW_SKIPS = "RESTARTBENCH_ALLOW_SKIPS"
_forbidden_skips: list[str] = []


def _record_forbidden_skip(report) -> None:
    if report.skipped and "gpu" not in getattr(report, "keywords", {}):  # a module skip has no keywords
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _forbidden_skips.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report):
    _record_forbidden_skip(report)


def pytest_collectreport(report):
    _record_forbidden_skip(report)


def pytest_sessionfinish(session, exitstatus):
    _stop_ops_build()
    if _forbidden_skips and not os.environ.get(ALLOW_SKIPS) and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if not _forbidden_skips:
        return
    verdict = "allowed by " + ALLOW_SKIPS if os.environ.get(ALLOW_SKIPS) else \
        f"the run FAILS: only GPU tests may skip (set {ALLOW_SKIPS}=1 where a tool cannot be installed)"
    terminalreporter.section(f"{len(_forbidden_skips)} non-GPU skips: {verdict}")
    for line in _forbidden_skips:
        terminalreporter.write_line(line)

# DeepSpeed's writer engines (FastPersist, decoupled) JIT-build its pin_memory, async_io and utils ops on their first
# run on a machine (restartbench.engines.deepspeed: _torch_extensions_dir), about 15 CPU-minutes on 2 cores. The
# suite leaves part of the CPU idle, so a session that will run a test marked deepspeed_ops starts DeepSpeed's own
# build at once, at the lowest priority, through the calls those engines make in every rank, with the ranks'
# environment; a marked test waits for it and fails with its output if it failed. A rank that finds the build still
# running waits on torch's build lock; one that finds it done only loads it.
DS_OPS = "deepspeed_ops"
_BUILD_OPS = ("from deepspeed.ops.op_builder import AsyncIOBuilder\n"
              "from restartbench.engines.deepspeed.engine import use_deepspeed_utils_op\n"
              "AsyncIOBuilder().load(verbose=False)\n"
              "use_deepspeed_utils_op()\n")
_ops_build: dict = {}


def pytest_sessionstart(session):
    """A session forked from a process that ran tests before (mutmut runs each mutant so, bench/mutation.py) starts
    with that process's memoised results: emptied, so the code under test runs (the what-if's tensors per stage,
    cached per preset and layout, otherwise hid every mutant of the function they call). A fresh process has none."""
    forget_memoised()


def pytest_configure(config):
    config.addinivalue_line("markers", f"{DS_OPS}: runs DeepSpeed's writer engines; waits for the session's build of "
                                       "their ops (started in the background at collection)")


def pytest_collection_modifyitems(items):
    """The tests marked deepspeed_ops run last: by then the background build of their ops is over."""
    items.sort(key=lambda item: item.get_closest_marker(DS_OPS) is not None)


def pytest_collection_finish(session):
    if session.config.option.collectonly or not any(item.get_closest_marker(DS_OPS) for item in session.items):
        return
    from restartbench import engines

    if not engines.missing_requirements("fastpersist"):  # else those tests skip, saying why
        _start_ops_build()


def _start_ops_build() -> None:
    """DeepSpeed's ops built (or, already built, loaded) in the background, as a rank of this machine's device would."""
    from restartbench import engines
    from restartbench.launchers import gpu_count

    device = "cuda" if gpu_count() else "cpu"
    env = {**os.environ, "DS_ACCELERATOR": device, **engines.launch_env("fastpersist", device)}
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", _BUILD_OPS], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _ops_build.update(proc=proc, log=log)


@pytest.fixture(autouse=True)
def _deepspeed_ops_built(request):
    """A test marked deepspeed_ops starts once the session's build of DeepSpeed's ops is over: the build, now what the
    suite waits for, gets back the normal priority (where this user may raise it)."""
    if request.node.get_closest_marker(DS_OPS) and _ops_build:
        proc, log = _ops_build["proc"], _ops_build["log"]
        with contextlib.suppress(OSError):  # PermissionError unless root; the build may be over
            os.setpriority(os.PRIO_PGRP, proc.pid, 0)
        if proc.wait() != 0:
            log.seek(0)
            pytest.fail(f"building DeepSpeed's ops failed (exit {proc.returncode}):\n{log.read()[-6000:]}")


def _stop_ops_build() -> None:
    """A build still running when the session ends (its tests deselected by a failure, -x) is interrupted: SIGINT, so
    that torch releases its build lock (a lock left behind would stall every later build)."""
    proc = _ops_build.get("proc")
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)

# (layout, dtype, extra options): the three layouts the suite proves, one in bf16 (slow on these CPUs),
# one with activation recomputation.
STUDY_CASES = [("tp2pp2", "fp32", ()), ("pp2dp2", "bf16", ()),
               ("tp1pp1dp2", "fp32", ("--activation-checkpoint-interval", "1"))]


def chunked_sha256(data: bytes, chunk: int = 64 * 2**20) -> str:
    """The manifests' file hash (restartbench.storage.filehash, sha256-chunked-v1) written from hashlib alone, as its
    docstring states the format: the header, then each chunk's SHA-256 digest in order."""
    import hashlib

    digests = b"".join(hashlib.sha256(data[i:i + chunk]).digest() for i in range(0, len(data), chunk))
    return hashlib.sha256(f"sha256-chunked-v1 {chunk} {len(data)}\n".encode() + digests).hexdigest()


def run_study(logs: Path, *argv: str, timeout: int = 600, env: dict | None = None
              ) -> tuple[subprocess.CompletedProcess, Path | None]:
    """Run config-n-run.py with a fresh logs root; return the process and the run folder it made."""
    before = set(logs.glob("*/*/*/*"))
    proc = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), *argv, "--logs", str(logs)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    made = sorted(set(logs.glob("*/*/*/*")) - before)
    return proc, (made[-1] if made else None)


def relaunch(run_dir: Path, *options: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A restore-only relaunch of a run folder (``./submit-job.sh --restore RUN_DIR [OPTIONS]``): a new attempt."""
    return subprocess.run([sys.executable, "-m", "restartbench.relaunch", str(run_dir), *options], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def copy_run(run_dir: Path, logs: Path) -> Path:
    """A copy of a run folder at its place under another logs root, for a test that changes it (a run folder
    relaunches where it is: tests/test_restore_attempts.py proves it of a copy)."""
    copy = logs / run_dir.relative_to(run_dir.parents[3])
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


def last_attempt_events(run_dir: Path) -> list[dict]:
    """The events of the run's latest restore attempt (metadata.json's ``restarts``)."""
    from restartbench.events import read_events

    record = json.loads((run_dir / "metadata.json").read_text())["restarts"][-1]["record"]
    return read_events(run_dir, record)


STUDY_SECRETS = {"AWS_ACCESS_KEY_ID": "AKIARESTARTBENCHTEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t/RESTARTBENCH+value"}
"""Credentials in the environment of every study run: tests/test_faults.py proves none reaches a run folder."""


@pytest.fixture(scope="session")
def study_runs(tmp_path_factory):
    """{layout: (process, run folder)} for STUDY_CASES, all under one logs root, each with its storage baseline and
    STUDY_SECRETS in its environment."""
    logs = tmp_path_factory.mktemp("study") / "logs"
    return {layout: run_study(logs, "tiny", layout, "--dtype", dtype, "--iters", "4", "--save-interval", "2", *extra,
                              env=STUDY_SECRETS)
            for layout, dtype, extra in STUDY_CASES}


@pytest.fixture(scope="session")
def study_logs(study_runs):
    return next(iter(study_runs.values()))[1].parents[3]


# One real run per engine besides torch (whose runs are the session's study_runs), layouts and dtypes spread over
# them: (engine, layout, dtype). tests/test_predict.py holds each run's files to their prediction,
# tests/test_engines_harness.py its restore to exactness.
ENGINE_CASES = [("fastpersist", "pp2dp2", "fp32"),  # every data-parallel writer writes its stage's model file
                ("lazy", "pp2dp1", "bf16"),
                ("dcp", "tp1pp1dp2", "bf16"),  # DCP's deduplication of the module across data-parallel replicas
                ("dcp-async", "pp2dp2", "fp32"),
                ("torchsnapshot", "pp2dp2", "bf16")]


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory):
    """engine -> (process, run folder) of its ENGINE_CASES run, made on first use (4 iterations, saves at 2 and 4)."""
    from restartbench import engines
    from restartbench.plan import PLAN_CACHE

    logs = tmp_path_factory.mktemp("engines") / "logs"
    runs = {}

    def run(engine):
        if engine not in runs:
            missing = engines.missing_requirements(engine)
            if missing:
                pytest.skip("; ".join(missing))
            _, layout, dtype = next(case for case in ENGINE_CASES if case[0] == engine)
            # fastpersist's first run on a machine JIT-builds DeepSpeed's ops (minutes on 2 cores), unless the
            # session's build in the background (DS_OPS) has done it
            runs[engine] = run_study(logs, "tiny", layout, "--dtype", dtype, "--engine", engine, "--iters", "4",
                                     "--save-interval", "2", "--baseline-mib", "0", timeout=1200,
                                     env={PLAN_CACHE: "off"})
        return runs[engine]

    return run


@pytest.fixture(scope="session")
def tiny_dp2_run(tmp_path_factory):
    """A complete tiny tp1pp1dp2 fp32 run saving at iterations 1 and 2 (no storage baseline), made once: read it, or
    change a copy of it (copy_run)."""
    proc, run_dir = run_study(tmp_path_factory.mktemp("tiny-dp2") / "logs", "tiny", "tp1pp1dp2", "--dtype", "fp32",
                              "--iters", "2", "--save-interval", "1", "--baseline-mib", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir

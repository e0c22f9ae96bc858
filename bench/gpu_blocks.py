"""The GPU session's blocks (bench/gpu_session.py): each block's command lines as they would run on this machine,
its expected seconds with the basis of the estimate, what it needs earlier in the visit and what it cleans up.

Blocks, in priority order (``plan_blocks``): ``setup``, ``probe``, ``datastates-build``, ``smoke``, ``gpu-units``,
``engines-1B-<engine>`` (one per engine or variant, ``gpu_results.ENGINES_FIRST`` then ``ENGINES_THEN``), ``tests``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpu_results import ENGINES_FIRST, ENGINES_THEN, engine_of, options_of
from results_io import ROOT, GiB

sys.path.insert(0, str(ROOT))

from restartbench.baseline import DD_FULL, FULL  # noqa: E402
from restartbench.estimate import OPTIMIZER_BYTES_PER_PARAM, weight_bytes  # noqa: E402
from restartbench.presets import get_preset  # noqa: E402

MiB = 2**20


@dataclass(frozen=True)
class Block:
    name: str
    expected_s: float
    basis: str
    """Why ``expected_s``: what was measured or assumed."""
    commands: tuple[tuple[str, ...], ...] = ()
    needs: tuple[str, ...] = ()
    """Blocks that must have ended ``ok`` earlier in this visit."""
    cleanup: tuple[tuple[str, ...], ...] = ()
    """Run after the commands whatever happened (frees the disk for the next block)."""
    env: dict[str, str] = field(default_factory=dict)
    every_visit: bool = False
    """Never skipped for a result held: it prepares the machine (setup)."""
    problem: str | None = None
    """Why the block cannot run at all (found while planning): recorded as its failure, nothing launched."""


@dataclass(frozen=True)
class Where:
    """The folders a session uses on the machine."""

    root: Path = ROOT
    work: Path = Path("/tmp/gpu-session")
    site: Path = Path(os.environ.get("RESTARTBENCH_SITE", "/tmp/site"))
    """Where bench/gpu-session.sh installed the wheels (its RESTARTBENCH_SITE)."""
    wheels: Path = Path(os.environ.get("RESTARTBENCH_WHEELS", ROOT / ".whl"))
    """What the CPU machine's scripts/device-wheels.sh made and the visit carried (RESTARTBENCH_WHEELS)."""

    def block_dir(self, name: str) -> Path:
        return self.work / name

    def log(self, name: str) -> Path:
        return self.work / f"{name}.log"


def runtime_command(path: Path) -> tuple[str, ...]:
    code = ("import json; from restartbench.runtime import runtime_info; "
            f"json.dump(runtime_info(), open({str(path)!r}, 'w'))")
    return (sys.executable, "-c", code)


def setup_block(where: Where) -> Block:
    """The machine's preparation past the wheels, which bench/gpu-session.sh installs into ``where.site`` before
    this script starts (its imports need them): the libaio .debs, and the versions, one import of torch and
    DeepSpeed from that site."""
    wheels = sorted(where.wheels.glob("*.whl"))
    debs = sorted(str(p) for p in where.wheels.glob("*.deb"))  # none: fastpersist's op build will say libaio is missing
    commands = [("dpkg", "-x", deb, "/") for deb in debs] + ([("ldconfig",)] if debs else [])
    commands.append(runtime_command(where.block_dir("setup") / "runtime.json"))
    problem = None if wheels else (f"no wheels in {where.wheels}: run scripts/device-wheels.sh on the CPU machine "
                                   "first and carry ['.whl'] to the GPU machine")
    return Block("setup", 10, "dpkg -x of the libaio .debs and one import of torch and DeepSpeed for the versions "
                 "(the 2026-11-27 visit's setup blocks took 10 and 7 s with the wheels' install, which "
                 "bench/gpu-session.sh now does before this script)", tuple(commands), every_visit=True,
                 problem=problem)


def probe_mib(free_bytes: int, checkpoint: int, reserve: int = 4 * GiB, cap_mib: int = 4096) -> int:
    """The probe's file (one job: the checkpoint's one rank), MiB: at most ``cap_mib`` (each pass ends in fsync or
    reads an evicted file, so 4 GiB measures the disk, not the page cache, in about 3 s a pass at its 1.4-2 GB/s),
    and small enough that the checkpoint and ``reserve`` still fit beside it on the disk."""
    return max(0, min(cap_mib, (free_bytes - checkpoint - reserve) // MiB))


def probe_block(where: Where, free_bytes: int, checkpoint: int) -> Block:
    out, mib = where.block_dir("probe"), probe_mib(free_bytes, checkpoint)
    commands = (
        ("nvidia-smi",),
        ("nvidia-smi", "--query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max",
         "--format=csv", "-f", str(out / "gpu.csv")),
        (sys.executable, str(where.root / "bench/gpu_probe.py"), "--gib", "4", "--repeats", "5",
         "--json", str(out / "copies.json")),
        (sys.executable, str(where.root / "bench/limits.py"), "--dir", str(where.work / "fio"), "--jobs", "1",
         "--mib-per-job", str(mib), "--repeats", "2", "--json", str(out / "limits.json")),
    )
    problem = None if mib >= 1024 else (
        f"{free_bytes / GiB:.1f} GiB free on the disk: a probe file of at least 1 GiB beside a "
        f"{checkpoint / 1e9:.1f} GB "
        "checkpoint and 4 GiB kept free does not fit; free the disk")
    fio = shutil.which("fio")
    disk = (f"fio ({fio}, bench/gpu-session.sh puts scripts/build-fio.sh's on the PATH): its {len(FULL)} methods "
            f"({sum(m.rw == 'write' for m in FULL)} write, {sum(m.rw == 'read' for m in FULL)} read, O_DIRECT with "
            "queues among them), 2 repeats each, with the file written for the reads and the evictions: about 100 s"
            if fio else f"no fio on the PATH (carry scripts/device-wheels.sh's .whl/fio): dd's {len(DD_FULL)} methods "
            "(4 write, 4 read, queue depth 1: lower bounds), 2 repeats each, with the file written for the reads and "
            "the evictions: about 90 s")
    return Block("probe", 140 if fio else 120, "nvidia-smi (2 s); 4 GiB copies each way, pinned and pageable, 5 "
                 "repeats at 11-55 GB/s and 3 pinnings (measured on the H100, 2026-11-26: 23 s with the nvidia-smi "
                 "calls), then the lazy engine's pinning of 4 GiB 3 times with its fault-in, 3 without and 3 into "
                 "huge pages (about 12 s: 0.39 s/GiB without); "
                 f"bench/limits.py, 1 job x {mib} MiB, write ending in fsync at 1.4 GB/s and cold read at 2.0 GB/s, "
                 f"with {disk}", commands, needs=("setup",),
                 cleanup=(("rm", "-rf", str(where.work / "fio")),), problem=problem)


def run_command(where: Where, preset: str, engine: str, logs: Path, *extra: str) -> tuple[str, ...]:
    return (sys.executable, str(where.root / "config-n-run.py"), preset, "tp1pp1", "--device", "cuda", "--engine",
            engine, "--baseline-mib", "0", "--logs", str(logs), *extra)


#: Engine blocks expected to take longer than the others' 200 s: the engine -> (seconds, why).
SLOWER = {
    "fastpersist": (430, "; FastPersist saved at 0.25 GB/s blocking on the H100 (FACTS: 48.1 s for 12.05 GB), so "
                         "about 85 s a save against dcp's 21 s, twice: about 330 s, + the JIT builds of its ops on a "
                         "fresh machine (pin_memory, async_io and utils; about 100 s together, assumed): 430 s"),
    "datastates": (240, " (its package built by datastates-build); + DataStates pins its 20 GiB host cache at each "
                        "launch (cudaMallocHost: 6-10 s at the probe's 0.31-0.47 s/GiB) and writes through one "
                        "host-tier thread, whose writes the durable time now waits for: 240 s, assumed"),
}


def engine_block(where: Where, label: str) -> Block:
    """The 1B run of one engine (``label``: an engine, or a variant of one with its options, ``VARIANTS``)."""
    name, engine = f"engines-1B-{label}", engine_of(label)
    ckpt = where.work / "ckpt" / label
    command = run_command(where, "1B", engine, where.block_dir(name) / "runs", "--dtype", "bf16", "--iters", "2",
                          "--save-interval", "1", "--keep-checkpoints", "1", "--checkpoint-dir", str(ckpt),
                          *options_of(label))
    seconds, slow = SLOWER.get(engine, (200, ""))
    return Block(name, seconds,
                 "1B bf16, 21 GB per checkpoint. The first H100 visit (b87956b): torch's block 344 s, of which about "
                 "120 s the harness's checks; the second (6cd9271): lazy's 275 s and dcp-async's 315 s, of which "
                 "about 110 s the checks. Since then the files are hashed in 64 MiB chunks on every core and each "
                 "digest copies into reused buffers: on the third (dd0987e), lazy-direct's block took 181 s and "
                 "dcp's 175 s: about 200 s" + slow, (command,),
                 needs=("setup", "datastates-build") if engine == "datastates" else ("setup",),
                 cleanup=(("rm", "-rf", str(ckpt)),))


#: The adapter's CUDA test on the build (tests/test_datastates.py): a state saved through DataStates' compiled engine,
#: a CPU tensor changed in place after the save, the files waited for with wait_for_writes, loaded back equal.
ADAPTER_TEST = "adapter_loads_back_equal"
ADAPTER_TEST_BASIS = ("; then the adapter's CUDA test on it (pytest's start, DeepSpeed's import and a 0.25 GB pinned "
                      "cache: about 20 s, assumed)")


def datastates_build_block(where: Where) -> Block:
    """The build, or where this machine already holds one of this source and torch (a visit's second command finds
    the first's: scripts/build-datastates.sh --check), its few seconds of checking it; then the adapter's CUDA test
    on it (``ADAPTER_TEST``)."""
    script = str(where.root / "scripts/build-datastates.sh")
    test = (sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-m", "gpu",
            "tests/test_datastates.py", "-k", ADAPTER_TEST)
    commands = (("bash", script, str(where.site)), test)
    env = {"DATASTATES_SITE": str(where.site)}
    if datastates_built(where):
        return Block("datastates-build", 35, "built earlier on this machine from this source and torch (its stamp "
                     f"in {where.site}/datastates/BUILT): the script checks it and imports it" + ADAPTER_TEST_BASIS,
                     commands, needs=("setup",), env=env)
    return Block("datastates-build", 110, "g++ on the 5 .cpp files of a torch CUDAExtension against CUDA's headers "
                 "(nvcc is asked only its version), in parallel, pip's install and the import check around it: the "
                 "whole block took 67 s on the H100 (the third visit, 16 cores), and the script 212 s on the 2-core "
                 "CPU machine at MAX_JOBS=2 (bench/results/2026-11-27-cpu2-datastates-build)" + ADAPTER_TEST_BASIS,
                 commands, needs=("setup",), env={"MAX_JOBS": "16", **env})


def datastates_built(where: Where) -> bool:
    """Whether ``where.site`` holds a DataStates build of this source and torch (only asked where a build left its
    stamp: the check imports torch)."""
    if not (where.site / "datastates" / "BUILT").is_file():
        return False
    check = ("bash", str(where.root / "scripts/build-datastates.sh"), "--check", str(where.site))
    return subprocess.run(check, env={**os.environ, "PYTHON": sys.executable}, capture_output=True).returncode == 0


def plan_blocks(where: Where, free_bytes: int | None = None) -> list[Block]:
    """Every block, in priority order, with its command lines as they would run on this machine now."""
    # P x (2 bf16 weight bytes + 12 optimizer bytes): DLIO's P·14, 21.0 GB (restartbench.plan's exact prediction
    # builds the model with DeepSpeed, which is not installed before the setup block)
    checkpoint = get_preset("1B").param_count() * (weight_bytes("bf16") + OPTIMIZER_BYTES_PER_PARAM)
    free = shutil.disk_usage(_existing(where.work)).free if free_bytes is None else free_bytes
    smoke_logs = where.block_dir("smoke") / "runs"
    nccl = {"NCCL_DEBUG": "WARN"}
    return [
        setup_block(where),
        probe_block(where, free, checkpoint),
        datastates_build_block(where),
        Block("smoke", 150, "small tp1pp1 (31 M params) twice, torch and lazy: two launches each of about 35 s "
              "(imports, CUDA context, NCCL init), training and saves well under a second each",
              tuple(run_command(where, "small", engine, smoke_logs) for engine in ("torch", "lazy")),
              needs=("setup",), env=nccl),
        Block("gpu-units", 50, "the new CUDA paths' own tests, no study run: the lazy engine's GPU-side copy wait "
              "and in-place pinning, a CUDA state saved and restored with buffered and O_DIRECT reads (12 MB), flash "
              "attention's backward under the proof's deterministic kernels, the chunked digest of device tensors "
              "(the first H100 visit: 14 s for the first two files' 4 tests; the second: 15 s, one failing)",
              ((sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-m", "gpu",
                "tests/test_gpu_lazy.py", "tests/test_proof_kernels.py", "tests/test_verify_chunked.py"),),
              needs=("setup",), env=nccl),
        *(engine_block(where, engine) for engine in ENGINES_FIRST + ENGINES_THEN),
        Block("tests", 480, "tests/test_gpu.py: 6 engines x small tp1pp1 bf16 runs of about 70 s (two launches each)",
              ((sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "tests/test_gpu.py"),),
              needs=("setup",), env=nccl),
    ]


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def block_env(where: Where, block: Block) -> dict[str, str]:
    """The environment of a block's commands: the wheels' site and the checkout first on the import path."""
    path = os.pathsep.join(filter(None, (str(where.site), str(where.root), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TORCH_CUDA_ARCH_LIST": "9.0", **block.env}

"""What a rank needs from torch and DeepSpeed at start-up (imported after the import span)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from restartbench import rundir
from restartbench.config import RunConfig
from restartbench.presets import ModelPreset, get_preset


def preset_for(cfg: RunConfig) -> ModelPreset:
    """The preset with the run's overrides (sequence length) applied."""
    return get_preset(cfg.model.preset, cfg.model.seq_len)


def skip_shm_comm_build() -> None:
    """Stop ``deepspeed.init_distributed`` from JIT-compiling its shared-memory op on CPU.

    The op (about 100 s of g++ on these machines) only serves inference all-reduce; the
    study's collectives go through gloo. ``deepspeed.comm.torch`` is looked up in
    ``sys.modules`` because ``import deepspeed.comm.torch as m`` yields the real ``torch``
    (the package re-exports the name).
    """
    import deepspeed.comm.torch  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def arch_list_deepspeed_can_parse(value: str) -> str:
    """``TORCH_CUDA_ARCH_LIST`` without architecture-specific suffixes: '9.0a' -> '9.0', '10.0f;12.0a+PTX' ->
    '10.0;12.0+PTX'. DeepSpeed's JIT op builder reads each entry's minor version with ``int()`` and dies on
    '0a' (seen on an H100 image whose list names sm_90a); the plain architecture builds the same ops."""
    entries = [entry.strip() for entry in value.replace(" ", ";").split(";") if entry.strip()]
    return ";".join(re.sub(r"^(\d+)\.(\d+)[A-Za-z]+", r"\1.\2", entry) for entry in entries)


def make_cuda_arch_list_parsable() -> str | None:
    """Rewrite this process's ``TORCH_CUDA_ARCH_LIST`` so that DeepSpeed can JIT-build its ops (FastPersist's
    async_io, ...); the note to record, or None when nothing was changed."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    parsable = arch_list_deepspeed_can_parse(value)
    if parsable == value:
        return None
    os.environ["TORCH_CUDA_ARCH_LIST"] = parsable
    return (f"TORCH_CUDA_ARCH_LIST {value!r} -> {parsable!r}: DeepSpeed's JIT op builder cannot parse "
            "architecture-specific suffixes")


CUBLAS_PROOF_WORKSPACE = ":4096:8"
"""cuBLAS's setting for reproducible results (NVIDIA's cuBLAS docs, 'Results reproducibility'): torch refuses a
deterministic matmul without it. It must be set before cuBLAS makes its first handle, so at start-up."""


def prepare_deterministic_proof(device: str) -> str | None:
    """On CUDA, set ``CUBLAS_WORKSPACE_CONFIG`` (unless the user set it) so that the proof's iterations can run with
    deterministic kernels (``proof_kernels``); the note to record, or None (CPU, or already set)."""
    if device != "cuda" or "CUBLAS_WORKSPACE_CONFIG" in os.environ:
        return None
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_PROOF_WORKSPACE
    return (f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_PROOF_WORKSPACE}: the proof's iteration K+1 (phase 1's reference and "
            "the resumed one) runs with torch.use_deterministic_algorithms(True)")


@contextmanager
def proof_kernels(deterministic: bool) -> Iterator[None]:
    """Run the block with deterministic kernels when asked, then restore the previous setting.

    The proof compares iteration K+1 resumed with iteration K+1 of the uninterrupted run bit for bit. On CUDA the
    flash-attention backward accumulates with atomics unless torch's deterministic mode is on (and not warn-only:
    then it stays non-deterministic), so two runs of the same iteration on the same state may differ in the last
    bits. Only those two iterations run deterministically: the timed training iterations run as a user's would.
    On CPU every kernel the study uses is deterministic already, and nothing changes."""
    if not deterministic:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def time_out_new_groups(timeout_s: int) -> str:
    """Make ``timeout_s`` torch's default timeout for the process groups created from now on; the note to record.

    DeepSpeed creates its data-, pipeline- and tensor-parallel groups with ``new_group(ranks)``, which gives them
    torch's default (30 min for gloo, 10 for NCCL), not the timeout given to init: a rank stalled in an iteration
    would hold the others that long (seen: --collective-timeout-s 5 did not end a stall in a training step)."""
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = distributed_c10d.default_pg_nccl_timeout = datetime.timedelta(
        seconds=timeout_s)
    return (f"torch's default process-group timeout set to {timeout_s} s (--collective-timeout-s): DeepSpeed creates "
            "its data-, pipeline- and tensor-parallel groups without a timeout of their own")


def init_distributed(backend: str, timeout_s: int) -> None:
    """The process group, connected before this returns (within the caller's dist-init span). Gloo connects in
    ``init_process_group``; NCCL at its first collective (DeepSpeed gives no ``device_id`` for an eager connect at
    world size 1), which would otherwise be whichever the phase makes first: ``deepspeed.initialize``'s in training,
    the harness's checkpoint check in a restore. One barrier here makes it the dist init's in both."""
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        torch.distributed.barrier(device_ids=[local_rank])


def runtime_info() -> dict[str, Any]:
    import deepspeed

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def write_runtime_info(run_dir: Path, world_size: int) -> None:
    (Path(run_dir) / rundir.RUNTIME).write_text(json.dumps({**runtime_info(), "world_size": world_size}, indent=2))

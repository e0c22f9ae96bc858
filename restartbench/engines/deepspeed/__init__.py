"""DeepSpeed's own checkpoint engines, driven through ``DeepSpeedEngine.save_checkpoint``/``load_checkpoint``: its
default engine (torch.save of every file), FastPersist, the decoupled writer and DataStates-LLM."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from restartbench.engines.base import CostTraits, EngineInfo
from restartbench.engines.deepspeed.options import DeepSpeedOptions
from restartbench.launchers import gpu_count


def _writer_block(decoupled: bool) -> Callable[[DeepSpeedOptions], dict[str, Any]]:
    def block(options: DeepSpeedOptions) -> dict[str, Any]:
        return {"checkpoint": {"writer": {"type": "fast", "decoupled": decoupled,
                                          "io_buffer_size": options.io_buffer_mb * 2**20,
                                          "io_buffer_double": True, "show_statistics": False,
                                          "data_parallel": options.writer_data_parallel}}}
    return block


def _torch_extensions_dir() -> str:
    """Where torch caches JIT-built ops (DeepSpeed's async_io, pin_memory, utils): the user's choice, else
    inside the virtual environment, so the first run's build (minutes on a small CPU) is reused."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    if sys.prefix != sys.base_prefix:
        return os.path.join(sys.prefix, "torch_extensions")
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")


def _libaio_missing() -> list[str]:
    """DeepSpeed's async_io op (FastPersist's writer) is JIT-built against libaio: its header must be
    there, unless the op is already built (cached JIT build or DeepSpeed installed with its ops)."""
    include_dirs = ["/usr/include", "/usr/local/include"] + [
        d for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH") for d in os.environ.get(var, "").split(":") if d]
    if any(os.path.isfile(os.path.join(d, "libaio.h")) for d in include_dirs):
        return []
    built = list(Path(_torch_extensions_dir()).glob("async_io/async_io*.so"))
    spec = importlib.util.find_spec("deepspeed")
    if spec and spec.origin:
        built += list((Path(spec.origin).parent / "ops" / "aio").glob("async_io_op*.so"))
    if built:
        return []
    return ["DeepSpeed's async_io op needs libaio, which is not installed (no libaio.h): install the system package "
            "'libaio-dev' (apt-get install libaio-dev; 'libaio-devel' with dnf/yum); scripts/setup-env.sh does it "
            "when run as root"]


def _writer_env(device: str) -> dict[str, str]:
    """What DeepSpeed's writer engines need in each rank. Their CROSS_RANK/CROSS_SIZE (which DeepSpeed's own
    launcher exports) launch.sh exports for every run: the node's rank, the nodes. FastPersist page-locks its
    I/O buffer; on a CPU-only machine only DeepSpeed's native pinning backend (its pin_memory op, mlock) can, as
    torch's pin_memory() needs an accelerator. On a GPU the engine is left as shipped: torch's pinning."""
    native_pinning = {"DS_PIN_MEMORY_BACKEND": "native"} if device == "cpu" else {}
    return {**native_pinning, "TORCH_EXTENSIONS_DIR": _torch_extensions_dir()}


DATASTATES_BUILD = ("bash scripts/build-datastates.sh /tmp/site (builds third_party/datastates-llm with the machine's "
                    "nvcc and CUDA torch), then export PYTHONPATH=/tmp/site:$PWD")


def _datastates_missing() -> list[str]:
    """DataStates-LLM runs on CUDA only, from the build of scripts/build-datastates.sh (its compiled engine and the
    adapter's ``datastates/__init__.py``); read without importing it (the launcher imports no torch)."""
    if gpu_count() == 0:
        return ["DataStates-LLM is CUDA only and no GPU is visible here (nvidia-smi lists none): its C++ engine copies "
                "GPU tensors into a pinned host cache (cudaMallocHost) and datastates.llm.Checkpointing refuses to "
                f"start without CUDA. On a GPU machine: {DATASTATES_BUILD}"]
    spec = importlib.util.find_spec("datastates")
    package = Path(spec.origin).parent if spec is not None and spec.origin else None
    if package is None or not list(package.glob("ckpt/src*.so")):
        return ["DataStates-LLM is not built for this Python (no datastates package with its compiled engine "
                f"datastates/ckpt/src*.so on its path): {DATASTATES_BUILD}"]
    return []


_DS = "restartbench.engines.deepspeed.engine"
_PREDICT, _EMULATE = "restartbench.engines.deepspeed.predict", "restartbench.engines.deepspeed.emulate"
_DECOUPLED = ("as shipped, DeepSpeed's decoupled writer fails with ZeRO-1 in a PipelineEngine: its writer processes "
              "refuse the non-leaf fp32 partitions ('Cowardly refusing to serialize non-leaf tensor'), so every save "
              "is recorded as failed and nothing is committed.")
_WRITER_OPTIONS = ("io_buffer_mb", "writer_data_parallel")
"""What DeepSpeed's writer block (``_writer_block``) is made of."""
#: torch.save of CUDA tensors copies each into new pageable host memory (FastPersist's too, before its pinned buffer).
_PAGEABLE = CostTraits(pageable_copy=True)
_NOT_EMULATED = ("its writer is not emulated: --emulate goes through DeepSpeed's default engine's files only (--engine "
                 "torch), whose names and state dicts the others write too")

ENGINES = (
    EngineInfo("torch", _DS, "TorchEngine", "DeepSpeed's default engine: torch.save of every file, synchronous",
               object_store=True, predictor=f"{_PREDICT}:TORCH", emulator=f"{_EMULATE}:TorchFiles",
               cost=_PAGEABLE,
               converter="restartbench.engines.deepspeed.universal:UNIVERSAL"),
    EngineInfo("fastpersist", _DS, "FastPersistEngine", "DeepSpeed FastPersist writer: aligned buffers, libaio",
               ds_config=_writer_block(False), launch_env=_writer_env, system_check=_libaio_missing,
               options=_WRITER_OPTIONS, predictor=f"{_PREDICT}:FASTPERSIST", not_emulated=_NOT_EMULATED,
               cost=_PAGEABLE,
               not_resharded="FastPersist's checkpoints do not convert with DeepSpeed's ds_to_universal.py as they "
                             "are: every data-parallel writer writes the model file, and the copies keep FastPersist's "
                             "suffix (mp_rank_00_model_states.pt-1.2), which the converter counts as model files "
                             "('Checkpoint model-state file count 4 does not match pp_degree=2 * tp_degree=1', "
                             "DeepSpeed 0.19.8, tiny pp2dp2)"),
    EngineInfo("decoupled", _DS, "DecoupledEngine", "DeepSpeed decoupled writer: background writer processes",
               ds_config=_writer_block(True), launch_env=_writer_env, system_check=_libaio_missing,
               options=_WRITER_OPTIONS, known_issues={"cpu": _DECOUPLED, "cuda": _DECOUPLED},
               not_predicted="DeepSpeed's decoupled writer fails as shipped with ZeRO-1 in a PipelineEngine (its "
                             "writer processes refuse the non-leaf fp32 partitions: 'Cowardly refusing to serialize "
                             "non-leaf tensor'), so no checkpoint of it exists to hold a prediction to; were it fixed, "
                             "it would write DeepSpeed's files (see --engine torch)",
               not_emulated=_NOT_EMULATED,
               not_resharded="as shipped its saves fail with ZeRO-1 in a PipelineEngine, so no checkpoint of it "
                             "exists to restart from, on any layout"),
    EngineInfo("datastates", _DS, "DataStatesEngine",
               "DeepSpeed's DataStates-LLM engine: lazy asynchronous copies to a pinned host cache (CUDA only)",
               ds_config=lambda options: {"datastates_ckpt": {"host_cache_size": options.host_cache_gb}},
               system_check=_datastates_missing, skip_when_missing=True, options=("host_cache_gb",),
               predictor=f"{_PREDICT}:DATASTATES",
               # its design (no run has completed yet: the what-if has no lines for it): copies on its own CUDA
               # stream into its host cache while training goes on, the flush in the background, the optimizer step
               # waiting for the copies (guard_optimizer_step); the cache is pinned at its configured size, not the
               # rank's bytes
               cost=CostTraits(asynchronous=True, side_stream=True),
               not_emulated=_NOT_EMULATED,
               not_resharded="its files hold DataStates' own format (a JSON header, raw tensor bytes, a pickle) "
                             "under DeepSpeed's names, which ds_to_universal.py cannot read (it torch.loads each "
                             "file), and DataStates refuses universal checkpoints itself (datastates-llm "
                             "datastates/llm/deepspeed/helper.py: 'Universal checkpointing loading is not yet "
                             "supported/tested')"))

"""Estimates made before launching: memory per rank, and checkpoint bytes.

Pure arithmetic on the preset and layout, written out so that it can be checked:

- parameters held by the busiest rank: its stage's decoder layers / tp, plus the
  embedding / tp on the first stage or the output head / tp and final norm on the last;
- memory per rank = weights (2 B bf16 or 4 B fp32) + fp32 gradients (4 B)
  + ZeRO-1 optimizer state (fp32 master, Adam m and v: 12 B, split over dp)
  + activations (about 34·b·s·h bytes per layer / tp, Korthikanti et al. 2022, for up to
  pp micro-batches in flight; with recomputation every k layers, 2·b·s·h per layer plus k
  full layers) + fp32 logits on the last stage (b·s·V/tp · 4 B, three copies)
  + a fixed per-process overhead;
- checkpoint bytes: ``restartbench.plan``'s prediction of every file the run's engine writes, to the byte within
  the engine's stated tolerance (it needs torch and DeepSpeed, imported only when asked, and is kept between
  processes: ``restartbench.plan.PLAN_CACHE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from restartbench.config import RunConfig
from restartbench.layout import Layout
from restartbench.plan import checkpoint_bytes as predicted
from restartbench.presets import ModelPreset

GiB = 1024**3
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights + Adam exp_avg + exp_avg_sq
PROCESS_OVERHEAD = {"cpu": 0.4 * GiB, "cuda": 1.5 * GiB}  # interpreter + torch (+ CUDA context)


def weight_bytes(dtype: str) -> int:
    return 2 if dtype == "bf16" else 4


def busiest_rank_params(preset: ModelPreset, layout: Layout) -> int:
    stage_layers = preset.layers // layout.pp * preset.layer_params() // layout.tp
    first = preset.embedding_params() // layout.tp
    last = preset.embedding_params() // layout.tp + preset.hidden
    if layout.pp == 1:
        return stage_layers + first + last
    return stage_layers + max(first, last)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def describe(self) -> str:
        parts = ", ".join(f"{name} {getattr(self, name) / GiB:.2f}"
                          for name in ("weights", "gradients", "optimizer", "activations", "overhead"))
        return f"{self.total / GiB:.2f} GiB ({parts} GiB)"


def memory_per_rank(preset: ModelPreset, layout: Layout, *, dtype: str, micro_batch: int, grad_accum: int,
                    activation_checkpoint_interval: int, device: str) -> MemoryEstimate:
    params = busiest_rank_params(preset, layout)
    b, s, h = micro_batch, preset.seq_len, preset.hidden
    layers = preset.layers // layout.pp
    full_layer = 34 * b * s * h / layout.tp
    if activation_checkpoint_interval:
        per_microbatch = 2 * b * s * h * layers + full_layer * activation_checkpoint_interval
    else:
        per_microbatch = full_layer * layers
    in_flight = min(layout.pp, grad_accum)
    logits = 3 * 4 * b * s * preset.vocab_size / layout.tp
    return MemoryEstimate(
        weights=params * weight_bytes(dtype),
        gradients=params * 4,
        optimizer=params * OPTIMIZER_BYTES_PER_PARAM / layout.dp,
        activations=per_microbatch * in_flight + logits,
        overhead=PROCESS_OVERHEAD[device],
    )


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Size of one checkpoint of the run (all ranks' files together), as ``restartbench.plan`` predicts it."""
    return predicted(cfg)

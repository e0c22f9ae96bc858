"""Estimates made before launching: memory per rank, and checkpoint bytes.

Pure arithmetic on the preset and layout, written out so that it can be checked:

- parameters held by the busiest rank (P): its stage's decoder layers / tp, plus the
  embedding / tp on the first stage or the output head / tp and final norm on the last;
- memory per rank, as DeepSpeed 0.19.8's ZeRO-1 (``DeepSpeedZeroOptimizer``, stage_1_and_2.py: the study's bf16
  runs take it too, since their gradients accumulate in bf16) allocates it, with w = 2 B (bf16) or 4 B (fp32):
  - weights w·P (``bit16_groups_flat``) and gradients w·P (each parameter's ``.grad`` in the model's dtype, whole:
    ZeRO-1 partitions only the optimizer);
  - optimizer 12·P/dp: the fp32 master partition (``single_partition_of_fp32_groups``) and Adam's two moments;
  - then the largest of what comes and goes, never at once:
    - activations (forward and backward): about 34·b·s·h bytes per layer / tp (Korthikanti et al. 2022) for up to
      pp micro-batches in flight, with recomputation every k layers 2·b·s·h per layer plus k full layers; plus the
      fp32 logits on the last stage (b·s·V/tp · 4 B, three copies);
    - the reduce bucket (after backward): ``reduce_gradients`` of a PipelineModule allocates
      ``reduce_bucket_size`` (5e8 by default) elements of the model's dtype, whatever the model's size (on CPU only
      the part the gradients fill is resident);
    - the step's buffers: ``step()`` flattens the rank's gradient partition into a new tensor (w·P/dp) and, in bf16,
      converts it to fp32 (4·P/dp) while the bf16 gradients still exist; only then are the gradients freed. Adam's
      step after that (torch's foreach AdamW: one fp32 temporary of the partition for the square root) holds the
      fp32 gradient and that temporary, 8·P/dp, but no longer the w·P gradients: never more than the flatten;
  - a fixed per-process overhead.
  Checked against ``cuda_max_allocated_bytes`` (the spans' torch peak) on the first H100 visit (2026-11-26, 1B
  tp1pp1 bf16, training iterations): 33.58 GB measured, 32.97 GB estimated without the process overhead (which
  torch's figure does not count), 1.8 % under; 34.58 GB with it. The old figure (fp32 gradients 4·P, nothing for
  the step) was 4·P/dp + 2·P short in bf16 at dp 1 and 2·P over at large dp;
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
REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's zero_optimization.reduce_bucket_size default (the study sets none)


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
    reduce_bucket: float
    step_buffers: float
    overhead: float

    @property
    def transient(self) -> float:
        """The largest of what comes and goes: activations, the reduce bucket and the step's buffers never coexist."""
        return max(self.activations, self.reduce_bucket, self.step_buffers)

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.transient + self.overhead

    def describe(self) -> str:
        held = ", ".join(f"{name} {getattr(self, name) / GiB:.2f}" for name in ("weights", "gradients", "optimizer"))
        passing = ", ".join(f"{name.replace('_', ' ')} {getattr(self, name) / GiB:.2f}"
                            for name in ("activations", "reduce_bucket", "step_buffers"))
        return (f"{self.total / GiB:.2f} GiB ({held}, the largest of: {passing}, overhead "
                f"{self.overhead / GiB:.2f} GiB)")


def memory_per_rank(preset: ModelPreset, layout: Layout, *, dtype: str, micro_batch: int, grad_accum: int,
                    activation_checkpoint_interval: int, device: str) -> MemoryEstimate:
    params = busiest_rank_params(preset, layout)
    w = weight_bytes(dtype)
    return MemoryEstimate(
        weights=params * w,
        gradients=params * w,
        optimizer=params * OPTIMIZER_BYTES_PER_PARAM / layout.dp,
        activations=activation_bytes(preset, layout, micro_batch=micro_batch, grad_accum=grad_accum,
                                     activation_checkpoint_interval=activation_checkpoint_interval),
        reduce_bucket=reduce_bucket_bytes(params, w, device),
        step_buffers=step_buffer_bytes(params, w, layout.dp),
        overhead=PROCESS_OVERHEAD[device],
    )


def reduce_bucket_bytes(params: int, w: int, device: str) -> float:
    """The reduce bucket: all of it on CUDA (the caching allocator reserves what ``torch.empty`` asks for); on CPU
    only the pages the gradients are copied into become resident, at most the rank's P elements."""
    elements = REDUCE_BUCKET_ELEMENTS if device == "cuda" else min(REDUCE_BUCKET_ELEMENTS, params)
    return elements * w


def step_buffer_bytes(params: int, w: int, dp: int) -> float:
    """What ZeRO-1's ``step()`` adds while the w-byte gradients still exist: the flattened partition (w·P/dp) and,
    unless the model is fp32 already (``.to`` then returns the same tensor), its fp32 copy (4·P/dp)."""
    return params * (w + (4 if w != 4 else 0)) / dp


def activation_bytes(preset: ModelPreset, layout: Layout, *, micro_batch: int, grad_accum: int,
                     activation_checkpoint_interval: int) -> float:
    b, s, h = micro_batch, preset.seq_len, preset.hidden
    layers = preset.layers // layout.pp
    full_layer = 34 * b * s * h / layout.tp
    if activation_checkpoint_interval:
        per_microbatch = 2 * b * s * h * layers + full_layer * activation_checkpoint_interval
    else:
        per_microbatch = full_layer * layers
    logits = 3 * 4 * b * s * preset.vocab_size / layout.tp
    return per_microbatch * min(layout.pp, grad_accum) + logits


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Size of one checkpoint of the run (all ranks' files together), as ``restartbench.plan`` predicts it."""
    return predicted(cfg)

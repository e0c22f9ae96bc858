"""A LLaMA decoder as a DeepSpeed ``PipelineModule`` with Megatron-style tensor parallelism.

The function is the one ``transformers.LlamaForCausalLM`` computes (untied embedding and head,
no biases, RMSNorm eps 1e-5, rotate-half RoPE with theta 10000, grouped-query causal attention,
SwiGLU MLP); a test copies our weights into it and compares logits.

Pipeline layers (the index is the ``XX`` of DeepSpeed's ``layer_XX-model_YY-model_states.pt``),
with their parameter names:

- 0 ``EmbeddingPipe``: ``weight`` [vocab/tp, hidden]
- 1..L ``DecoderLayerPipe``: ``attn_norm`` [hidden]; ``q`` [heads·head_dim/tp, hidden];
  ``k``, ``v`` [kv_heads·head_dim/tp, hidden]; ``o`` [hidden, heads·head_dim/tp]; ``mlp_norm`` [hidden];
  ``gate``, ``up`` [ffn/tp, hidden]; ``down`` [hidden, ffn/tp]. RoPE tables are non-persistent buffers.
- L+1 ``FinalNormPipe``: ``weight`` [hidden]
- L+2 ``LMHeadPipe``: ``weight`` [vocab/tp, hidden]

Tensor parallelism: q, k, v, gate, up and the head are column-parallel (rank r holds output rows
[r·n/tp, (r+1)·n/tp), so attention heads [r·H/tp, (r+1)·H/tp) and kv-heads [r·KV/tp, (r+1)·KV/tp),
which keeps every query head with its own kv-head); o and down are row-parallel (input columns
split the same way, outputs all-reduced); the embedding holds vocabulary rows [r·V/tp, (r+1)·V/tp)
(other ids give zeros, then all-reduce); the head's logits are all-gathered over the vocabulary.
Norm weights are replicated. Every full weight's values are fixed by (seed, layer index, name, shape): its flattened
elements are cut into chunks of ``DRAW_CHUNK``, each drawn whole from a generator seeded by (seed, layer index, name,
chunk index); a rank keeps its slice, so the model is the same function for any tp, pp, dp. The chunks are drawn
in a thread pool (one thread per CPU the process may use), and a rank holding rows [a, b) of a weight (split along
dimension 0) draws only the chunks these rows overlap.

Each sliced parameter carries its split (``TensorParallel.parameter``); from these marks the module declares
``universal_checkpoint_info``, the regular expressions by which DeepSpeed's ``ds_to_universal.py`` merges a
checkpoint's slices into full parameters (Universal Checkpointing, issue 19).
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.checkpoint import constants as uc
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from torch import nn

from restartbench.data import stable_seed
from restartbench.launchers import cpu_share
from restartbench.layout import Layout
from restartbench.presets import ModelPreset

RMS_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02
#: Elements of a weight's flattened values drawn from one generator (1 MiB of fp32). A constant: the values depend on
#: it, never on the layout or the thread count. Small enough that a 1B layer's smallest weights (k, v: 1 M elements)
#: still give a 16-core pool work; large enough that a generator's set-up (about 6 µs) is well under 1 % of a draw.
DRAW_CHUNK = 1 << 18
#: Attributes of a tensor-parallel parameter (``TensorParallel.parameter``): the dimension it is split along, and
#: whether that dimension is the vocabulary. A parameter without them is replicated over the tensor-parallel group.
TP_DIM = "tp_dim"
VOCABULARY = "vocabulary"


class TensorParallel:
    """This rank's place in its tensor-parallel group, shared by all its layers.

    The group is filled in by ``build_pipeline_module`` once DeepSpeed's grid exists; with
    size 1 it stays None and no collective runs.
    """

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank
        self.group: dist.ProcessGroup | None = None

    def shard(self, seed: int, layer: int, name: str, shape: tuple[int, ...], dim: int) -> torch.Tensor:
        """This rank's equal slice along ``dim`` of the full weight ``normal(seed, layer, name, shape)``, in its own
        storage. Along dimension 0 the slice is a contiguous range of the flattened weight, and only it is drawn;
        along another dimension the full weight is drawn and the slice copied out of it (with tp 1: the whole)."""
        if shape[dim] % self.size:
            raise ValueError(f"dimension {dim} of size {shape[dim]} does not split into {self.size} shards")
        if dim == 0:
            rows, row = shape[0] // self.size, math.prod(shape[1:])
            start = self.rank * rows * row
            return normal(seed, layer, name, shape, start, start + rows * row).view(rows, *shape[1:])
        full = normal(seed, layer, name, shape).view(shape)
        return full if self.size == 1 else full.chunk(self.size, dim=dim)[self.rank].clone()

    def parameter(self, seed: int, layer: int, name: str, shape: tuple[int, ...], dim: int, *,
                  vocabulary: bool = False) -> nn.Parameter:
        """This rank's slice along ``dim`` of the full weight (``shard``) as a parameter that says how it was cut
        (``TP_DIM``, ``VOCABULARY``), as Megatron marks its parallel parameters: ``universal_checkpoint_info`` reads
        the marks."""
        param = nn.Parameter(self.shard(seed, layer, name, shape, dim))
        setattr(param, TP_DIM, dim)
        setattr(param, VOCABULARY, vocabulary)
        return param


# --- collectives with the autograd each side needs ---------------------------------------


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient (the input fed every rank's shard)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sum of the ranks' partial results); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension; backward keeps this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        ctx.tp = tp
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.tp.size, dim=-1)[ctx.tp.rank].contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _CopyToTP.apply(x, tp) if tp.size > 1 else x


def reduce_from_tp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp) if tp.size > 1 else x


def gather_from_tp(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _GatherFromTP.apply(x, tp) if tp.size > 1 else x


# --- layers -------------------------------------------------------------------------------


def draw_threads() -> int:
    """Threads that draw a weight's chunks: this rank's share of the node's CPUs (``launchers.cpu_share``)."""
    return cpu_share()


_DRAW_POOLS: dict[int, ThreadPoolExecutor] = {}


def _draw_pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of ``threads`` drawing threads, made on first use and kept (idle between draws) until
    ``release_draw_threads``."""
    if threads not in _DRAW_POOLS:
        _DRAW_POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="restartbench-draw")
    return _DRAW_POOLS[threads]


def release_draw_threads() -> None:
    """End the drawing threads, once the model is built. They are not daemons: left alive, they would make a rank
    end through the interpreter's teardown (``launchers.end_process``), where an engine's compiled code may be
    deleted under its own threads (DataStates'), after the rank's records are written."""
    while _DRAW_POOLS:
        _DRAW_POOLS.popitem()[1].shutdown(wait=True)


def normal(seed: int, layer: int, name: str, shape: tuple[int, ...], start: int = 0, stop: int | None = None, *,
           threads: int | None = None) -> torch.Tensor:
    """Elements [start, stop) (default: all) of the flattened full (unsharded) weight of ``shape`` ~ N(0, INIT_STD),
    flat, the same in every process for these arguments whatever ``threads`` (default ``draw_threads()``).

    Chunk c holds flattened elements [c·DRAW_CHUNK, min((c+1)·DRAW_CHUNK, numel)) and is drawn whole from a generator
    seeded by (seed, layer, name, c) (torch's normal_ gives other values for a shorter draw, so a chunk the range
    cuts is drawn whole into a scratch tensor and its part copied). Only the chunks overlapping the range are drawn,
    each by one thread of the pool: normal_ releases the GIL, and its generator is the chunk's own. A seed is a CRC-32
    (``stable_seed``; torch's CPU generator keeps a seed's low 32 bits only), so two chunks of a model may, rarely,
    hold the same values. On the meta device nothing is drawn (shapes only; drawing there imports torch._dynamo)."""
    numel = math.prod(shape)
    stop = numel if stop is None else stop
    if not 0 <= start <= stop <= numel:
        raise ValueError(f"elements [{start}, {stop}) are not within a weight of {numel}")
    out = torch.empty(stop - start)
    if out.is_meta or start == stop:
        return out

    def draw(chunk: int) -> None:
        low, high = chunk * DRAW_CHUNK, min((chunk + 1) * DRAW_CHUNK, numel)
        generator = torch.Generator().manual_seed(stable_seed("weight", seed, layer, name, chunk))
        if start <= low and high <= stop:
            out[low - start:high - start].normal_(0.0, INIT_STD, generator=generator)
        else:
            whole = torch.empty(high - low).normal_(0.0, INIT_STD, generator=generator)
            first, last = max(low, start), min(high, stop)  # the part of the chunk within [start, stop)
            out[first - start:last - start].copy_(whole[first - low:last - low])

    chunks = range(start // DRAW_CHUNK, (stop - 1) // DRAW_CHUNK + 1)
    threads = draw_threads() if threads is None else threads
    if threads == 1 or len(chunks) == 1:
        for chunk in chunks:
            draw(chunk)
    else:
        for _ in _draw_pool(threads).map(draw, chunks):  # re-raises a thread's error
            pass
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm as LLaMA does it: statistics in fp32, scaled in the input's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rope_tables(head_dim: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, head_dim] for rotate-half RoPE, computed in fp32."""
    if torch.empty(0).is_meta:  # shapes only (as in parameter_splits): arange there would import torch._dynamo
        return torch.empty(seq_len, head_dim), torch.empty(seq_len, head_dim)
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class EmbeddingPipe(nn.Module):
    """Vocabulary-parallel token embedding: int64 ids [batch, seq] -> hidden [batch, seq, hidden]."""

    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int):
        super().__init__()
        self.tp = tp
        self.rows = preset.vocab_size // tp.size
        self.weight = tp.parameter(seed, 0, "embedding", (preset.vocab_size, preset.hidden), 0, vocabulary=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        start = self.tp.rank * self.rows
        outside = (tokens < start) | (tokens >= start + self.rows)
        local = torch.where(outside, 0, tokens - start)
        hidden = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(hidden, self.tp)


class DecoderLayerPipe(nn.Module):
    """One pre-norm decoder layer: x + attention(norm(x)), then + SwiGLU(norm(x)). ``layer`` is its pipeline index."""

    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int, layer: int):
        super().__init__()
        self.tp = tp
        h, hd = preset.hidden, preset.head_dim
        self.head_dim = hd
        self.local_heads = preset.heads // tp.size
        self.local_kv_heads = preset.kv_heads // tp.size

        def column(name: str, rows: int) -> nn.Parameter:
            return tp.parameter(seed, layer, name, (rows, h), 0)

        def row(name: str, cols: int) -> nn.Parameter:
            return tp.parameter(seed, layer, name, (h, cols), 1)

        self.attn_norm = nn.Parameter(torch.ones(h))
        self.q = column("q", preset.heads * hd)
        self.k = column("k", preset.kv_dim)
        self.v = column("v", preset.kv_dim)
        self.o = row("o", preset.heads * hd)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.gate = column("gate", preset.ffn_hidden)
        self.up = column("up", preset.ffn_hidden)
        self.down = row("down", preset.ffn_hidden)
        cos, sin = _rope_tables(hd, preset.seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(copy_to_tp(_rms_norm(x, self.attn_norm), self.tp))
        return x + self._mlp(copy_to_tp(_rms_norm(x, self.mlp_norm), self.tp))

    def _heads(self, y: torch.Tensor, weight: torch.Tensor, count: int) -> torch.Tensor:
        """Project and split into heads: [batch, seq, hidden] -> [batch, count, seq, head_dim]."""
        batch, seq, _ = y.shape
        return F.linear(y, weight).view(batch, seq, count, self.head_dim).transpose(1, 2)

    def _attention(self, y: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = y.shape
        q = self._heads(y, self.q, self.local_heads)
        k = self._heads(y, self.k, self.local_kv_heads)
        v = self._heads(y, self.v, self.local_kv_heads)
        cos, sin = self.rope_cos[:seq].to(q.dtype), self.rope_sin[:seq].to(q.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        # Query head i reads kv-head i // group, as transformers' repeat_kv arranges it.
        group = self.local_heads // self.local_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))
        attended = attended.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim)
        return reduce_from_tp(F.linear(attended, self.o), self.tp)

    def _mlp(self, y: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(F.linear(y, self.gate)) * F.linear(y, self.up)
        return reduce_from_tp(F.linear(hidden, self.down), self.tp)


class FinalNormPipe(nn.Module):
    def __init__(self, preset: ModelPreset):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(preset.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight)


class LMHeadPipe(nn.Module):
    """Vocabulary-parallel output head; every tp rank ends with the full logits [batch, seq, vocab]."""

    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int):
        super().__init__()
        self.tp = tp
        self.weight = tp.parameter(seed, preset.layers + 2, "head", (preset.vocab_size, preset.hidden), 0,
                                   vocabulary=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_from_tp(F.linear(copy_to_tp(x, self.tp), self.weight), self.tp)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32 whatever the training precision."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def layer_specs(preset: ModelPreset, tp: TensorParallel, seed: int) -> list[LayerSpec]:
    """The whole model, embedding to head; ``nn.Sequential(*(s.build() for s in specs))`` is it in one process."""
    return [
        LayerSpec(EmbeddingPipe, preset, tp, seed),
        *[LayerSpec(DecoderLayerPipe, preset, tp, seed, layer) for layer in range(1, preset.layers + 1)],
        LayerSpec(FinalNormPipe, preset),
        LayerSpec(LMHeadPipe, preset, tp, seed),
    ]


# --- how the parameters are split, for DeepSpeed's universal checkpoints ---------------------------


@lru_cache(maxsize=8)
def parameter_splits(preset: ModelPreset) -> tuple[tuple[str, int | None, bool], ...]:
    """(PipelineModule name ``<pipeline index>.<name>``, tensor-parallel dimension or None, vocabulary or not) of
    every parameter of the whole model, in module order, read off the layers' own parameters (``TP_DIM``,
    ``VOCABULARY``): one layer of each class is built on the meta device."""
    built: dict[type, list[tuple[str, nn.Parameter]]] = {}
    with torch.device("meta"):
        specs = layer_specs(preset, TensorParallel(1, 0), seed=0)
        for spec in specs:
            if isinstance(spec, TiedLayerSpec):  # its copies on two stages would need pipeline-replicated patterns
                raise NotImplementedError(f"tied layer {spec.key}: declare its pipeline-replicated patterns")
            if spec.typename not in built:
                built[spec.typename] = list(spec.build().named_parameters())
    return tuple((f"{index}.{name}", getattr(param, TP_DIM, None), getattr(param, VOCABULARY, False))
                 for index, spec in enumerate(specs) for name, param in built[spec.typename])


def _name_patterns(selected: list[str], every: list[str]) -> list[str]:
    """Anchored regular expressions matching exactly the names ``selected`` among ``every``: one per parameter name
    after the layer index, ``\\d+`` where every layer holding that name is selected, else the indices.
    ``ds_to_universal.py`` matches with ``re.match`` and refuses a name two patterns of one list match."""
    def layers_holding(suffix: str, names: list[str]) -> list[str]:
        return [index for index, _, rest in (name.partition(".") for name in names) if rest == suffix]

    patterns = []
    for suffix in dict.fromkeys(name.partition(".")[2] for name in selected):
        indices = layers_holding(suffix, selected)
        if indices == layers_holding(suffix, every):
            layers = r"\d+"
        else:
            layers = indices[0] if len(indices) == 1 else f"(?:{'|'.join(indices)})"
        patterns.append(f"^{layers}\\.{re.escape(suffix)}$")
    return patterns


def universal_checkpoint_info(preset: ModelPreset) -> dict[str, Any]:
    """``universal_checkpoint_info`` as Megatron-DeepSpeed declares it, which ``DeepSpeedEngine._save_checkpoint``
    copies from the module into every ``mp_rank_*_model_states.pt`` and ``ds_to_universal.py`` reads to merge each
    parameter's tensor-parallel slices to full shape. Derived from ``parameter_splits``; the same for every rank,
    stage and layout, since the converter reads it from the first model file only:

    - ``tp_replicated_parameter_patterns``: parameters without a tensor-parallel dimension (the RMSNorm weights).
      Every tp rank holds them whole and equal (their gradients are all-reduced by ``copy_to_tp``), which the
      converter checks before keeping one copy.
    - ``parameter_with_row_parallelism_patterns``: split along dimension 1 (o, down), concatenated there. Parameters
      split along dimension 0 (q, k, v, gate, up, the vocabulary) need no pattern: dimension 0 is the default.
    - ``vocabulary_parameter_patterns`` and ``original_vocab_size``: the embedding and the head, split over the
      vocabulary; the converter cuts the merged rows to ``original_vocab_size``. The model pads no vocabulary (the
      preset's size must divide by tp), so nothing is cut; a loader on another tp pads again if it must.
    - ``pipeline_replicated_parameter_patterns``: none, the embedding and head are not tied (no ``TiedLayerSpec``;
      ``parameter_splits`` refuses one).
    - ``parameter_to_average_patterns``: none; no replicated parameter may differ between tp ranks.
    - ``parameter_with_2_sub_params_cat_dim_0``: none; gate and up are two parameters, not one fused SwiGLU weight.
    """
    splits = parameter_splits(preset)
    every = [name for name, _, _ in splits]
    if any(dim not in (None, 0, 1) for _, dim, _ in splits):
        raise NotImplementedError("a parameter split along a dimension other than 0 or 1")

    def patterns(selected: list[str]) -> list[str]:
        return _name_patterns(selected, every)

    return {
        uc.UNIVERSAL_CHECKPOINT_VERSION_KEY: uc.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        uc.TP_REPLICATED_PARAMETER_PATTERNS: patterns([name for name, dim, _ in splits if dim is None]),
        uc.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: patterns([name for name, dim, _ in splits if dim == 1]),
        uc.VOCABULARY_PARAMETER_PATTERNS: patterns([name for name, _, vocabulary in splits if vocabulary]),
        uc.ORIGINAL_VOCAB_SIZE: preset.vocab_size,
        uc.PIPELINE_REPLICATED_PARAMETER_PATTERNS: [],
        uc.PARAMETER_TO_AVERAGE_PATTERNS: [],
        uc.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0: [],
    }


def pipeline_topology(layout: Layout) -> PipeModelDataParallelTopology:
    """The ranks' grid the pipeline module is built on: DeepSpeed's own, ranks laid out pipe, data, model."""
    return PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)


def rank_coordinates(layout: Layout, rank: int) -> tuple[int, int, int]:
    """(pipeline stage, tensor slice, data-parallel rank) of global ``rank``, as the built module's grid will give
    them (``get_stage_id``, ``get_slice_parallel_rank``, ``get_data_parallel_rank``), known before it is built."""
    coord = pipeline_topology(layout).get_coord(rank)
    return coord.pipe, coord.model, coord.data


def build_pipeline_module(preset: ModelPreset, layout: Layout, *, seed: int,
                          activation_checkpoint_interval: int = 0) -> PipelineModule:
    """The model for this rank's pipeline stage and tensor-parallel shard (distributed must be initialized)."""
    topology = pipeline_topology(layout)
    # LayerSpec.build runs before the module has its grid: take the tp rank from the topology now,
    # and hand the process group to the layers (through the shared TensorParallel) once the grid exists.
    tp = TensorParallel(layout.tp, topology.get_coord(dist.get_rank()).model)
    module = PipelineModule(layers=layer_specs(preset, tp, seed), topology=topology, loss_fn=cross_entropy,
                            partition_method="type:DecoderLayerPipe",
                            activation_checkpoint_interval=activation_checkpoint_interval,
                            # Only decoder layers are recomputed: the embedding's input (token ids) carries no
                            # gradient, and DeepSpeed's reentrant checkpoint would then cut the graph.
                            checkpointable_layers=["DecoderLayerPipe"])
    if layout.tp > 1:
        tp.group = module._grid.get_slice_parallel_group()
    _declare_universal_checkpoint_info(module, preset)
    return module


def _declare_universal_checkpoint_info(module: PipelineModule, preset: ModelPreset) -> None:
    """Set the attribute DeepSpeed's save copies into the model files (``universal_checkpoint_info``), after checking
    that it names this stage's parameters as DeepSpeed does (the meta build could drift from PipelineModule's names)."""
    known = {name for name, _, _ in parameter_splits(preset)}
    unknown = sorted({name for name, _ in module.named_parameters()} - known)
    if unknown:
        raise RuntimeError(f"parameters {unknown} are not in universal_checkpoint_info's names")
    setattr(module, uc.UNIVERSAL_CHECKPOINT_INFO, universal_checkpoint_info(preset))

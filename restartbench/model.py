"""A LLaMA decoder as a DeepSpeed ``PipelineModule`` with Megatron-style tensor parallelism.

Layers (pipeline layer index in DeepSpeed's file names ``layer_XX-model_YY-model_states.pt``):
0 ``EmbeddingPipe`` (``weight``: vocabulary rows / tp), 1..L ``DecoderLayerPipe``
(``attn_norm``, ``q``, ``k``, ``v``, ``o``, ``mlp_norm``, ``gate``, ``up``, ``down``), L+1
``FinalNormPipe`` (``weight``), L+2 ``LMHeadPipe`` (``weight``: vocabulary rows / tp).

Tensor parallelism: q, k, v, gate, up and the output head are column-parallel (output rows
split; rank r holds attention heads [r·H/tp, (r+1)·H/tp) and kv-heads likewise); o and down
are row-parallel (input columns split, outputs all-reduced); the embedding is split by
vocabulary rows (ids outside a rank's range give zeros, then all-reduce). Norm weights are
replicated. Every full weight is drawn from a generator seeded by (seed, layer, name) and
then sliced, so a model is the same function for any tp, pp and dp — which the tests check.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from torch import nn

from restartbench.data import stable_seed
from restartbench.layout import Layout
from restartbench.presets import ModelPreset

RMS_EPS = 1e-5
ROPE_THETA = 10000.0
INIT_STD = 0.02


class TensorParallel:
    """This rank's place in its tensor-parallel group; the group is set once the grid exists."""

    def __init__(self, size: int, rank: int):
        self.size, self.rank = size, rank
        self.group: dist.ProcessGroup | None = None

    def shard(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        return full.chunk(self.size, dim=dim)[self.rank].contiguous()


# --- collectives with the autograd each side needs ---------------------------------------


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient (the input fed every rank's shard)."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sum of partial results); identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.tp.size, dim=-1)[ctx.tp.rank].contiguous(), None


def copy_to_tp(x, tp):
    return _CopyToTP.apply(x, tp) if tp.size > 1 else x


def reduce_from_tp(x, tp):
    return _ReduceFromTP.apply(x, tp) if tp.size > 1 else x


def gather_from_tp(x, tp):
    return _GatherFromTP.apply(x, tp) if tp.size > 1 else x


# --- layers -------------------------------------------------------------------------------


def _normal(seed: int, layer: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(stable_seed("weight", seed, layer, name))
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class EmbeddingPipe(nn.Module):
    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int):
        super().__init__()
        self.tp = tp
        self.rows = preset.vocab_size // tp.size
        full = _normal(seed, 0, "embedding", (preset.vocab_size, preset.hidden))
        self.weight = nn.Parameter(tp.shard(full, 0))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        start = self.tp.rank * self.rows
        outside = (tokens < start) | (tokens >= start + self.rows)
        local = torch.where(outside, 0, tokens - start)
        hidden = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(hidden, self.tp)


class DecoderLayerPipe(nn.Module):
    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int, layer: int):
        super().__init__()
        self.tp = tp
        h, hd = preset.hidden, preset.head_dim
        self.head_dim = hd
        self.local_heads = preset.heads // tp.size
        self.local_kv_heads = preset.kv_heads // tp.size

        def column(name: str, rows: int, cols: int) -> nn.Parameter:
            return nn.Parameter(tp.shard(_normal(seed, layer, name, (rows, cols)), 0))

        def row(name: str, rows: int, cols: int) -> nn.Parameter:
            return nn.Parameter(tp.shard(_normal(seed, layer, name, (rows, cols)), 1))

        self.attn_norm = nn.Parameter(torch.ones(h))
        self.q = column("q", preset.heads * hd, h)
        self.k = column("k", preset.kv_dim, h)
        self.v = column("v", preset.kv_dim, h)
        self.o = row("o", h, preset.heads * hd)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.gate = column("gate", preset.ffn_hidden, h)
        self.up = column("up", preset.ffn_hidden, h)
        self.down = row("down", h, preset.ffn_hidden)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(preset.seq_len, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(copy_to_tp(_rms_norm(x, self.attn_norm), self.tp))
        return x + self._mlp(copy_to_tp(_rms_norm(x, self.mlp_norm), self.tp))

    def _attention(self, y: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = y.shape

        def heads(weight: torch.Tensor, count: int) -> torch.Tensor:
            return F.linear(y, weight).view(batch, seq, count, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q, self.local_heads), heads(self.k, self.local_kv_heads), heads(self.v, self.local_kv_heads)
        cos, sin = self.rope_cos[:seq].to(q.dtype), self.rope_sin[:seq].to(q.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
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
    def __init__(self, preset: ModelPreset, tp: TensorParallel, seed: int):
        super().__init__()
        self.tp = tp
        full = _normal(seed, preset.layers + 2, "head", (preset.vocab_size, preset.hidden))
        self.weight = nn.Parameter(tp.shard(full, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_from_tp(F.linear(copy_to_tp(x, self.tp), self.weight), self.tp)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32 whatever the training precision."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def layer_specs(preset: ModelPreset, tp: TensorParallel, seed: int) -> list[LayerSpec]:
    return [
        LayerSpec(EmbeddingPipe, preset, tp, seed),
        *[LayerSpec(DecoderLayerPipe, preset, tp, seed, layer) for layer in range(1, preset.layers + 1)],
        LayerSpec(FinalNormPipe, preset),
        LayerSpec(LMHeadPipe, preset, tp, seed),
    ]


def build_pipeline_module(preset: ModelPreset, layout: Layout, *, seed: int,
                          activation_checkpoint_interval: int = 0) -> PipelineModule:
    """The model for this rank's pipeline stage and tensor-parallel shard (distributed must be initialized)."""
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    # LayerSpec.build runs before the module has its grid: take the tp rank from the topology now,
    # and hand the process group to the layers once the grid exists.
    tp = TensorParallel(layout.tp, topology.get_coord(dist.get_rank()).model)
    module = PipelineModule(layers=layer_specs(preset, tp, seed), topology=topology, loss_fn=cross_entropy,
                            partition_method="type:DecoderLayerPipe",
                            activation_checkpoint_interval=activation_checkpoint_interval,
                            # Only decoder layers are recomputed: the embedding's input (token ids) carries no
                            # gradient, and DeepSpeed's reentrant checkpoint would then cut the graph.
                            checkpointable_layers=["DecoderLayerPipe"])
    tp.group = module._grid.get_slice_parallel_group()
    return module

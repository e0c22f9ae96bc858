"""The initial weights are a function of (seed, layer, name, shape) only: the chunked, threaded draw
(``model.normal``) gives the same bits whatever the thread count, and a tensor-parallel rank's weight is exactly
its slice of the tp 1 weight, also where a rank's rows begin or end inside a chunk (then drawn whole and cut)."""

import threading

import pytest
import torch

from restartbench import launchers, model
from restartbench.engines.lazy import copies
from restartbench.model import DecoderLayerPipe, EmbeddingPipe, LMHeadPipe, TensorParallel, normal
from restartbench.presets import PRESETS

TINY = PRESETS["tiny"]


def test_draw_is_the_same_bits_for_any_thread_count(monkeypatch):
    """Ten chunks, the last one short; then a range starting and ending inside chunks, drawn with 1 and 4 threads,
    is the same part of the full draw."""
    monkeypatch.setattr(model, "DRAW_CHUNK", 1000)
    shape = (37, 250)  # 9250 elements
    one = normal(5, 3, "q", shape, threads=1)
    assert one.shape == (9250,)
    assert torch.equal(one, normal(5, 3, "q", shape, threads=4))
    assert torch.equal(one, normal(5, 3, "q", shape, threads=2))
    assert torch.equal(one[1234:7777], normal(5, 3, "q", shape, 1234, 7777, threads=4))
    assert torch.equal(one[1234:7777], normal(5, 3, "q", shape, 1234, 7777, threads=1))
    assert not torch.equal(one, normal(5, 3, "k", shape, threads=1))  # another name, other values
    assert not torch.equal(one[:1000], one[1000:2000])  # every chunk its own generator
    assert one.std().item() == pytest.approx(model.INIT_STD, rel=0.05)


def test_the_drawing_threads_end_once_released_and_a_later_draw_makes_them_again(monkeypatch):
    """A rank's drawing threads (not daemons) end once its model is built (``train`` calls ``release_draw_threads``),
    so that the rank can end without the interpreter's teardown; a later draw makes a pool again, with the same bits."""
    monkeypatch.setattr(model, "DRAW_CHUNK", 1000)

    def drawing() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("restartbench-draw") and t.is_alive()]

    first = normal(5, 3, "q", (37, 250), threads=3)
    assert drawing()
    model.release_draw_threads()
    assert drawing() == []
    assert torch.equal(first, normal(5, 3, "q", (37, 250), threads=3))
    model.release_draw_threads()


@pytest.mark.parametrize("dim", [0, 1])
def test_tensor_parallel_shards_are_exact_slices_of_the_full_weight(monkeypatch, dim):
    """tp 2, 3 and 4 ranks' shards are bitwise the slices of the full weight; with 1000-element chunks the ranks'
    row ranges (dimension 0, the part drawn alone) begin and end inside chunks."""
    monkeypatch.setattr(model, "DRAW_CHUNK", 1000)
    shape = (48, 36)
    full = normal(9, 4, "gate", shape).view(shape)
    assert torch.equal(TensorParallel(1, 0).shard(9, 4, "gate", shape, dim), full)
    for tp in (2, 3, 4):
        for rank in range(tp):
            assert torch.equal(TensorParallel(tp, rank).shard(9, 4, "gate", shape, dim),
                               full.chunk(tp, dim=dim)[rank]), (tp, rank)


@pytest.mark.parametrize("chunk", [1000, 1 << 18])
def test_tp2_layers_hold_exact_slices_of_the_tp1_layers(monkeypatch, chunk):
    """The tiny model's layers with tp 2 hold bitwise the slices of their tp 1 weights: column-parallel and
    vocabulary weights along dimension 0, row-parallel along 1."""
    monkeypatch.setattr(model, "DRAW_CHUNK", chunk)
    full = DecoderLayerPipe(TINY, TensorParallel(1, 0), seed=3, layer=2)
    shards = [DecoderLayerPipe(TINY, TensorParallel(2, r), seed=3, layer=2) for r in range(2)]
    for name, dim in (("q", 0), ("k", 0), ("v", 0), ("gate", 0), ("up", 0), ("o", 1), ("down", 1)):
        for rank, shard in enumerate(shards):
            assert torch.equal(getattr(shard, name), getattr(full, name).chunk(2, dim=dim)[rank]), name
    for cls in (EmbeddingPipe, LMHeadPipe):
        whole = cls(TINY, TensorParallel(1, 0), seed=3).weight
        for rank in range(2):
            assert torch.equal(cls(TINY, TensorParallel(2, rank), seed=3).weight, whole.chunk(2)[rank]), cls


def test_meta_build_draws_nothing():
    """On the meta device (parameter_splits, shards.py) the layers get their shapes and no values."""
    with torch.device("meta"):
        layer = DecoderLayerPipe(TINY, TensorParallel(2, 1), seed=0, layer=1)
    assert layer.q.is_meta and layer.q.shape == (TINY.heads * TINY.head_dim // 2, TINY.hidden)
    assert layer.down.is_meta and layer.down.shape == (TINY.hidden, TINY.ffn_hidden // 2)


@pytest.mark.parametrize("cpus, local_world, threads", [(16, None, 16), (16, "8", 2), (2, "4", 1), (8, "bad", 8),
                                                        (8, "0", 8)])
def test_ranks_on_one_node_share_its_cpus_for_drawing(monkeypatch, cpus, local_world, threads):
    """Each of torchrun's LOCAL_WORLD_SIZE ranks draws on its share of the CPUs, at least one thread, and faults the
    lazy engine's pinned buffer in on as many (at most copies.FAULT_THREADS)."""
    monkeypatch.setattr(launchers.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    if local_world is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    assert model.draw_threads() == threads
    assert copies.fault_threads() == min(threads, copies.FAULT_THREADS)

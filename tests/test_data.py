"""The synthetic token stream: a global batch is the same on every layout that has as many micro-batches."""

import torch

from restartbench.data import micro_batches


def global_batch(dp: int, grad_accum: int, step: int = 3) -> list[torch.Tensor]:
    """Every replica's micro-batches of one step, in replica order: the global batch DeepSpeed averages over."""
    return [tokens for dp_rank in range(dp)
            for tokens, _ in micro_batches(vocab_size=97, seq_len=8, micro_batch=2, grad_accum=grad_accum, step=step,
                                           dp_rank=dp_rank, seed=1234)]


def test_a_restart_on_another_layout_with_the_same_global_batch_trains_on_the_same_samples():
    reference = global_batch(dp=2, grad_accum=2)
    for dp, grad_accum in ((4, 1), (1, 4)):
        assert all(torch.equal(a, b) for a, b in zip(global_batch(dp, grad_accum), reference, strict=True))


def test_samples_differ_between_steps_and_micro_batches():
    first, second = global_batch(dp=2, grad_accum=2, step=1), global_batch(dp=2, grad_accum=2, step=2)
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[0], first[1])
    tokens, labels = micro_batches(vocab_size=97, seq_len=8, micro_batch=2, grad_accum=1, step=1, dp_rank=0,
                                   seed=1234)[0]
    assert torch.equal(tokens[:, 1:], labels[:, :-1]), "labels are the tokens shifted by one"

"""Synthetic token batches, a pure function of (seed, step, the micro-batch's index in the global batch).

Because a batch depends only on those numbers, a resumed run sees exactly the batch the
uninterrupted run saw at the same step, with no data-loader state to checkpoint. The index is
global (data-parallel rank × micro-batches per rank + micro-batch), so a restart on another layout
with the same global batch (dp × grad_accum micro-batches) trains on the same samples.
"""

from __future__ import annotations

import zlib

import torch


def stable_seed(*parts: object) -> int:
    """A seed from any parts, the same in every process (unlike ``hash`` of strings)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) | (len(parts) << 32)


def micro_batches(*, vocab_size: int, seq_len: int, micro_batch: int, grad_accum: int,
                  step: int, dp_rank: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, labels) pairs for one iteration of one data-parallel replica; labels are tokens shifted by one."""
    batches = []
    for micro in range(grad_accum):
        generator = torch.Generator().manual_seed(stable_seed("data", seed, step, dp_rank * grad_accum + micro))
        tokens = torch.randint(vocab_size, (micro_batch, seq_len + 1), generator=generator)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches

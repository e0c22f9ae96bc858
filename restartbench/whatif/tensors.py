"""Tensors per rank: what an engine that handles one item per tensor pays for, beside the plan's bytes and files.

Why. PyTorch DCP (``dcp``, ``dcp-async``) plans its save per tensor (a WriteItem each, gathered on the coordinator,
deduplicated, one metadata entry each), writes each tensor as its own ``torch.save`` entry of the rank's ``.distcp``
file, and at a load plans, seeks and ``torch.load``s each tensor again (a ReadItem each). So its time grows with the
rank's tensors at equal bytes and files: on this study's CPU calibration an emulated 33B tp1pp2 rank (66.7 MB, 276
tensors written) saved in 0.81 s where an emulated 3B tp1pp1dp2 rank (59.7 MB, 141 tensors) took 0.41 s; the
plan's bytes and files (one ``.distcp`` per rank whatever the model) cannot tell them apart. An emulated run keeps the
preset's depth and shrinks its width (``restartbench.shards.scaled_preset``), so its tensors are those of the full
model: the count does not depend on ``--emulate-scale`` nor on the dtype.

The count. Every engine saves the same training state (``restartbench.engines.harness_state``): the stage module's
state_dict for the rank's tensor slice, and ZeRO-1's optimizer partition. For the study's LLaMA-style decoder that is
9 tensors a decoder layer (2 norms, q, k, v, o, gate, up, down), the embedding on the first pipeline stage, the
final norm and the output head on the last, and 4 optimizer tensors whatever dp (ZeRO-1's flat fp32 partition,
Adam's step and two moments of it: one parameter group). Rather than copy that by hand, ``stage_tensors`` counts the
tensors of the very state the plan predicts the files from (``restartbench.shards.training_states``: DeepSpeed's own
partition of the layers into stages, on meta tensors; ``tests/test_whatif_tensors.py`` holds the arithmetic above
against it).

Held and written. Each rank holds (plans, and reads back at a load) its module and optimizer tensors. What it writes
depends on the engine: DCP's global plan deduplicates the module tensors the data-parallel replicas share and gives
each to the replica with the least bytes planned so far (``torch.distributed.checkpoint._dedup_save_plans``), which
spreads them over the replicas: the busiest writes about ``ceil(module / dp)`` of them beside its optimizer's. The
balance is by bytes, not by count, so a replica that takes a large tensor takes fewer others and the busiest by count
writes more: the rule gives 132 where DCP's planner gives 141 (3B tp1pp1dp2), 150 for 152 (7B tp1pp1dp2), 42 for 49
and 23 for 31 (small on tp1pp1dp2 and tp1pp2dp2, whose embedding is a large share of a stage's bytes). DeepSpeed's
engines write the module from data-parallel rank 0 only, as the plan's bytes do
(``restartbench.whatif.predict.job_for``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from restartbench.config import RunConfig
from restartbench.engines import harness_state
from restartbench.plan import setup_for
from restartbench.shards import training_states
from restartbench.whatif.terms import COLLECTIVE, base_engine

#: (pipeline stage, tensor-parallel rank) → (module tensors, optimizer tensors) of one rank there.
StageTensors = dict[tuple[int, int], tuple[int, int]]


@lru_cache(maxsize=64)
def stage_tensors(preset: str, layout: str, dtype: str = "bf16") -> StageTensors:
    """The tensors of one rank at each (stage, tp rank): counted on the plan's training state of data-parallel rank
    0 there (the other replicas hold as many)."""
    cfg = RunConfig()
    cfg.model.preset, cfg.model.dtype, cfg.layout.layout = preset, dtype, layout
    cfg.storage.checkpoint_dir = "/checkpoints"  # the folder's path changes no tensor
    setup = setup_for(cfg)
    tp, pp, dp = setup.layout.tp, setup.layout.pp, setup.layout.dp
    first = {(stage * dp) * tp + t for stage in range(pp) for t in range(tp)}  # DeepSpeed's axes: pipe, data, model
    counts: StageTensors = {}
    for _, coord, state in training_states(setup, first):
        _, tensors = harness_state.split(harness_state.capture(state))
        module = sum(1 for key in tensors if key.startswith("module/"))
        counts[coord.pipe, coord.model] = (module, len(tensors) - module)
    return counts


def spreads_module(engine: str) -> bool:
    """Whether the engine's save spreads the replicas' module tensors over them (DCP's deduplication), rather than
    writing them from data-parallel rank 0 (DeepSpeed's engines)."""
    return base_engine(engine) in COLLECTIVE


def busiest(counts: StageTensors, dp: int, engine: str) -> tuple[int, int]:
    """(held, written): the most tensors a rank holds (module and optimizer: what it plans and reads back), and the
    most it writes at data-parallel ``dp`` (each over the ranks; 0, 0 without counts)."""
    if not counts:
        return 0, 0
    held = max(module + optimizer for module, optimizer in counts.values())
    if spreads_module(engine):
        written = max(math.ceil(module / dp) + optimizer for module, optimizer in counts.values())
    else:
        written = held  # data-parallel rank 0 writes the module beside its optimizer share
    return held, written

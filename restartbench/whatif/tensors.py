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
of its stage's module depends on the engine (``module_shares``): DeepSpeed's engines and the lazy engine write it
from data-parallel rank 0 only; torchsnapshot from every replica; DCP's global plan deduplicates the tensors the
replicas share and gives each to the replica with the fewest bytes planned so far
(``torch.distributed.checkpoint._dedup_save_plans``), which spreads them over the replicas by bytes, not by count: a
replica that takes the embedding takes few others, and at a large dp the busiest writes at least the largest tensor.
``module_shares`` replays that choice (``restartbench.engines.dcp.predict.dedup_owners``, the engine's
``CostTraits.module_split``) on the stage's tensors (``stage_module``), so the bytes and tensors each replica writes at
any dp are DCP's own (``tests/test_whatif_tensors.py`` holds it to DCP's function, ``tests/test_whatif_parts.py`` the
bytes to the plan at a larger dp).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from restartbench.engines import cost_traits, harness_state, module_split
from restartbench.engines.dcp.predict import tensor_saved_size
from restartbench.layout import Layout
from restartbench.plan import config_named, setup_for
from restartbench.shards import training_states

#: (pipeline stage, tensor-parallel rank) → (module tensors, optimizer tensors) of one rank there.
StageTensors = dict[tuple[int, int], tuple[int, int]]


class Tensor(NamedTuple):
    """One module tensor as the engines write it."""

    raw: int
    """Its bytes (elements × element size): what DCP's deduplication weighs it by."""
    entry: int
    """Bytes of its ``torch.save`` entry in a DCP ``.distcp`` file (the tensor and its zip records)."""


#: (pipeline stage, tensor-parallel rank) → the stage module's tensors of one rank there, in the state's order.
StageModule = dict[tuple[int, int], tuple[Tensor, ...]]


class Share(NamedTuple):
    """What one data-parallel replica writes of its stage's module at a save."""

    raw: int
    """Tensor bytes."""
    written: int
    """Bytes it adds to the replica's files: the tensor bytes, or for DCP their ``torch.save`` entries; the
    other engines' file framing does not grow with the tensors and is counted with the rank's files."""
    tensors: int


@lru_cache(maxsize=64)
def stage_tensors(preset: str, layout: str, dtype: str = "bf16") -> StageTensors:
    """The tensors of one rank at each (stage, tp rank): counted on the plan's training state of data-parallel rank
    0 there (the other replicas hold as many)."""
    counts: StageTensors = {}
    for key, tensors in _first_replicas(preset, layout, dtype, 1.0):
        module = sum(1 for name in tensors if name.startswith("module/"))
        counts[key] = (module, len(tensors) - module)
    return counts


@lru_cache(maxsize=64)
def stage_module(preset: str, layout: str, dtype: str = "bf16", scale: float = 1.0) -> StageModule:
    """The stage module's tensors at each (stage, tp rank), in the state's order (DCP plans them in it), on the plan's
    training state of data-parallel rank 0 there (``scale``: an emulated run's width factor)."""
    module: StageModule = {}
    with tempfile.TemporaryDirectory(prefix="restartbench-whatif-") as scratch:
        for key, tensors in _first_replicas(preset, layout, dtype, scale):
            module[key] = tuple(Tensor(t.numel() * t.element_size(),
                                       tensor_saved_size(t.dtype, tuple(t.shape), scratch))
                                for name, t in tensors.items() if name.startswith("module/"))
    return module


def _first_replicas(preset: str, layout: str, dtype: str,
                    scale: float) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    """((stage, tp rank), its tensors by the harness state's keys) of data-parallel rank 0 at each stage and tp rank,
    on meta tensors."""
    setup = setup_for(config_named(preset, layout, dtype=dtype), scale=scale)
    tp, pp, dp = setup.layout.tp, setup.layout.pp, setup.layout.dp
    first = {(stage * dp) * tp + t for stage in range(pp) for t in range(tp)}  # DeepSpeed's axes: pipe, data, model
    for _, coord, state in training_states(setup, first):
        _, tensors = harness_state.split(harness_state.capture(state))
        yield (coord.pipe, coord.model), tensors


def spreads_module(engine: str) -> bool:
    """Whether the engine's save spreads the replicas' module tensors over them (DCP's deduplication), rather than
    writing them whole from one replica or from each (``CostTraits.module_split``)."""
    return cost_traits(engine).module_split is not None


def replica_ranks(stage: int, tp_rank: int, layout: Layout) -> list[int]:
    """The global ranks of the data-parallel replicas at (stage, tp rank), in data-parallel order (DeepSpeed's axes:
    pipe, data, model)."""
    return [(stage * layout.dp + data) * layout.tp + tp_rank for data in range(layout.dp)]


def module_shares(module: Sequence[Tensor], ranks: Sequence[int], engine: str) -> list[Share]:
    """What each replica (``ranks``: their global ranks, ``replica_ranks``) writes of a stage module at a save, in
    data-parallel order, as the engine's ``CostTraits`` say: shared out by its ``module_split`` (DCP's deduplication,
    ``restartbench.engines.dcp.predict.dedup_owners``), all of it from every replica (torchsnapshot), or all of it
    from replica 0 (DeepSpeed's engines, the lazy engine)."""
    split = module_split(engine)
    if split is not None:
        shares = [[0, 0, 0] for _ in ranks]
        for tensor, replica in zip(module, split([t.raw for t in module], ranks)):
            share = shares[replica]
            share[0], share[1], share[2] = share[0] + tensor.raw, share[1] + tensor.entry, share[2] + 1
        return [Share(*share) for share in shares]
    raw = sum(t.raw for t in module)
    whole = Share(raw, raw, len(module))
    if every_replica(engine):
        return [whole] * len(ranks)
    return [whole] + [Share(0, 0, 0)] * (len(ranks) - 1)


def stage_shares(module: StageModule, layout: Layout, engine: str) -> dict[tuple[int, int], list[Share]]:
    """(stage, tp rank) → ``module_shares`` of its replicas on ``layout``."""
    return {(stage, tp): module_shares(tensors, replica_ranks(stage, tp, layout), engine)
            for (stage, tp), tensors in module.items()}


def read_beyond_written(module: StageModule, layout: Layout, engine: str) -> int:
    """The most bytes a rank reads at a load beyond what it wrote, of its stage module: for DCP the tensors its
    replicas wrote (a rank reads every tensor it holds); 0 for the others, whose writer of the module holds it."""
    if not spreads_module(engine):
        return 0
    return max((module_held(module[key], engine) - max(share.written for share in shares)
                for key, shares in stage_shares(module, layout, engine).items()), default=0)


def module_held(module: Sequence[Tensor], engine: str) -> int:
    """The bytes of a stage module each of its ranks reads at a load: all of it, whoever wrote it (DCP: its entries
    in the replicas' files; the others: the tensors, from replica 0's files or, torchsnapshot, from its own)."""
    return sum(t.entry if spreads_module(engine) else t.raw for t in module)


def every_replica(engine: str) -> bool:
    """Whether every data-parallel replica writes (and reads back) its own copy of the stage module."""
    return cost_traits(engine).every_replica


def index_items(counts: StageTensors, dp: int) -> int:
    """The items DCP's ``.metadata`` indexes at data-parallel ``dp``: each stage module's tensors once (the replicas
    share them) and every rank's optimizer tensors and its own object (the harness state's skeleton)."""
    return sum(module + dp * (optimizer + 1) for module, optimizer in counts.values())


def planned_items(counts: StageTensors, dp: int, engine: str) -> int:
    """The items every rank plans at data-parallel ``dp`` in a collective engine's save, which its coordinator gathers
    and deduplicates (DCP: ``restartbench.engines.dcp.coordinator``): each rank's module and optimizer tensors and
    its own object. 0 for an engine whose ranks save alone, and without counts."""
    if not counts or not cost_traits(engine).collective:
        return 0
    return sum(dp * (module + optimizer + 1) for module, optimizer in counts.values())


def busiest(counts: StageTensors, module: StageModule, layout: Layout, engine: str) -> tuple[int, int]:
    """(held, written): the most tensors a rank holds (module and optimizer: what it plans and reads back), and the
    most it writes on ``layout``: for DCP its share of the module (``module_shares``) beside its optimizer's, for the
    other engines all it holds (its module, on replica 0 or on every one). Each over the ranks; 0, 0 without
    counts."""
    if not counts:
        return 0, 0
    held = max(stage + optimizer for stage, optimizer in counts.values())
    if not spreads_module(engine):
        return held, held
    shares = stage_shares(module, layout, engine)
    written = max(max(share.tensors for share in shares[key]) + optimizer for key, (_, optimizer) in counts.items())
    return held, written

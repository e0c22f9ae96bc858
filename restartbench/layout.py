"""Parallel layouts: parse names like ``tp2pp4dp2`` and check them against a model.

Grammar: any of ``tp<N>``, ``pp<N>``, ``dp<N>`` in any order, each at most once,
N ≥ 1. A missing ``tp`` or ``pp`` is 1; a missing ``dp`` is inferred from the
world size (``world // (tp·pp)``). ``tp2pp4`` on 16 ranks is ``tp2pp4dp2``.

Everything here is pure: no torch, no environment. Each error says what is
wrong with which numbers and what to change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from restartbench.presets import ModelPreset

_PART = re.compile(r"(tp|pp|dp)(\d+)")


class LayoutError(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """Tensor × pipeline × data parallel degrees; world size is their product."""

    tp: int
    pp: int
    dp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        """Canonical name, every degree written: ``tp2pp4dp1``."""
        return f"tp{self.tp}pp{self.pp}dp{self.dp}"


@dataclass(frozen=True)
class LayoutSpec:
    """A parsed layout name; ``dp`` is None where the name leaves it to the world size."""

    tp: int
    pp: int
    dp: int | None

    def resolve(self, world_size: int | None) -> Layout:
        """Fix every degree, inferring dp from the world size where needed."""
        model_ranks = self.tp * self.pp
        if self.dp is None:
            if world_size is None:
                return Layout(self.tp, self.pp, 1)
            if world_size % model_ranks:
                raise LayoutError(
                    f"world size {world_size} is not a multiple of tp·pp = {self.tp}·{self.pp} = {model_ranks}; "
                    f"use {model_ranks}·k ranks or name dp explicitly"
                )
            return Layout(self.tp, self.pp, world_size // model_ranks)
        layout = Layout(self.tp, self.pp, self.dp)
        if world_size is not None and layout.world_size != world_size:
            raise LayoutError(
                f"layout {layout.name} needs tp·pp·dp = {self.tp}·{self.pp}·{self.dp} = {layout.world_size} ranks, "
                f"but {world_size} were given; launch {layout.world_size} ranks or change the layout"
            )
        return layout


def parse_layout(text: str) -> LayoutSpec:
    """Parse ``tp2pp4``, ``pp2dp2``, ``dp4`` … into a LayoutSpec."""
    name = text.strip().lower()
    parts = _PART.findall(name)
    if not name or "".join(k + n for k, n in parts) != name:
        raise LayoutError(
            f"malformed layout {text!r}: write degrees as tp<N>, pp<N>, dp<N> in any order, e.g. tp2pp4 or tp2pp2dp2"
        )
    degrees: dict[str, int] = {}
    for key, number in parts:
        if key in degrees:
            raise LayoutError(f"malformed layout {text!r}: {key} is given twice")
        if int(number) < 1:
            raise LayoutError(f"malformed layout {text!r}: {key}{number} must be at least 1")
        degrees[key] = int(number)
    return LayoutSpec(tp=degrees.get("tp", 1), pp=degrees.get("pp", 1), dp=degrees.get("dp"))


def layout_problems(layout: Layout, preset: ModelPreset) -> list[str]:
    """Every reason the model cannot be split this way, each with the numbers and a fix. Empty = fits."""
    problems = []
    if preset.layers % layout.pp:
        problems.append(
            f"{preset.name} has {preset.layers} layers, not divisible by pp={layout.pp}; "
            f"choose pp among {_divisors(preset.layers)}"
        )
    for what, count in (("attention heads", preset.heads), ("kv-heads", preset.kv_heads)):
        if count % layout.tp:
            problems.append(
                f"{preset.name} has {count} {what}, not divisible by tp={layout.tp}; "
                f"choose tp among {_divisors(count)}"
            )
    if preset.hidden % preset.heads:
        problems.append(f"{preset.name}: hidden {preset.hidden} is not divisible by its {preset.heads} heads")
    if preset.vocab_size % layout.tp:
        problems.append(
            f"{preset.name} has a vocabulary of {preset.vocab_size}, not divisible by tp={layout.tp} "
            f"(the embedding and output head are split by vocabulary rows)"
        )
    if preset.ffn_hidden % layout.tp:
        problems.append(f"{preset.name}: ffn hidden {preset.ffn_hidden} is not divisible by tp={layout.tp}")
    return problems


def validate_layout(spec: LayoutSpec | str, preset: ModelPreset, world_size: int | None = None) -> Layout:
    """Resolve and check a layout for a preset; raise LayoutError listing every problem."""
    if isinstance(spec, str):
        spec = parse_layout(spec)
    layout = spec.resolve(world_size)
    problems = layout_problems(layout, preset)
    if problems:
        raise LayoutError(f"layout {layout.name} does not fit {preset.name}:\n  - " + "\n  - ".join(problems))
    return layout


def restore_grad_accum(saved: Layout, saved_grad_accum: int, new: Layout) -> int:
    """Micro-batches per rank and iteration on ``new`` that keep the run's global batch (dp × grad_accum micro-batches
    of the same samples, ``restartbench.data``), so a restart on another layout resumes the same training."""
    micro_batches = saved.dp * saved_grad_accum
    if micro_batches % new.dp:
        raise LayoutError(f"the run's global batch is {micro_batches} micro-batches (dp={saved.dp} × "
                          f"{saved_grad_accum} per rank); {new.name} has dp={new.dp}, which does not divide it, so a "
                          f"restart there would train on another batch; choose dp among {_divisors(micro_batches)}, "
                          f"or train the run with --grad-accum a multiple of {new.dp // math.gcd(new.dp, saved.dp)}")
    return micro_batches // new.dp


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)

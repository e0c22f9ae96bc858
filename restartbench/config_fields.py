"""The fields of the run configuration: ``opt`` makes one, with its documentation, how it appears on the command
line and the values it accepts (``Allowed``).

Standard library only, and nothing else of restartbench: ``restartbench.config`` and every engine folder's
``options.py`` (the engine's options, part of the configuration) declare their fields with it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Allowed:
    """The values an option accepts besides its type (None, for an optional field, is always accepted; a float must
    be finite): at least ``low`` (above it when ``low_open``), at most ``high``, matching ``pattern``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    pattern: str | None = None
    """A regular expression the whole value must match."""
    says: str = ""
    """How to say what matches ``pattern``, for a person: 'HH:MM:SS'."""

    def describe(self) -> str:
        if self.pattern:
            return self.says
        low = f"above {self.low:g}" if self.low_open else f"at least {self.low:g}"
        if self.high is None:
            return low
        return f"between {self.low:g} and {self.high:g}" if not self.low_open else f"{low} and at most {self.high:g}"

    def accepts(self, value: Any) -> bool:
        if value is None:
            return True
        if self.pattern:
            return re.fullmatch(self.pattern, value) is not None
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above_low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above_low and (self.high is None or value <= self.high)


AT_LEAST_1 = Allowed(low=1)
AT_LEAST_0 = Allowed(low=0)


def opt(default: Any, doc: str, *, positional: bool = False, choices: tuple[str, ...] | None = None,
        allowed: Allowed | None = None, by_device: dict[str, Any] | None = None, before: Any = None) -> Any:
    """A config field with its documentation, how it appears on the command line, and the values it accepts.

    ``by_device``: for a field whose default is None, what None stands for on each device the run's state lives on
    (``{"cpu": False, "cuda": True}``). ``before``: what a run had before the field existed, where that is not what
    its default says now (a run folder's config.json written then lacks the key)."""
    return field(default=default, metadata={"doc": doc, "positional": positional, "choices": choices,
                                            "allowed": allowed, "by_device": by_device, "before": before})


def for_device(value: Any, by_device: dict[str, Any] | None, device: str | None) -> Any:
    """``value``; where it is None, what ``by_device`` (``opt``'s) says for ``device`` ('cuda:1' counts as 'cuda'),
    None for a device it does not name."""
    if value is not None or not by_device:
        return value
    return by_device.get((device or "").split(":")[0])


def device_default(leaf: Any, device: str | None) -> Any:
    """The value a field's default stands for on ``device`` (``for_device``)."""
    return for_device(leaf.default, leaf.metadata.get("by_device"), device)


def saved_value(leaf: Any, section: dict[str, Any], device: str | None) -> Any:
    """What a run had for a field, as its saved config section says, on the device it ran on (``for_device``): the
    value saved; where the section lacks the key (written before the field existed), ``opt``'s ``before``, else
    the default."""
    if leaf.name in section:
        value = section[leaf.name]
    else:
        value = leaf.default if leaf.metadata.get("before") is None else leaf.metadata["before"]
    return for_device(value, leaf.metadata.get("by_device"), device)


def flag(name: str, negated: bool = False) -> str:
    """How the field ``name`` is spelled on the command line: '--lazy-direct-io' for ``lazy_direct_io``, and
    '--no-lazy-direct-io' ``negated`` (a boolean turned off, as argparse's BooleanOptionalAction spells it)."""
    return f"--{'no-' if negated else ''}{name.replace('_', '-')}"

"""A checkpoint's interference with training: the slowdown of the iterations its background work overlapped and its
whole cost (``results.interference`` per checkpoint), as table columns, and how ``checkpoint_summary`` takes their
medians: over the checkpoints whose background work training saw end (``background_seen``), over all where none
did."""

from __future__ import annotations

from typing import Any

import pandas as pd

from restartbench.results import whole_cost


def cost_columns(cost: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's interference (``results.interference``) as table columns."""
    return {column: cost.get(column) for column in ("overlapped_iterations", "slowdown_s", "cost_s",
                                                    "background_seen")}


#: A checkpoint's interference columns (``results.interference``) that ``checkpoint_summary`` takes medians of.
INTERFERENCE = ("overlapped_iterations", "slowdown_s")


def seen_columns(ckpt: pd.DataFrame) -> pd.DataFrame:
    """``_seen`` (background_seen, absent counted False) and ``_seen_<column>``: the interference figures of those
    checkpoints only (NaN elsewhere)."""
    seen = ckpt["background_seen"].eq(True) if "background_seen" in ckpt else pd.Series(False, index=ckpt.index)
    numbers = {c: pd.to_numeric(ckpt[c], errors="coerce") if c in ckpt else pd.Series(float("nan"), index=ckpt.index)
               for c in INTERFERENCE}
    return ckpt.assign(_seen=seen.astype(int), **numbers, **{f"_seen_{c}": numbers[c].where(seen)
                                                              for c in INTERFERENCE})


def interference_aggregations() -> dict[str, tuple[str, str]]:
    """The named aggregations of ``seen_columns``' columns: the seen checkpoints' count, and the medians over the
    seen checkpoints and over all of them (``interference_medians`` picks)."""
    return {"seen_checkpoints": ("_seen", "sum"), **{f"_seen_{c}": (f"_seen_{c}", "median") for c in INTERFERENCE},
            **{f"_all_{c}": (c, "median") for c in INTERFERENCE}}


def interference_medians(summary: pd.DataFrame) -> None:
    """In place: each interference column the median over the seen checkpoints where there were any, else over all,
    and ``cost_s`` = ``stall_s`` + ``slowdown_s`` (``results.whole_cost``: a negative slowdown adds nothing)."""
    for column in INTERFERENCE:
        seen, every = summary.pop(f"_seen_{column}"), summary.pop(f"_all_{column}")
        summary[column] = seen.where(summary["seen_checkpoints"] > 0, every)
    summary["cost_s"] = [whole_cost(stall, slowdown) if pd.notna(stall) and pd.notna(slowdown) else None
                         for stall, slowdown in zip(summary["stall_s"], summary["slowdown_s"])]

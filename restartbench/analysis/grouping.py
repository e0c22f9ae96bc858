"""How the tables are grouped, ordered and picked from: the grouping keys of a configuration (``group_keys``), the
engines in the registry's order, a preset / layout / engines selection, the configuration a notebook shows first,
and the logs root a notebook reads."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from restartbench.analysis.columns import SETUP_KEYS
from restartbench.engines import engine_names
from restartbench.layout import parse_layout


def group_keys(table: pd.DataFrame) -> list[str]:
    """preset, layout, the setup columns that vary in this table (dtype, device, storage, client, nodes, the engine's
    options), engine."""
    varying = [key for key in SETUP_KEYS if key in table.columns and table[key].nunique(dropna=False) > 1]
    return ["preset", "layout", *varying, "engine"]


def engine_order(engines: Iterable[str]) -> list[str]:
    """The registry's order (none, torch, ...) for known engines, then the others alphabetically."""
    known = engine_names()
    present = set(engines)
    return [e for e in known if e in present] + sorted(present - set(known))


def sort_rows(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows sorted by ``keys``, engines in the registry's order (none, torch, ...) rather than by name."""
    if frame.empty or "engine" not in frame.columns:
        return frame.reset_index(drop=True)
    order = {engine: i for i, engine in enumerate(engine_order(frame["engine"].unique()))}
    others = [k for k in keys if k != "engine"]
    return (frame.assign(_engine_order=frame["engine"].map(order))
            .sort_values([*others, "_engine_order"], kind="stable")
            .drop(columns="_engine_order").reset_index(drop=True))



def select(table: pd.DataFrame, preset: str | None = None, layout: str | None = None,
           engines: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows of one preset / layout / engines (None: all); a layout may be given as tp2pp2 or tp2pp2dp1."""
    if table.empty:
        return table
    mask = pd.Series(True, index=table.index)
    if preset is not None:
        mask &= table["preset"] == preset
    if layout is not None:
        mask &= (table["layout"] == layout) | (table["layout"] == _canonical(layout, table))
    if engines is not None:
        mask &= table["engine"].isin(list(engines))
    return table[mask]


def _canonical(layout: str, table: pd.DataFrame) -> str:
    """tp2pp2 -> the table's tp2pp2dp<N> (dp1 preferred where the name leaves dp open)."""
    try:
        spec = parse_layout(layout)
    except ValueError:
        return layout
    if spec.dp is not None:
        return f"tp{spec.tp}pp{spec.pp}dp{spec.dp}"
    prefix = f"tp{spec.tp}pp{spec.pp}dp"
    matches = sorted(name for name in table["layout"].dropna().unique() if str(name).startswith(prefix))
    return prefix + "1" if prefix + "1" in matches or not matches else matches[0]


LOGS_ENV = "RESTARTBENCH_LOGS"


def logs_from_env(default: str = "logs") -> Path:
    """The logs root for notebooks: $RESTARTBENCH_LOGS, else ``default``; a relative path that does not exist here
    is also tried one folder up (a notebook runs in notebooks/, the logs live at the repository root)."""
    path = Path(os.environ.get(LOGS_ENV) or default).expanduser()
    if not path.is_absolute() and not path.exists() and (Path.cwd().parent / path).exists():
        path = Path.cwd().parent / path
    return path


def pick_configuration(table: pd.DataFrame) -> tuple[str | None, str | None]:
    """The (preset, layout) with the most engines measured (ties: most runs, then name)."""
    if table.empty:
        return None, None
    counts = table.groupby(["preset", "layout"]).agg(engines=("engine", "nunique"), runs=("run_id", "nunique"))
    counts = counts.sort_values(["engines", "runs"], ascending=False, kind="stable")
    preset, layout = counts.index[0]
    return preset, layout


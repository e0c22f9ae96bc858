"""A table built from the blocks of many runs' records (``Columns``), as ``pd.DataFrame(rows)`` builds one from all
their rows: the columns in the order they first appear, NaN where a row lacks a column, the rows in the order added.

Why not a list per column, extended block by block: a run's blocks hold a few rows and a hundred columns, and over
10,000 runs that was a million list extensions, the most of a read from records (issue 27). Blocks with the same keys
(most runs of a study give the same few) are kept together instead, as they came, and each column is joined once per
keys when the table is asked for, then the rows put back in the order they were added.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

from restartbench.analysis import records


class Blocks:
    """The blocks added with one set of keys: their columns (as given: lists or encoded), and the rows they hold."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.columns: list[list[Any]] = []
        self.count = 0

    def joined(self) -> dict[str, list[Any]]:
        """Each column of every block, in the order added, decoded."""
        joined = {}
        for key, parts in zip(self.keys, zip(*self.columns)):
            if set(map(type, parts)) != {list}:
                parts = map(records.decode_column, parts)
            joined[key] = list(chain.from_iterable(parts))
        return joined


class Columns:
    """A table from blocks of rows (``add``), each column a list or encoded (``records.encode_column``), decoded only
    when the table is asked for (``frame``)."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[str, ...], Blocks] = {}
        self.added: list[tuple[Blocks, int]] = []
        self.kept: dict[str, list[Any]] | None = None

    def add(self, keys: tuple[str, ...], columns: list[Any], count: int) -> None:
        """Append ``count`` rows given as their columns, in the order of ``keys``."""
        blocks = self.blocks.get(keys)
        if blocks is None:
            blocks = self.blocks[keys] = Blocks(keys)
        blocks.columns.append(columns)
        blocks.count += count
        self.added.append((blocks, count))
        self.kept = None

    def frame(self, order: dict[str, Any]) -> pd.DataFrame:
        """The table, the columns of ``order`` first (in its order), then the others as they came."""
        with collector_paused():
            if self.kept is None:
                self.kept = self.join()
            columns = self.kept
            frame = pd.DataFrame(columns) if columns else pd.DataFrame()
        ordered = [c for c in order if c in frame.columns] + [c for c in frame.columns if c not in order]
        return frame.reindex(columns=ordered or list(order))

    def join(self) -> dict[str, list[Any]]:
        """Every column, rows in the order added (kept until more are added: a table may be asked for again)."""
        names = list(dict.fromkeys(chain.from_iterable(self.blocks)))
        columns: dict[str, list[Any]] = {name: [] for name in names}
        for blocks in self.blocks.values():
            joined = blocks.joined()
            blocks.columns = [list(joined.values())]  # one block from now on: the runs' own lists freed
            for name, column in columns.items():
                column.extend(joined[name] if name in joined else [np.nan] * blocks.count)
        rows = self.row_order()
        if rows is not None:
            pick = itemgetter(*rows)
            columns = {name: list(pick(column)) for name, column in columns.items()}
        return columns

    def row_order(self) -> list[int] | None:
        """Where each row added is among the rows joined keys by keys (``frame``), in the order added; None where
        that is already the order (one set of keys, or each set's blocks added together)."""
        start, place = {}, 0
        for blocks in self.blocks.values():
            start[id(blocks)] = place
            place += blocks.count
        rows: list[int] = []
        for blocks, count in self.added:
            first = start[id(blocks)]
            rows.extend(range(first, first + count))
            start[id(blocks)] = first + count
        return None if rows == list(range(len(rows))) else rows


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the tables grow or are joined: they hold no cycles, and every full
    collection would scan all they hold so far (the work per run grew with the runs read: issue 27; joining 10,000
    runs' tidy table took 15 s with it on)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

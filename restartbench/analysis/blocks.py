"""A table built from the blocks of many runs' records (``Columns``), as ``pd.DataFrame(rows)`` builds one from all
their rows: the columns in the order they first appear, NaN where a row lacks a column, the rows in the order added.

Why not a list per column, extended block by block: a run's blocks hold a few rows and a hundred columns, and over
10,000 runs that was a million list extensions, the most of a read from records (issue 27). Blocks with the same keys
(most runs of a study give the same few) are kept together instead, each block as one array (``Blocks``), and each
column is picked out of them at once when the table is asked for, then the rows put back in the order they were added.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from restartbench.analysis import records


class Blocks:
    """The blocks added with one set of keys, and the rows each holds, each block as one array of objects: a block of
    plain columns (a run's few rows: the record's list per column) as its values, column after column; one with
    encoded columns (``records.encode_column``) as its columns, decoded when the table is asked for (``held``).

    Arrays, not the record's lists: 10,000 runs' blocks were millions of small lists, which every pass of Python's
    garbage collector scanned again (a list it tracks for ever; an array of objects it never scans), so that the
    tables' steps after ``collect`` took seconds more at 10,000 runs, 20 times their time at 2,000; and joining them
    column by column visited each list in turn (issue 27)."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.parts: list[np.ndarray] = []  # sealed: each a block's values, or a run of plain blocks' values
        self.encoded: list[bool] = []
        self.sizes: list[int] = []  # the rows of each part
        self.counts: list[int] = []  # the rows of each block
        self.count = 0
        self.pending: list[list[Any]] = []  # the plain blocks' columns added since the last part
        self.pending_rows = 0

    def add(self, columns: list[Any], count: int) -> None:
        """A block, as its columns. Plain blocks wait in ``pending`` until ``seal`` makes those in a row one part:
        one array for thousands of runs' blocks, not one each (half of a read from records was these arrays)."""
        if set(map(type, columns)) != {list}:  # encoded
            self.seal()
            self._part(held(columns), True, count)
        else:
            self.pending.append(columns)
            self.pending_rows += count
        self.counts.append(count)
        self.count += count

    def seal(self) -> None:
        """The plain blocks waiting made one part (``add``): an array, which the garbage collector does not track."""
        if self.pending:
            columns = chain.from_iterable(self.pending)
            self._part(values_of(columns, self.pending_rows * len(self.keys)), False, self.pending_rows)
            self.pending, self.pending_rows = [], 0

    def _part(self, part: np.ndarray, encoded: bool, rows: int) -> None:
        self.parts.append(part)
        self.encoded.append(encoded)
        self.sizes.append(rows)

    def joined(self) -> dict[str, np.ndarray]:
        """Each column of every block, in the order added (arrays of the values, decoded); the blocks are one from
        now on, the runs' own freed."""
        self.seal()
        values = self.values()
        counts = np.array(self.counts, dtype=np.int64)
        block = np.repeat(np.arange(len(counts)), counts)  # each row's block
        start = (np.cumsum(counts) - counts)[block]  # the row its block starts at
        first = start * len(self.keys) + np.arange(self.count) - start  # where its value of the first column is
        joined = {key: values[first + index * counts[block]] for index, key in enumerate(self.keys)}
        one = np.concatenate([values[:0], *joined.values()])  # values[:0]: none where there are no keys
        self.parts, self.encoded, self.sizes, self.counts = [one], [False], [self.count], [self.count]
        return joined

    def values(self) -> np.ndarray:
        """Every block's values, block after block, each column after column."""
        return np.concatenate([values_of(map(decoded, part), rows * len(self.keys)) if encoded else part
                               for part, encoded, rows in zip(self.parts, self.encoded, self.sizes)])


def values_of(columns: Iterable[Iterable[Any]], size: int) -> np.ndarray:
    """The values of ``columns``, one after the other, as an array of objects."""
    return np.fromiter(chain.from_iterable(columns), dtype=object, count=size)


def held(columns: list[Any]) -> np.ndarray:
    """An encoded block's columns as an array, those the garbage collector would scan made arrays too: a list of
    values as an array of them, the ``[[value, count], ...]`` of a column of runs as an array of two columns (the
    other encodings are dicts of plain values, which it does not track)."""
    held = [values_of([column], len(column)) if type(column) is list
            else np.array(column["runs"], dtype=object) if "runs" in column
            else column for column in columns]
    return values_of([held], len(held))


def decoded(column: Any) -> Any:
    """The values of a column ``held`` keeps."""
    if type(column) is not np.ndarray:
        return records.decode_column(column)
    return column if column.ndim == 1 else np.repeat(column[:, 0], column[:, 1].astype(np.int64))


class Columns:
    """A table from blocks of rows (``add``), each column a list or encoded (``records.encode_column``), decoded only
    when the table is asked for (``frame``)."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[str, ...], Blocks] = {}
        self.added: list[tuple[str, ...]] = []  # each block's keys (the Blocks' own), in the order added
        self.counts: list[int] = []  # and its rows
        self.kept: pd.DataFrame | None = None

    def add(self, keys: tuple[str, ...], columns: list[Any], count: int) -> None:
        """Append ``count`` rows given as their columns, in the order of ``keys``."""
        blocks = self.blocks.get(keys)
        if blocks is None:
            blocks = self.blocks[keys] = Blocks(keys)
        blocks.add(columns, count)
        self.added.append(blocks.keys)
        self.counts.append(count)
        self.kept = None

    def seal(self) -> None:
        """Every plain block waiting made part of an array (``Blocks.seal``): to be called before the garbage
        collector is back, once the blocks of many runs are added."""
        for blocks in self.blocks.values():
            blocks.seal()

    def frame(self, order: dict[str, Any]) -> pd.DataFrame:
        """The table with every column of ``order`` first (in its order; empty where no row has it, as in a study
        whose runs all lack a restart), then the others as they came."""
        if self.kept is None:
            with collector_paused():
                self.kept = self.made()
        frame = self.kept
        return frame.reindex(columns=[*order, *(c for c in frame.columns if c not in order)])

    def made(self) -> pd.DataFrame:
        """The table as the blocks make it (kept until more are added: a table may be asked for again). Its columns
        joined die here, before the garbage collector is back (it would scan every value)."""
        columns = self.join()
        return pd.DataFrame(columns) if columns else pd.DataFrame()

    def join(self) -> dict[str, list[Any]]:
        """Every column, rows in the order added."""
        names = list(dict.fromkeys(chain.from_iterable(self.blocks)))
        joined = [(blocks.count, blocks.joined()) for blocks in self.blocks.values()]
        rows = self.row_order()
        columns = {}
        for name in names:
            column = np.concatenate([parts[name] if name in parts else np.full(count, np.nan, dtype=object)
                                     for count, parts in joined])
            columns[name] = (column if rows is None else column[rows]).tolist()
        return columns

    def row_order(self) -> np.ndarray | None:
        """Where each row added is among the rows joined keys by keys (``frame``), in the order added; None where
        that is already the order (one set of keys, or each set's blocks added together)."""
        start, place = {}, 0
        for keys, blocks in self.blocks.items():
            start[keys] = place
            place += blocks.count
        rows: list[int] = []
        for keys, count in zip(self.added, self.counts):
            first = start[keys]
            rows.extend(range(first, first + count))
            start[keys] = first + count
        return None if rows == list(range(len(rows))) else np.array(rows, dtype=np.int64)


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

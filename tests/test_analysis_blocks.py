"""restartbench.analysis.blocks: a table from the blocks of many runs, as pd.DataFrame(rows) builds it, holding
nothing the garbage collector must scan at every full collection (issue 27: 10,000 runs' blocks)."""

import gc

import numpy as np

from restartbench.analysis import records
from restartbench.analysis.blocks import Columns


def test_blocks_are_joined_in_the_order_added_with_nan_where_a_block_lacks_a_column():
    table = Columns()
    table.add(("a", "b"), [[1.0, 2.0], ["x", "y"]], 2)
    table.add(("a",), [records.encode_column([3.0] * 8)], 8)
    table.add(("b", "a"), [["z"], [4.0]], 1)
    frame = table.frame({"b": None})
    assert list(frame.columns) == ["b", "a"]
    assert frame["a"].tolist() == [1.0, 2.0, *[3.0] * 8, 4.0]
    assert frame["b"].tolist()[:2] == ["x", "y"] and frame["b"].tolist()[-1] == "z"
    assert all(isinstance(v, float) and np.isnan(v) for v in frame["b"].tolist()[2:10])


def test_a_blocks_plain_columns_leave_the_garbage_collectors_tracking():
    """A record decodes to lists, which the collector tracks for ever; a tuple of plain values it stops tracking at
    its first pass."""
    table = Columns()
    table.add(("a", "b"), [[1.0, 2.0], ["x", "y"]], 2)
    gc.collect()
    gc.collect()
    stored = table.blocks[("a", "b")].columns[0]
    assert not any(gc.is_tracked(column) for column in stored) and not gc.is_tracked(stored)

"""restartbench.analysis.blocks: a table from the blocks of many runs, as pd.DataFrame(rows) builds it, holding
nothing the garbage collector tracks (issue 27: its passes over 10,000 runs' blocks took seconds)."""

import gc

import numpy as np
import pandas as pd

from restartbench.analysis import records
from restartbench.analysis.blocks import Columns


def mixed_table() -> Columns:
    """Plain blocks, encoded ones (same, runs, f8, a list of values) and a set of keys that comes back later."""
    table = Columns()
    table.add(("a", "b"), [[1.0, 2.0], ["x", "y"]], 2)
    table.add(("a", "c"), [records.encode_column([3.0] * 8), records.encode_column(list("ppppqqqq"))], 8)
    table.add(("b", "a"), [["z"], [{"stage": 4.0}]], 1)
    table.add(("a", "b"), [[5.0], ["w"]], 1)
    table.add(("a", "c"), [records.encode_column([0.5 * i for i in range(8)]), list("rstuvwxy")], 8)
    return table


#: mixed_table's rows, as pd.DataFrame(rows) takes them.
ROWS = [{"a": 1.0, "b": "x"}, {"a": 2.0, "b": "y"}, *[{"a": 3.0, "c": c} for c in "ppppqqqq"],
        {"b": "z", "a": {"stage": 4.0}}, {"a": 5.0, "b": "w"},
        *[{"a": 0.5 * i, "c": c} for i, c in enumerate("rstuvwxy")]]


def test_blocks_are_joined_in_the_order_added_with_nan_where_a_block_lacks_a_column():
    frame = mixed_table().frame({"c": None})
    expected = pd.DataFrame(ROWS)[["c", "a", "b"]]
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert frame.map(type).equals(expected.map(type))


def test_blocks_added_after_a_table_was_made_join_as_if_added_before():
    table = mixed_table()
    first = table.frame({})
    table.add(("b", "a"), [["v"], [6.0]], 1)
    pd.testing.assert_frame_equal(table.frame({}), pd.DataFrame([*ROWS, {"b": "v", "a": 6.0}]), check_exact=True)
    pd.testing.assert_frame_equal(first, pd.DataFrame(ROWS), check_exact=True)


def test_a_table_asked_for_again_is_a_copy_of_its_own():
    table = mixed_table()
    first = table.frame({})
    first.loc[0, "a"] = -1.0
    assert table.frame({}).loc[0, "a"] == 1.0


def test_the_stored_blocks_are_nothing_the_garbage_collector_tracks():
    """A record decodes to lists (and runs to lists of lists), which the collector tracks for ever and scans at every
    pass; the blocks hold them in arrays, which it does not track."""
    table = mixed_table()
    stored = [part for blocks in table.blocks.values() for part in blocks.parts]
    held = [column for part in stored for column in part if isinstance(column, (list, dict, np.ndarray))]
    assert held and not any(gc.is_tracked(obj) for obj in [*stored, *held])
    table.frame({})
    assert not any(gc.is_tracked(part) for blocks in table.blocks.values() for part in blocks.parts)

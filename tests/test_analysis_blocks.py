"""restartbench.analysis.blocks: a table from the blocks of many runs, as pd.DataFrame(rows) builds it, holding
nothing the garbage collector tracks (issue 27: its passes over 10,000 runs' blocks took seconds)."""

import gc
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from restartbench.analysis import records
from restartbench.analysis.blocks import Columns
from restartbench.analysis.collecting import run_id_of
from restartbench.events import decode_json


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


def test_plain_blocks_added_in_a_row_are_sealed_into_one_part_between_encoded_ones():
    """Consecutive plain blocks of one set of keys are one array (one part), not one each; an encoded block between
    them ends a run; the rows still come back in the order added."""
    table = Columns()
    for value in (1.0, 2.0, 3.0):
        table.add(("a",), [[value]], 1)
    table.add(("a",), [records.encode_column([4.0] * 8)], 8)
    table.add(("a",), [[5.0, 6.0]], 2)
    table.seal()
    blocks = table.blocks[("a",)]
    assert [len(part) for part in blocks.parts] == [3, 1, 2] and blocks.encoded == [False, True, False]
    assert table.frame({})["a"].tolist() == [1.0, 2.0, 3.0, *[4.0] * 8, 5.0, 6.0]


def test_a_table_asked_for_again_is_a_copy_of_its_own():
    table = mixed_table()
    first = table.frame({})
    first.loc[0, "a"] = -1.0
    assert table.frame({}).loc[0, "a"] == 1.0


def test_the_stored_blocks_are_nothing_the_garbage_collector_tracks():
    """A record decodes to lists (and runs to lists of lists), which the collector tracks for ever and scans at every
    pass; the blocks hold them in arrays, which it does not track, once sealed (``collect`` seals its tables before
    the collector is back)."""
    table = mixed_table()
    table.seal()
    assert not any(blocks.pending for blocks in table.blocks.values())
    stored = [part for blocks in table.blocks.values() for part in blocks.parts]
    held = [column for part in stored for column in part if isinstance(column, (list, dict, np.ndarray))]
    assert held and not any(gc.is_tracked(obj) for obj in [*stored, *held])
    table.frame({})
    assert not any(gc.is_tracked(part) for blocks in table.blocks.values() for part in blocks.parts)


def _typed(values):
    """Each value with its type, NaN as a marker of its own (NaN never equals itself)."""
    return [(type(v), "nan" if v != v else v) for v in values]


@pytest.mark.parametrize("values", [
    ["restore", "restore", "load", "load", "load", "load", None, None, None, None],  # labels and gaps: runs
    [True, True, 1, 1, 1, 1, False, False, 0, 0, 0, 0],  # True == 1: the runs must keep each value's type
    [float("nan")] * 4 + [1.5] * 4 + [None] * 4,  # NaN never equals: each NaN a run of one
    [0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, "0", "0", "0", "0"],
    ["a"] * 12,
])
def test_an_encoded_column_decodes_to_the_same_values_of_the_same_types(values):
    encoded = records.encode_column(values)
    assert _typed(records.decode_column(encoded)) == _typed(values)
    assert records.column_length(encoded) == len(values)


def test_labels_in_runs_are_stored_as_runs():
    labels = ["imports"] * 40 + ["ckpt load"] * 50 + [None] * 10
    assert records.encode_column(labels) == {"runs": [["imports", 40], ["ckpt load", 50], [None, 10]]}


def test_a_record_is_read_as_json_writes_it_nan_included():
    """orjson reads a record, json where orjson refuses the text: a NaN that json wrote is read back as NaN."""
    record = {"tables": {"rows": [[["a", "b"], [[1.5, 2], {"same": "x", "n": 9}]]]}, "excluded": None}
    assert decode_json(json.dumps(record).encode()) == record
    with_nan = decode_json(json.dumps({"v": [float("nan"), 1.0]}).encode())
    assert with_nan["v"][0] != with_nan["v"][0] and with_nan["v"][1] == 1.0


@pytest.mark.parametrize("root, run", [("logs", "logs/tiny/tp1pp1dp2/torch/r1"), ("/abs/logs", "/abs/logs/a/b"),
                                       (".", "tiny/r1"), ("../logs", "../logs/x/y"), ("/", "/x/y"),
                                       ("logs", "logs2/x"), ("a/b", "a/b/c")])
def test_a_run_id_is_the_folder_relative_to_the_root(root, run):
    """The shortcut for a folder found under the root gives what os.path.relpath gives."""
    assert run_id_of(Path(run), Path(root)) == os.path.relpath(run, root)

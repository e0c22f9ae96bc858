"""The lazy engine's pure pieces, one at a time: its file format (restartbench/engines/lazy/format.py) and the
arithmetic and header checks of its load in another layout (restartbench/engines/lazy/reshard.py).

The multi-rank round trips of tests/test_engine_lazy_reshard.py prove the reshard exact, but they run under torchrun,
where mutation testing (bench/mutation.py) cannot see. These tests pin each piece in one process with exact values:
the header's fields and byte layout, the messages that name a damaged file, alignment at its boundaries, the element
runs of a reshard against a numpy oracle, and the bytes and seconds counted per saved file."""

import enum
import itertools
import json
import math
import re
import struct
import time

import numpy as np
import pytest
import torch

from restartbench.engines.lazy import format as fmt
from restartbench.engines.lazy import reshard

LAYOUT = {"tp": 2, "pp": 3, "dp": 4, "rank": 5}
"""The layout header of a file written by a tp2pp3dp4 checkpoint."""


def spec(name, shape, dtype="float32"):
    return fmt.TensorSpec(name, dtype, tuple(shape), "cpu")


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern matching ``message`` whole."""
    return f"^{re.escape(message)}$"


def one_file_plan(**tensors):
    return fmt.make_plan([("f.lazy", "optim", [(spec(name, shape), False) for name, shape in tensors.items()])])


def write_lazy(path, tensors, meta):
    """A lazy file at ``path`` holding ``tensors`` (name -> CPU tensor) with ``meta`` in its header."""
    file = fmt.make_plan([(path.name, "optim", [(fmt.tensor_spec(n, t), False) for n, t in tensors.items()])]).files[0]
    head, _ = fmt.encode_header(file, meta, {})
    data = bytearray(file.data_bytes)
    for entry in file.entries:
        data[entry.offset:entry.offset + entry.spec.nbytes] = tensors[entry.spec.name].numpy().tobytes()
    path.write_bytes(head + data)


def header_of_version(version) -> bytes:
    text = json.dumps({"version": version}).encode()
    return fmt.PREAMBLE.pack(fmt.MAGIC, len(text), 4096) + text


# -- plan ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, alignment, expected", [
    (0, 64, 0), (1, 64, 64), (63, 64, 64), (64, 64, 64), (65, 64, 128), (4095, 4096, 4096), (4097, 4096, 8192)])
def test_align_up_rounds_to_the_next_multiple(value, alignment, expected):
    assert fmt.align_up(value, alignment) == expected


def test_torch_dtype_is_the_named_dtype_and_refuses_other_names():
    assert fmt.torch_dtype("bfloat16") is torch.bfloat16
    for name in ("float33", "zeros"):
        with pytest.raises(fmt.LazyFormatError, match=exactly(f"unknown dtype '{name}' in a restartbench-lazy header")):
            fmt.torch_dtype(name)


def test_tensor_spec_records_dtype_shape_and_device():
    tensor = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert fmt.tensor_spec("w", tensor) == fmt.TensorSpec("w", "bfloat16", (2, 3), "cpu")


def test_gaps_are_the_buffer_ranges_no_tensor_covers():
    plan = fmt.make_plan([("a.lazy", "model", [(spec("x", (16,)), False), (spec("y", (16,)), False),
                                               (spec("z", (3,)), False)]),
                          ("b.lazy", "optim", [(spec("w", (1024,)), False)])])
    # x and y touch (0-64, 64-128), z is 128-140, a's data region ends at 4096 and w fills b's exactly
    assert list(plan.gaps()) == [(140, 4096)]
    late = fmt.EntryPlan(spec("x", (4,)), offset=64, buffer_offset=64)  # a first tensor past the buffer's start
    file = fmt.FilePlan("a.lazy", "model", (late,), data_bytes=4096, buffer_offset=0)
    assert list(fmt.SavePlan((file,), 4096, ()).gaps()) == [(0, 64), (80, 4096)]


# -- header --------------------------------------------------------------------------------------------------


def test_header_holds_the_documented_fields_in_the_documented_byte_layout():
    plan = one_file_plan(x=(10,))
    head, data_offset = fmt.encode_header(plan.files[0], {"tag": "step2"}, {"engine": {"global_steps": 2}})
    magic, length, offset = struct.unpack_from("<8sQQ", head)  # docs/lazy-format.md: the 24-byte preamble
    assert magic == b"RBLAZY01" and offset == data_offset == len(head) == 4096
    assert head[24 + length:] == bytes(4096 - 24 - length)
    header = json.loads(head[24:24 + length])
    assert header == {
        "format": "restartbench-lazy", "version": 2, "kind": "optim", "tag": "step2",
        "alignment": {"file": 4096, "entry": 64}, "data_bytes": 4096,
        "tensors": [{"name": "x", "dtype": "float32", "shape": [10], "device": "cpu", "offset": 0, "nbytes": 40}],
        "values": {"engine": {"global_steps": 2}}}
    assert fmt.decode_header(head) == (header, 4096)


def test_a_header_is_standard_json_without_nan():
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        fmt.encode_header(one_file_plan(x=(1,)).files[0], {}, {"loss": math.nan})


def test_reading_a_header_counts_the_preamble_and_header_json_only(tmp_path):
    head, data_offset = fmt.encode_header(one_file_plan(x=(10,)).files[0], {}, {})
    path = tmp_path / "f.lazy"
    path.write_bytes(head + bytes(4096))
    header, offset, nbytes = fmt.read_header_counted(path)
    assert offset == data_offset and nbytes == 24 + struct.unpack_from("<8sQQ", head)[1]
    assert header == fmt.decode_header(head)[0]


def test_a_short_or_cut_header_is_refused_saying_how_short():
    head, _ = fmt.encode_header(one_file_plan(x=(1,)).files[0], {}, {})
    needs = 24 + struct.unpack_from("<8sQQ", head)[1]
    with pytest.raises(fmt.LazyFormatError, match=exactly("<bytes>: 6 bytes, too short for a restartbench-lazy file")):
        fmt.decode_header(head[:6])
    for cut in (24, needs - 1):
        with pytest.raises(fmt.LazyFormatError, match=exactly(f"f.lazy: header cut short ({cut} bytes, header "
                                                              f"needs {needs})")):
            fmt.decode_header(head[:cut], "f.lazy")


@pytest.mark.parametrize("version", [3, None])
def test_a_header_of_another_version_is_refused_naming_the_readable_ones(version):
    with pytest.raises(fmt.LazyFormatError, match=exactly(f"<bytes>: format version {version}, this reader knows "
                                                          "1, 2")):
        fmt.decode_header(header_of_version(version))


def test_a_damaged_file_is_refused_naming_its_path(tmp_path):
    path = tmp_path / "f.lazy"
    path.write_bytes(fmt.MAGIC + b"\0\0")
    with pytest.raises(fmt.LazyFormatError, match=exactly(f"{path}: 10 bytes, too short for a restartbench-lazy "
                                                          "file")):
        fmt.read_header_counted(path)
    path.write_bytes(header_of_version(3))
    with pytest.raises(fmt.LazyFormatError, match=exactly(f"{path}: format version 3, this reader knows 1, 2")):
        fmt.read_header_counted(path)
    head, data_offset = fmt.encode_header(one_file_plan(x=(10,)).files[0], {}, {})
    path.write_bytes(head + bytes(100))
    with pytest.raises(fmt.LazyFormatError, match=exactly(f"{path}: {data_offset + 100} bytes, the header says "
                                                          f"{data_offset + 4096} (truncated: an interrupted save?)")):
        fmt.read_header_counted(path)


# -- plain values ------------------------------------------------------------------------------------------------


class Scaler:
    def __init__(self):
        self.cur_scale, self.dynamic = 2.0, True


class Holder:
    def __init__(self, items):
        self.items = items


class Stage(enum.IntEnum):
    one = 1


def here(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_an_object_of_plain_attributes_is_saved_by_class_and_attributes():
    encoded = fmt.encode_value(Scaler(), "optimizer.loss_scaler", {})
    assert encoded == {"t": "object", "class": here(Scaler), "attrs": {"cur_scale": 2.0, "dynamic": True}}
    assert fmt.decode_value(encoded) == fmt.ObjectState(here(Scaler), {"cur_scale": 2.0, "dynamic": True})


@pytest.mark.parametrize("obj", [Stage.one, Holder([1]), Holder.__new__(Holder), object()],
                         ids=["enum", "non-plain attribute", "no attributes", "no __dict__"])
def test_any_other_object_is_opaque_by_class_and_repr(obj):
    encoded = fmt.encode_value(obj, "x", {})
    assert encoded == {"t": "opaque", "class": here(type(obj)), "repr": repr(obj)}
    assert fmt.decode_value(encoded) == fmt.Opaque(here(type(obj)), repr(obj))


def test_tensors_in_lists_and_tuples_are_collected_under_their_index():
    first, second, tensors = torch.ones(2), torch.zeros(3), {}
    encoded = fmt.encode_value({"p": [first, (second,)]}, "m", tensors)
    assert tensors.keys() == {"m.p[0]", "m.p[1][0]"}
    assert tensors["m.p[0]"] is first and tensors["m.p[1][0]"] is second
    assert fmt.decode_value(encoded) == {"p": [fmt.TensorRef("m.p[0]"), (fmt.TensorRef("m.p[1][0]"),)]}


def test_an_unknown_value_tag_is_refused():
    with pytest.raises(fmt.LazyFormatError, match=exactly("unknown value tag 'set' in a restartbench-lazy header")):
        fmt.decode_value({"t": "set", "v": []})


def test_child_path_dots_keys_under_a_path():
    assert fmt.child_path("", 3) == "3"
    assert fmt.child_path("optimizer", "state") == "optimizer.state"
    assert fmt.child_path("optimizer.state", 0) == "optimizer.state.0"


# -- reshard arithmetic ------------------------------------------------------------------------------------------


def slice_oracle(full, dim, src, dst):
    """Per element of the live slice ``dst`` (row-major): its index in the saved slice ``src``, -1 if src lacks it."""
    index = np.arange(math.prod(full)).reshape(full)
    saved = np.take(index, range(src[0], src[0] + src[1]), axis=dim).ravel()
    live = np.take(index, range(dst[0], dst[0] + dst[1]), axis=dim).ravel()
    where = {value: i for i, value in enumerate(saved)}
    return [where.get(value, -1) for value in live]


def copied(runs, size):
    """What each of ``size`` target elements holds after ``runs`` copy source element indices: -1 where none lands."""
    target = np.full(size, -1)
    for src, dst, count in runs:
        target[dst:dst + count] = np.arange(src, src + count)
    return target.tolist()


@pytest.mark.parametrize("full, dim, src, dst", [
    ([4, 6], 1, (0, 3), (2, 2)), ([4, 6], 1, (3, 3), (2, 3)), ([4, 6], 1, (0, 6), (3, 2)),
    ([2, 6, 3], 1, (2, 4), (0, 3)), ([2, 6, 3], 1, (0, 3), (3, 3)), ([6, 2, 3], 0, (2, 2), (3, 3)),
    ([3, 4, 5], 2, (1, 3), (2, 3))])
def test_slice_runs_copy_exactly_the_overlap_of_two_slices(full, dim, src, dst):
    runs = reshard.slice_runs(full, dim, src, dst)
    live = math.prod(full) // full[dim] * dst[1]
    assert copied(runs, live) == slice_oracle(full, dim, src, dst)
    assert reshard.merge_runs(runs) == runs and all(count > 0 for _, _, count in runs)


def test_merge_runs_joins_only_runs_contiguous_on_both_sides():
    runs = [(10, 0, 2), (12, 2, 3), (20, 5, 1), (21, 9, 1), (12, 12, 1), (13, 13, 2)]
    assert reshard.merge_runs(runs) == [(10, 0, 5), (20, 5, 1), (21, 9, 1), (12, 12, 3)]
    assert copied(reshard.merge_runs(runs), 15) == copied(runs, 15)


def test_partition_pieces_cut_a_range_at_the_partition_bounds():
    def pieces(flat, count, partition):
        return list(itertools.islice(reshard.partition_pieces(flat, count, partition), 5))  # bounded: no endless loop

    assert pieces(5, 10, 4) == [(1, 1, 3), (2, 0, 4), (3, 0, 3)]
    assert pieces(8, 4, 4) == [(2, 0, 4)]
    assert pieces(3, 0, 4) == []


def test_saved_sizes_reads_the_layout_from_file_names_and_lists_the_missing(tmp_path):
    names = ([reshard.model_file(s, t) for s in range(3) for t in range(2)]
             + [reshard.optim_file(s, t, d) for s in range(3) for t in range(2) for d in range(4)])
    missing = [reshard.model_file(2, 1), reshard.optim_file(1, 0, 3)]
    for name in set(names) - set(missing) | {"notes.txt"}:
        (tmp_path / name).touch()
    assert reshard.saved_sizes(tmp_path) == ((2, 3, 4), sorted(missing))


def test_saved_sizes_is_none_without_lazy_optimizer_files(tmp_path):
    assert reshard.saved_sizes(tmp_path / "absent") is None
    (tmp_path / reshard.model_file(0, 0)).touch()
    assert reshard.saved_sizes(tmp_path) is None


def test_batches_group_runs_contiguous_in_the_file_up_to_a_chunk():
    def run(offset, size):
        return reshard.Run(offset, memoryview(bytes(size)))

    def grouped(runs, chunk):
        return [[(r.offset, r.view.nbytes) for r in batch] for batch in reshard.batches(runs, chunk)]

    runs = [run(100, 10), run(0, 4), run(4, 3), run(7, 1), run(8, 4), run(12, 3), run(15, 1), run(110, 5)]
    assert grouped(runs, 8) == [[(0, 4), (4, 3), (7, 1)], [(8, 4), (12, 3), (15, 1)], [(100, 10)], [(110, 5)]]
    assert grouped(runs, 1 << 20) == [[(0, 4), (4, 3), (7, 1), (8, 4), (12, 3), (15, 1)], [(100, 10), (110, 5)]]
    many = [run(i, 1) for i in range(reshard.MAX_IOVECS + 1)]
    assert [len(batch) for batch in reshard.batches(many, 1 << 20)] == [reshard.MAX_IOVECS, 1]


# -- the saved files -----------------------------------------------------------------------------------------------


def test_saved_files_read_a_header_once_adding_its_bytes_and_seconds(tmp_path):
    name = reshard.optim_file(0, 0, 0)
    write_lazy(tmp_path / name, {"exp_avg": torch.arange(6.0)}, {"layout": LAYOUT})
    header, data_offset, nbytes = fmt.read_header_counted(tmp_path / name)
    files = reshard.SavedFiles(tmp_path, (2, 3, 4))
    files.bytes[name], files.seconds[name] = 100, 1.0  # reads of the file counted already: the header's add to them
    start = time.perf_counter()
    assert files.header(name) == (header, data_offset)
    took = time.perf_counter() - start
    assert files.bytes[name] == 100 + nbytes and 0 < files.seconds[name] - 1.0 <= took
    (tmp_path / name).unlink()
    assert files.header(name) == (header, data_offset) and files.bytes[name] == 100 + nbytes, "read once"


def test_a_header_whose_layout_disagrees_with_the_file_names_is_refused_naming_both(tmp_path):
    name = reshard.model_file(0, 0)
    write_lazy(tmp_path / name, {"w": torch.ones(2)}, {"layout": LAYOUT})
    message = (f"{tmp_path / name}: its header says layout tp2pp3dp4, the checkpoint's file names tp1pp1dp1: "
               "files of two checkpoints mixed?")
    with pytest.raises(fmt.LazyRestoreError, match=exactly(message)):
        reshard.SavedFiles(tmp_path, (1, 1, 1)).header(name)


def test_an_optimizer_piece_reads_up_to_the_saved_tensors_last_element(tmp_path):
    name = reshard.optim_file(0, 0, 0)
    write_lazy(tmp_path / name, {"optimizer.exp_avg": torch.arange(6.0) + 10},
               {"layout": LAYOUT, "zero": [{"tensors": {"exp_avg": "optimizer.exp_avg"}}]})
    target = torch.zeros(8)
    piece = reshard.Piece(file=name, group=0, element=3, target_group=0, target_element=1, count=3)
    [run] = reshard.piece_runs(reshard.SavedFiles(tmp_path, (2, 3, 4)), tmp_path, piece, {"exp_avg": target})
    with open(tmp_path / name, "rb") as handle:
        handle.seek(run.offset)
        assert handle.readinto(run.view) == 12
    assert target.tolist() == [0, 13, 14, 15, 0, 0, 0, 0]

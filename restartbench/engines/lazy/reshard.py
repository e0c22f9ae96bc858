"""The lazy engine's load in another parallel layout (tensor, pipeline, data parallel; ZeRO-1), with no conversion
pass: each rank of the new layout reads, from the files as they were written, only the byte ranges that hold its
elements (load-time resharding, as veScale's and ByteCheckpoint's loaders do; none of their code is used).

How a rank plans its reads, from the headers of format version 2 (``capture.layout_fields``):

1. The saved layout comes from the file names (``saved_sizes``); a rank of tensor-parallel rank k of T reads the
   saved slices j that overlap its own along each split dimension (equal slices: j from k·Ts/T to (k+1)·Ts/T).
2. The model files of the saved stages holding its layers (the first guessed by proportion, then the next ones
   until every layer is found): their ``params`` give each tensor's full shape, split dimension and slice offset,
   and their ``zero`` each parameter's offset in the saved stage's flat ZeRO buffer and the partition length.
3. For every module tensor: the runs of elements where a saved slice and the live slice meet (``slice_runs``), one
   run per row where a row-split (``tp_dim`` 1) tensor changes tensor-parallel size, else one run per slice; read
   from the model files straight into the module's tensors.
4. For every parameter element in the rank's new ZeRO-1 partition: the same runs, cut to the partition, placed in
   the saved flat buffer and split at the saved partitions' bounds: a range of the saved rank's fp32 master
   weights and of each Adam moment, read into the new partition's tensors (padding elements are zero, as ZeRO
   keeps them). Only the optimizer files that hold such ranges are opened.
5. The plain state (hyperparameters, the loss scaler, the scheduler, the step counters) and Adam's step come from
   the first of those optimizer files: they are the same on every rank. Layout-derived entries (partition counts,
   paddings, fragment maps) stay the live engine's (``restore.LAYOUT_KEYS``).

Every read is an ``os.preadv`` of exactly the bytes wanted, scattered into the targets (runs contiguous in the
file are one read); ``FileRecord.bytes`` counts every byte read of a file, its header's included.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from restartbench.engines.base import FileRecord
from restartbench.engines.lazy.capture import RankLayout, ZeroGroup, module_params, zero_groups
from restartbench.engines.lazy.copies import byte_view
from restartbench.engines.lazy.format import LazyRestoreError, read_header_counted, torch_dtype
from restartbench.engines.lazy.restore import broadcast_tensors, preadv_all, restore_plain

MODEL_FILE = re.compile(r"model_pp(\d+)_tp(\d+)\.lazy")
OPTIM_FILE = re.compile(r"optim_pp(\d+)_tp(\d+)_dp(\d+)\.lazy")
MAX_IOVECS = 512
"""Scatter targets per ``preadv`` (the system's IOV_MAX is 1024 on Linux)."""


def layout_name(sizes: tuple[int, int, int]) -> str:
    tp, pp, dp = sizes
    return f"tp{tp}pp{pp}dp{dp}"


def model_file(stage: int, tp: int) -> str:
    return f"model_pp{stage:02d}_tp{tp:02d}.lazy"


def optim_file(stage: int, tp: int, dp: int) -> str:
    return f"optim_pp{stage:02d}_tp{tp:02d}_dp{dp:03d}.lazy"


def saved_sizes(folder: Path) -> tuple[tuple[int, int, int], list[str]] | None:
    """(tp, pp, dp) of the layout that wrote the checkpoint in ``folder``, from its file names (a directory listing,
    no file read), and the files of that layout it lacks; None where it holds no lazy optimizer file."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None
    optims = [tuple(map(int, m.groups())) for m in map(OPTIM_FILE.fullmatch, names) if m]
    if not optims:
        return None
    pp, tp, dp = (max(coord[i] for coord in optims) + 1 for i in range(3))
    expected = [model_file(s, t) for s in range(pp) for t in range(tp)]
    expected += [optim_file(s, t, d) for s in range(pp) for t in range(tp) for d in range(dp)]
    return (tp, pp, dp), sorted(set(expected) - set(names))


def saved_slices(rank: int, size: int, saved: int) -> range:
    """The saved tensor-parallel ranks whose equal slices overlap slice ``rank`` of ``size``."""
    return range(rank * saved // size, -(-(rank + 1) * saved // size))


def slice_runs(full: list[int], dim: int | None, src: tuple[int, int], dst: tuple[int, int]
               ) -> list[tuple[int, int, int]]:
    """(source element, target element, count) runs copying what a saved slice ``src`` = (offset, length) along
    ``dim`` of a tensor of shape ``full`` holds of the live slice ``dst``, elements counted in each slice's own
    row-major order; a replicated tensor (``dim`` None) is one run."""
    if dim is None:
        return [(0, 0, math.prod(full))]
    lo, hi = max(src[0], dst[0]), min(src[0] + src[1], dst[0] + dst[1])
    if lo >= hi:
        return []
    outer, inner = math.prod(full[:dim]), math.prod(full[dim + 1:])
    runs = [(o * src[1] * inner + (lo - src[0]) * inner, o * dst[1] * inner + (lo - dst[0]) * inner,
             (hi - lo) * inner) for o in range(outer)]
    return merge_runs(runs)


def merge_runs(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Runs contiguous on both sides joined."""
    merged: list[tuple[int, int, int]] = []
    for src, dst, count in runs:
        if merged and merged[-1][0] + merged[-1][2] == src and merged[-1][1] + merged[-1][2] == dst:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + count)
        else:
            merged.append((src, dst, count))
    return merged


def partition_pieces(flat: int, count: int, partition: int) -> Iterator[tuple[int, int, int]]:
    """(data-parallel rank, element in its partition, count) of ``count`` elements from ``flat`` of a flat buffer cut
    into partitions of ``partition`` elements."""
    while count:
        rank, within = divmod(flat, partition)
        take = min(count, partition - within)
        yield rank, within, take
        flat, count = flat + take, count - take


# -- the saved files, as far as this rank reads them --------------------------------------------------------------


@dataclass
class SavedFiles:
    """The checkpoint's headers this rank has read and the bytes and seconds spent on each file."""
    folder: Path
    sizes: tuple[int, int, int]
    headers: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def header(self, name: str) -> tuple[dict[str, Any], int]:
        if name not in self.headers:
            start = time.perf_counter()
            header, data_offset, nbytes = read_header_counted(self.folder / name)
            self.bytes[name] += nbytes
            self.seconds[name] += time.perf_counter() - start
            self._check(name, header)
            self.headers[name] = header, data_offset
        return self.headers[name]

    def _check(self, name: str, header: dict[str, Any]) -> None:
        if "layout" not in header:
            raise LazyRestoreError(
                f"{self.folder / name}: format version {header.get('version')} does not record what a load in another "
                f"layout needs; restore checkpoint {self.folder.name} in the layout it was saved in "
                f"({layout_name(self.sizes)}), whose files it has, or save it again with this version")
        saved = header["layout"]
        if (saved["tp"], saved["pp"], saved["dp"]) != self.sizes:
            raise LazyRestoreError(f"{self.folder / name}: its header says layout "
                                   f"{layout_name((saved['tp'], saved['pp'], saved['dp']))}, the checkpoint's file "
                                   f"names {layout_name(self.sizes)}: files of two checkpoints mixed?")

    def entries(self, name: str) -> dict[str, dict[str, Any]]:
        return {entry["name"]: entry for entry in self.header(name)[0]["tensors"]}

    def records(self) -> list[FileRecord]:
        return [FileRecord(str(self.folder / name), self.bytes[name], self.seconds[name])
                for name in sorted(self.bytes)]


@dataclass(frozen=True)
class Source:
    """Where one live module tensor's elements are in the checkpoint: its saved stage and, per saved
    tensor-parallel slice that holds some, the (source, target, count) element runs."""
    stage: int
    runs: dict[int, list[tuple[int, int, int]]]


# -- planning ----------------------------------------------------------------------------------------------------


def find_stages(files: SavedFiles, layout: RankLayout, slices: range, names: set[str]) -> dict[str, int]:
    """The saved stage of every live module tensor, reading the model-file headers of the saved stages from the one
    proportion points to (the pipeline splits layers evenly), upward while they hold live tensors, then downward."""
    pp = files.sizes[1]
    guess = min(pp - 1, layout.pp * pp // layout.pp_size)
    where: dict[str, int] = {}
    for direction in (range(guess, pp), range(guess - 1, -1, -1)):
        for stage in direction:
            if not names - where.keys():
                return where
            held = {p["name"] for j in slices for p in files.header(model_file(stage, j))[0]["params"]}
            if not held & names and where:
                break  # past this rank's layers
            where.update({name: stage for name in held & names})
    missing = sorted(names - where.keys())
    if missing:
        raise LazyRestoreError(f"checkpoint {files.folder.name} ({layout_name(files.sizes)}) holds no {missing[:5]} "
                               "of the model built here: saved with another preset?")
    return where


def module_sources(files: SavedFiles, layout: RankLayout, slices: range, live: dict[str, dict[str, Any]],
                   tensors: dict[str, torch.Tensor]) -> dict[str, Source]:
    """Every live module tensor's saved stage and element runs, checked against the saved full shape, split and
    dtype (a preset or --dtype that differs is named)."""
    stages = find_stages(files, layout, slices, set(live))
    sources, problems = {}, []
    for name, mine in live.items():
        stage, runs, covered = stages[name], {}, 0
        for j in slices:
            file = model_file(stage, j)
            saved = next(p for p in files.header(file)[0]["params"] if p["name"] == name)
            entry = files.entries(file)[f"module.{name}"]
            if saved["shape"] != mine["shape"] or saved["tp_dim"] != mine["tp_dim"]:
                problems.append(f"{name}: saved with full shape {saved['shape']} split along {saved['tp_dim']}, here "
                                f"{mine['shape']} split along {mine['tp_dim']}")
                break
            if entry["dtype"] != str(tensors[name].dtype).removeprefix("torch."):
                problems.append(f"{name}: saved as {entry['dtype']}, here {tensors[name].dtype} (another --dtype?)")
                break
            dim = saved["tp_dim"]
            if dim is None:
                runs[j] = slice_runs(saved["shape"], None, (0, 0), (0, 0))
                covered = tensors[name].numel()
                break  # replicated: the first overlapping slice holds it whole
            found = slice_runs(saved["shape"], dim, (saved["tp_offset"], entry["shape"][dim]),
                               (mine["tp_offset"], tensors[name].shape[dim]))
            if found:
                runs[j] = found
                covered += sum(count for _, _, count in found)
        else:
            if covered != tensors[name].numel():
                problems.append(f"{name}: the saved slices cover {covered} of its {tensors[name].numel()} elements")
        sources[name] = Source(stage, runs)
    if problems:
        raise LazyRestoreError(f"checkpoint {files.folder.name} ({layout_name(files.sizes)}) does not fit the model "
                               f"built here ({layout_name(layout.sizes)}): " + "; ".join(problems[:5]))
    return sources


@dataclass(frozen=True)
class Piece:
    """A range of saved partition elements (all the rank's element-wise tensors of group ``group`` in ``file``)
    that goes to elements of the live group ``target_group``'s partition."""
    file: str
    group: int
    element: int
    target_group: int
    target_element: int
    count: int


def optimizer_pieces(files: SavedFiles, live_groups: list[ZeroGroup], sources: dict[str, Source]) -> list[Piece]:
    """The saved ranges that make this rank's new ZeRO-1 partitions: every parameter element of each partition,
    found by its runs in the saved stage's flat buffer and cut at the saved partitions' bounds."""
    pieces = []
    for group in live_groups:
        start, end = group.partition_start, group.partition_start + group.partition_numel
        for name, offset, numel in group.params:
            lo, hi = max(0, start - offset), min(numel, end - offset)
            if lo >= hi:
                continue
            source = sources[name]
            for j, runs in source.runs.items():
                model = files.header(model_file(source.stage, j))[0]
                saved_group, saved_offset = next((g, o) for g, zero in enumerate(model["zero"])
                                                 for n, o, _ in zero["params"] if n == name)
                partition = model["zero"][saved_group]["partition_numel"]
                for src, dst, count in runs:
                    a, b = max(dst, lo), min(dst + count, hi)
                    if a >= b:
                        continue
                    target = offset + a - start
                    for rank, within, take in partition_pieces(saved_offset + src + a - dst, b - a, partition):
                        pieces.append(Piece(optim_file(source.stage, j, rank), saved_group, within, group.index,
                                            target, take))
                        target += take
    return pieces


# -- reads ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """The file's bytes from ``offset`` on, as many as ``view`` holds (a host memoryview of the target's bytes)."""
    offset: int
    view: memoryview


def host(target: torch.Tensor, mirrors: list[tuple[torch.Tensor, torch.Tensor]], zero: bool) -> torch.Tensor:
    """Where reads into ``target`` land: the tensor itself on the CPU (contiguous), else a host mirror copied to it
    after the reads (``mirrors``). ``zero``: elements no read covers are zero (ZeRO's padding)."""
    if target.device.type == "cpu" and target.is_contiguous():
        if zero:
            target.detach().zero_()
        return target
    for live, mirror in mirrors:
        if live is target:
            return mirror
    mirror = (torch.zeros if zero else torch.empty)(tuple(target.shape), dtype=target.dtype)
    mirrors.append((target, mirror))
    return mirror


def bytes_of(tensor: torch.Tensor, element: int, count: int) -> memoryview:
    size = tensor.element_size()
    return memoryview(byte_view(tensor).numpy())[element * size:(element + count) * size]


def read_runs(files: SavedFiles, runs: dict[str, list[Run]], io_threads: int, chunk: int) -> None:
    """Every run, as ``preadv`` scatter reads of runs contiguous in the file (at most ``chunk`` bytes and
    MAX_IOVECS targets each), ``io_threads`` at a time; bytes and seconds counted per file."""
    lock = threading.Lock()

    def read(name: str, fd: int, batch: list[Run]) -> None:
        start = time.perf_counter()
        got = preadv_all(fd, [run.view for run in batch], batch[0].offset)
        with lock:
            files.bytes[name] += got
            files.seconds[name] += time.perf_counter() - start

    fds = {name: os.open(files.folder / name, os.O_RDONLY) for name in runs}
    try:
        with ThreadPoolExecutor(io_threads, thread_name_prefix="lazy-reshard") as pool:
            reads = [pool.submit(read, name, fds[name], batch) for name, file_runs in runs.items()
                     for batch in batches(file_runs, chunk)]
            for done in reads:
                done.result()
    finally:
        for fd in fds.values():
            os.close(fd)


def batches(runs: list[Run], chunk: int) -> Iterator[list[Run]]:
    """Runs in file order, grouped where each starts where the last ended."""
    batch: list[Run] = []
    end = size = 0
    for run in sorted(runs, key=lambda r: r.offset):
        if batch and (run.offset != end or size >= chunk or len(batch) >= MAX_IOVECS):
            yield batch
            batch, size = [], 0
        batch.append(run)
        end, size = run.offset + run.view.nbytes, size + run.view.nbytes
    if batch:
        yield batch


# -- the load ------------------------------------------------------------------------------------------------------


def load_resharded(ds_engine: Any, layout: RankLayout, folder: Path, sizes: tuple[int, int, int], *,
                   io_threads: int, chunk: int, dp_read_once: bool) -> list[FileRecord]:
    """Restore checkpoint ``folder``, written in layout ``sizes`` (tp, pp, dp), into this rank of another layout;
    the files read, with their bytes. With ``dp_read_once`` data-parallel rank 0 alone reads the module's bytes
    and broadcasts them (its replicas still read the model files' headers, to plan their optimizer reads)."""
    files = SavedFiles(folder, sizes)
    tensors = dict(ds_engine.module.state_dict())
    live = {p["name"]: p for p in module_params(ds_engine, layout)}
    slices = saved_slices(layout.tp, layout.tp_size, sizes[0])
    sources = module_sources(files, layout, slices, live, tensors)
    groups = zero_groups(ds_engine.optimizer, layout)
    if not groups:
        raise LazyRestoreError("a load in another layout needs a DeepSpeed ZeRO optimizer (its flat fp32 partitions); "
                               f"this engine has {type(ds_engine.optimizer).__name__}")
    pieces = optimizer_pieces(files, groups, sources)
    optim_files = sorted({piece.file for piece in pieces})
    first = next(iter(sources.values()))
    values_file = optim_files[0] if optim_files else optim_file(first.stage, slices[0], 0)
    header = files.header(values_file)[0]
    if len(header["zero"]) != len(groups):
        raise LazyRestoreError(f"{values_file}: {len(header['zero'])} ZeRO parameter groups saved, {len(groups)} here")
    restore_plain(ds_engine, header["values"])

    mirrors: list[tuple[torch.Tensor, torch.Tensor]] = []
    runs: dict[str, list[Run]] = defaultdict(list)
    if not dp_read_once or layout.dp == 0:
        _module_runs(files, sources, tensors, mirrors, runs)
    elementwise, scalars = optimizer_targets(ds_engine.optimizer, groups, files, values_file)
    hosts = [{key: host(tensor, mirrors, zero=True) for key, tensor in targets.items()} for targets in elementwise]
    for piece in pieces:
        runs[piece.file] += piece_runs(files, folder, piece, hosts[piece.target_group])
    data_offset = files.header(values_file)[1]
    for entry, target in scalars:
        runs[values_file].append(Run(data_offset + entry["offset"], bytes_of(host(target, mirrors, zero=False), 0,
                                                                            target.numel())))
    read_runs(files, runs, io_threads, chunk)
    with torch.no_grad():
        for target, mirror in mirrors:
            target.copy_(mirror)
    if dp_read_once and layout.dp_size > 1:
        broadcast_tensors(list(tensors.values()), layout.dp_src, layout.dp_group, chunk)
    return files.records()


def _module_runs(files: SavedFiles, sources: dict[str, Source], tensors: dict[str, torch.Tensor],
                 mirrors: list[tuple[torch.Tensor, torch.Tensor]], runs: dict[str, list[Run]]) -> None:
    """Add to ``runs`` the reads of every module tensor's saved slices into its host target (a mirror where the
    tensor is on a device, copied over after the reads)."""
    for name, source in sources.items():
        target = host(tensors[name], mirrors, zero=False)
        for j, element_runs in source.runs.items():
            file = model_file(source.stage, j)
            entry, data_offset = files.entries(file)[f"module.{name}"], files.header(file)[1]
            base, size = data_offset + entry["offset"], target.element_size()
            runs[file] += [Run(base + src * size, bytes_of(target, dst, count)) for src, dst, count in element_runs]


def piece_runs(files: SavedFiles, folder: Path, piece: Piece, targets: dict[str, torch.Tensor]) -> list[Run]:
    """The reads of one optimizer piece (a range of a saved ZeRO partition) into each of its group's host targets
    (the fp32 weights and Adam's moments), each checked against the file's header first."""
    header, data_offset = files.header(piece.file)
    saved = header["zero"][piece.group]["tensors"]
    entries = files.entries(piece.file)
    runs = []
    for key, target in targets.items():
        entry = entries[saved[key]] if key in saved else None
        if entry is None or entry["dtype"] != str(target.dtype).removeprefix("torch."):
            raise LazyRestoreError(f"{folder / piece.file}: no {key} of group {piece.group} in "
                                   f"{target.dtype} to restore from")
        if (piece.element + piece.count) * target.element_size() > entry["nbytes"]:
            raise LazyRestoreError(f"{folder / piece.file}: {entry['name']} holds {entry['shape']} elements, the "
                                   f"plan reads up to {piece.element + piece.count} (a damaged header?)")
        runs.append(Run(data_offset + entry["offset"] + piece.element * target.element_size(),
                        bytes_of(target, piece.target_element, piece.count)))
    return runs


def optimizer_targets(optimizer: Any, groups: list[ZeroGroup], files: SavedFiles, values_file: str
                      ) -> tuple[list[dict[str, torch.Tensor]], list[tuple[dict[str, Any], torch.Tensor]]]:
    """Per live group, the tensors its partition's elements are read into (``fp32`` and each element-wise Adam
    state, created where a fresh optimizer has none yet, as torch.optim creates them); and the one-value states
    (Adam's step) with the saved entry each is read from."""
    header = files.header(values_file)[0]
    entries = files.entries(values_file)
    inner = optimizer.optimizer
    elementwise, scalars = [], []
    for group, saved in zip(groups, header["zero"]):
        targets = {"fp32": group.fp32}
        state = inner.state[group.fp32]
        for key, name in saved["tensors"].items():
            if key == "fp32":
                continue
            entry = entries[name]
            dtype = torch_dtype(entry["dtype"])
            if entry["shape"] == []:
                live = state.get(key)
                if not (isinstance(live, torch.Tensor) and live.shape == () and live.dtype == dtype):
                    device = torch.device("cpu") if entry["device"] == "cpu" else group.fp32.device
                    live = state[key] = torch.zeros((), dtype=dtype, device=device)
                scalars.append((entry, live))
                continue
            live = state.get(key)
            if not (isinstance(live, torch.Tensor) and live.shape == group.fp32.shape and live.dtype == dtype):
                live = state[key] = torch.zeros(group.fp32.shape, dtype=dtype, device=group.fp32.device)
            targets[key] = live
        elementwise.append(targets)
    return elementwise, scalars

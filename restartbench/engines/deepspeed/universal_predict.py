"""The universal checkpoint DeepSpeed's ``ds_to_universal.py`` makes of a checkpoint of DeepSpeed's default engine
(issue 19), predicted: every file it writes, with its bytes, and the temporary fragments it writes on the way.

``python deepspeed/checkpoint/ds_to_universal.py --input_folder <ckpt>/<tag> --output_folder <ckpt>/<tag>_universal``
(DeepSpeed 0.19.8, ZeRO-1, our model's ``universal_checkpoint_info``) does, in this order:

1. extraction: for every (pipeline, tensor, data) rank, it loads the rank's optimizer file, cuts the trailing
   partition's padding off Adam's moments, and torch.saves each parameter's fragment of each flat state
   (``exp_avg``, ``exp_avg_sq``, ``fp32``: ``narrow(...).clone()``; ``step``: Adam's whole step tensor) as
   ``<out>/tmp/<name>/<tp>/<state>.<dp:02d>``;
2. merge: per parameter name, per state, the data-parallel fragments are joined (``torch.cat``) and reshaped to the
   tp rank's shard, the shards merged as the name's pattern says (replicated: the first; averaged: the mean;
   otherwise concatenated along ``cat_dim``, 1 for row-parallel ones; vocabulary ones cut to ``original_vocab_size``)
   and torch.saved as ``<out>/zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt``: a dict ``cat_dim`` (split parameters),
   ``vocab_tensor`` (embedding and head), ``param`` (full shape), in that order; ``step.pt`` is the step tensor;
3. ``<out>/zero/optimizer_state.pt``: the optimizer file of pipeline, tensor and data-parallel rank 0 without its
   sharded entries, its ``group_paddings`` cleared and ``param_groups`` added;
4. ``<out>/tmp`` removed; every ``mp_rank_*_model_states.pt`` copied into ``<out>`` (same bytes);
5. ``latest_universal``, in the output folder's parent, holding the output folder's name.

The same operations run here on the meta tensors of ``restartbench.shards`` (each rank's ZeRO-1 optimizer state as
DeepSpeed saves it), and every torch.save'd file is sized by torch.save itself (``restartbench.sizes.saved_size``),
so the sizes are exact on a CPU run (``tests/test_universal.py`` holds a real conversion to them, file by file).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from restartbench.shards import ShardSetup, shard_files, training_states
from restartbench.sizes import PlannedFile, payload_bytes, saved_size, signature

#: The output folder's name is the tag's with this suffix, beside the tag's folder (the study's convention).
SUFFIX = "_universal"
#: The file, in the checkpoint folder, naming the latest universal checkpoint (``ds_to_universal.py``).
LATEST = "latest_universal"
#: The states of each parameter's files, in the order the converter writes them.
STATES = ("fp32", "exp_avg", "exp_avg_sq")
CONVERTER_RANK = 0
"""``PlannedFile.rank`` of every file: the converter is one process, not a rank of the run; its files are listed as
rank 0's."""


@dataclass
class UniversalPlan:
    """The universal checkpoint of one study checkpoint: its files (paths relative to the checkpoint folder, as
    ``PlannedFile.path``) and the fragments the conversion writes and deletes."""

    tag: str
    folder: str
    """The output folder, relative to the checkpoint folder: ``<tag>_universal``."""
    files: list[PlannedFile]
    fragments: list[PlannedFile]
    """``<folder>/tmp/<name>/<tp>/<state>.<dp>``: written in the extraction, read in the merge, removed before the
    model files are copied. They all exist at once after the extraction."""

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def fragment_bytes(self) -> int:
        """Bytes of the temporary fragments: written once each and deleted, so besides the output's bytes the
        conversion writes these too, and the disk must hold them and the merged files at once (before the removal)."""
        return sum(f.bytes for f in self.fragments)

    def by_kind(self) -> dict[str, dict[str, int]]:
        kinds: dict[str, dict[str, int]] = {}
        for f in self.files:
            entry = kinds.setdefault(f.kind, {"files": 0, "bytes": 0})
            entry["files"] += 1
            entry["bytes"] += f.bytes
        return kinds

    def totals(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "files": len(self.files),
                "payload_bytes": sum(f.payload_bytes for f in self.files), "by_kind": self.by_kind(),
                "fragment_files": len(self.fragments),
                "fragment_bytes": self.fragment_bytes}

    def to_dict(self) -> dict[str, Any]:
        """The totals and every file; the fragments by their totals only (70B: 23,000 of them)."""
        return {"tag": self.tag, "folder": self.folder, "totals": self.totals(),
                "files": [asdict(f) for f in self.files]}


def predict_universal(setup: ShardSetup, checkpoint_files: list[PlannedFile] | None = None) -> UniversalPlan:
    """The universal checkpoint of ``setup``'s checkpoint (DeepSpeed's default engine). ``checkpoint_files``: that
    checkpoint's predicted files (``deepspeed_files``), whose model files the conversion copies; measured afresh
    when not given."""
    folder = setup.tag + SUFFIX
    with tempfile.TemporaryDirectory(prefix="restartbench-universal-") as scratch:
        sizer = _Sizer(scratch)
        extracted = _extract(setup, folder, sizer)
        files = [*_merged(setup, folder, extracted, sizer),
                 sizer.file(f"{folder}/zero/optimizer_state.pt", "object", extracted.optimizer),
                 *_model_copies(setup, folder, checkpoint_files, sizer)]
    files.append(PlannedFile(LATEST, CONVERTER_RANK, "metadata", 0, len(folder.encode())))
    return UniversalPlan(setup.tag, folder, files, extracted.fragments)


class _Sizer:
    """``saved_size`` of states at paths, measured once per signature and file name stem: torch.save names the zip's
    records after the stem (``fp32.00`` -> ``fp32/data.pkl``), so files alike but for their folders or extensions
    (every parameter's ``fp32.pt``, every data-parallel rank's ``fp32.<dp>``) have one size."""

    def __init__(self, scratch: str):
        self.scratch, self.sizes = scratch, {}

    def file(self, path: str, kind: str, state: Any) -> PlannedFile:
        name = os.path.basename(path)
        key = (os.path.splitext(name)[0], signature(state))
        if key not in self.sizes:
            self.sizes[key] = saved_size(state, name, self.scratch)
        return PlannedFile(path, CONVERTER_RANK, kind, payload_bytes(state), self.sizes[key])


# --- 1. extraction ----------------------------------------------------------------------------------------------


@dataclass
class _Extracted:
    fragments: list[PlannedFile]
    slices: dict[tuple[str, int], dict[str, list[Any]]]
    """(name, tp rank) -> state -> the fragments' tensors, by data-parallel rank."""
    shapes: dict[str, tuple[int, ...]]
    """Every parameter's tp shard shape, in module order (the model files' ``param_shapes``)."""
    optimizer: dict[str, Any]
    """The contents of ``zero/optimizer_state.pt``."""


def _extract(setup: ShardSetup, folder: str, sizer: _Sizer) -> _Extracted:
    """``extract_zero_shards`` of every rank, on meta tensors."""
    out = _Extracted([], defaultdict(lambda: defaultdict(list)), {}, {})
    for rank, coord, state in training_states(setup):  # ranks in order: a shard's fragments by data-parallel rank
        out.shapes.update((name, tuple(t.shape)) for name, t in state.module.state_dict().items())
        saved = state.optimizer.state_dict()
        flat = _flat_states(saved)
        for name, address in saved["param_slice_mappings"][0].items():
            for key, tensor in flat.items():
                piece = tensor if key == "step" else tensor.narrow(0, address.start, address.numel).clone()
                path = f"{folder}/tmp/{name}/{coord.model}/{key}.{coord.data:0>2d}"
                out.fragments.append(sizer.file(path, "optimizer", piece))
                out.slices[name, coord.model][key].append(piece)
        if rank == 0:
            out.optimizer = _common_optimizer_state(saved, setup.layout.dp)
    return out


def _flat_states(saved: dict[str, Any]) -> dict[str, Any]:
    """A rank's flat states as ``extract_zero_shards`` takes them, after ``ZeROCheckpoint._strip_tensor_paddings``
    cut the trailing partition's padding off Adam's moments (the fp32 partition is saved without it)."""
    padding = saved["group_paddings"][0]
    adam = saved["base_optimizer_state"]["state"][0]

    def stripped(key: str) -> Any:
        tensor = adam[key]
        return tensor.narrow(0, 0, tensor.numel() - padding).clone() if padding else tensor

    flat = {"exp_avg": stripped("exp_avg"), "exp_avg_sq": stripped("exp_avg_sq"),
            "fp32": saved["single_partition_of_fp32_groups"][0]}
    if "step" in adam:
        flat["step"] = adam["step"]
    return flat


def _common_optimizer_state(saved: dict[str, Any], dp: int) -> dict[str, Any]:
    """``zero/optimizer_state.pt``: ``_save_optimizer_state`` on rank (0, 0, 0)'s optimizer state as
    ``ZeROCheckpoint.get_state_for_rank`` reads it (partition count set, group paddings cleared)."""
    sharded = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")
    groups = len(saved["group_paddings"])
    read = {**saved, "partition_count": [dp] * groups, "group_paddings": [0] * groups}
    return {**{k: v for k, v in read.items() if k not in sharded},
            "param_groups": saved["base_optimizer_state"]["param_groups"]}


# --- 2. merge ---------------------------------------------------------------------------------------------------


def _merged(setup: ShardSetup, folder: str, extracted: _Extracted, sizer: _Sizer) -> Iterator[PlannedFile]:
    """``zero/<name>/step.pt`` and ``zero/<name>/<state>.pt`` of every parameter, as ``merge_tp_slices`` makes them
    from the fragments."""
    from restartbench.model import universal_checkpoint_info

    info = universal_checkpoint_info(setup.preset)
    for name, shape in extracted.shapes.items():
        shards = [extracted.slices[name, tp] for tp in range(setup.layout.tp)]
        yield sizer.file(f"{folder}/zero/{name}/step.pt", "optimizer", shards[0]["step"][0])
        for state in STATES:
            yield sizer.file(f"{folder}/zero/{name}/{state}.pt", "optimizer",
                             _merged_state(name, [s[state] for s in shards], shape, info))


def _merged_state(name: str, pieces: list[list[Any]], shape: tuple[int, ...], info: dict[str, Any]) -> dict[str, Any]:
    """One state of one parameter at full shape, in the dict the converter saves."""
    import torch
    from deepspeed.checkpoint import constants as uc

    def matches(key: str) -> bool:
        return any(re.match(pattern, name) for pattern in info.get(key, []))

    if matches(uc.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0) or info.get(uc.PARAMETER_WITH_SUB_PARAMS):
        raise NotImplementedError(f"{name}: sub-parameters are not predicted")
    shards = [torch.cat(dp_pieces, dim=0).reshape(shape) for dp_pieces in pieces]
    saved: dict[str, Any] = {}
    if matches(uc.TP_REPLICATED_PARAMETER_PATTERNS):
        param = shards[0]
    elif matches(uc.PARAMETER_TO_AVERAGE_PATTERNS):
        param = sum(shards) / len(shards)
    else:
        saved[uc.CAT_DIM] = 1 if matches(uc.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS) else 0
        param = torch.cat(shards, dim=saved[uc.CAT_DIM])
    if matches(uc.VOCABULARY_PARAMETER_PATTERNS):
        param = param[:info[uc.ORIGINAL_VOCAB_SIZE], :]
        saved[uc.VOCAB_TENSOR] = True
    saved[uc.PARAM] = param
    return saved


# --- 4. the model files, copied -----------------------------------------------------------------------------------


def _model_copies(setup: ShardSetup, folder: str, checkpoint_files: list[PlannedFile] | None,
                  sizer: _Sizer) -> list[PlannedFile]:
    """Every ``mp_rank_*_model_states.pt`` of the checkpoint, copied (``shutil.copy2``) into the output folder."""
    if checkpoint_files is None:
        checkpoint_files = [sizer.file(f.path, f.kind, f.state) for f in shard_files(setup) if f.kind == "model"]
    return [PlannedFile(f"{folder}/{os.path.basename(f.path)}", CONVERTER_RANK, "model", f.payload_bytes, f.bytes)
            for f in checkpoint_files if f.kind == "model"]


# --- output -------------------------------------------------------------------------------------------------------


def render_text(plan: UniversalPlan) -> str:
    """The universal checkpoint for ``python -m restartbench.plan ... --universal``: each parameter's four files on
    one line, then the other files, the totals and the temporary fragments."""
    t = plan.totals()
    lines = [f"universal checkpoint of {plan.tag} (ds_to_universal.py --output_folder <checkpoint folder>/"
             f"{plan.folder}), written by one process:"]
    params: dict[str, list[PlannedFile]] = {}
    others = []
    for f in plan.files:
        parts = f.path.split("/")
        if len(parts) == 4 and parts[1] == "zero":
            params.setdefault(parts[2], []).append(f)
        else:
            others.append(f)
    width = max([0] + [len(name) for name in params])
    for name, files in params.items():
        lines.append(f"  {plan.folder}/zero/{name + '/':<{width + 1}}  " + "  ".join(
            f"{os.path.splitext(os.path.basename(f.path))[0]} {f.bytes:,}" for f in files))
    lines += [f"  {f.path:<60} {f.kind:<9} file {f.bytes:>16,}" for f in others]
    kinds = "; ".join(f"{kind}: {v['files']} files, {v['bytes']:,} B" for kind, v in t["by_kind"].items())
    return "\n".join([*lines, "", f"universal per kind: {kinds}",
                      f"universal checkpoint: {t['bytes']:,} B in {t['files']} files; payload {t['payload_bytes']:,} B",
                      f"temporary fragments ({plan.folder}/tmp, written, read back and removed during the conversion): "
                      f"{t['fragment_bytes']:,} B in {t['fragment_files']} files"]) + "\n"

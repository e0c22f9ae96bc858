"""DeepSpeed's universal checkpoints (issue 19): the model declares how its parameters are split
(``restartbench.model.universal_checkpoint_info``), DeepSpeed's default engine saves the declaration in every model
file, and DeepSpeed's ``ds_to_universal.py``, run as DeepSpeed ships it, converts a study checkpoint into every
parameter's fp32 weights and Adam moments at full shape, by name; the predictor's universal checkpoint
(``restartbench.engines.deepspeed.universal_predict``) is what the converter writes, file by file and byte for byte.

FastPersist's folders (``--engine fastpersist``) do not convert as they are: every data-parallel writer writes the
model file, and the copies past the lowest writer keep FastPersist's suffix (``mp_rank_00_model_states.pt-1.2``),
which ds_to_universal.py counts as model files: "RuntimeError: Checkpoint model-state file count 4 does not match
pp_degree=2 * tp_degree=1." (DeepSpeed 0.19.8, tiny pp2dp2)."""

import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import deepspeed.checkpoint
import pytest
import torch
from conftest import copy_run
from deepspeed.checkpoint import constants as uc

from restartbench.config import RunConfig
from restartbench.engines.deepspeed.universal_predict import predict_universal
from restartbench.layout import parse_layout
from restartbench.model import TensorParallel, layer_specs, parameter_splits, universal_checkpoint_info
from restartbench.plan import setup_for
from restartbench.presets import get_preset

CONVERTER = Path(deepspeed.checkpoint.__file__).parent / "ds_to_universal.py"
STATES = ("fp32", "exp_avg", "exp_avg_sq")
TINY = get_preset("tiny")


def full_shapes(preset, tp: int = 1, tp_rank: int = 0) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape (PipelineModule name) in the model built with ``tp`` on the meta device."""
    with torch.device("meta"):
        layers = [spec.build() for spec in layer_specs(preset, TensorParallel(tp, tp_rank), seed=0)]
    return {f"{index}.{name}": tuple(p.shape) for index, layer in enumerate(layers)
            for name, p in layer.named_parameters()}


def matched(patterns: list[str], names: list[str]) -> set[str]:
    return {name for name in names if any(re.match(pattern, name) for pattern in patterns)}


# -- the declaration, without processes -------------------------------------------------------------------------


def test_each_parameters_split_is_the_dimension_its_shards_shrink():
    """The marks the patterns come from (``TP_DIM``) say what the model's shards do: under tp 2 a parameter is half
    as long along its marked dimension and whole along every other; an unmarked one is whole."""
    whole, half = full_shapes(TINY), full_shapes(TINY, tp=2, tp_rank=1)
    for name, dim, _ in parameter_splits(TINY):
        expected = list(whole[name])
        if dim is not None:
            expected[dim] //= 2
        assert half[name] == tuple(expected), name
    assert list(whole) == [name for name, _, _ in parameter_splits(TINY)]


@pytest.mark.parametrize("preset", ["tiny", "70B"])
def test_each_pattern_list_selects_exactly_its_parameters(preset):
    model = get_preset(preset)
    splits = parameter_splits(model)
    names = [name for name, _, _ in splits]
    info = universal_checkpoint_info(model)
    last = model.layers + 2
    expected = {
        uc.TP_REPLICATED_PARAMETER_PATTERNS: {n for n, dim, _ in splits if dim is None},
        uc.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: {n for n, dim, _ in splits if dim == 1},
        uc.VOCABULARY_PARAMETER_PATTERNS: {"0.weight", f"{last}.weight"},
    }
    assert {f"{model.layers + 1}.weight", "1.attn_norm", "1.mlp_norm"} <= expected[uc.TP_REPLICATED_PARAMETER_PATTERNS]
    assert {"1.o", "1.down", f"{model.layers}.down"} <= expected[uc.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS]
    for key, selected in expected.items():
        assert matched(info[key], names) == selected, key
        # ds_to_universal.py refuses a name two patterns of a list match, and (strict) a pattern nothing matches
        assert all(sum(bool(re.match(p, name)) for p in info[key]) <= 1 for name in names), key
        assert all(matched([p], names) for p in info[key]), key
    assert info[uc.ORIGINAL_VOCAB_SIZE] == model.vocab_size
    assert info[uc.UNIVERSAL_CHECKPOINT_VERSION_KEY] == uc.UNIVERSAL_CHECKPOINT_VERSION_VALUE
    for key in (uc.PIPELINE_REPLICATED_PARAMETER_PATTERNS, uc.PARAMETER_TO_AVERAGE_PATTERNS,
                uc.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0):
        assert info[key] == [], key


# -- DeepSpeed's converter on real study checkpoints ---------------------------------------------------------------


def saved_state(folder: Path, tp: int) -> dict[str, dict[str, torch.Tensor]]:
    """state -> name -> full tensor, gathered from the study checkpoint's ZeRO-1 optimizer files without DeepSpeed's
    converter: each rank's fragments (``param_slice_mappings``) joined over data-parallel ranks into its tp shard,
    the shards joined along the parameter's tensor-parallel dimension (replicated ones must be equal)."""
    shapes = {(name, r): shape for r in range(tp) for name, shape in full_shapes(TINY, tp, r).items()}
    fragments: dict[tuple[str, int, str], list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for path in folder.glob("zero_pp_rank_*_mp_rank_*_optim_states.pt"):
        dp, mp = map(int, re.search(r"zero_pp_rank_(\d+)_mp_rank_(\d+)", path.name).groups())
        optimizer = torch.load(path, weights_only=False)["optimizer_state_dict"]
        flat = {"fp32": optimizer["single_partition_of_fp32_groups"][0],
                **{s: optimizer["base_optimizer_state"]["state"][0][s] for s in STATES[1:]}}
        for name, fragment in optimizer["param_slice_mappings"][0].items():
            for state, tensor in flat.items():  # the model file's ranks are numbered pipe-major, then tp
                fragments[name, mp % tp, state].append((dp, tensor.narrow(0, fragment.start, fragment.numel)))
    gathered: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for name, dim, _ in parameter_splits(TINY):
        for state in STATES:
            shards = [torch.cat([t for _, t in sorted(fragments[name, r, state], key=lambda f: f[0])])
                      .reshape(shapes[name, r]) for r in range(tp)]
            if dim is None:
                assert all(torch.equal(shards[0], s) for s in shards[1:]), (name, state)
            gathered[state][name] = shards[0] if dim is None else torch.cat(shards, dim=dim)
    return gathered


@dataclass
class Conversion:
    run: Path
    folder: Path
    """The run's checkpoint folder: the conversion reads ``step2`` and writes ``step2_universal`` beside it."""
    before: dict[str, int]
    """Every file in the checkpoint folder before the conversion (path relative to it -> bytes)."""


def files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def ds_to_universal(source: Path, output: Path, *options: str) -> None:
    """DeepSpeed's shipped converter, as a subprocess, one worker each (strict checks on)."""
    convert = subprocess.run([sys.executable, str(CONVERTER), "--input_folder", str(source), "--output_folder",
                              str(output), "--num_extract_workers", "1", "--num_merge_workers", "1", *options],
                             capture_output=True, text=True, timeout=600)
    assert convert.returncode == 0, convert.stdout[-2000:] + convert.stderr[-2000:]


@pytest.fixture(scope="module")
def converted(tmp_path_factory, study_runs):
    """layout -> the Conversion of a tiny fp32 run's step-2 checkpoint into ``<checkpoints>/step2_universal``, the
    study's convention (made on first use), in a copy of the session's study run of that layout (its first save is
    at iteration 2)."""
    made: dict[str, Conversion] = {}

    def convert(layout: str) -> Conversion:
        if layout not in made:
            proc, study_run = study_runs[layout]
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            assert RunConfig.load(study_run / "config.json").model.dtype == "fp32"
            run = copy_run(study_run, tmp_path_factory.mktemp(f"universal-{layout}") / "logs")
            folder = run / "checkpoints"
            before = files_under(folder)
            ds_to_universal(folder / "step2", folder / "step2_universal")
            made[layout] = Conversion(run, folder, before)
        return made[layout]

    return convert


LAYOUTS = ["tp2pp2", "tp1pp1dp2"]


@pytest.mark.multirank
@pytest.mark.parametrize("layout", LAYOUTS)
def test_deepspeeds_converter_gives_every_parameter_at_full_shape(converted, layout):
    """A tiny fp32 run saves at iteration 2; DeepSpeed's ds_to_universal.py (the shipped file, strict checks on)
    writes one folder per parameter name, every one of them, with its fp32 weights and Adam moments at the model's
    full shape, equal to what the study checkpoint holds gathered by hand, and Adam's step 2."""
    conversion = converted(layout)
    source, output = conversion.folder / "step2", conversion.folder / "step2_universal"

    shapes = full_shapes(TINY)
    zero = output / "zero"
    assert sorted(p.name for p in zero.iterdir() if p.is_dir()) == sorted(shapes)
    assert (zero / "optimizer_state.pt").is_file()
    assert (output.parent / "latest_universal").read_text() == "step2_universal"
    expected = saved_state(source, parse_layout(layout).tp)
    for name, shape in shapes.items():
        for state in STATES:
            param = torch.load(zero / name / f"{state}.pt", weights_only=False)[uc.PARAM]
            assert (tuple(param.shape), param.dtype) == (shape, torch.float32), (name, state)
            assert torch.equal(param, expected[state][name]), (name, state)
        assert float(torch.load(zero / name / "step.pt", weights_only=False)) == 2.0, name
    for model_file in sorted(output.glob("mp_rank_*_model_states.pt")):  # copied from the study checkpoint
        declared = torch.load(model_file, weights_only=False)[uc.UNIVERSAL_CHECKPOINT_INFO]
        assert declared == universal_checkpoint_info(TINY), model_file.name


@pytest.mark.multirank
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_conversion_writes_exactly_the_predicted_files_and_fragments(converted, layout, tmp_path):
    """The predictor's universal checkpoint (``python -m restartbench.plan ... --universal``) is the conversion's:
    every predicted file, and no other, appears in the checkpoint folder with exactly the predicted bytes (the
    temporary folder removed); converted again with ``--keep_temp_folder``, the fragments left in ``tmp`` are the
    predicted ones, byte for byte."""
    conversion = converted(layout)
    cfg = RunConfig.load(conversion.run / "config.json")
    plan = predict_universal(setup_for(cfg))
    after = files_under(conversion.folder)
    assert {path: size for path, size in after.items() if path not in conversion.before} == \
        {f.path: f.bytes for f in plan.files}
    assert all(after[path] == size for path, size in conversion.before.items())  # the checkpoint left as it was

    kept = tmp_path / "kept"
    ds_to_universal(conversion.folder / "step2", kept / "step2_universal", "--keep_temp_folder")
    assert files_under(kept) == {f.path: f.bytes for f in [*plan.files, *plan.fragments]}
    assert sum(size for path, size in files_under(kept).items() if "/tmp/" in path) == plan.fragment_bytes

"""The run configuration tree, its generated CLI, planning checks, and template rendering (no launch)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from restartbench import engines
from restartbench.config import RunConfig, build_parser, config_from_args
from restartbench.engines.lazy.options import direct_io
from restartbench.study import StudyError, plan_run, render

ROOT = Path(__file__).resolve().parent.parent


def test_cli_is_generated_from_the_tree_with_docs():
    help_text = build_parser().format_help()
    for option in ("--engine", "--save-interval", "--checkpoint-dir", "--dry-run", "--no-verify", "--dtype"):
        assert option in help_text
    assert "Checkpoint every N iterations" in help_text


def test_cli_values_land_in_their_sections():
    cfg = config_from_args(["13B", "tp2pp4", "--iters", "8", "--save-interval", "4", "--dtype", "fp32", "--no-verify"])
    assert (cfg.model.preset, cfg.layout.layout) == ("13B", "tp2pp4")
    assert (cfg.train.iters, cfg.train.save_interval, cfg.model.dtype, cfg.launch.verify) == (8, 4, "fp32", False)


def test_defaults_are_the_embedded_demo():
    cfg = config_from_args([])
    assert (cfg.model.preset, cfg.layout.layout, cfg.engine.engine) == ("tiny", "tp2pp2", "torch")


def test_json_round_trip_and_unknown_keys(tmp_path):
    cfg = config_from_args(["tiny", "pp2dp2", "--iters", "3"])
    cfg.save(tmp_path / "config.json")
    assert RunConfig.load(tmp_path / "config.json") == cfg
    with pytest.raises(ValueError, match=r"unknown key\(s\) in config section 'train': \['itres'\]"):
        RunConfig.from_dict({"train": {"itres": 3}})


def _plan(*argv):
    cfg = config_from_args([*argv, "--dry-run"])
    return cfg, plan_run(cfg)


def test_70b_tp8pp8_renders_for_64_gpus():
    cfg, plan = _plan("70B", "tp8pp8")
    rendered = render(cfg, plan)
    assert (plan.world_size, plan.nnodes, plan.nproc_per_node, plan.backend) == (64, 8, 8, "nccl")
    ds = json.loads(rendered.ds_config_text)
    assert ds["zero_optimization"]["stage"] == 1 and ds["bf16"]["enabled"] is True
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 1
    assert "--nnodes 8 --nproc-per-node 8" in rendered.launch_script
    assert 'export CROSS_RANK="${NODE_RANK:-0}" CROSS_SIZE=8' in rendered.launch_script  # as DeepSpeed's launcher
    assert subprocess.run(["bash", "-n"], input=rendered.launch_script, text=True).returncode == 0


def test_seq_len_override_is_planned_and_estimated_with():
    """The plan (plan.json) records the sequence length trained with, and memory is estimated for it."""
    _, default = _plan("3B", "tp1pp1", "--device", "cuda")
    _, short = _plan("3B", "tp1pp1", "--device", "cuda", "--seq-len", "1024")
    assert (default.preset["seq_len"], short.preset["seq_len"]) == (4096, 1024)
    activations = [float(p.memory_per_rank_estimate.split("activations ")[1].split(",")[0]) for p in (default, short)]
    assert activations[1] < activations[0] / 3


def test_dp_is_inferred_from_ranks_given():
    _, plan = _plan("tiny", "pp2", "--nproc-per-node", "4")
    assert plan.layout == {"tp": 1, "pp": 2, "dp": 2}


def test_paths_with_spaces_are_quoted(tmp_path):
    cfg, plan = _plan("tiny", "tp2pp2", "--logs", str(tmp_path / "my logs"))
    script = render(cfg, plan).launch_script
    assert plan.run_dir not in script  # launch.sh finds its run folder from its own place, quoted
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    folder = tmp_path / "my logs" / "a run"
    folder.mkdir(parents=True)
    found = next(line for line in script.splitlines() if line.startswith("RUN_DIR="))
    (folder / "launch.sh").write_text(f'{found}\necho "$RUN_DIR"\n')
    printed = subprocess.run(["bash", str(folder / "launch.sh")], capture_output=True, text=True)
    assert printed.stdout.strip() == str(folder.resolve())


@pytest.mark.parametrize("argv, message", [
    (["175B", "tp2"], "unknown model preset '175B'; known presets"),
    (["tiny", "tp2pp2", "--engine", "nebula"],
     "unknown checkpoint engine 'nebula'; known engines: none, torch, fastpersist"),
    (["tiny", "tp3"], "4 attention heads, not divisible by tp=3"),
    (["tiny", "tp2pp2dp2", "--nproc-per-node", "4"], "needs tp·pp·dp = 2·2·2 = 8 ranks, but 4 were given"),
    (["tiny", "tp2pp2", "--lazy-prefetch"], "--lazy-prefetch is an option of the lazy engine, and this run's engine "
     "is torch: the run would ignore it while its config.json said it was set. Drop it, or choose --engine lazy."),
    (["tiny", "tp2pp2", "--engine", "lazy", "--io-buffer-mb", "8"], "--io-buffer-mb is an option of the fastpersist "
     "and decoupled engines, and this run's engine is lazy: the run would ignore it while its config.json said it was "
     "set. Drop it, or choose --engine fastpersist or --engine decoupled."),
])
def test_bad_input_is_refused_before_anything_is_written(argv, message, tmp_path):
    cfg = config_from_args([*argv, "--logs", str(tmp_path)])
    with pytest.raises(StudyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_run(cfg)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["--engine", "lazy", "--lazy-prefetch", "--dp-read-once", "--lazy-chunk-mb", "8", "--no-lazy-direct-io"],
    ["--engine", "fastpersist", "--io-buffer-mb", "8", "--writer-data-parallel", "socket"],
    ["--engine", "datastates", "--host-cache-gb", "2"],
    ["--engine", "torch", "--lazy-io-threads", "4"],  # at its default: nothing is set, nothing to refuse
])
def test_an_engines_own_options_are_taken(argv):
    _plan("tiny", "tp2pp2", *argv)


def test_every_engine_option_is_read_by_some_engine_and_every_engine_reads_only_options():
    owned = {field.name for cls in engines.engine_options().values() for field in dataclasses.fields(cls)}
    read = {name: engines.engine_info(name).options for name in engines.engine_names()}
    assert {option for options in read.values() for option in options} == owned
    assert read["lazy"] == ("dp_read_once", "lazy_chunk_mb", "lazy_io_threads", "lazy_direct_io", "lazy_prefetch")
    assert read["torch"] == read["dcp"] == read["none"] == ()


def test_a_runs_engine_options_are_said_as_the_command_line_words_that_set_them():
    section = {"engine": "lazy", "lazy_direct_io": True, "lazy_chunk_mb": 8, "lazy_io_threads": 4,
               "io_buffer_mb": 16}  # io_buffer_mb is not lazy's: not said
    assert engines.options_set("lazy", section, "cpu") == "--lazy-chunk-mb 8 --lazy-direct-io"
    assert engines.options_set("lazy", {"engine": "lazy"}, "cpu") == ""  # keys it lacks predate their options
    assert engines.options_set("fastpersist", {"io_buffer_mb": 16}, "cuda") == "--io-buffer-mb 16"
    assert engines.options_set("toy", {"toy_file_prefix": "mine"}, "cpu") == ""  # not registered here


@pytest.mark.parametrize("saved, device, said", [
    (None, "cpu", ""), (False, "cpu", ""), (True, "cpu", "--lazy-direct-io"),
    (None, "cuda", ""), (True, "cuda", ""), (False, "cuda", "--no-lazy-direct-io"),
    ("lacking", "cpu", ""), ("lacking", "cuda", "--no-lazy-direct-io"),
])
def test_lazy_direct_io_is_said_against_its_default_on_the_runs_device(saved, device, said):
    """On by default on CUDA, off on the CPU (since 2026-11-27's fourteenth session): a run is named by what it did
    against what a run there does by default. A config.json that lacks the key was written before the option
    existed, when every run read and wrote buffered: on CUDA that is now --no-lazy-direct-io."""
    section = {"engine": "lazy"} if saved == "lacking" else {"engine": "lazy", "lazy_direct_io": saved}
    assert engines.options_set("lazy", section, device) == said


@pytest.mark.parametrize("words, chosen, cpu, cuda", [
    ([], None, False, True), (["--lazy-direct-io"], True, True, True), (["--no-lazy-direct-io"], False, False, False)])
def test_lazy_direct_io_is_chosen_on_the_command_line_or_by_the_device(words, chosen, cpu, cuda):
    options = config_from_args(["tiny", "dp1", "--engine", "lazy", *words]).engine
    assert options.lazy_direct_io is chosen
    assert (direct_io(options, "cpu"), direct_io(options, "cuda"), direct_io(options, "cuda:3")) == (cpu, cuda, cuda)


def test_memory_check_refuses_a_preset_too_big_for_this_machine(tmp_path):
    cfg = config_from_args(["13B", "dp1", "--device", "cpu", "--logs", str(tmp_path)])
    with pytest.raises(StudyError, match="needs about .* GiB per rank"):
        plan_run(cfg)


def test_templates_refuse_undefined_variables():
    from restartbench.render import template_environment

    with pytest.raises(jinja2.UndefinedError):
        template_environment().get_template("ds_config.json.j2").render(micro_batch=1)


def test_config_n_run_dry_run_prints_json_and_script():
    out = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "13B", "tp2pp4", "--dry-run"],
                         capture_output=True, text=True, check=True).stdout
    assert "# --- ds_config.json ---" in out and "restartbench.torchrun" in out and "8 ranks" in out


def test_dry_run_creates_nothing(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "tiny", "tp2pp2", "--dry-run",
                    "--logs", str(tmp_path)], capture_output=True, text=True, check=True)
    assert not any(tmp_path.iterdir())


def test_config_n_run_reports_errors_with_exit_code_2():
    proc = subprocess.run([sys.executable, str(ROOT / "config-n-run.py"), "huge"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown model preset 'huge'" in proc.stdout


def test_unwritable_checkpoint_folder_is_refused_and_leaves_nothing(tmp_path):
    from restartbench.study import run_study

    cfg = config_from_args(["tiny", "pp2dp2", "--logs", str(tmp_path / "logs"), "--checkpoint-dir", "/dev/null/ckpt"])
    with pytest.raises(StudyError, match="cannot be created"):
        run_study(cfg)
    assert not (tmp_path / "logs").exists()


def test_full_disk_is_refused_before_launch_with_bytes_needed(tmp_path, monkeypatch):
    import shutil as shutil_module

    from restartbench import study

    monkeypatch.setattr(study.shutil, "disk_usage", lambda _: shutil_module._ntuple_diskusage(10, 10, 1024))
    cfg = config_from_args(["tiny", "pp2dp2", "--logs", str(tmp_path / "logs"), "--iters", "4", "--save-interval", "2"])
    with pytest.raises(StudyError, match=r"has 0.00 GiB free, but 2 checkpoint\(s\) of about"):
        study.run_study(cfg)
    assert not (tmp_path / "logs").exists()


def test_every_preset_is_named_in_the_preset_help():
    """The positional's help lists the presets a person may choose (config-n-run.py's and the what-if CLI's)."""
    from restartbench.presets import PRESETS
    from restartbench.whatif.cli import build_parser as whatif_parser

    for parser in (build_parser(), whatif_parser()):
        helps = {action.dest: action.help or "" for action in parser._actions}
        preset_help = next(text for dest, text in helps.items() if dest.endswith("preset"))
        assert all(f" {name}" in preset_help.replace("(", " ").replace(",", " ") for name in PRESETS), preset_help

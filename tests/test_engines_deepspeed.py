"""DeepSpeed's writer engines measured as shipped: FastPersist's file-name workaround, and honest failures."""

import json

import pytest

from conftest import run_study
from restartbench import engines
from restartbench.engines.deepspeed_engines import drop_writer_suffixes


def test_writer_suffixes_are_dropped_and_each_rename_is_reported(tmp_path):
    suffixed = tmp_path / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt-0.1"
    suffixed.write_bytes(b"x" * 10)
    plain = tmp_path / "mp_rank_00_model_states.pt"
    plain.write_bytes(b"y")
    notes = drop_writer_suffixes([str(tmp_path / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), str(plain)])
    assert (tmp_path / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").read_bytes() == b"x" * 10
    assert not suffixed.exists() and plain.read_bytes() == b"y"
    assert len(notes) == 1 and "-0.1" in notes[0]


def test_an_ambiguous_suffix_is_left_alone(tmp_path):
    for suffix in ("-0.2", "-1.2"):
        (tmp_path / f"layer_01-model_00-model_states.pt{suffix}").write_bytes(b"z")
    assert drop_writer_suffixes([str(tmp_path / "layer_01-model_00-model_states.pt")]) == []


def test_known_failures_as_shipped_are_stated_per_device():
    assert "pin_memory" in engines.known_issue("fastpersist", "cpu")
    assert engines.known_issue("fastpersist", "cuda") is None
    assert "Cowardly" in engines.known_issue("decoupled", "cuda")
    assert engines.known_issue("torch", "cpu") is None


@pytest.mark.multirank
@pytest.mark.parametrize("engine, message", [
    ("fastpersist", "Cannot access accelerator device"),
    ("decoupled", "Cowardly refusing to serialize non-leaf tensor"),
])
def test_broken_as_shipped_engines_fail_with_their_own_message(tmp_path, engine, message):
    """On CPU both fail as shipped: the run is failed, DeepSpeed's message is kept, nothing is named latest."""
    proc, run = run_study(tmp_path / "logs", "tiny", "tp1pp1dp2", "--dtype", "fp32", "--iters", "2",
                          "--engine", engine, timeout=600)
    assert proc.returncode != 0
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["status"] == "failed" and message in meta["error"]
    assert meta["engine_known_issue"] == engines.known_issue(engine, "cpu")
    assert not (run / "checkpoints" / "latest").exists()

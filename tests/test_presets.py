"""Preset arithmetic, checked against transformers' LlamaForCausalLM built on the meta device."""

import pytest
import torch
import transformers

from restartbench.presets import PRESETS, UnknownPresetError, get_preset


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_count_matches_transformers_llama(name):
    p = PRESETS[name]
    config = transformers.LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden, intermediate_size=p.ffn_hidden,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    assert p.param_count() == sum(t.numel() for t in model.parameters())


@pytest.mark.parametrize("name, billions",
                         [("1B", 1.5), ("3B", 3.6), ("7B", 6.7), ("13B", 13.0), ("33B", 32.5), ("70B", 70.6)])
def test_study_sizes_are_what_their_names_say(name, billions):
    assert PRESETS[name].param_count() / 1e9 == pytest.approx(billions, abs=0.05)


def test_published_dimensions():
    p = PRESETS["70B"]
    assert (p.vocab_size, p.hidden, p.ffn_hidden, p.layers, p.heads, p.kv_heads) == (128256, 8192, 28672, 80, 64, 8)
    p = PRESETS["13B"]
    assert (p.hidden, p.ffn_hidden, p.layers, p.heads, p.kv_heads) == (5120, 13824, 40, 40, 40)
    p = PRESETS["3B"]
    assert (p.hidden, p.ffn_hidden, p.layers, p.heads, p.kv_heads) == (3072, 8192, 28, 24, 8)
    p = PRESETS["1B"]
    assert (p.vocab_size, p.hidden, p.ffn_hidden, p.layers, p.heads, p.kv_heads) == (128256, 2048, 8192, 16, 32, 8)


def test_1b_is_the_one_gpu_visit_size():
    """Llama-3.2-1B untied: 1,498,482,688 parameters by hand (embedding and head 2x128256x2048 = 525,336,576;
    a layer 2x2048 + 2048x(2048 + 2x512) + 2048^2 + 3x8192x2048 = 60,821,504, times 16; final norm 2048), a
    checkpoint of P x 14 = 20.98 GB."""
    p = PRESETS["1B"]
    assert p.param_count() == 525_336_576 + 16 * 60_821_504 + 2048 == 1_498_482_688
    assert p.param_count() * 14 / 1e9 == pytest.approx(20.98, abs=0.01)


def test_lookup_is_case_insensitive_and_unknown_lists_known():
    assert get_preset("70b").name == "70B"
    with pytest.raises(UnknownPresetError, match="known presets: tiny, small, 1B, 3B"):
        get_preset("175B")


def test_presets_are_frozen():
    with pytest.raises(AttributeError):
        PRESETS["tiny"].hidden = 1

"""Layout grammar and validation: pure functions, so tested exhaustively (and with hypothesis)."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from restartbench.layout import (
    Layout,
    LayoutError,
    layout_problems,
    parse_layout,
    restore_grad_accum,
    validate_layout,
)
from restartbench.presets import PRESETS


@pytest.mark.parametrize("text, expected", [
    ("tp2pp4", (2, 4, None)), ("tp2pp4dp2", (2, 4, 2)), ("dp4", (1, 1, 4)), ("pp2dp2", (1, 2, 2)),
    ("DP2TP2", (2, 1, 2)), ("tp1pp1dp2", (1, 1, 2)),
])
def test_parse(text, expected):
    spec = parse_layout(text)
    assert (spec.tp, spec.pp, spec.dp) == expected


@pytest.mark.parametrize("text", ["", "tp", "tp0", "tp2tp2", "tp2-pp2", "x2", "tp2 pp2", "tp-1"])
def test_malformed_layouts_are_refused_with_the_grammar(text):
    with pytest.raises(LayoutError, match="malformed layout|at least 1|given twice"):
        parse_layout(text)


def test_dp_inferred_from_world_size():
    assert parse_layout("tp2pp4").resolve(16) == Layout(2, 4, 2)
    assert parse_layout("tp2pp4").resolve(None) == Layout(2, 4, 1)


def test_world_size_mismatch_names_the_numbers():
    with pytest.raises(LayoutError, match=r"tp·pp·dp = 2·2·2 = 8 ranks, but 4 were given"):
        parse_layout("tp2pp2dp2").resolve(4)
    with pytest.raises(LayoutError, match="world size 6 is not a multiple of tp·pp = 2·2 = 4"):
        parse_layout("tp2pp2").resolve(6)


def test_problems_name_numbers_and_fix():
    problems = layout_problems(Layout(3, 3, 1), PRESETS["70B"])
    text = "\n".join(problems)
    assert "80 layers, not divisible by pp=3" in text and "choose pp among 1, 2, 4, 5, 8" in text
    assert "64 attention heads, not divisible by tp=3" in text
    assert "8 kv-heads, not divisible by tp=3; choose tp among 1, 2, 4, 8" in text


def test_study_layouts_fit():
    assert validate_layout("tp8pp8", PRESETS["70B"]).world_size == 64
    assert validate_layout("tp2pp4", PRESETS["13B"]).name == "tp2pp4dp1"
    assert validate_layout("tp2pp2", PRESETS["tiny"], 4) == Layout(2, 2, 1)


@given(tp=st.integers(1, 16), pp=st.integers(1, 16), dp=st.integers(1, 16), name=st.sampled_from(list(PRESETS)))
def test_validation_accepts_exactly_the_divisible_layouts(tp, pp, dp, name):
    preset = PRESETS[name]
    fits = (preset.layers % pp == 0 and preset.heads % tp == 0 and preset.kv_heads % tp == 0
            and preset.vocab_size % tp == 0 and preset.ffn_hidden % tp == 0)
    text = f"tp{tp}pp{pp}dp{dp}"
    if fits:
        assert validate_layout(text, preset, tp * pp * dp) == Layout(tp, pp, dp)
    else:
        with pytest.raises(LayoutError, match=f"does not fit {name}"):
            validate_layout(text, preset, tp * pp * dp)


@given(st.text(max_size=12))
def test_parse_never_crashes_with_anything_but_layout_error(text):
    try:
        spec = parse_layout(text)
    except LayoutError:
        return
    assert min(spec.tp, spec.pp, spec.dp or 1) >= 1


def test_dp_inferred_is_an_integer_degree():
    assert parse_layout("tp2pp4").resolve(16).name == "tp2pp4dp2"
    assert validate_layout("tp2pp2", PRESETS["tiny"], 8) == Layout(2, 2, 2)


@pytest.mark.parametrize("layers, choices", [(128, "1, 2, 4, 8, 16, 32, 64"), (130, "1, 2, 5, 10, 13, 26")])
def test_suggested_degrees_are_the_divisors_up_to_64(layers, choices):
    preset = dataclasses.replace(PRESETS["70B"], layers=layers)
    assert f"choose pp among {choices}\n" in "\n".join(layout_problems(Layout(1, 3, 1), preset)) + "\n"


def test_every_problem_is_listed_one_per_line():
    preset = dataclasses.replace(PRESETS["tiny"], hidden=65)
    with pytest.raises(LayoutError) as refused:
        validate_layout("tp3pp3", preset, 9)
    lines = str(refused.value).splitlines()
    assert lines[0] == "layout tp3pp3dp1 does not fit tiny:"
    assert lines[1:] == ["  - " + problem for problem in layout_problems(Layout(3, 3, 1), preset)]
    assert any(line == "  - tiny: hidden 65 is not divisible by its 4 heads" for line in lines)
    assert len(lines) == 1 + 6  # layers, heads, kv-heads, hidden, vocabulary, ffn


@pytest.mark.parametrize(("saved", "grad_accum", "new", "expected"), [
    (Layout(2, 2, 1), 2, Layout(1, 2, 2), 1),  # tp2pp2 -> pp2dp2: 2 micro-batches, one per replica
    (Layout(1, 1, 2), 2, Layout(1, 1, 4), 1),
    (Layout(1, 1, 4), 1, Layout(1, 1, 2), 2),  # dp4 -> dp2: each replica takes two
    (Layout(2, 1, 2), 3, Layout(1, 2, 1), 6),
])
def test_a_restart_on_another_layout_keeps_the_global_batch(saved, grad_accum, new, expected):
    assert restore_grad_accum(saved, grad_accum, new) == expected
    assert new.dp * expected == saved.dp * grad_accum


def test_a_restart_layout_whose_dp_does_not_divide_the_global_batch_is_refused_with_the_choices():
    with pytest.raises(LayoutError, match=r"global batch is 2 micro-batches \(dp=1 × 2 per rank\); tp1pp1dp4 has "
                                          r"dp=4, which does not divide it.*choose dp among 1, 2"):
        restore_grad_accum(Layout(2, 2, 1), 2, Layout(1, 1, 4))

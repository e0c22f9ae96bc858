"""Property-based tests (hypothesis) for the run-config parser, preset lookup, layout rules on any model shape
and the grouping of rank errors."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from restartbench.config import RunConfig, config_from_args, leaf_fields
from restartbench.events import rank_errors, ranks_label
from restartbench.layout import Layout, layout_problems
from restartbench.presets import PRESETS, ModelPreset, UnknownPresetError, get_preset

LEAVES = {leaf.name: (section, leaf) for section, leaf in leaf_fields()}
SECTIONS = [f.name for f in dataclasses.fields(RunConfig)]
values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=8))


def _section_keys(section):
    return sorted(name for name, (owner, _) in LEAVES.items() if owner == section) + ["bogus_key"]


config_dicts = st.one_of(
    st.fixed_dictionaries({}, optional={
        section: st.dictionaries(st.sampled_from(_section_keys(section)), values, max_size=4) for section in SECTIONS}),
    st.fixed_dictionaries({"bogus": st.just({})}),
)


@given(config_dicts)
def test_from_dict_builds_or_names_the_unknown_key(data):
    try:
        cfg = RunConfig.from_dict(data)
    except ValueError as error:
        assert "bogus" in str(error) or " must be " in str(error)
        return
    for section, keys in data.items():
        for key, value in keys.items():
            assert getattr(getattr(cfg, section), key) == value


@given(iters=st.integers(1, 10**4), interval=st.integers(1, 100), dtype=st.sampled_from(["bf16", "fp32"]),
       verify=st.booleans(), preset=st.sampled_from(list(PRESETS)), logs=st.text(st.characters(
           blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
           lambda s: not s.startswith("-") and s.strip()))  # --logs refuses a blank folder name, as it should
def test_cli_round_trips_through_json(iters, interval, dtype, verify, preset, logs):
    argv = [preset, "tp1", "--iters", str(iters), "--save-interval", str(interval), "--dtype", dtype,
            "--verify" if verify else "--no-verify", "--logs", logs]
    cfg = config_from_args(argv)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.train.iters, cfg.train.save_interval, cfg.model.dtype, cfg.launch.verify, cfg.paths.logs) == (
        iters, interval, dtype, verify, logs)


@given(st.text(max_size=10))
def test_preset_lookup_finds_or_lists_the_known(name):
    try:
        preset = get_preset(name)
    except UnknownPresetError as error:
        assert all(known in str(error) for known in PRESETS)
        return
    assert preset.name.lower() == name.lower()


shapes = st.builds(
    lambda heads, head_dim, kv_div, layers, ffn, vocab: ModelPreset(
        "random", vocab, heads * head_dim, ffn, layers, heads, heads // kv_div, 16, "hypothesis"),
    heads=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), head_dim=st.sampled_from([8, 16, 64]),
    kv_div=st.sampled_from([1, 2, 4]), layers=st.integers(1, 48), ffn=st.integers(1, 4096), vocab=st.integers(1, 70000),
).filter(lambda p: p.kv_heads >= 1 and p.heads % p.kv_heads == 0)


@settings(max_examples=300)
@given(preset=shapes, tp=st.integers(1, 16), pp=st.integers(1, 16))
def test_layout_rules_on_any_shape(preset, tp, pp):
    problems = layout_problems(Layout(tp, pp, 1), preset)
    fits = all(n % d == 0 for n, d in ((preset.layers, pp), (preset.heads, tp), (preset.kv_heads, tp),
                                        (preset.vocab_size, tp), (preset.ffn_hidden, tp)))
    assert (not problems) == fits
    for problem in problems:
        assert str(tp) in problem or str(pp) in problem


@given(preset=shapes)
def test_param_count_is_the_sum_of_its_terms(preset):
    h = preset.hidden
    per_layer = 2 * h + h * h + 2 * h * preset.kv_dim + h * h + 3 * preset.ffn_hidden * h
    assert preset.param_count() == 2 * preset.vocab_size * h + preset.layers * per_layer + h


def test_unknown_preset_message_is_actionable():
    with pytest.raises(UnknownPresetError, match="unknown model preset 'x'; known presets: tiny"):
        get_preset("x")


def _expand(label):
    """The ranks a ranks_label names."""
    ranks = []
    for span in label.split(" ", 1)[1].split(", "):
        first, _, last = span.partition("–")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


@given(st.sets(st.integers(0, 300), min_size=1))
def test_ranks_label_names_exactly_the_ranks(ranks):
    label = ranks_label(list(ranks))
    assert _expand(label) == sorted(ranks)
    assert label.startswith("ranks " if len(ranks) > 1 else "rank ")


def test_rank_errors_one_line_per_distinct_message():
    outcomes = [{"rank": r, "error": "RuntimeError: boom"} for r in range(4)]
    outcomes += [{"rank": 4, "error": None}, {"rank": 5, "error": "OSError: disk"},
                 {"rank": 7, "error": "RuntimeError: boom"}]
    assert rank_errors(outcomes) == ["ranks 0–3, 7: RuntimeError: boom", "rank 5: OSError: disk"]

"""bench/mutation.py's choices, without running mutmut: which targets a run takes, that each target names the tests
written for its module, and that a second run on the same day does not overwrite the first's result."""

import json
import re
from pathlib import Path

import pytest
from test_bench_results import ROOT, bench_module

mutation = bench_module("mutation")
results_io = bench_module("results-io")


def test_the_named_targets_are_taken_in_the_study_s_order():
    chosen = mutation.chosen_targets("integrity, verify")
    assert [t.name for t in chosen] == ["verify", "integrity"]
    assert mutation.chosen_targets(",".join(t.name for t in mutation.TARGETS)) == mutation.TARGETS


@pytest.mark.parametrize("names,said", [("verify,verifyy", "unknown target(s) 'verifyy'"), (" , ", "no target named")])
def test_a_target_that_is_none_of_them_is_refused_with_the_list(names, said):
    with pytest.raises(ValueError, match=rf"^--targets: {re.escape(said)}; the targets are 'verify', 'integrity', "):
        mutation.chosen_targets(names)


@pytest.mark.parametrize("target", mutation.TARGETS, ids=[t.slug for t in mutation.TARGETS])
def test_a_target_s_modules_and_tests_exist_and_it_names_every_test_file_of_its_modules(target):
    # the chunked digest's tests (tests/test_verify_chunked.py) went unnamed for two weeks: verify scored 76 %
    for path in (*target.modules, *target.tests):
        assert (ROOT / path).is_file(), path
    for module in target.modules:
        stem = module.removeprefix("restartbench/").removesuffix(".py")
        if "/" not in stem:
            own = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob(f"test_{stem}*.py")
                         if p.stem == f"test_{stem}" or p.stem.startswith(f"test_{stem}_"))
            assert set(own) <= set(target.tests), f"{target.name}: {sorted(set(own) - set(target.tests))} not named"


def _meta(started: str) -> dict:
    return {"date": "2026-12-07", "machine": "cpu2", "benchmark": "mutation", "started": started}


def test_a_second_run_on_the_same_day_is_numbered_and_a_run_rewrites_only_its_own(tmp_path):
    first = results_io.attempt_stem(tmp_path, _meta("10:00"))
    assert first.name == "2026-12-07-cpu2-mutation"
    Path(f"{first}.json").write_text(json.dumps({"meta": _meta("10:00")}))
    assert results_io.attempt_stem(tmp_path, _meta("10:00")) == first  # the same run again: its own file
    second = results_io.attempt_stem(tmp_path, _meta("14:00"))
    assert second.name == "2026-12-07.2-cpu2-mutation"
    Path(f"{second}.json").write_text(json.dumps({"meta": _meta("14:00")}))
    # fixed: the check read '<date>.json' for a numbered stem (Path.with_suffix takes '.2-cpu2-mutation' for a
    # suffix), so a third attempt overwrote the second, and with that file present the numbering never ended
    assert results_io.attempt_stem(tmp_path, _meta("14:00")) == second
    assert results_io.attempt_stem(tmp_path, _meta("16:00")).name == "2026-12-07.3-cpu2-mutation"


def _result(accepted_why: str | None, status: str = "survived") -> dict:
    survivor = {"mutant": "m.x_f__mutmut_1", "status": status, "line": "buffer = None", "accepted": accepted_why}
    row = {"target": "verify", "modules": ["restartbench/verify.py"], "tests": ["tests/test_verify.py"],
           "functions": [], "mutants": 10, "counts": {"killed": 9, status: 1}, "score": 1.0,
           "required_score": 1.0, "meets_target": True, "survivors": [survivor]}
    meta = {"date": "2026-12-07", "command": "python bench/mutation.py", "machine": "cpu2", "host": "h", "cpus": 2,
            "cpu": "x86_64", "memory_bytes": 2**30, "device": "cpu", "python": "3.11", "torch": "2", "deepspeed": "0",
            "commit": "c0de", "load_average_at_start": 0.0}
    return {"meta": meta, "mutmut": "mutmut 3.8.1", "targets": [row]}


@pytest.mark.parametrize("why,said", [
    ("gpu only: CUDA staging; guarded by t", "— left to a GPU: CUDA staging; guarded by t"),
    ("equivalent: whitespace", "— accepted: equivalent: whitespace"),
    (None, "— **not accepted: a test is missing**")])
def test_a_survivor_is_said_to_be_equivalent_left_to_a_gpu_or_missing_a_test(why, said):
    text = mutation.markdown(_result(why))
    assert text.splitlines()[-1].endswith(said)
    assert ("1 survivor(s) run only on CUDA" in text) is (why is not None and why.startswith("gpu only:"))


def test_a_mutant_whose_tests_ran_out_of_time_is_listed_as_detected():
    text = mutation.markdown(_result(None, status="timeout"))
    assert text.splitlines()[-1].endswith("(timeout): `buffer = None` — detected: the tests ran past mutmut's time "
                                          "limit against it")
    assert "counts as detected" in text and "counts as detected" not in mutation.markdown(_result(None))


def test_the_score_counts_timeouts_as_detected_and_leaves_accepted_survivors_out():
    counts = {"killed": 90, "timeout": 2, "survived": 6, "no tests": 2}
    survivors = [{"accepted": "equivalent: x"}, {"accepted": "gpu only: y"}, *[{"accepted": None}] * 6]
    assert mutation.score_of(counts, survivors) == 92 / 98
    assert mutation.score_of({"killed": 0}, []) == 1.0  # nothing to mutate: nothing missed

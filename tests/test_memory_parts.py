"""restartbench.analysis.restart_rows.parts_at: the part of each memory sample, found by placing the samples among
the spans' bounds at once, against ``part_at``'s own answer for each sample (nested spans, spans starting
together, samples on a bound, before the first span and after the last)."""

import random

import pytest

from restartbench.analysis import restart_rows


def spans_of(rng: random.Random, count: int) -> list[dict]:
    spans = []
    for index in range(count):
        start = rng.choice([0.0, 1.0, 2.5, 4.0, rng.uniform(0, 10)])
        end = start + rng.choice([0.0, 0.5, 3.0, rng.uniform(0, 5)])
        spans.append({"part": f"p{index}", "start_s": start, "end_s": end})
    return sorted(spans, key=lambda s: s["start_s"])


@pytest.mark.parametrize("seed", range(40))
def test_each_samples_part_is_the_one_its_own_lookup_gives(seed):
    rng = random.Random(seed)
    spans = spans_of(rng, rng.randint(0, 6))
    bounds = [b for s in spans for b in (s["start_s"], s["end_s"])]
    times = sorted([rng.uniform(-1, 16) for _ in range(50)] + bounds + [-1.0, 20.0])
    starts = [s["start_s"] for s in spans]
    assert restart_rows.parts_at(spans, times) == [restart_rows.part_at(spans, starts, t) for t in times]


def test_a_nan_bound_looks_up_every_sample():
    spans = [{"part": "a", "start_s": 0.0, "end_s": float("nan")}, {"part": "b", "start_s": 1.0, "end_s": 2.0}]
    times = [0.5, 1.0, 1.5, 3.0]
    assert restart_rows.parts_at(spans, times) == [restart_rows.part_at(spans, [0.0, 1.0], t) for t in times]

#!/usr/bin/env python3
"""How long the what-if's plans take at scale: the ranks it reads against every rank of the layout.

    python bench/whatif_speed.py [--preset 70B] [--tp 8] [--pp 8] [--dps 4,32] [--engines torch,...] [--repeats 1]

A prediction (``python -m restartbench.whatif``) starts from each engine's checkpoint plan
(``restartbench.whatif.predict.shapes_for``), which is most of its time. Per data-parallel size and engine this
times two ways to the same ``Shape``:

- ``every rank``: the plan of every rank of the layout (what a prediction did before 2026-12-07: 70B tp8pp8dp256,
  16,384 ranks, took 498 s for five engines on the 2-core machine);
- ``what is read``: ``predict.planned_at``'s plan (an engine whose ranks plan alone: data-parallel ranks 0 and 1 of
  each stage and tp rank at the layout's dp; a collective engine, DCP: every rank at dp 8 at most).

It checks that the two shapes are equal where both are the layout's own plan (every engine but a collective one above
dp 8, whose shape then comes from dp 8 by design) and reports each time and the ratio. Each figure is the median of
``repeats`` runs in this process, each from emptied caches (the first plan of an engine imports its code: a warm-up plan
of each runs first and is not counted). Nothing is written but the results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from results_io import ROOT, add_output_arguments, attempt_stem, heading, positive_ints, run_meta, write_results

sys.path.insert(0, str(ROOT))

from restartbench.engines import cost_traits  # noqa: E402
from restartbench.layout import Layout  # noqa: E402
from restartbench.memo import forget_memoised  # noqa: E402
from restartbench.presets import get_preset  # noqa: E402
from restartbench.whatif.predict import plan_for, planned_at, shape_of  # noqa: E402

ENGINES = ("torch", "lazy", "torchsnapshot", "dcp", "dcp-async")


def timed(preset: str, layout: Layout, engine: str, ranks: frozenset[int] | None,
          repeats: int) -> tuple[float, object]:
    """The median seconds of ``repeats`` plans of ``engine`` on ``layout`` (of ``ranks`` only where given) made into
    a ``Shape``, and the shape."""
    params = get_preset(preset).param_count()
    seconds, shape = [], None
    for _ in range(repeats):
        forget_memoised()  # neither way times the other's leftovers
        start = time.perf_counter()
        shape = shape_of(plan_for(preset, layout.name, engine, ranks=ranks), layout, params)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), shape


def measure(preset: str, tp: int, pp: int, dps: list[int], engines: list[str], repeats: int) -> list[dict]:
    for engine in engines:  # warm-up: each engine's imports and DeepSpeed's first model build
        plan_for(preset, f"tp{tp}pp{pp}dp2", engine)
    rows = []
    for dp in dps:
        layout = Layout(tp, pp, dp)
        for engine in engines:
            whole_s, whole = timed(preset, layout, engine, None, repeats)
            planned, ranks = planned_at(layout, engine)
            read_s, read = timed(preset, planned, engine, ranks, repeats)
            comparable = planned == layout
            if comparable and read != whole:
                raise RuntimeError(f"{preset} {layout.name} {engine}: the shape of the ranks read differs from "
                                   "the whole plan's")
            rows.append({"layout": layout.name, "ranks": layout.world_size, "engine": engine,
                         "collective": cost_traits(engine).collective, "planned": planned.name,
                         "ranks_planned": planned.world_size if ranks is None else len(ranks),
                         "every_rank_s": whole_s, "read_s": read_s, "ratio": whole_s / read_s,
                         "same_shape": comparable})
            print(f"{layout.name} {engine}: every rank {whole_s:.2f} s, what is read {read_s:.2f} s "
                  f"({whole_s / read_s:.1f}x)", flush=True)
    return rows


def markdown(result: dict) -> str:
    rows = result["rows"]
    lines = [*heading("What-if planning speed", result["meta"]),
             f"{result['preset']}: each engine's checkpoint plan behind a prediction, the median of "
             f"{result['repeats']} run(s) in one process after a warm-up plan of each engine, each from emptied "
             "caches. Every rank = the plan of every rank of the layout; what is read = `predict.planned_at`'s "
             "(data-parallel ranks 0 and 1 of each stage and tp rank at the layout's dp; a collective engine's every "
             "rank at dp 8 at most). Same shape = the two shapes compared equal (a collective engine above dp 8 is "
             "planned at dp 8 by design: not compared).", "",
             "| layout | ranks | engine | planned | ranks planned | every rank s | what is read s | ratio "
             "| same shape |",
             "|---|---|---|---|---|---|---|---|---|",
             *[f"| {r['layout']} | {r['ranks']} | {r['engine']} | {r['planned']} | {r['ranks_planned']} | "
               f"{r['every_rank_s']:.2f} | {r['read_s']:.2f} | {r['ratio']:.1f}× | "
               f"{'yes' if r['same_shape'] else 'not compared'} |" for r in rows], "",
             f"All engines: every rank {sum(r['every_rank_s'] for r in rows):.1f} s, what is read "
             f"{sum(r['read_s'] for r in rows):.1f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="70B")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--dps", type=positive_ints, default="4,32",
                        help="data-parallel sizes, comma-separated (default %(default)s)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--repeats", type=int, default=1)
    add_output_arguments(parser)
    options = parser.parse_args(argv)
    meta = run_meta("whatif-speed", argv, options.machine)
    rows = measure(options.preset, options.tp, options.pp, options.dps,
                   options.engines.split(","), options.repeats)
    result = {"meta": meta, "preset": options.preset, "repeats": options.repeats, "rows": rows}
    write_results(options.out, result, markdown, attempt_stem(options.out, meta))


if __name__ == "__main__":
    main(sys.argv[1:])

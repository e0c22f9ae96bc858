#!/usr/bin/env python3
"""What ``--lazy-prefetch`` saves a restart on this machine: whole study runs of the lazy engine with and without it.

    python bench/lazy_prefetch.py [--preset small] [--layout tp1pp1] [--repeats 3] [--json FILE | --out DIR]

Each repeat runs ``config-n-run.py PRESET LAYOUT --engine lazy --iters 2 --save-interval 1 --baseline-mib 0`` once
in each of four modes (buffered and ``--lazy-direct-io``, each without and with ``--lazy-prefetch``), in another
order each repeat (a run's two launches: train, then the relaunch that restores step2 from
a cold page cache and proves it exact), in a temporary logs folder removed at the end. Per mode, the medians over
repeats of the restart (launch to the end of the first resumed iteration, max over ranks), of the restart less the
harness's own checks on its critical path (what a job that checks nothing takes), and of its engine set-up and
checkpoint-load parts; with the prefetch, also its read's own time and how long the load still waited for it. The
saving, for each I/O mode, is the difference of the medians of the restart less checks. A GPU's start-up (CUDA
context, NCCL, a larger model's build and ``deepspeed.initialize``) is longer and its read larger: the GPU session's
``engines-1B-lazy-direct-prefetch`` block measures it at 1B.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from results_io import ROOT, add_output_arguments, heading, measure_in_scratch, run_meta

sys.path.insert(0, str(ROOT))

from restartbench.analysis import collect  # noqa: E402

MODES = {"buffered": (), "buffered + prefetch": ("--lazy-prefetch",), "O_DIRECT": ("--lazy-direct-io",),
         "O_DIRECT + prefetch": ("--lazy-direct-io", "--lazy-prefetch")}
"""Each mode's config-n-run.py options; a mode and the next one differ by the prefetch only."""
FIGURES = {"restart_s": "restart s", "restart_less_checks_s": "restart less checks s",
           "restart_engine_setup_s": "engine setup s", "restart_ckpt_load_s": "ckpt load s",
           "prefetch_read_s": "prefetch read s", "prefetch_wait_s": "load's wait for it s"}


def one_run(logs: Path, preset: str, layout: str, options: tuple[str, ...]) -> dict:
    """One study run in its own logs folder: its restart row's figures."""
    command = [sys.executable, str(ROOT / "config-n-run.py"), preset, layout, "--engine", "lazy", "--iters", "2",
               "--save-interval", "1", "--baseline-mib", "0", "--logs", str(logs),
               "--checkpoint-dir", str(logs / "ckpt"), *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench/lazy_prefetch.py: {' '.join(command)} exited with {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    row = collect(logs).table().query("kind == 'restart'").iloc[0]
    if row["verdict"] != "exact":
        raise SystemExit(f"bench/lazy_prefetch.py: the restore in {logs} was not exact: {row['verdict']}")
    return {key: None if row.get(key) is None or row.get(key) != row.get(key) else float(row[key])
            for key in FIGURES}


def measure(root: Path, preset: str, layout: str, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for repeat in range(repeats):
        for index in range(len(MODES)):
            mode = list(MODES)[(index + repeat) % len(MODES)]
            runs[mode].append(one_run(root / f"r{repeat}-m{list(MODES).index(mode)}", preset, layout, MODES[mode]))
            figures = runs[mode][-1]
            print(f"repeat {repeat + 1}: {mode}: restart {figures['restart_s']:.2f} s, less checks "
                  f"{figures['restart_less_checks_s']:.2f} s, ckpt load {figures['restart_ckpt_load_s']:.2f} s",
                  flush=True)
    medians = {mode: {key: _median([r[key] for r in rows]) for key in FIGURES} for mode, rows in runs.items()}
    savings = {}
    for without, with_ in zip(list(MODES)[::2], list(MODES)[1::2], strict=True):
        before, after = medians[without]["restart_less_checks_s"], medians[with_]["restart_less_checks_s"]
        savings[without] = {"saving_s": before - after, "saving_share": (before - after) / before}
    return {"preset": preset, "layout": layout, "repeats": repeats, "runs": runs, "medians": medians,
            "savings": savings}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def markdown(result: dict) -> str:
    lines = [*heading("What --lazy-prefetch saves a restart", result["meta"]),
             f"`config-n-run.py {result['preset']} {result['layout']} --engine lazy --iters 2 --save-interval 1` "
             "(O_DIRECT: with `--lazy-direct-io`; prefetch: with `--lazy-prefetch`), "
             f"{result['repeats']} repeats of each mode in rotating order; the relaunch restores step2 from a cold "
             "page cache, proved exact. Medians over repeats; each figure the max over ranks. restart = launch to the "
             "end of the first resumed iteration; restart less checks = less the harness's own checks on its "
             "critical path; prefetch read = the early read's own time, beside the model build and "
             "deepspeed.initialize; load's wait = how long the load still waited for it.", "",
             "| mode | " + " | ".join(FIGURES.values()) + " | restart less checks min–max s |",
             "|---" * (len(FIGURES) + 2) + "|"]
    for mode, figures in result["medians"].items():
        spread = [run["restart_less_checks_s"] for run in result["runs"][mode]]
        lines.append(f"| {mode} | " + " | ".join("—" if figures[key] is None else f"{figures[key]:.2f}"
                                                  for key in FIGURES) + f" | {min(spread):.2f}–{max(spread):.2f} |")
    widest = max(max(r["restart_less_checks_s"] for r in runs) - min(r["restart_less_checks_s"] for r in runs)
                 for runs in result["runs"].values())
    lines += ["", *(f"- {io}: the prefetch saved **{saved['saving_s']:.2f} s** of the restart less checks at the "
                    f"median ({saved['saving_share']:.0%} of it)" for io, saved in result["savings"].items()),
              "", f"A negative saving: the runs with the prefetch restarted slower here. A saving smaller than the "
              f"spread of one mode's repeats (up to {widest:.2f} s here) is not told apart from noise by "
              f"{result['repeats']} repeats.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--layout", default="tp1pp1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the result here only (no results file)")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    measure_in_scratch(run_meta("lazy-prefetch", argv, args.machine), "lazy-prefetch-",
                       lambda root: measure(root, args.preset, args.layout, args.repeats), args.json, args.out,
                       markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Soak: N full save/restore cycles (each a real run: train + checkpoint, relaunch + restore) on the tiny preset.

    python bench/soak.py --cycles 20 [--layout tp1pp1dp2]

Records, per cycle, the launcher's open file descriptors, RSS and live child processes after the run, every
``rank.resources`` event of the run (each rank's open descriptors, RSS, threads and children after each
checkpoint) and whether the restore was exact — then the growth from the first cycle to the last. A leak shows
as steady growth; the numbers are measurements, not a pass/fail. Writes
``bench/results/YYYY-MM-DD-<machine>-soak.json`` (every cycle, every event) and ``.md`` (made from it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import psutil
from results_io import add_output_arguments, machine_line, run_meta, write_results

from restartbench.config import RunConfig, config_from_args
from restartbench.events import Event, read_events
from restartbench.study import run_study

MiB = 2**20


def soak_config(layout: str, logs: Path) -> RunConfig:
    return config_from_args(["tiny", layout, "--dtype", "fp32", "--iters", "2", "--logs", str(logs)])


def run_cycle(index: int, layout: str, logs: Path, launcher: psutil.Process) -> dict:
    """One real run; the launcher's resources after it and the run's own resource and restore events."""
    start = time.perf_counter()
    status = run_study(soak_config(layout, logs))
    wall_s = time.perf_counter() - start
    run_dir = sorted(logs.glob("*/*/*/*"))[-1]
    events = read_events(run_dir)
    results = [e for e in events if e["event"] == Event.RESTORE_RESULT]
    return {"cycle": index, "exit": status, "wall_s": wall_s, "run": str(run_dir.relative_to(logs)),
            "exact": bool(results) and all(e["exact"] for e in results),
            "launcher": {"open_fds": launcher.num_fds(), "rss_bytes": launcher.memory_info().rss,
                         "children": len(launcher.children(recursive=True))},
            "rank_resources": [e for e in events if e["event"] == Event.RANK_RESOURCES]}


def cycle_row(cycle: dict) -> dict:
    """A cycle's figures for the table: the launcher's, and the max over ranks and checkpoints of the ranks'."""
    ranks = cycle["rank_resources"]
    return {"cycle": cycle["cycle"], "exit": cycle["exit"], "exact": cycle["exact"], "wall_s": cycle["wall_s"],
            "fds": cycle["launcher"]["open_fds"], "rss_mib": cycle["launcher"]["rss_bytes"] / MiB,
            "children": cycle["launcher"]["children"],
            "rank_fds": max(e["open_fds"] for e in ranks), "rank_rss_mib": max(e["rss_bytes"] for e in ranks) / MiB,
            "rank_threads": max(e["threads"] for e in ranks)}


def signed_mib(value: float) -> str:
    return f"{round(value, 1) + 0.0:+.1f} MiB"  # + 0.0: no "-0.0"


def growth_line(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    return (f"Growth from cycle {first['cycle']} to cycle {last['cycle']}: launcher fds "
            f"{last['fds'] - first['fds']:+d}, launcher RSS {signed_mib(last['rss_mib'] - first['rss_mib'])}, children "
            f"left after the last cycle {last['children']}, rank fds {last['rank_fds'] - first['rank_fds']:+d}, rank "
            f"RSS {signed_mib(last['rank_rss_mib'] - first['rank_rss_mib'])}, rank threads "
            f"{last['rank_threads'] - first['rank_threads']:+d}.")


def outcome_line(rows: list[dict]) -> str:
    bad = [r["cycle"] for r in rows if r["exit"] != 0 or not r["exact"]]
    if not bad:
        return f"All {len(rows)} cycles exited 0 with restores verified exact."
    return f"Cycles that failed or did not restore exactly: {', '.join(map(str, bad))}."


def run_description(config: dict) -> str:
    """The run every cycle repeats, from its configuration."""
    train, launch = config["train"], config["launch"]
    return (f"{config['model']['preset']} {config['layout']['layout']} {config['model']['dtype']}, engine "
            f"{config['engine']['engine']}, {train['iters']} iterations with a checkpoint every "
            f"{train['save_interval']}, then a relaunch and a {launch['restore_cache']} restore"
            + (", verified exact or failed" if launch["verify"] else ", not verified"))


def markdown(result: dict) -> str:
    meta = result["meta"]
    rows = [cycle_row(c) for c in result["cycles"]]
    lines = [f"# Soak: {len(rows)} full save/restore cycles — {meta['machine']}, {meta['date']}", "",
             f"`{meta['command']}`: each cycle is a real run, {run_description(result['config'])}.", "",
             machine_line(meta), "",
             "| cycle | exit | exact | wall s | launcher fds | launcher RSS MiB | children left | rank fds | "
             "rank RSS MiB | rank threads |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['cycle']} | {r['exit']} | {r['exact']} | {r['wall_s']:.1f} | {r['fds']} | {r['rss_mib']:.1f} | "
              f"{r['children']} | {r['rank_fds']} | {r['rank_rss_mib']:.1f} | {r['rank_threads']} |" for r in rows]
    lines += ["", "launcher: this process (it runs every cycle), after the run. rank: the max over ranks and "
              "checkpoints of the run's `rank.resources` events (the JSON holds every event).", "",
              growth_line(rows), outcome_line(rows), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--layout", default="tp1pp1dp2")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    meta = run_meta("soak", argv, args.machine)
    launcher = psutil.Process()
    with tempfile.TemporaryDirectory() as logs:
        config = dataclasses.asdict(soak_config(args.layout, Path(logs)))
        cycles = []
        for index in range(1, args.cycles + 1):
            cycles.append(run_cycle(index, args.layout, Path(logs), launcher))
            print(f"cycle {index}: exit {cycles[-1]['exit']} after {cycles[-1]['wall_s']:.0f} s", flush=True)
    result = {"meta": meta, "config": config, "cycles": cycles}
    write_results(args.out, result, markdown)
    return 0 if all(c["exit"] == 0 and c["exact"] for c in cycles) else 1


if __name__ == "__main__":
    sys.exit(main())

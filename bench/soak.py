#!/usr/bin/env python3
"""Soak: N full save/restore cycles (each a real run: train + checkpoint, relaunch + restore) on the tiny preset.

    python bench/soak.py --cycles 20 [--layout tp1pp1dp2]

Prints, per cycle, the launcher's open file descriptors, RSS and live child processes after the run,
and the ranks' open descriptors and RSS at their last checkpoint — then the growth from the first
cycle to the last. A leak shows as steady growth; the numbers are measurements, not a pass/fail.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import psutil

from restartbench.config import config_from_args
from restartbench.events import read_events
from restartbench.study import run_study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--layout", default="tp1pp1dp2")
    args = parser.parse_args()
    me = psutil.Process()
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for cycle in range(1, args.cycles + 1):
            cfg = config_from_args(["tiny", args.layout, "--dtype", "fp32", "--iters", "2", "--logs", logs])
            status = run_study(cfg)
            run_dir = sorted(Path(logs).glob("*/*/*/*"))[-1]
            ranks = [e for e in read_events(run_dir) if e["event"] == "rank.resources"]
            rows.append({"cycle": cycle, "exit": status, "fds": me.num_fds(), "rss_mb": me.memory_info().rss / 2**20,
                         "children": len(me.children(recursive=True)),
                         "rank_fds": max(e["open_fds"] for e in ranks), "rank_rss_mb": max(e["rss_bytes"] for e in ranks) / 2**20})
    print(f"{'cycle':>5} {'exit':>4} {'fds':>4} {'rss MiB':>8} {'children':>8} {'rank fds':>8} {'rank rss MiB':>12}")
    for r in rows:
        print(f"{r['cycle']:>5} {r['exit']:>4} {r['fds']:>4} {r['rss_mb']:>8.1f} {r['children']:>8} {r['rank_fds']:>8} "
              f"{r['rank_rss_mb']:>12.1f}")
    first, last = rows[0], rows[-1]
    print(f"growth over {len(rows)} cycles: launcher fds {last['fds'] - first['fds']:+d}, launcher RSS "
          f"{last['rss_mb'] - first['rss_mb']:+.1f} MiB, children left {last['children']}, rank fds "
          f"{last['rank_fds'] - first['rank_fds']:+d}, rank RSS {last['rank_rss_mb'] - first['rank_rss_mb']:+.1f} MiB")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

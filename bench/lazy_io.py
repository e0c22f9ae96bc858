#!/usr/bin/env python3
"""The lazy engine's file I/O on this machine: its buffered writes and reads against ``--lazy-direct-io``'s O_DIRECT.

    python bench/lazy_io.py [--gib 1] [--repeats 3] [--dir DIR] [--json FILE | --out DIR]

A rank's state of ``gib`` GiB (AdamW over a stack of 2048-wide fp32 linear layers: weights, exp_avg and exp_avg_sq,
12 bytes a parameter) is saved by ``LazyEngine`` into ``--dir`` (default: a new temporary folder in $TMPDIR, removed at
the end) and restored into a fresh model and optimizer, in each mode, ``repeats`` times, in another order each repeat:

- durable: ``save`` called until ``wait_until_durable`` returns (every file and folder fsync'd), for the engine's
  second save, as a run's later saves are: the first faults in a buffer that its set-up did not (buffered mode), and
  its files stay on the disk meanwhile, as a run's previous checkpoint does until the next one is committed (the
  last mode's files are removed before the first save, and the removal synced: a file system mounted with
  ``discard`` trims the freed blocks then, which would otherwise run beside the save measured);
- cold restore: the files evicted from the page cache first (checked with ``mincore``), then ``load`` until it
  returns; each restore is proved exact against the saved state's digest.

Median, min and max of each, in GB/s (GB = 10^9 bytes), the direct mode's speed-up, and with ``--limits FILE`` (a
bench/limits.py result of this machine, made just before: the best of fio's methods) each against the disk's
limits. On the CPU the engine's copies are memcpys into its host buffer on a background thread; on a GPU they are
device-to-host copies, and the GPU session's ``engines-1B-lazy`` and ``engines-1B-lazy-direct`` blocks measure both
modes in the whole study at 21 GB.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import types
from pathlib import Path

from results_io import ROOT, heading, measure_in_scratch, run_meta, speed_figures, speed_parser

sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from restartbench import pagecache  # noqa: E402
from restartbench.config import EngineConfig  # noqa: E402
from restartbench.engines.lazy.engine import LazyEngine  # noqa: E402
from restartbench.verify import training_state_digest  # noqa: E402

WIDTH = 2048
"""Each layer: a WIDTH x WIDTH weight and its bias, 4.2 M parameters, 50 MB of state with AdamW's two moments."""
STATE_BYTES_PER_PARAM = 12
MODES = {"buffered": False, "direct (O_DIRECT)": True}


def rank_state(gib: float, seed: int) -> types.SimpleNamespace:
    """A model and AdamW with its moments, of about ``gib`` GiB of state, with what the lazy engine reads of a
    DeepSpeed engine."""
    torch.manual_seed(seed)
    layers = max(1, round(gib * 2**30 / STATE_BYTES_PER_PARAM / (WIDTH * WIDTH + WIDTH)))
    module = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.randn(2, WIDTH)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return types.SimpleNamespace(module=module, optimizer=optimizer, lr_scheduler=None, global_steps=1,
                                 global_samples=2, skipped_steps=0)


def options(direct: bool) -> EngineConfig:
    return EngineConfig(engine="lazy", lazy_direct_io=direct)


def set_up(state: types.SimpleNamespace, direct: bool) -> tuple[LazyEngine, float]:
    """An engine as a launch sets it up (``prepare``: its host buffer), and the seconds that took (a restart part,
    ``startup.engine``, not the save's or the load's)."""
    engine = LazyEngine(options(direct))
    start = time.perf_counter()
    engine.prepare(state)
    return engine, time.perf_counter() - start


def save_and_restore(state: types.SimpleNamespace, fresh: types.SimpleNamespace, folder: Path, direct: bool,
                     digest: str) -> tuple[dict[str, float], int]:
    """One save (durable seconds) and one cold restore (seconds) in a mode, each engine set up first (seconds), and
    the files' bytes."""
    shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    saver, save_setup = set_up(state, direct)
    saver.save(state, str(folder), "step0")  # the buffer's first use: a torch.empty one is faulted in by its copies
    saver.wait_until_durable()
    start = time.perf_counter()
    saver.save(state, str(folder), "step1")
    durable = saver.wait_until_durable() - start
    paths = sorted((folder / "step1").iterdir())
    cache = pagecache.evict_and_measure(paths)
    if cache.resident_fraction > 0.01:
        raise RuntimeError(f"{cache.resident_fraction:.1%} of the files stayed in the page cache after the eviction: "
                           "the restore would not be cold")
    loader, load_setup = set_up(fresh, direct)
    start = time.perf_counter()
    loader.load(fresh, str(folder), "step1")
    restore = time.perf_counter() - start
    if training_state_digest(fresh) != digest:
        raise RuntimeError(f"the {'direct' if direct else 'buffered'} restore is not exact")
    vars(state.optimizer).pop("step")  # the saver's step guard: the next saver's would wrap it, keeping this one alive
    return ({"durable": durable, "restore": restore, "setup": max(save_setup, load_setup)},
            sum(path.stat().st_size for path in paths))


def measure(folder: Path, gib: float, repeats: int) -> dict:
    state, fresh = rank_state(gib, seed=0), rank_state(gib, seed=1)
    digest = training_state_digest(state)
    seconds = {mode: {"durable": [], "restore": [], "setup": []} for mode in MODES}
    nbytes = 0
    for repeat in range(repeats):
        order = list(MODES)[repeat % 2:] + list(MODES)[:repeat % 2]
        for mode in order:
            taken, nbytes = save_and_restore(state, fresh, folder / "ckpt", MODES[mode], digest)
            for side, value in taken.items():
                seconds[mode][side].append(value)
            print(f"repeat {repeat + 1}: {mode}: set-up {taken['setup']:.2f} s, durable {taken['durable']:.2f} s "
                  f"({nbytes / 1e9 / taken['durable']:.2f} GB/s), cold restore {taken['restore']:.2f} s "
                  f"({nbytes / 1e9 / taken['restore']:.2f} GB/s)", flush=True)
    modes = [{"mode": mode, **{figure["method"]: figure for figure in speed_figures(sides, nbytes)}}
             for mode, sides in seconds.items()]
    buffered, direct = modes
    return {"bytes": nbytes, "layers": len(state.module), "repeats": repeats, "modes": modes,
            "direct_speedup": {side: buffered[side]["median_s"] / direct[side]["median_s"]
                               for side in ("durable", "restore")}}


def storage_limits(path: Path | None) -> dict | None:
    """A bench/limits.py result's file, best write and best read (MB/s) and their methods."""
    if path is None:
        return None
    limits = json.loads(path.read_text())
    try:
        return {"file": path.name, "date": limits["meta"]["date"], "machine": limits["meta"]["machine"],
                "write_MBps": limits["write"]["best_MBps"], "write_method": limits["write"]["method"],
                "read_MBps": limits["read"]["best_MBps"], "read_method": limits["read"]["method"]}
    except (KeyError, TypeError):
        raise SystemExit(f"bench/lazy_io.py: {path} has no write.best_MBps / read.best_MBps: give a result of "
                         "today's bench/limits.py (its --json FILE, or its bench/results/*-limits.json)") from None


def with_limits(result: dict, limits: dict | None) -> dict:
    if limits is None:
        return {**result, "limits": None}
    for mode in result["modes"]:
        mode["durable"]["over_write_limit"] = mode["durable"]["GBps"] * 1e3 / limits["write_MBps"]
        mode["restore"]["over_read_limit"] = mode["restore"]["GBps"] * 1e3 / limits["read_MBps"]
    return {**result, "limits": limits}


def markdown(result: dict) -> str:
    limits = result["limits"]
    lines = [*heading("The lazy engine's file I/O: buffered against O_DIRECT", result["meta"]),
             f"One rank's files of {result['bytes'] / 1e9:.2f} GB ({result['layers']} linear layers of {WIDTH}, fp32, "
             f"AdamW), saved and restored in each mode, {result['repeats']} repeats; set-up = the engine's `prepare` "
             "(its host buffer: a pinned or page-aligned one is faulted in there), the slower of the save's and the "
             "load's, a restart part of its own; durable = the engine's second save to every file fsync'd (its first "
             "faults in a buffer that set-up left untouched; its files stay on the disk, as a run's previous "
             "checkpoint does); cold restore = the files evicted first, load until it "
             "returns, proved exact. GB = 10^9 bytes.",
             "", "| mode | set-up s (median) | durable s (median) | durable GB/s | min–max | ÷ disk write | cold "
             "restore s (median) | restore GB/s | min–max | ÷ disk read |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in result["modes"]:
        durable, restore = mode["durable"], mode["restore"]
        lines.append(f"| {mode['mode']} | {mode['setup']['median_s']:.2f} | {durable['median_s']:.2f} | "
                     f"{durable['GBps']:.2f} | "
                     f"{durable['min_GBps']:.2f}–{durable['max_GBps']:.2f} | {_ratio(durable, 'over_write_limit')} | "
                     f"{restore['median_s']:.2f} | {restore['GBps']:.2f} | "
                     f"{restore['min_GBps']:.2f}–{restore['max_GBps']:.2f} | {_ratio(restore, 'over_read_limit')} |")
    speedup = result["direct_speedup"]
    together = ", ".join(f"{m['mode']} {m['setup']['median_s'] + m['restore']['median_s']:.2f} s" for m in
                         result["modes"])
    lines += ["", f"O_DIRECT against buffered, at the median: durable **{speedup['durable']:.2f}×**, cold restore "
              f"**{speedup['restore']:.2f}×** (above 1: O_DIRECT is faster). Set-up and cold restore together, as a "
              f"restart pays them: {together}.", ""]
    lines.append(f"Disk limits: `{limits['file']}` (bench/limits.py on {limits['machine']}, {limits['date']}, best "
                 f"of its methods): write {limits['write_MBps']:.0f} MB/s ({limits['write_method']}), read "
                 f"{limits['read_MBps']:.0f} MB/s ({limits['read_method']})." if limits else
                 "Disk limits: none given (--limits, a bench/limits.py result of this machine): the ratios are left "
                 "out.")
    return "\n".join(lines) + "\n"


def _ratio(side: dict, key: str) -> str:
    return f"{side[key]:.2f}" if key in side else "—"


def main(argv: list[str] | None = None) -> int:
    parser = speed_parser(__doc__.splitlines()[0], 1.0, "the rank's state")
    parser.add_argument("--limits", type=Path, default=None,
                        help="a bench/limits.py JSON result of this machine and --dir's disk, for the ratios")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the folder to write the checkpoints in (default: a new temporary folder in $TMPDIR; "
                        "it must take O_DIRECT: tmpfs does not)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    limits = storage_limits(args.limits)  # before the minutes of measuring: a wrong file is said at once
    measure_in_scratch(run_meta("lazy-io", argv, args.machine), "lazy-io-",
                       lambda folder: with_limits(measure(folder, args.gib, args.repeats), limits), args.json,
                       args.out, markdown, where=args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

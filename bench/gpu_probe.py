#!/usr/bin/env python3
"""The host-device copy limits of one GPU, measured with torch: the floor of a checkpoint's stall.

    python bench/gpu_probe.py --gib 4 --repeats 5 --json copies.json

- device-to-host and host-to-device bandwidth into (from) pinned host memory and into (from) pageable host memory:
  one copy of ``--gib`` GiB on one stream, timed from a device synchronize to the next, best of ``--repeats``
  after one warm-up copy (GB = 10^9 bytes);
- the cost of pinning host memory: ``cudaHostRegister`` of a fresh, touched host buffer of the same size, timed,
  then unregistered and freed (torch's caching host allocator would answer a second ``pin_memory=True`` request from
  its cache, so it is bypassed), at most 3 times, as seconds per GiB, best and worst.

Used by ``bench/gpu_session.py``'s ``probe`` block (``--json``). Without a CUDA device it exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

GiB = 2**30
GB = 1e9


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=4.0, help="size of each copy, GiB (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed copies per direction (default: %(default)s)")
    p.add_argument("--json", required=True, help="file for the figures")
    return p


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes with the device idle before it and finished after it."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    action()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def best_bandwidth(nbytes: int, repeats: int, copy: Callable[[], object]) -> dict:
    copy()  # warm-up: the first copy pays for mappings the others reuse
    seconds = [timed(copy) for _ in range(repeats)]
    return {"best_GBps": nbytes / GB / min(seconds), "worst_GBps": nbytes / GB / max(seconds), "seconds": seconds}


def pin_cost(nbytes: int, repeats: int) -> dict:
    """Seconds per GiB to page-lock ``nbytes`` of fresh host memory (cudaHostRegister), then unlocked and freed."""
    cudart = torch.cuda.cudart()
    seconds = []
    for _ in range(repeats):
        buffer = torch.ones(nbytes, dtype=torch.uint8)  # touched: the pages exist before they are pinned
        start = time.perf_counter()
        status = cudart.cudaHostRegister(buffer.data_ptr(), nbytes, 0)
        seconds.append(time.perf_counter() - start)
        if int(status) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {int(status)}")
        cudart.cudaHostUnregister(buffer.data_ptr())
        del buffer
    return {"best_s_per_GiB": min(seconds) / (nbytes / GiB), "worst_s_per_GiB": max(seconds) / (nbytes / GiB),
            "seconds": seconds}


def copies(nbytes: int, repeats: int) -> dict:
    """Each direction to and from pinned and pageable host memory (the buffers are freed on return)."""
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    return {
        "d2h_pinned": best_bandwidth(nbytes, repeats, lambda: pinned.copy_(device, non_blocking=True)),
        "h2d_pinned": best_bandwidth(nbytes, repeats, lambda: device.copy_(pinned, non_blocking=True)),
        "d2h_pageable": best_bandwidth(nbytes, repeats, lambda: pageable.copy_(device)),
        "h2d_pageable": best_bandwidth(nbytes, repeats, lambda: device.copy_(pageable)),
    }


def measure(nbytes: int, repeats: int) -> dict:
    figures = {**copies(nbytes, repeats), "pin": pin_cost(nbytes, min(repeats, 3))}
    return {**figures, "bytes": nbytes, "repeats": repeats, "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "method": "one torch copy_ on the current stream, device synchronized before "
            "and after; best of the repeats after a warm-up; GB = 1e9 bytes"}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.gib <= 0 or args.repeats < 1:
        raise SystemExit("--gib must be above 0 and --repeats at least 1")
    if not torch.cuda.is_available():
        print("bench/gpu_probe.py measures a CUDA device's copies, and torch sees none here: run it on a GPU "
              "machine (bench/gpu_session.py's probe block)", file=sys.stderr)
        return 2
    figures = measure(int(args.gib * GiB), args.repeats)
    with open(args.json, "w") as handle:
        json.dump(figures, handle, indent=1)
    print(json.dumps({k: v["best_GBps"] for k, v in figures.items() if isinstance(v, dict) and "best_GBps" in v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

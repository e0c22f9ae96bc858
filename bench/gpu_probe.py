#!/usr/bin/env python3
"""The host-device copy limits of one GPU, measured with torch: the floor of a checkpoint's stall.

    python bench/gpu_probe.py --gib 4 --repeats 5 --json copies.json

- device-to-host and host-to-device bandwidth into (from) pinned host memory and into (from) pageable host memory:
  one copy of ``--gib`` GiB on one stream, timed from a device synchronize to the next, best of ``--repeats``
  after one warm-up copy (GB = 10^9 bytes);
- the cost of pinning host memory (``pin``): ``cudaHostRegister`` of a fresh host buffer of the same size whose
  pages were already touched (``torch.ones``, not timed), timed, then unregistered and freed (torch's caching host
  allocator would answer a second ``pin_memory=True`` request from its cache, so it is bypassed), at most 3 times,
  as seconds per GiB, best and worst. Touched pages only get locked: 0.05 s/GiB on the first H100 visit;
- the lazy engine's own pinning (``engine_pin``: ``copies.pin_pages`` of the same size, a fresh mapping), with its
  parallel fault-in (``prefault``) and without (``no_prefault``: ``cudaHostRegister`` faults every page in on one
  thread, as on the first visit, where a 21 GB buffer took 7.7-8.2 s at engine set-up, about 0.39 s/GiB): the
  fault-in and the register timed apart, at most 3 times each, and one device-to-host copy into the buffer (pages
  first touched by several threads may lie on other NUMA nodes than one thread's would).

Used by ``bench/gpu_session.py``'s ``probe`` block (``--json``). Without a CUDA device it exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from restartbench.engines.lazy.copies import pin_pages  # noqa: E402

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


def engine_pin_cost(nbytes: int, repeats: int, device: str = "cuda") -> dict:
    """``pin_pages(nbytes)`` as the lazy engine pins its host buffer, with and without the parallel fault-in, and
    into private huge-page memory with it (``prefault_huge``: ``copies.PinnedPages``' ``huge_pages``): seconds
    per GiB of the fault-in, the register and both (best of ``repeats``; both: worst too), the threads that faulted
    the pages in, and the D2H bandwidth into the last buffer pinned (best of 2 after a warm-up). ``device``: where the
    copy comes from (tests/test_gpu_session.py runs this on the CPU, pinning nothing)."""
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    figures = {}
    for name, prefault, huge_pages in (("prefault", True, False), ("no_prefault", False, False),
                                       ("prefault_huge", True, True)):
        fault, register = [], []
        for repeat in range(repeats):
            pages = pin_pages(nbytes, prefault=prefault, huge_pages=huge_pages)
            fault.append(pages.fault_s)
            register.append(pages.register_s)
            if repeat == repeats - 1:
                into = pages.tensor
                d2h = best_bandwidth(nbytes, 2, lambda into=into: into.copy_(source, non_blocking=True))["best_GBps"]
                threads = pages.fault_threads
            pages.unpin()
        total = [f + r for f, r in zip(fault, register)]
        figures[name] = {"best_s_per_GiB": min(total) / (nbytes / GiB), "worst_s_per_GiB": max(total) / (nbytes / GiB),
                         "fault_best_s_per_GiB": min(fault) / (nbytes / GiB),
                         "register_best_s_per_GiB": min(register) / (nbytes / GiB),
                         "fault_threads": threads, "d2h_GBps": d2h, "fault_s": fault, "register_s": register}
    return figures


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
    figures = {**copies(nbytes, repeats), "pin": pin_cost(nbytes, min(repeats, 3)),
               "engine_pin": engine_pin_cost(nbytes, min(repeats, 3))}
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
    print(json.dumps({"pin_touched_s_per_GiB": figures["pin"]["best_s_per_GiB"],
                      **{f"engine_pin_{k}_s_per_GiB": v["best_s_per_GiB"] for k, v in figures["engine_pin"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

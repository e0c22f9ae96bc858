#!/usr/bin/env python3
"""How fast the exact-restore digest hashes a training state: the old blake2b digest against the chunked SHA-256 one.

    python bench/digest_speed.py [--gib 4] [--threads N] [--repeats 3] [--json FILE | --out DIR]

The state is on the CPU and shaped like a ZeRO-1 rank's at 1B: three large fp32 tensors (the flat fp32 partition,
exp_avg, exp_avg_sq) hold 85 % of the bytes, the bf16 module the rest in 16 MiB tensors. Each method hashes it
``repeats`` times (in another order each repeat); the figure is the median, with min and max:

- ``blake2b, 1 thread``: the old ``verify.tensor_hash`` (blake2b of the header and the bytes), tensor after tensor;
- ``blake2b, a thread per tensor``: the old ``verify.digest`` above its PARALLEL_BYTES (a pool of ``threads``, one
  tensor per task: a huge tensor stays on one thread);
- ``sha256 chunked, 1 thread`` and ``sha256 chunked, N threads``: today's ``verify.digest`` (CHUNK_BYTES chunks of
  every tensor spread over the pool, SHA-256).

GB = 10^9 bytes. With ``--json FILE`` the result goes to FILE only; without, to
``bench/results/YYYY-MM-DD-<machine>-digest-speed.json`` and ``.md`` (bench/results_io.py) or under ``--out``.
"""

from __future__ import annotations

import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from results_io import ROOT, heading, run_meta, speed_figures, speed_parser, speed_table, write_json_or_results

sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from restartbench import verify  # noqa: E402

MODULE_TENSOR_BYTES = 16 * 2**20
BIG_SHARE = 0.85


def build_state(gib: float) -> dict:
    """Three fp32 tensors of BIG_SHARE / 3 of ``gib`` each, the rest as bf16 tensors of MODULE_TENSOR_BYTES."""
    total = int(gib * 2**30)
    big = int(total * BIG_SHARE / 3) // 4
    module_count = max(1, (total - 3 * big * 4) // MODULE_TENSOR_BYTES)
    generator = torch.Generator().manual_seed(0)

    def filled(count: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(count, dtype=torch.float32).uniform_(generator=generator).to(dtype)

    return {"module": {f"layer{i}.weight": filled(MODULE_TENSOR_BYTES // 2, torch.bfloat16)
                       for i in range(module_count)},
            "optimizer": {"single_partition_of_fp32_groups": [filled(big, torch.float32)],
                          "state": {0: {"exp_avg": filled(big, torch.float32),
                                        "exp_avg_sq": filled(big, torch.float32), "step": 4}}}}


def old_tensor_hash(tensor: torch.Tensor) -> str:
    """``verify.tensor_hash`` before the chunks: blake2b (12 bytes) of the dtype, shape and one host copy's bytes."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    digest.update(memoryview(raw.cpu().numpy()))
    return digest.hexdigest()


def old_digest(state: dict, threads: int) -> dict[str, str]:
    """``verify.digest`` before the chunks: a pool of ``threads``, one tensor per task."""
    entries = verify.flatten(state)
    tensors = [key for key, value in entries.items() if isinstance(value, torch.Tensor)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        hashes = dict(zip(tensors, pool.map(old_tensor_hash, (entries[key] for key in tensors))))
    return {key: hashes.get(key, value) for key, value in entries.items()}


def methods(threads: int) -> dict:
    return {"blake2b, 1 thread": lambda state: old_digest(state, 1),
            f"blake2b, a thread per tensor ({threads} threads)": lambda state: old_digest(state, threads),
            "sha256 chunked, 1 thread": lambda state: verify.digest(state, threads=1),
            f"sha256 chunked, {threads} threads": lambda state: verify.digest(state, threads=threads)}


def measure(gib: float, threads: int, repeats: int) -> dict:
    started = time.perf_counter()
    state = build_state(gib)
    tensors = [value for value in verify.flatten(state).values() if isinstance(value, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    print(f"state: {nbytes / 1e9:.2f} GB in {len(tensors)} tensors, built in {time.perf_counter() - started:.1f} s",
          flush=True)
    named = methods(threads)
    seconds: dict[str, list[float]] = {name: [] for name in named}
    digests: dict[str, dict] = {}
    for repeat in range(repeats):
        order = list(named)[repeat % len(named):] + list(named)[:repeat % len(named)]
        for name in order:
            start = time.perf_counter()
            digests[name] = named[name](state)
            seconds[name].append(time.perf_counter() - start)
            print(f"repeat {repeat + 1}: {name}: {seconds[name][-1]:.2f} s "
                  f"({nbytes / 1e9 / seconds[name][-1]:.2f} GB/s)", flush=True)
    names = list(named)
    if digests[names[0]] != digests[names[1]] or digests[names[2]] != digests[names[3]]:
        raise RuntimeError("a method's digest depends on its thread count")
    figures = speed_figures(seconds, nbytes)
    baseline = figures[0]["median_s"]
    for figure in figures:
        figure["speedup_vs_blake2b_1_thread"] = baseline / figure["median_s"]
    return {"bytes": nbytes, "tensors": len(tensors), "largest_tensor_bytes": max(t.numel() * t.element_size()
                                                                                 for t in tensors),
            "threads": threads, "repeats": repeats, "chunk_bytes": verify.CHUNK_BYTES, "hash_name": verify.HASH_NAME,
            "methods": figures,
            "ratio_new_vs_old": figures[1]["median_s"] / figures[3]["median_s"],
            "ratio_new_vs_single_thread_blake2b": baseline / figures[3]["median_s"]}


def markdown(result: dict) -> str:
    meta, figures = result["meta"], result["methods"]
    lines = [*heading("Digest speed", meta),
             f"A CPU state of {result['bytes'] / 1e9:.2f} GB in {result['tensors']} tensors (largest "
             f"{result['largest_tensor_bytes'] / 1e9:.2f} GB), {result['repeats']} repeats; chunks of "
             f"{result['chunk_bytes'] / 2**20:.0f} MiB ({result['hash_name']}). GB = 10^9 bytes.", "",
             *speed_table(figures, "vs blake2b, 1 thread", "speedup_vs_blake2b_1_thread")]
    lines += ["", f"The new digest against the old one as a run used it ({figures[1]['method']}): "
              f"**{result['ratio_new_vs_old']:.2f}×**; against single-thread blake2b: "
              f"**{result['ratio_new_vs_single_thread_blake2b']:.2f}×**.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = speed_parser(__doc__.splitlines()[0], 4.0, "the state")
    parser.add_argument("--threads", type=int, default=verify.HASH_THREADS,
                        help="threads of the threaded methods (default: verify.HASH_THREADS, %(default)s here)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    meta = run_meta("digest-speed", argv, args.machine)
    result = {"meta": meta, **measure(args.gib, args.threads, args.repeats)}
    write_json_or_results(args.json, args.out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

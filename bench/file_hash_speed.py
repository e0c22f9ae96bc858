#!/usr/bin/env python3
"""How fast a commit hashes a rank's files for the manifest: the whole files' SHA-256, one file per thread (the
manifests' format until 2026-11-27), against SHA-256 in chunks on several threads (``filehash.FORMAT``, today's).

    python bench/file_hash_speed.py [--gib 4] [--threads N] [--repeats 3] [--dir DIR] [--json FILE | --out DIR]

The files are shaped like a 1B ZeRO-1 rank's (an 18 GB optimizer file and a 3 GB model file): one of 86 % and
one of 14 % of ``gib``, written to ``--dir`` (default: a temporary folder on the disk the results go to, removed at
the end) and hashed ``repeats`` times with each method, in another order each repeat. The page cache holds the
files (they were just written), as it does at a commit; a restore's check reads them cold, where the disk sets the
pace. The figure is the median, with min and max:

- ``sha256 whole, a thread per file``: ``hash_each`` over ``file_hash(path, "sha256")`` (the largest file on one
  thread bounds it);
- ``sha256 chunked, 1 thread`` and ``sha256 chunked, N threads``: ``filehash.hash_file`` as a commit calls it.

GB = 10^9 bytes. With ``--json FILE`` the result goes to FILE only; without, to
``bench/results/YYYY-MM-DD-<machine>-file-hash-speed.json`` and ``.md`` (bench/results_io.py) or under ``--out``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from results_io import ROOT, heading, measure_in_scratch, run_meta, speed_figures, speed_parser, speed_table

sys.path.insert(0, str(ROOT))

from restartbench.integrity import hash_each  # noqa: E402
from restartbench.storage import LocalStore, filehash  # noqa: E402

SHARES = (0.86, 0.14)
"""A 1B rank's files: 17.98 GB of optimizer partition and 3.00 GB of bf16 weights."""
WRITE_BLOCK = 64 * 2**20


def write_files(folder: Path, gib: float) -> list[str]:
    """The rank's files, of random bytes (written in blocks of one random block, offset by its index so no two
    blocks of a file are equal), flushed to the page cache."""
    names, block = [], bytearray(os.urandom(WRITE_BLOCK))
    for index, share in enumerate(SHARES):
        name, remaining = f"file{index}.bin", int(gib * 2**30 * share)
        with open(folder / name, "wb") as handle:
            count = 0
            while remaining > 0:
                block[:8] = count.to_bytes(8, "little")
                handle.write(memoryview(block)[:min(remaining, WRITE_BLOCK)])
                remaining -= WRITE_BLOCK
                count += 1
        names.append(name)
    return names


def measure(folder: Path, gib: float, threads: int, repeats: int) -> dict:
    names = write_files(folder, gib)
    store, nbytes = LocalStore(folder), sum((folder / name).stat().st_size for name in names)
    methods = {
        "sha256 whole, a thread per file": lambda: hash_each(names, lambda n: store.file_hash(n, filehash.WHOLE)),
        "sha256 chunked, 1 thread": lambda: [filehash.hash_file(folder / n, threads=1) for n in names],
        f"sha256 chunked, {threads} threads": lambda: hash_each(
            names, lambda n: filehash.hash_file(folder / n, threads=threads)),
    }
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    hashes: dict[str, list[str]] = {}
    for repeat in range(repeats):
        order = list(methods)[repeat % len(methods):] + list(methods)[:repeat % len(methods)]
        for name in order:
            start = time.perf_counter()
            hashes[name] = methods[name]()
            seconds[name].append(time.perf_counter() - start)
            print(f"repeat {repeat + 1}: {name}: {seconds[name][-1]:.2f} s "
                  f"({nbytes / 1e9 / seconds[name][-1]:.2f} GB/s)", flush=True)
    chunked = list(methods)[1:]
    if hashes[chunked[0]] != hashes[chunked[1]]:
        raise RuntimeError("the chunked hash depends on its thread count")
    figures = speed_figures(seconds, nbytes)
    for figure in figures:
        figure["speedup_vs_whole"] = figures[0]["median_s"] / figure["median_s"]
    return {"bytes": nbytes, "files": len(names), "largest_file_bytes": max((folder / n).stat().st_size
                                                                            for n in names),
            "threads": threads, "repeats": repeats, "cpus": os.cpu_count(), "chunk_bytes": filehash.CHUNK_BYTES,
            "format": filehash.FORMAT, "methods": figures,
            "ratio_chunked_vs_whole": figures[0]["median_s"] / figures[2]["median_s"]}


def markdown(result: dict) -> str:
    meta, figures = result["meta"], result["methods"]
    lines = [*heading("Manifest file hash speed", meta),
             f"{result['files']} files of {result['bytes'] / 1e9:.2f} GB together (largest "
             f"{result['largest_file_bytes'] / 1e9:.2f} GB), in the page cache as at a commit, {result['repeats']} "
             f"repeats, {result['cpus']} CPUs; chunks of {result['chunk_bytes'] / 2**20:.0f} MiB "
             f"({result['format']}). GB = 10^9 bytes.", "",
             *speed_table(figures, "vs whole files", "speedup_vs_whole")]
    lines += ["", f"The chunked hash on {result['threads']} threads against the whole files' (a thread per file): "
              f"**{result['ratio_chunked_vs_whole']:.2f}×** here. It scales with the cores until memory bandwidth or "
              "the disk sets the pace: the H100 machine has 16.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = speed_parser(__doc__.splitlines()[0], 4.0, "the rank's files")
    parser.add_argument("--threads", type=int, default=filehash.THREADS,
                        help="threads of the chunked method (default: filehash.THREADS, %(default)s here)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="the folder to write the files in (default: a new temporary folder in $TMPDIR)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    measure_in_scratch(run_meta("file-hash-speed", argv, args.machine), "file-hash-speed-",
                       lambda folder: measure(folder, args.gib, args.threads, args.repeats), args.json, args.out,
                       markdown, where=args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

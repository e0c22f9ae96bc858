"""Checkpoint integrity: a manifest per committed checkpoint, checked before a restore.

At commit, rank 0 writes ``<tag>/manifest.json`` — every file of every rank with its size and
SHA-256 — and only then points ``latest`` at the tag. A tag folder without a manifest was never
committed. Before a restore the ranks share the manifest's files between them, check size and
hash, and agree on the result; a corrupt or truncated file is named, and the restore refuses or
falls back to the newest earlier checkpoint that checks out (``--on-corrupt``).

``ckpt_dir`` is a folder, or a ``restartbench.storage`` store (a folder or an S3 prefix) as the ranks hold it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from restartbench.storage import LocalStore, ObjectStore, open_store

MANIFEST = "manifest.json"


def sha256_of(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


FILE_THREADS = min(8, os.cpu_count() or 1)
"""Files hashed at once by ``sha256_each``: hashlib and file reads release the GIL, and one thread hashed a 1B
model's rank (a 3 GB and an 18 GB file) at about 1 GB/s, one file after the other. Each file's hash is still the
SHA-256 of the whole file (what ``sha256sum`` prints), so one file is hashed on one thread: the largest bounds it."""


def sha256_each(paths: list[str], sha256: Callable[[str], str] = sha256_of, threads: int | None = None) -> list[str]:
    """``sha256(path)`` of every path, in their order, up to ``threads`` (default FILE_THREADS) files at once. A
    store's own (``store.sha256``) hashes paths relative to it. The first failure is raised, as one thread's would."""
    threads = min(threads or FILE_THREADS, len(paths))
    if threads <= 1:
        return [sha256(path) for path in paths]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(sha256, paths))


Store = LocalStore | ObjectStore


def _store(ckpt_dir: str | Path | Store) -> Store:
    return ckpt_dir if isinstance(ckpt_dir, (LocalStore, ObjectStore)) else open_store(ckpt_dir)


def write_manifest(ckpt_dir: str | Path | Store, tag: str, files: list[dict[str, Any]]) -> None:
    """Atomically and durably write the manifest of ``tag`` (files: path relative to ckpt_dir, bytes, sha256, rank)."""
    text = json.dumps({"tag": tag, "files": sorted(files, key=lambda f: f["path"])}, indent=1)
    _store(ckpt_dir).write_durably(f"{tag}/{MANIFEST}", text)


def read_manifest(ckpt_dir: str | Path | Store, tag: str) -> list[dict[str, Any]]:
    store = _store(ckpt_dir)
    if not store.exists(f"{tag}/{MANIFEST}"):
        raise FileNotFoundError(f"checkpoint {tag} in {store.location} has no {MANIFEST}: it was never committed")
    return json.loads(store.read_text(f"{tag}/{MANIFEST}"))["files"]


def committed_tags(ckpt_dir: str | Path | Store) -> list[str]:
    """Tags with a manifest, newest step first."""
    tags = [path.split("/")[0] for path in _store(ckpt_dir).glob(f"*/{MANIFEST}")]
    return sorted(tags, key=tag_step, reverse=True)


def tag_step(tag: str) -> int:
    """The iteration in a tag's name (``step4`` -> 4); -1 for a name without digits, which sorts before every step."""
    digits = "".join(ch for ch in tag if ch.isdigit())
    return int(digits) if digits else -1


def check_share(ckpt_dir: str | Path | Store, tag: str, rank: int, world_size: int,
                threads: int | None = None) -> list[str]:
    """Check this rank's share of the manifest (every world_size-th file); a line per problem, naming the file. The
    files whose size is right are hashed ``sha256_each`` (several at once)."""
    store = _store(ckpt_dir)
    problems: dict[int, str] = {}
    to_hash = []
    share = read_manifest(store, tag)[rank::world_size]
    for index, entry in enumerate(share):
        path, size = store.url_of(entry["path"]), store.size(entry["path"])
        if size is None:
            problems[index] = f"{path}: missing"
        elif size != entry["bytes"]:
            problems[index] = f"{path}: {size} bytes, manifest says {entry['bytes']} (truncated or overwritten)"
        else:
            to_hash.append(index)
    hashes = sha256_each([share[index]["path"] for index in to_hash], store.sha256, threads)
    for index, digest in zip(to_hash, hashes):
        if digest != share[index]["sha256"]:
            problems[index] = f"{store.url_of(share[index]['path'])}: SHA-256 differs from the manifest (corrupt)"
    return [problems[index] for index in sorted(problems)]

"""Checkpoint integrity: a manifest per committed checkpoint, checked before a restore.

At commit, rank 0 writes ``<tag>/manifest.json`` — every file of every rank with its size and hash (SHA-256 in
chunks: ``restartbench.storage.filehash``) — and only then points ``latest`` at the tag. A tag folder without a
manifest was never committed. Before a restore the ranks share the manifest's files between them, check size and
hash, and agree on the result; a corrupt or truncated file is named, and the restore refuses or falls back to the
newest earlier checkpoint that checks out (``--on-corrupt``).

``ckpt_dir`` is a folder, or a ``restartbench.storage`` store (a folder or an S3 prefix) as the ranks hold it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from restartbench.storage import LocalStore, ObjectStore, filehash, open_store

MANIFEST = "manifest.json"


FILE_THREADS = min(8, os.cpu_count() or 1)
"""Files hashed at once by ``hash_each``: a rank's files (a 1B model's rank: a 3 GB and an 18 GB file) are hashed
together, and each file's chunks on threads of its own (``filehash``), so the largest file no longer bounds it."""


def hash_each(paths: list[str], file_hash: Callable[[str], str], threads: int | None = None) -> list[str]:
    """``file_hash(path)`` of every path (a store's own, ``store.file_hash``: paths relative to it), in their order,
    up to ``threads`` (default FILE_THREADS) files at once. The first failure is raised, as one thread's would."""
    return filehash.map_on_threads(file_hash, paths, threads or FILE_THREADS)


Store = LocalStore | ObjectStore


def _store(ckpt_dir: str | Path | Store) -> Store:
    return ckpt_dir if isinstance(ckpt_dir, (LocalStore, ObjectStore)) else open_store(ckpt_dir)


def write_manifest(ckpt_dir: str | Path | Store, tag: str, files: list[dict[str, Any]]) -> None:
    """Atomically and durably write the manifest of ``tag`` (files: path relative to ckpt_dir, bytes, hash, rank;
    the hash of ``filehash.FORMAT``, which the manifest names)."""
    manifest = {"tag": tag, "hash_format": filehash.FORMAT, "files": sorted(files, key=lambda f: f["path"])}
    text = json.dumps(manifest, indent=1)
    _store(ckpt_dir).write_durably(f"{tag}/{MANIFEST}", text)


def read_manifest(ckpt_dir: str | Path | Store, tag: str) -> list[dict[str, Any]]:
    """The manifest's files, each with its ``hash`` and the ``hash_format`` it is in (a manifest from before the
    chunked format recorded each file's whole SHA-256 as ``sha256``)."""
    store = _store(ckpt_dir)
    if not store.exists(f"{tag}/{MANIFEST}"):
        raise FileNotFoundError(f"checkpoint {tag} in {store.location} has no {MANIFEST}: it was never committed")
    manifest = json.loads(store.read_text(f"{tag}/{MANIFEST}"))
    fmt = manifest.get("hash_format", filehash.WHOLE)
    return [{**entry, "hash": entry.get("hash", entry.get(filehash.WHOLE)), "hash_format": fmt}
            for entry in manifest["files"]]


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
    files whose size is right are hashed (``hash_each``: several at once, each in the manifest's format)."""
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
    fmt = share[0]["hash_format"] if share else filehash.FORMAT
    hashes = hash_each([share[index]["path"] for index in to_hash], lambda path: store.file_hash(path, fmt), threads)
    for index, digest in zip(to_hash, hashes):
        if digest != share[index]["hash"]:
            problems[index] = f"{store.url_of(share[index]['path'])}: its {fmt} hash differs from the manifest " \
                              "(corrupt)"
    return [problems[index] for index in sorted(problems)]

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
from pathlib import Path
from typing import Any

from restartbench.storage import LocalStore, ObjectStore, open_store

MANIFEST = "manifest.json"


def sha256_of(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


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


def check_share(ckpt_dir: str | Path | Store, tag: str, rank: int, world_size: int) -> list[str]:
    """Check this rank's share of the manifest (every world_size-th file); a line per problem, naming the file."""
    store = _store(ckpt_dir)
    problems = []
    for entry in read_manifest(store, tag)[rank::world_size]:
        path, size = store.url_of(entry["path"]), store.size(entry["path"])
        if size is None:
            problems.append(f"{path}: missing")
        elif size != entry["bytes"]:
            problems.append(f"{path}: {size} bytes, manifest says {entry['bytes']} (truncated or overwritten)")
        elif store.sha256(entry["path"]) != entry["sha256"]:
            problems.append(f"{path}: SHA-256 differs from the manifest (corrupt)")
    return problems

"""Checkpoint integrity: a manifest per committed checkpoint, checked before a restore.

At commit, rank 0 writes ``<tag>/manifest.json`` — every file of every rank with its size and
SHA-256 — and only then points ``latest`` at the tag. A tag folder without a manifest was never
committed. Before a restore the ranks share the manifest's files between them, check size and
hash, and agree on the result; a corrupt or truncated file is named, and the restore refuses or
falls back to the newest earlier checkpoint that checks out (``--on-corrupt``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


def sha256_of(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_manifest(ckpt_dir: str | Path, tag: str, files: list[dict[str, Any]]) -> None:
    """Atomically and durably write the manifest of ``tag`` (files: path relative to ckpt_dir, bytes, sha256, rank)."""
    folder = Path(ckpt_dir) / tag
    tmp = folder / (MANIFEST + ".tmp")
    with tmp.open("w") as handle:
        json.dump({"tag": tag, "files": sorted(files, key=lambda f: f["path"])}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / MANIFEST)


def read_manifest(ckpt_dir: str | Path, tag: str) -> list[dict[str, Any]]:
    path = Path(ckpt_dir) / tag / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {tag} in {ckpt_dir} has no {MANIFEST}: it was never committed")
    return json.loads(path.read_text())["files"]


def committed_tags(ckpt_dir: str | Path) -> list[str]:
    """Tags with a manifest, newest step first."""
    tags = [p.parent.name for p in Path(ckpt_dir).glob(f"*/{MANIFEST}")]
    return sorted(tags, key=_step, reverse=True)


def _step(tag: str) -> int:
    digits = "".join(ch for ch in tag if ch.isdigit())
    return int(digits) if digits else -1


def check_share(ckpt_dir: str | Path, tag: str, rank: int, world_size: int) -> list[str]:
    """Check this rank's share of the manifest (every world_size-th file); a line per problem, naming the file."""
    problems = []
    for entry in read_manifest(ckpt_dir, tag)[rank::world_size]:
        path = Path(ckpt_dir) / entry["path"]
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {entry['bytes']} (truncated or overwritten)")
        elif sha256_of(path) != entry["sha256"]:
            problems.append(f"{path}: SHA-256 differs from the manifest (corrupt)")
    return problems

"""``python -m restartbench.storage.hashsum FILE...``: each file's manifest hash (``filehash.FORMAT``), printed as
``sha256sum`` prints its own, to check a checkpoint's files by hand against its ``manifest.json``. (A module of its
own: ``filehash`` is imported by the package, so running it with ``-m`` would run a second copy of it.)"""

from __future__ import annotations

import sys

from restartbench.storage.filehash import hash_file


def main(argv: list[str]) -> int:
    """Print each file's hash; a file that cannot be read is named on stderr and the others are still hashed, the
    exit status then 1."""
    status = 0
    for name in argv:
        try:
            print(f"{hash_file(name)}  {name}")
        except OSError as error:
            print(f"hashsum: {name}: {error.strerror or error}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

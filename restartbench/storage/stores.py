"""The stores: how the harness reaches a checkpoint's own files (the manifest, ``latest``, the hashes, the listing
of committed tags). ``LocalStore`` for a folder; for an object-store prefix ``S3Store`` (s3torchconnector) or
``FsspecStore`` (s3fs, gcsfs), where one object PUT is atomic (a reader sees the old ``latest`` or the new one, never
a torn one) and an object is durable once its upload has completed. ``open_store`` picks the store of a location,
``probe`` checks an object store before a run is launched.

The object-store clients are imported only when such a target is used.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib
import importlib.metadata
import os
import shutil
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from restartbench.durability import fsync_dir
from restartbench.storage import filehash
from restartbench.storage.explain import explain_error
from restartbench.storage.locations import (
    FSSPEC_FILESYSTEMS,
    PART_SIZE,
    SETTINGS,
    GCSSettings,
    ObjectLocation,
    S3Settings,
    StorageError,
    is_remote,
    settings_from_plan,
)

PROBE_ATTEMPTS = 2
"""Attempts per request of the preflight probe: an unreachable endpoint is reported in seconds."""


@functools.cache
def s3_client(settings: S3Settings) -> Any:
    """One s3torchconnector client per settings and process (its CRT client is costly to create)."""
    return new_s3_client(settings)


def new_s3_client(settings: S3Settings, max_attempts: int = 10, part_size: int = PART_SIZE) -> Any:
    """A fresh client: it reads the credentials from the environment (or profile) as they are now."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client  # S3Checkpoint wraps it but cannot list, head or delete

    config = S3ClientConfig(force_path_style=settings.force_path_style, max_attempts=max_attempts,
                            part_size=part_size)
    return S3Client(settings.region, endpoint=settings.endpoint, s3client_config=config)


class LocalStore:
    """A checkpoint folder on a local or shared file system; writes are fsync'd, renames atomic."""

    remote = False

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.location = str(root)

    def url_of(self, relative: str) -> str:
        return str(self.root / relative)

    def exists(self, relative: str) -> bool:
        return (self.root / relative).is_file()

    def read_text(self, relative: str) -> str:
        return (self.root / relative).read_text()

    def write_durably(self, relative: str, text: str) -> None:
        """Write, fsync, rename over ``relative`` (atomic), fsync the folder."""
        path = self.root / relative
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def size(self, relative: str) -> int | None:
        path = self.root / relative
        return path.stat().st_size if path.is_file() else None

    def file_hash(self, relative: str, fmt: str = filehash.FORMAT) -> str:
        """The manifest's hash of one file (``filehash``): its chunks read and hashed on several threads."""
        return filehash.hash_file(self.root / relative, fmt)

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern) if p.is_file())

    def files(self) -> dict[str, int]:
        """Every file under the folder, relative path -> bytes."""
        return {str(p.relative_to(self.root)): p.stat().st_size for p in sorted(self.root.rglob("*")) if p.is_file()}

    def delete(self, relative: str) -> None:
        """Remove one file, then fsync its folder (the removal is durable before what depends on it)."""
        path = self.root / relative
        path.unlink(missing_ok=True)
        fsync_dir(path.parent)

    def remove_tree(self, relative: str) -> None:
        shutil.rmtree(self.root / relative, ignore_errors=True)

    def free_bytes(self) -> int | None:
        return shutil.disk_usage(self.root).free


class ObjectStore:
    """What the object-store stores share: names, globbing, hashing through the client's reader, errors."""

    remote = True
    tool = ""
    """The client library, as baseline.json names it."""

    def __init__(self, location: ObjectLocation, settings: S3Settings | GCSSettings):
        self.where, self.settings = location, settings
        self.location = location.url

    def url_of(self, relative: str) -> str:
        return self.where.url_of(relative)

    def relative(self, url: str) -> str:
        return self.where.relative(url)

    def exists(self, relative: str) -> bool:
        return self.size(relative) is not None

    def glob(self, pattern: str) -> list[str]:
        """Keys matching a glob whose '*' stays within one path segment, like a file system's glob."""
        depth = pattern.count("/")
        return sorted(k for k in self.files() if k.count("/") == depth and fnmatch.fnmatchcase(k, pattern))

    def file_hash(self, relative: str, fmt: str = filehash.FORMAT) -> str:
        """The manifest's hash (``filehash``) of the object as the service returns it now: a full read, in order."""
        digest, buffer = filehash.new_hasher(fmt), bytearray(PART_SIZE)
        try:
            with self.reader(self.url_of(relative)) as reader:
                while count := reader.readinto(buffer):
                    digest.update(memoryview(buffer)[:count])
        except self.client_errors as error:
            raise self.error(error, f"reading {relative} to hash it") from None
        return digest.hexdigest()

    def remove_tree(self, relative: str) -> None:
        """Delete every object under ``relative``, as far as the service lets us (like ``rmtree(ignore_errors=True)``:
        what is left has no manifest, so it is never restored)."""
        with contextlib.suppress(Exception):
            for key in self.files(relative):
                self.delete(key)

    def free_bytes(self) -> int | None:
        return None  # an object store has no free-space figure

    def error(self, error: BaseException, doing: str) -> StorageError:
        return explain_error(error, self.where, self.settings, doing)

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(self.tool)
        except importlib.metadata.PackageNotFoundError:
            return None


class S3Store(ObjectStore):
    """An S3 prefix through s3torchconnector's client (``S3Checkpoint`` streams for whole objects)."""

    tool = "s3torchconnector"

    def __init__(self, location: ObjectLocation, settings: S3Settings, client: Any = None):
        super().__init__(location, settings)
        self._client = client

    @property
    def client(self) -> Any:
        return self._client or s3_client(self.settings)

    @property
    def client_errors(self) -> tuple[type[BaseException], ...]:
        from s3torchconnector import S3Exception

        return (S3Exception,)

    def for_probe(self) -> S3Store:
        """The same store with a client that retries little, so that a dead endpoint is reported in seconds."""
        return S3Store(self.where, self.settings, new_s3_client(self.settings, max_attempts=PROBE_ATTEMPTS))

    def list_some(self) -> None:
        try:
            for _page in self.client.list_objects(self.where.bucket, self.where.key() and self.where.key() + "/",
                                                  max_keys=1):
                return
        except Exception as error:  # noqa: BLE001 - S3Exception and the CRT's errors, explained in words
            raise self.error(error, "listing the prefix") from None

    def writer(self, url: str) -> Any:
        """A writable stream into the object at ``url`` (a multipart upload, completed when it is closed)."""
        return self._checkpoint.writer(url)

    def reader(self, url: str) -> Any:
        return self._checkpoint.reader(url)

    @functools.cached_property
    def _checkpoint(self) -> Any:
        from s3torchconnector import S3Checkpoint

        return S3Checkpoint(self.settings.region, endpoint=self.settings.endpoint,
                            s3client_config=self.client.s3client_config)

    def read_text(self, relative: str) -> str:
        try:
            return self.client.get_object(self.where.bucket, self.where.key(relative)).read().decode()
        except Exception as error:  # noqa: BLE001
            if _not_found(error):
                raise FileNotFoundError(f"{self.url_of(relative)} does not exist") from None
            raise self.error(error, f"reading {relative}") from None

    def write_durably(self, relative: str, text: str) -> None:
        """One PUT: S3 makes the object visible whole or not at all, and durable when the PUT returns."""
        try:
            writer = self.client.put_object(self.where.bucket, self.where.key(relative))
            writer.write(text.encode())
            writer.close()
        except Exception as error:  # noqa: BLE001
            raise self.error(error, f"writing {relative}") from None

    def size(self, relative: str) -> int | None:
        try:
            return self.client.head_object(self.where.bucket, self.where.key(relative)).size
        except Exception as error:  # noqa: BLE001
            if _not_found(error):
                return None
            raise self.error(error, f"looking up {relative}") from None

    def files(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (or under ``under`` in it), relative key -> bytes."""
        prefix = self.where.key(under)
        prefix = prefix + "/" if prefix and not prefix.endswith("/") else prefix
        found = {}
        try:
            for page in self.client.list_objects(self.where.bucket, prefix):
                for info in page.object_info:
                    found[self.where.relative(f"{self.where.scheme}{self.where.bucket}/{info.key}")] = info.size
        except StorageError:
            raise
        except Exception as error:  # noqa: BLE001
            raise self.error(error, f"listing {under or 'the prefix'}") from None
        return found

    def delete(self, relative: str) -> None:
        try:
            self.client.delete_object(self.where.bucket, self.where.key(relative))
        except Exception as error:  # noqa: BLE001
            raise self.error(error, f"deleting {relative}") from None


def _not_found(error: BaseException) -> bool:
    """The object is not there (a missing bucket holds no object either)."""
    text = str(error).lower()
    return any(words in text for words in ("not found", "does not exist", "nosuchkey", "nosuchbucket", "404"))


class FsspecStore(ObjectStore):
    """An S3 or GCS prefix through fsspec (s3fs, gcsfs): the route Lightning and most tools take."""

    def __init__(self, location: ObjectLocation, settings: S3Settings | GCSSettings, attempts: int | None = None):
        super().__init__(location, settings)
        self.tool = FSSPEC_FILESYSTEMS[location.scheme][0]
        self._attempts = attempts

    @functools.cached_property
    def fs(self) -> Any:
        package, module, cls, install = FSSPEC_FILESYSTEMS[self.where.scheme]
        try:
            filesystem = getattr(importlib.import_module(module), cls)
        except ImportError:
            raise StorageError(f"checkpoints to {self.location} through fsspec need the Python package {package}: "
                               f"{install}") from None
        return filesystem(skip_instance_cache=True, **self.settings.fsspec_options(self._attempts))

    @property
    def client_errors(self) -> tuple[type[BaseException], ...]:
        return _fsspec_errors()

    def for_probe(self) -> FsspecStore:
        return FsspecStore(self.where, self.settings, attempts=PROBE_ATTEMPTS)

    def list_some(self) -> None:
        try:
            _check_reachable(self.settings.endpoint)
            self.fs.info(self.where.bucket)
        except self.client_errors as error:
            raise self.error(error, "looking up the bucket") from None

    def writer(self, url: str) -> Any:
        """A writable file (uploaded in parts of PART_SIZE; complete, and durable, when closed)."""
        return self.fs.open(url, "wb", block_size=PART_SIZE)

    def reader(self, url: str) -> Any:
        return self.fs.open(url, "rb", block_size=PART_SIZE)

    def read_text(self, relative: str) -> str:
        try:
            return self.fs.cat_file(self.where.path(relative)).decode()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.url_of(relative)} does not exist") from None
        except self.client_errors as error:
            raise self.error(error, f"reading {relative}") from None

    def write_durably(self, relative: str, text: str) -> None:
        """One upload of the whole object: visible whole or not at all, durable when it returns."""
        try:
            self.fs.pipe_file(self.where.path(relative), text.encode())
        except self.client_errors as error:
            raise self.error(error, f"writing {relative}") from None

    def size(self, relative: str) -> int | None:
        try:
            self.fs.invalidate_cache()
            return self.fs.info(self.where.path(relative))["size"]
        except FileNotFoundError:
            return None
        except self.client_errors as error:
            raise self.error(error, f"looking up {relative}") from None

    def files(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (or under ``under`` in it), relative key -> bytes."""
        head = self.where.path() + "/"
        try:
            self.fs.invalidate_cache()
            found = self.fs.find(self.where.path(under), detail=True)
        except FileNotFoundError:
            return {}
        except self.client_errors as error:
            raise self.error(error, f"listing {under or 'the prefix'}") from None
        return {name[len(head):]: info["size"] for name, info in sorted(found.items())
                if name.startswith(head) and info.get("type") != "directory"}

    def delete(self, relative: str) -> None:
        try:
            self.fs.rm_file(self.where.path(relative))
        except self.client_errors as error:
            raise self.error(error, f"deleting {relative}") from None


def _check_reachable(endpoint: str | None, timeout_s: float = 3) -> None:
    """A TCP connection to a custom endpoint, first: gcsfs retries a refused connection six times with back-off
    (about a minute) before it gives up, and no option of its own shortens that."""
    if not endpoint:
        return
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(f"cannot connect to {parsed.hostname}:{port}: {error}") from None


@functools.lru_cache(maxsize=1)
def _fsspec_errors() -> tuple[type[BaseException], ...]:
    """What fsspec's object-store clients raise: OSError subclasses mostly, and their HTTP stacks' own errors."""
    errors: list[type[BaseException]] = [OSError, ValueError]
    for module, name in (("botocore.exceptions", "BotoCoreError"), ("botocore.exceptions", "ClientError"),
                         ("aiohttp", "ClientError")):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(getattr(importlib.import_module(module), name))
    return tuple(errors)


STORES = {"s3torchconnector": S3Store, "fsspec": FsspecStore}
"""The client recorded in the settings -> the store that uses it."""


def open_store(location: str | Path, remote: dict[str, Any] | None = None) -> LocalStore | ObjectStore:
    """The store of a checkpoint location; ``remote``: the settings plan.json recorded (else from the environment)."""
    if not is_remote(location):
        return LocalStore(location)
    where = ObjectLocation.parse(str(location))
    settings = settings_from_plan(remote) if remote else SETTINGS[where.scheme].resolve()
    return STORES[settings.client](where, settings)


def probe(store: ObjectStore) -> None:
    """Before launching: find the bucket, then write, read back and delete one small object.

    Raises StorageError for a missing bucket, refused credentials or an unreachable endpoint, each
    said in words; requests are retried little, so a dead endpoint is reported in seconds."""
    quick = store.for_probe()
    name, payload = f".restartbench-probe-{os.getpid()}", "restartbench probe\n"
    quick.list_some()
    quick.write_durably(name, payload)
    try:
        got = quick.read_text(name)
    except FileNotFoundError:
        got = None
    if got != payload:
        raise StorageError(f"{quick.url_of(name)}: reading back the probe object gave {got!r}, not what was written; "
                           "the storage service does not return what was stored")
    quick.delete(name)

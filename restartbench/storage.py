"""Where checkpoints live: a local folder (disk, parallel file system, /dev/shm) or an object-store prefix.

``--checkpoint-dir`` takes a path, ``s3://BUCKET/PREFIX`` or ``gs://BUCKET/PREFIX``. An s3:// prefix is
reached through s3torchconnector (AWS's CRT client, the default) or through fsspec's s3fs
(``--object-client fsspec``), so that the two routes can be compared on the same checkpoints, as seed 002
compares a storage connector with fsspec; gs:// through fsspec's gcsfs. For S3 the endpoint, region and
addressing style come from the options (``--s3-endpoint``, ``--s3-region``, ``--s3-path-style``) or else from
the usual AWS variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``); for GCS the endpoint from ``--gcs-endpoint`` or
``STORAGE_EMULATOR_HOST``. Credentials only ever come from the provider's own chain (AWS variables, profile or
role; Google's application default credentials): they are never options, so they never reach ``config.json``,
``plan.json`` or a log.

The harness reaches the checkpoint's own files (the manifest, ``latest``, the hashes, the listing of
committed tags) through a ``Store``: ``LocalStore`` for a folder; ``S3Store`` (s3torchconnector) or
``FsspecStore`` for a prefix, where one object PUT is atomic (a reader sees the old ``latest`` or the new
one, never a torn one) and an object is durable once its upload has completed. The engines that write to an
object store live with the engines (``restartbench.engines.object_store``); this module knows no engine.

The object-store clients are imported only when such a target is used.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import posixpath
import re
import shutil
import socket
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from restartbench import baseline
from restartbench.durability import fsync_dir
from restartbench.progress import say

S3_SCHEME, GS_SCHEME = "s3://", "gs://"
OBJECT_SCHEMES = (S3_SCHEME, GS_SCHEME)
DEFAULT_REGION = "us-east-1"
PART_SIZE = 8 * 2**20
"""Bytes per upload part (multipart) and per read of every object-store client, and of the baseline."""
PROBE_ATTEMPTS = 2
"""Attempts per request of the preflight probe: an unreachable endpoint is reported in seconds."""
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
S3_CLIENTS = ("s3torchconnector", "fsspec")


class StorageError(RuntimeError):
    """The checkpoint target cannot be used; the message says what was wrong and what to do."""


def is_s3(location: str | Path | None) -> bool:
    return str(location or "").startswith(S3_SCHEME)


def is_remote(location: str | Path | None) -> bool:
    """An object-store location (s3:// or gs://), not a folder."""
    return str(location or "").startswith(OBJECT_SCHEMES)


# --- object-store locations and client settings ---------------------------------------------------


@dataclass(frozen=True)
class ObjectLocation:
    scheme: str
    """``s3://`` or ``gs://``."""
    bucket: str
    prefix: str
    """Key prefix without leading or trailing '/' (may be empty: the bucket's root)."""

    @classmethod
    def parse(cls, url: str) -> ObjectLocation:
        scheme = next((s for s in OBJECT_SCHEMES if str(url).startswith(s)), None)
        bucket, _, prefix = str(url)[len(scheme or ""):].partition("/")
        if scheme is None or not bucket or "//" in prefix:
            raise StorageError(f"{url!r} is not an object-store location: write it as s3://BUCKET or "
                               "s3://BUCKET/PREFIX (gs://BUCKET/PREFIX for Google Cloud Storage)")
        return cls(scheme, bucket, prefix.strip("/"))

    @property
    def url(self) -> str:
        return f"{self.scheme}{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}{self.bucket}"

    def key(self, relative: str = "") -> str:
        return posixpath.join(self.prefix, relative) if self.prefix else relative

    def url_of(self, relative: str) -> str:
        return f"{self.scheme}{self.bucket}/{self.key(relative)}"

    def path(self, relative: str = "") -> str:
        """fsspec's name of the object or prefix: ``bucket/key`` without the scheme."""
        return posixpath.join(self.bucket, self.key(relative)).rstrip("/")

    def relative(self, url: str) -> str:
        """``url`` (an object of this location) relative to the prefix."""
        head = self.url + "/"
        if not url.startswith(head):
            raise StorageError(f"{url} is not under the checkpoint location {self.url}")
        return url[len(head):]


@dataclass(frozen=True)
class S3Settings:
    """How to reach the S3 service (what plan.json records; no credentials)."""

    endpoint: str | None
    region: str
    force_path_style: bool
    credentials: str
    """Where the credentials come from, in words (never their values)."""
    client: str = "s3torchconnector"
    """The client checkpoints go through: s3torchconnector or fsspec (s3fs)."""
    scheme: ClassVar[str] = S3_SCHEME

    @classmethod
    def resolve(cls, endpoint: str | None = None, region: str | None = None, path_style: bool | None = None,
                environ: dict[str, str] | None = None, client: str | None = None) -> S3Settings:
        """Options first, then the AWS variables; path-style addressing by default for a custom endpoint
        (MinIO, SeaweedFS, Ceph: buckets are not DNS names there), virtual-hosted on AWS itself."""
        env = os.environ if environ is None else environ
        endpoint = endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        if env.get("AWS_ACCESS_KEY_ID"):
            credentials = "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        elif env.get("AWS_PROFILE"):
            credentials = f"AWS profile {env['AWS_PROFILE']!r}"
        else:
            credentials = "AWS default chain (shared credentials file, instance or task role)"
        return cls(endpoint, region, endpoint is not None if path_style is None else path_style, credentials,
                   client or "s3torchconnector")

    def describe(self) -> str:
        return (f"endpoint {self.endpoint or 'AWS'}, region {self.region}, "
                f"{'path-style' if self.force_path_style else 'virtual-hosted'} addressing, client {self.client}, "
                f"credentials from {self.credentials}")

    def fsspec_options(self, attempts: int | None = None) -> dict[str, Any]:
        """s3fs's options for the same service, in parts of PART_SIZE as s3torchconnector's (``attempts``: retries
        per request, for a quick probe)."""
        config: dict[str, Any] = {"s3": {"addressing_style": "path" if self.force_path_style else "auto"}}
        if attempts:
            config |= {"retries": {"max_attempts": attempts, "mode": "standard"}, "connect_timeout": 3}
        return {"endpoint_url": self.endpoint, "client_kwargs": {"region_name": self.region},
                "config_kwargs": config, "default_block_size": PART_SIZE}

    def with_client(self, client: str) -> S3Settings:
        return S3Settings(self.endpoint, self.region, self.force_path_style, self.credentials, client)


@dataclass(frozen=True)
class GCSSettings:
    """How to reach Google Cloud Storage (what plan.json records; no credentials)."""

    endpoint: str | None
    anonymous: bool
    """No credentials are sent: a custom endpoint (an emulator) without GOOGLE_APPLICATION_CREDENTIALS."""
    credentials: str
    client: str = "fsspec"
    scheme: ClassVar[str] = GS_SCHEME

    @classmethod
    def resolve(cls, endpoint: str | None = None, environ: dict[str, str] | None = None) -> GCSSettings:
        env = os.environ if environ is None else environ
        endpoint = endpoint or env.get("STORAGE_EMULATOR_HOST") or None
        anonymous = endpoint is not None and not env.get("GOOGLE_APPLICATION_CREDENTIALS")
        credentials = ("none (anonymous requests to a custom endpoint)" if anonymous else
                       "GOOGLE_APPLICATION_CREDENTIALS" if env.get("GOOGLE_APPLICATION_CREDENTIALS") else
                       "Google application default credentials (gcloud, metadata server)")
        return cls(endpoint, anonymous, credentials)

    def describe(self) -> str:
        return f"endpoint {self.endpoint or 'Google'}, client fsspec (gcsfs), credentials from {self.credentials}"

    def fsspec_options(self, attempts: int | None = None) -> dict[str, Any]:
        """gcsfs's options (it retries by its own rules: ``attempts`` is not used)."""
        return {"endpoint_url": self.endpoint, "token": "anon" if self.anonymous else None, "block_size": PART_SIZE}


SETTINGS = {S3_SCHEME: S3Settings, GS_SCHEME: GCSSettings}


def settings_to_plan(settings: S3Settings | GCSSettings) -> dict[str, Any]:
    return {"scheme": settings.scheme, **asdict(settings)}


def settings_from_plan(recorded: dict[str, Any]) -> S3Settings | GCSSettings:
    fields = {k: v for k, v in recorded.items() if k != "scheme"}
    return SETTINGS[recorded.get("scheme", S3_SCHEME)](**fields)


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


def redact(text: str) -> str:
    """``text`` with the value of every AWS secret in the environment replaced by '***'."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value:
            text = text.replace(value, "***")
    return text


def condense(message: str) -> str:
    """The service's own code and message where the client quotes its XML error body, else the message."""
    code, text = re.search(r"<Code>(.*?)</Code>", message), re.search(r"<Message>(.*?)</Message>", message)
    status = re.search(r"response_status: (\d+)", message)
    if not code:
        return message
    return f"{code[1]}: {text[1] if text else ''}" + (f" (HTTP {status[1]})" if status else "")


UNREACHABLE = ("the endpoint cannot be reached: check --s3-endpoint / AWS_ENDPOINT_URL (or --gcs-endpoint / "
               "STORAGE_EMULATOR_HOST) and that the service is running and reachable from here")
#: What a refused credential looks like in a client's message; HTTP 401 and 403 as whole numbers only (a port such as
#: 40113 in "cannot connect to 127.0.0.1:40113" is not a refusal).
REFUSED = re.compile(r"forbidden|signature|access key|accessdenied|access denied|credentials|invalidaccesskeyid"
                     r"|\b40[13]\b")


def explain_error(error: BaseException, location: ObjectLocation, settings: S3Settings | GCSSettings,
                  doing: str) -> StorageError:
    """A StorageError naming the target, what failed, the likely cause and what to do."""
    raw = condense(redact(str(error)))
    lowered = raw.lower()
    where = f"checkpoint location {location.url} ({settings.describe()})"
    if isinstance(error, FileNotFoundError) or "bucket does not exist" in lowered or "nosuchbucket" in lowered:
        cause = (f"bucket {location.bucket!r} does not exist there; create it (e.g. aws s3 mb "
                 f"s3://{location.bucket}, gcloud storage buckets create gs://{location.bucket}) or name an existing "
                 "bucket in --checkpoint-dir")
    elif isinstance(error, (ConnectionError, TimeoutError)):
        cause = UNREACHABLE
    elif isinstance(error, PermissionError) or REFUSED.search(lowered):
        cause = ("the credentials were refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                 "or GOOGLE_APPLICATION_CREDENTIALS, and that they may list, write and read this bucket")
    elif any(word in lowered for word in ("crt error", "connection", "connect", "dns", "resolve", "timed out",
                                          "timeout", "socket")):
        cause = UNREACHABLE
    else:
        cause = "the storage service refused the request"
    return StorageError(f"{where}: {doing} failed: {cause} ({type(error).__name__}: {raw})")


# --- stores: the checkpoint's own files, local or in an object store --------------------------------


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

    def sha256(self, relative: str) -> str:
        with open(self.root / relative, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern) if p.is_file())

    def files(self) -> dict[str, int]:
        """Every file under the folder, relative path -> bytes."""
        return {str(p.relative_to(self.root)): p.stat().st_size for p in sorted(self.root.rglob("*")) if p.is_file()}

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

    def sha256(self, relative: str) -> str:
        """SHA-256 of the object as the service returns it now (a full read)."""
        digest, buffer = hashlib.sha256(), bytearray(PART_SIZE)
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


FSSPEC_FILESYSTEMS = {
    S3_SCHEME: ("s3fs", "s3fs", "S3FileSystem", "pip install -c constraints.txt -e '.[s3]'"),
    # gcsfs's core file system (the JSON API); its experimental zonal-bucket layer probes each bucket over gRPC
    GS_SCHEME: ("gcsfs", "gcsfs.core", "GCSFileSystem", "pip install -c constraints.txt -e '.[gcs]'"),
}
"""scheme -> (package, module, class, how to install it)."""


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


def check_remote_location(location: str, client: str | None) -> ObjectLocation:
    """The parsed location, if this installation and ``client`` can reach it; else StorageError."""
    where = ObjectLocation.parse(location)
    if where.scheme == GS_SCHEME and client not in (None, "fsspec"):
        raise StorageError(f"gs:// checkpoints go through fsspec (gcsfs); --object-client {client} applies to "
                           "s3:// only")
    if where.scheme == S3_SCHEME and client in (None, "s3torchconnector"):
        package, install = "s3torchconnector", "pip install -c constraints.txt -e '.[s3]'"
    else:
        package, _module, _cls, install = FSSPEC_FILESYSTEMS[where.scheme]
    if importlib.util.find_spec(package) is None:
        raise StorageError(f"checkpoints to {location} need the Python package {package}: {install}")
    return where


def resolve_settings(where: ObjectLocation, options: Any) -> S3Settings | GCSSettings:
    """The settings of a location from the run's storage options (``config.StorageConfig``) and the environment."""
    if where.scheme == GS_SCHEME:
        return GCSSettings.resolve(options.gcs_endpoint)
    return S3Settings.resolve(options.s3_endpoint, options.s3_region, options.s3_path_style,
                              client=options.object_client)


# --- the object-store baseline: a plain upload and download of the same size, through each client ----------


def record_remote_baseline(run_dir: Path, location: str, remote: dict[str, Any], size_mib: int) -> Path | None:
    """Measure the location with plain transfers and write ``run_dir/baseline.json``; on a problem print a
    note and return None (a baseline is context for the analysis, never a reason to fail the run).

    The top-level figures are those of the client the checkpoints go through; ``other_clients`` holds the same
    transfer through the other route to S3 (s3torchconnector or s3fs), for comparison."""
    store = open_store(location, remote)
    say(f"storage baseline: a {size_mib} MiB object uploaded and downloaded in {store.location} through {store.tool}")
    try:
        result = measure_store(store, size_mib)
    except Exception as error:  # noqa: BLE001 - StorageError, the clients' errors: reported, the run goes on
        say(f"note: storage baseline not measured: {redact(str(error))}")
        return None
    result["other_clients"] = {other.tool: _measured_or_reason(other, size_mib) for other in _other_routes(store)}
    path = Path(run_dir) / baseline.BASELINE_FILE
    path.write_text(json.dumps(result, indent=2) + "\n")
    others = "; ".join(f"{tool} " + (f"write {r['write_MBps']:.0f} MB/s, read {r['read_MBps']:.0f} MB/s"
                                      if "write_MBps" in r else f"not measured ({r['error']})")
                       for tool, r in result["other_clients"].items())
    say(f"storage baseline: {store.tool} write {result['write_MBps']:.0f} MB/s, read {result['read_MBps']:.0f} MB/s"
        + (f"; {others}" if others else ""))
    return path


def _other_routes(store: ObjectStore) -> list[ObjectStore]:
    """The same S3 location through the other client (none for GCS: fsspec is its only route here)."""
    if not isinstance(store.settings, S3Settings):
        return []
    other = next(c for c in S3_CLIENTS if c != store.settings.client)
    return [STORES[other](store.where, store.settings.with_client(other))]


def _measured_or_reason(store: ObjectStore, size_mib: int) -> dict[str, Any]:
    try:
        return measure_store(store, size_mib)
    except ImportError as missing:
        return {"tool": store.tool, "error": f"{missing.name} is not installed"}
    except Exception as error:  # noqa: BLE001
        return {"tool": store.tool, "error": redact(f"{type(error).__name__}: {error}")}


def measure_store(store: ObjectStore, size_mib: int) -> dict[str, Any]:
    """Upload then download one object of ``size_mib`` MiB through the store's client, as a checkpoint file goes:
    written in parts of PART_SIZE (multipart), the time ending when the upload is complete (the object is then
    durable); read back whole into one reused buffer. The object is always deleted."""
    if size_mib <= 0:
        raise StorageError(f"the baseline size must be a positive number of MiB, got {size_mib}")
    name = f".restartbench-baseline-{store.tool}-{os.getpid()}"
    url, size, part = store.url_of(name), size_mib * 2**20, os.urandom(PART_SIZE)
    try:
        start = time.perf_counter()
        with store.writer(url) as writer:
            for offset in range(0, size, PART_SIZE):
                writer.write(part[:min(PART_SIZE, size - offset)])
        write_s, start = time.perf_counter() - start, time.perf_counter()
        got, buffer = 0, bytearray(PART_SIZE)
        with store.reader(url) as reader:
            while count := reader.readinto(buffer):
                got += count
        read_s = time.perf_counter() - start
    finally:
        with contextlib.suppress(Exception):
            store.delete(name)
    if got != size:
        raise StorageError(f"{url}: {store.tool} read back {got} bytes of the {size} written")
    return {"tool": store.tool, "version": store.version(), "write_MBps": size / write_s / 1e6,
            "read_MBps": size / read_s / 1e6, "target": url, "endpoint": store.settings.endpoint,
            "size_bytes": size, "block_size": PART_SIZE,
            "write_method": f"{store.tool}: one object written in parts of {PART_SIZE} B (multipart), time until the "
                            "upload is complete",
            "read_method": f"{store.tool}: the whole object read in blocks of {PART_SIZE} B into one buffer",
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

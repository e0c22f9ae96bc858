"""Where checkpoints live: a local folder (disk, parallel file system, /dev/shm) or an S3 prefix.

``--checkpoint-dir`` takes either a path or ``s3://BUCKET/PREFIX``. For S3 the endpoint, region and
addressing style come from the options (``--s3-endpoint``, ``--s3-region``, ``--s3-path-style``) or
else from the usual AWS variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``); the credentials only ever
from the AWS credential chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an
instance role): they are never options, so they never reach ``config.json``, ``plan.json`` or a log.

The harness reaches the checkpoint's own files (the manifest, ``latest``, the hashes, the listing of
committed tags) through a ``Store``: ``LocalStore`` for a folder, ``S3Store`` for a prefix, where one
object PUT is atomic (a reader sees the old ``latest`` or the new one, never a torn one) and an object
is durable once its upload has completed. ``engine_for_target`` gives the checkpoint engine that writes
to the target: for S3, ``S3TorchEngine`` runs DeepSpeed's own ``save_checkpoint``/``load_checkpoint``
with every file streamed through s3torchconnector (``torch.save`` into an ``S3Checkpoint`` writer).

s3torchconnector is imported only when an S3 target is used.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import hashlib
import importlib.util
import json
import os
import posixpath
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from restartbench.engines import fsync_dir, object_store_engines
from restartbench.engines.deepspeed_engines import FileRecord, TorchEngine

S3_SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"
PROBE_ATTEMPTS = 2
"""Attempts per request of the preflight probe: an unreachable endpoint is reported in about a second."""
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


class StorageError(RuntimeError):
    """The checkpoint target cannot be used; the message says what was wrong and what to do."""


def is_s3(location: str | Path | None) -> bool:
    return str(location or "").startswith(S3_SCHEME)


# --- S3 locations and client settings ----------------------------------------------------------


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    """Key prefix without leading or trailing '/' (may be empty: the bucket's root)."""

    @classmethod
    def parse(cls, url: str) -> "S3Location":
        bucket, _, prefix = str(url)[len(S3_SCHEME):].partition("/")
        if not is_s3(url) or not bucket or "//" in prefix:
            raise StorageError(f"{url!r} is not an S3 location: write it as s3://BUCKET or s3://BUCKET/PREFIX")
        return cls(bucket, prefix.strip("/"))

    @property
    def url(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{S3_SCHEME}{self.bucket}"

    def key(self, relative: str = "") -> str:
        return posixpath.join(self.prefix, relative) if self.prefix else relative

    def url_of(self, relative: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key(relative)}"

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

    @classmethod
    def resolve(cls, endpoint: str | None = None, region: str | None = None, path_style: bool | None = None,
                environ: dict[str, str] | None = None) -> "S3Settings":
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
        return cls(endpoint, region, endpoint is not None if path_style is None else path_style, credentials)

    @classmethod
    def from_plan(cls, recorded: dict[str, Any]) -> "S3Settings":
        return cls(**recorded)

    def to_plan(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"endpoint {self.endpoint or 'AWS'}, region {self.region}, "
                f"{'path-style' if self.force_path_style else 'virtual-hosted'} addressing, credentials from "
                f"{self.credentials}")


@functools.lru_cache(maxsize=None)
def s3_client(settings: S3Settings) -> Any:
    """One s3torchconnector client per settings and process (its CRT client is costly to create)."""
    return new_s3_client(settings)


def new_s3_client(settings: S3Settings, max_attempts: int = 10, part_size: int = 8 * 2**20) -> Any:
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


def explain_s3_error(error: BaseException, location: S3Location, settings: S3Settings, doing: str) -> StorageError:
    """A StorageError naming the target, what failed, the likely cause and what to do."""
    raw = condense(redact(str(error)))
    lowered = raw.lower()
    where = f"S3 checkpoint location {location.url} ({settings.describe()})"
    if "bucket does not exist" in lowered or "nosuchbucket" in lowered:
        cause = (f"bucket {location.bucket!r} does not exist there; create it (e.g. aws s3 mb s3://{location.bucket}) "
                 "or name an existing bucket in --checkpoint-dir")
    elif any(word in lowered for word in ("forbidden", "signature", "access key", "accessdenied", "access denied",
                                          "credentials", "invalidaccesskeyid", "403")):
        cause = ("the credentials were refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) "
                 "and that they may list, write and read this bucket")
    elif any(word in lowered for word in ("crt error", "connection", "connect", "dns", "resolve", "timed out",
                                          "timeout", "socket")):
        cause = ("the endpoint cannot be reached: check --s3-endpoint / AWS_ENDPOINT_URL and that the S3 service "
                 "is running and reachable from here")
    else:
        cause = "the S3 service refused the request"
    return StorageError(f"{where}: {doing} failed: {cause} ({type(error).__name__}: {raw})")


def probe(location: S3Location, settings: S3Settings) -> None:
    """Before launching: list the prefix, then write, read back and delete one small object.

    Raises StorageError for a missing bucket, refused credentials or an unreachable endpoint, each
    said in words. Requests are retried at most ``PROBE_ATTEMPTS`` times, so this takes about a second
    even when the endpoint does not answer."""
    client = new_s3_client(settings, max_attempts=PROBE_ATTEMPTS)
    key = location.key(f".restartbench-probe-{os.getpid()}")
    payload = b"restartbench probe\n"
    steps = [("listing the prefix", lambda: _list_page(client, location)),
             ("writing a probe object", lambda: _put(client, location.bucket, key, payload)),
             ("reading the probe object back", lambda: _check_probe(client, location.bucket, key, payload)),
             ("deleting the probe object", lambda: client.delete_object(location.bucket, key))]
    for doing, step in steps:
        try:
            step()
        except StorageError:
            raise
        except Exception as error:  # noqa: BLE001 - S3Exception and the CRT's errors, explained in words
            raise explain_s3_error(error, location, settings, doing) from None


def _list_page(client: Any, location: S3Location) -> None:
    for _page in client.list_objects(location.bucket, location.key() and location.key() + "/", max_keys=1):
        return


def _put(client: Any, bucket: str, key: str, data: bytes) -> None:
    writer = client.put_object(bucket, key)
    writer.write(data)
    writer.close()


def _check_probe(client: Any, bucket: str, key: str, payload: bytes) -> None:
    got = client.get_object(bucket, key).read()
    if got != payload:
        raise StorageError(f"s3://{bucket}/{key}: read back {len(got)} bytes that differ from the {len(payload)} "
                           "written; the S3 service does not return what was stored")


# --- stores: the checkpoint's own files, local or in S3 -----------------------------------------


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


class S3Store:
    """A checkpoint prefix in S3 (s3torchconnector's client)."""

    remote = True

    def __init__(self, location: S3Location, settings: S3Settings):
        self.where, self.settings = location, settings
        self.location = location.url

    @property
    def client(self) -> Any:
        return s3_client(self.settings)

    def url_of(self, relative: str) -> str:
        return self.where.url_of(relative)

    def exists(self, relative: str) -> bool:
        return self.size(relative) is not None

    def read_text(self, relative: str) -> str:
        try:
            return self.client.get_object(self.where.bucket, self.where.key(relative)).read().decode()
        except Exception as error:  # noqa: BLE001
            if _not_found(error):
                raise FileNotFoundError(f"{self.url_of(relative)} does not exist") from None
            raise self._error(error, f"reading {relative}") from None

    def write_durably(self, relative: str, text: str) -> None:
        """One PUT: S3 makes the object visible whole or not at all, and durable when the PUT returns."""
        try:
            _put(self.client, self.where.bucket, self.where.key(relative), text.encode())
        except Exception as error:  # noqa: BLE001
            raise self._error(error, f"writing {relative}") from None

    def size(self, relative: str) -> int | None:
        try:
            return self.client.head_object(self.where.bucket, self.where.key(relative)).size
        except Exception as error:  # noqa: BLE001
            if _not_found(error):
                return None
            raise self._error(error, f"looking up {relative}") from None

    def sha256(self, relative: str, chunk: int = 8 * 2**20) -> str:
        """SHA-256 of the object as the service returns it now (a full GET)."""
        digest, buffer = hashlib.sha256(), bytearray(chunk)
        try:
            reader = self.client.get_object(self.where.bucket, self.where.key(relative))
            while count := reader.readinto(buffer):
                digest.update(memoryview(buffer)[:count])
        except Exception as error:  # noqa: BLE001
            raise self._error(error, f"reading {relative} to hash it") from None
        return digest.hexdigest()

    def files(self, under: str = "") -> dict[str, int]:
        """Every object under the prefix (or under ``under`` in it), relative key -> bytes."""
        prefix = self.where.key(under)
        prefix = prefix + "/" if prefix and not prefix.endswith("/") else prefix
        found = {}
        try:
            for page in self.client.list_objects(self.where.bucket, prefix):
                for info in page.object_info:
                    found[self.where.relative(f"{S3_SCHEME}{self.where.bucket}/{info.key}")] = info.size
        except StorageError:
            raise
        except Exception as error:  # noqa: BLE001
            raise self._error(error, f"listing {under or 'the prefix'}") from None
        return found

    def glob(self, pattern: str) -> list[str]:
        """Keys matching a glob whose '*' stays within one path segment, like a file system's glob."""
        depth = pattern.count("/")
        return sorted(k for k in self.files() if k.count("/") == depth and fnmatch.fnmatchcase(k, pattern))

    def remove_tree(self, relative: str) -> None:
        """Delete every object under ``relative``, as far as the service lets us (like ``rmtree(ignore_errors=True)``:
        what is left has no manifest, so it is never restored)."""
        with contextlib.suppress(Exception):
            for key in self.files(relative):
                self.client.delete_object(self.where.bucket, self.where.key(key))

    def free_bytes(self) -> int | None:
        return None  # an object store has no free-space figure

    def _error(self, error: BaseException, doing: str) -> StorageError:
        return explain_s3_error(error, self.where, self.settings, doing)


def _not_found(error: BaseException) -> bool:
    """The object is not there (a missing bucket holds no object either)."""
    text = str(error).lower()
    return any(words in text for words in ("not found", "does not exist", "nosuchkey", "nosuchbucket", "404"))


def open_store(location: str | Path, s3: dict[str, Any] | None = None) -> LocalStore | S3Store:
    """The store of a checkpoint location; ``s3``: the settings plan.json recorded (else from the environment)."""
    if not is_s3(location):
        return LocalStore(location)
    settings = S3Settings.from_plan(s3) if s3 else S3Settings.resolve()
    return S3Store(S3Location.parse(str(location)), settings)


# --- checkpoint engines writing to S3 -----------------------------------------------------------

def check_s3_target(engine: str, location: str) -> S3Location:
    """The parsed S3 location, if this installation and ``engine`` can checkpoint to it; else StorageError."""
    where = S3Location.parse(location)
    if importlib.util.find_spec("s3torchconnector") is None:
        raise StorageError(f"checkpoints to {location} need the Python package s3torchconnector: "
                           "pip install -c constraints.txt -e '.[s3]'")
    able = object_store_engines()
    if engine not in able:
        raise StorageError(f"engine {engine!r} writes local files only, so it cannot checkpoint to {location}; "
                           f"with an s3:// --checkpoint-dir use --engine {', '.join(able)}, or give a "
                           "local --checkpoint-dir")
    return where


def engine_for_target(engine: Any, store: LocalStore | S3Store) -> Any:
    """The checkpoint engine that writes to ``store``: ``engine`` itself for a folder (and for ``none``, which
    writes nothing); for S3 the one its ``for_store`` gives (engines registered with ``object_store``)."""
    if not store.remote or not engine.saves_state:
        return engine
    for_store = getattr(engine, "for_store", None)
    if for_store is None:
        raise StorageError(f"engine {type(engine).__name__} cannot write to {store.location}; use --engine "
                           f"{', '.join(object_store_engines())}")
    return for_store(store)


class S3FileEngine:
    """A DeepSpeed checkpoint engine that streams each file to S3 (``torch.save`` into s3torchconnector's
    ``S3Checkpoint`` writer: a multipart upload for objects larger than one part) and loads with ``torch.load``
    from its reader. DeepSpeed's paths ``s3://bucket/prefix/tag/name`` are the object URLs. Everything but
    save, load and makedirs is DeepSpeed's own torch engine's (``inner``)."""

    def __init__(self, inner: Any, store: "S3Store"):
        from s3torchconnector import S3Checkpoint

        settings = store.settings
        config = s3_client(settings).s3client_config
        self.inner, self.store = inner, store
        self.checkpoint = S3Checkpoint(settings.region, endpoint=settings.endpoint, s3client_config=config)
        self.saved: list[FileRecord] = []
        self.loaded: list[FileRecord] = []
        self.sizes: dict[str, int] = {}
        """Object URL -> bytes, from the listing taken before a load."""
        self.durable_at = time.perf_counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """S3 has no folders: a key prefix exists once an object is written under it."""

    def save(self, state_dict: Any, path: str) -> None:
        import torch
        from s3torchconnector import S3Exception

        start = time.perf_counter()
        try:
            with self.checkpoint.writer(path) as writer:
                torch.save(state_dict, writer, _use_new_zipfile_serialization=self.inner.zipfile_serialization)
        except S3Exception as error:  # the CRT's error, said in words, with the object
            raise self.store._error(error, f"uploading {path}") from None
        # leaving the block completed the upload: the object is durable and visible from here on
        self.durable_at = time.perf_counter()
        self.saved.append(FileRecord(path, writer.tell(), self.durable_at - start))

    def load(self, path: str, map_location: Any = None) -> Any:
        import torch
        from s3torchconnector import S3Exception

        start = time.perf_counter()
        try:
            state = torch.load(self.checkpoint.reader(path), map_location=map_location, weights_only=False)
        except S3Exception as error:
            raise self.store._error(error, f"downloading {path}") from None
        self.loaded.append(FileRecord(path, self.sizes.get(path, 0), time.perf_counter() - start))
        return state


class S3TorchEngine(TorchEngine):
    """DeepSpeed's default engine (``torch``) with its files in S3, through DeepSpeed's own save and load.

    Two places where DeepSpeed 0.19.8 reaches the local file system directly, not through its checkpoint
    engine, are answered for S3 (each stated in ``workarounds`` or here):

    - at save, global rank 0 copies ``zero_to_fp32.py`` and ``zero_to_torch.py`` into the tag folder with
      ``shutil.copyfile``: here they are uploaded instead (same bytes; like DeepSpeed's copy they are not
      checkpoint-engine files, so they are not in the manifest);
    - at load, DeepSpeed finds the model files with ``glob.glob`` and checks names with ``os.path.exists``:
      for ``s3://`` paths only, and only during the load, both are answered from one listing of the tag's
      objects, taken before the load (and counted in it). Local paths go to the real functions.

    A file is durable when its upload has completed (inside ``save``), so there is no fsync to wait for.
    """

    def __init__(self, options: Any, store: S3Store):
        super().__init__(options)
        self.store = store
        self._files: S3FileEngine | None = None

    def _s3_files(self, ds_engine: Any) -> S3FileEngine:
        if self._files is None or ds_engine.checkpoint_engine is not self._files:
            self._files = S3FileEngine(ds_engine.checkpoint_engine, self.store)
            ds_engine.checkpoint_engine = self._files
            ds_engine._copy_recovery_script = self._upload_recovery_scripts
        return self._files

    def save(self, ds_engine: Any, save_dir: str, tag: str) -> None:
        files = self._s3_files(ds_engine)
        files.saved.clear()
        self.workarounds = []
        ds_engine.save_checkpoint(save_dir, tag=tag, save_latest=False)

    def _upload_recovery_scripts(self, save_path: str) -> None:
        import deepspeed

        utils = Path(deepspeed.__file__).parent / "utils"
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            self.store.write_durably(self.store.where.relative(f"{save_path.rstrip('/')}/{script}"),
                                     (utils / script).read_text())
        self.workarounds.append("uploaded DeepSpeed's zero_to_fp32.py and zero_to_torch.py to the checkpoint prefix, "
                                "where DeepSpeed puts them in a folder (it copies them with shutil.copyfile, which "
                                "writes local files only)")

    def wait_until_durable(self) -> float:
        return self._files.durable_at if self._files else time.perf_counter()

    def written(self) -> list[FileRecord]:
        return list(self._files.saved) if self._files else []

    def read(self) -> list[FileRecord]:
        return list(self._files.loaded) if self._files else []

    def load(self, ds_engine: Any, load_dir: str, tag: str) -> None:
        files = self._s3_files(ds_engine)
        files.loaded.clear()
        files.sizes = {self.store.url_of(k): size for k, size in self.store.files(tag).items()}
        with s3_paths_from_listing(files.sizes):
            path, _client_state = ds_engine.load_checkpoint(
                load_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag!r} under {load_dir}")


@contextlib.contextmanager
def s3_paths_from_listing(objects: dict[str, int]) -> Iterator[None]:
    """While active, ``glob.glob`` and ``os.path.exists`` answer ``s3://`` paths from ``objects`` (URL -> bytes);
    every other path goes to the real functions."""
    real_glob, real_exists = glob.glob, os.path.exists

    def s3_glob(pattern: Any, *args: Any, **kwargs: Any) -> list[str]:
        if not is_s3(pattern):
            return real_glob(pattern, *args, **kwargs)
        folder = posixpath.dirname(pattern)
        return sorted(u for u in objects if posixpath.dirname(u) == folder and fnmatch.fnmatchcase(u, pattern))

    def s3_exists(path: Any) -> bool:
        if not isinstance(path, str) or not is_s3(path):
            return real_exists(path)
        return path in objects or any(u.startswith(path.rstrip("/") + "/") for u in objects)

    glob.glob, os.path.exists = s3_glob, s3_exists
    try:
        yield
    finally:
        glob.glob, os.path.exists = real_glob, real_exists


# --- the S3 baseline: plain multipart transfers of the same size, both client routes ------------------

BASELINE_PART = 8 * 2**20


def record_s3_baseline(run_dir: Path, location: str, s3: dict[str, Any], size_mib: int) -> Path | None:
    """Measure the S3 location with plain transfers and write ``run_dir/baseline.json``; on a problem print a
    note and return None (a baseline is context for the analysis, never a reason to fail the run).

    The top-level figures are s3torchconnector's (the client the checkpoints go through); ``fsspec`` holds
    the same transfer through s3fs, the fsspec route, for comparison."""
    from restartbench import baseline
    from restartbench.progress import say

    where, settings = S3Location.parse(location), S3Settings.from_plan(s3)
    say(f"storage baseline: a {size_mib} MiB object uploaded (multipart) and downloaded in {where.url}")
    try:
        result = baseline.measure_s3(where.url, size_mib, region=settings.region, endpoint=settings.endpoint,
                                     part_size=BASELINE_PART, path_style=settings.force_path_style)
    except Exception as error:  # noqa: BLE001 - S3Exception, BaselineError: reported, the run goes on
        say(f"note: storage baseline not measured: {redact(str(error))}")
        return None
    result["fsspec"] = _fsspec_or_reason(where, settings, size_mib)
    path = Path(run_dir) / baseline.BASELINE_FILE
    path.write_text(json.dumps(result, indent=2) + "\n")
    fsspec = result["fsspec"]
    say(f"storage baseline: s3torchconnector write {result['write_MBps']:.0f} MB/s, read {result['read_MBps']:.0f} "
        "MB/s; s3fs " + (f"write {fsspec['write_MBps']:.0f} MB/s, read {fsspec['read_MBps']:.0f} MB/s"
                         if "write_MBps" in fsspec else f"not measured ({fsspec['error']})"))
    return path


def _fsspec_or_reason(where: S3Location, settings: S3Settings, size_mib: int) -> dict[str, Any]:
    try:
        return measure_fsspec(where, settings, size_mib)
    except ImportError as missing:
        return {"tool": "s3fs", "error": f"{missing.name} is not installed (pip install s3fs)"}
    except Exception as error:  # noqa: BLE001
        return {"tool": "s3fs", "error": redact(f"{type(error).__name__}: {error}")}


def measure_fsspec(where: S3Location, settings: S3Settings, size_mib: int, part_size: int = BASELINE_PART
                   ) -> dict[str, Any]:
    """The same upload and download as ``baseline.measure_s3`` through s3fs (fsspec's S3 file system):
    written in blocks of ``part_size`` (a multipart upload), read back whole; the object is then deleted."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=settings.endpoint, skip_instance_cache=True,
                           client_kwargs={"region_name": settings.region},
                           config_kwargs={"s3": {"addressing_style": "path" if settings.force_path_style else "auto"}})
    url = where.url_of(f".restartbench-baseline-fsspec-{os.getpid()}")
    size, part = size_mib * 2**20, os.urandom(part_size)
    try:
        start = time.perf_counter()
        with fs.open(url, "wb", block_size=part_size) as handle:
            for offset in range(0, size, part_size):
                handle.write(part[:min(part_size, size - offset)])
        write_s, start = time.perf_counter() - start, time.perf_counter()
        got = 0
        with fs.open(url, "rb", block_size=part_size, cache_type="none") as handle:
            while chunk := handle.read(part_size):
                got += len(chunk)
        read_s = time.perf_counter() - start
    finally:
        with contextlib.suppress(Exception):
            fs.rm(url)
    if got != size:
        raise StorageError(f"{url}: s3fs read back {got} bytes of the {size} written")
    return {"tool": "s3fs", "version": s3fs.__version__, "write_MBps": size / write_s / 1e6,
            "read_MBps": size / read_s / 1e6, "size_bytes": size, "block_size": part_size,
            "write_method": f"s3fs file written in blocks of {part_size} B (multipart), time until closed",
            "read_method": f"s3fs file read in blocks of {part_size} B, no read-ahead cache"}

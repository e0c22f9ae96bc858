"""Object-store locations (``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX``) and how to reach them: the settings a
run records in plan.json (endpoint, region, addressing, client; where the credentials come from, in words, never
their values), resolved from the options and the provider's usual variables, and the check that this installation
has the client a location needs.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

S3_SCHEME, GS_SCHEME = "s3://", "gs://"
OBJECT_SCHEMES = (S3_SCHEME, GS_SCHEME)
DEFAULT_REGION = "us-east-1"
PART_SIZE = 8 * 2**20
"""Bytes per upload part (multipart) and per read of every object-store client, and of the baseline."""
S3_CLIENTS = ("s3torchconnector", "fsspec")


class StorageError(RuntimeError):
    """The checkpoint target cannot be used; the message says what was wrong and what to do."""


def is_s3(location: str | Path | None) -> bool:
    return str(location or "").startswith(S3_SCHEME)


def is_remote(location: str | Path | None) -> bool:
    """An object-store location (s3:// or gs://), not a folder."""
    return str(location or "").startswith(OBJECT_SCHEMES)


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


FSSPEC_FILESYSTEMS = {
    S3_SCHEME: ("s3fs", "s3fs", "S3FileSystem", "pip install -c constraints.txt -e '.[s3]'"),
    # gcsfs's core file system (the JSON API); its experimental zonal-bucket layer probes each bucket over gRPC
    GS_SCHEME: ("gcsfs", "gcsfs.core", "GCSFileSystem", "pip install -c constraints.txt -e '.[gcs]'"),
}
"""scheme -> (package, module, class, how to install it)."""


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

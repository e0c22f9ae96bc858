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

The harness reaches the checkpoint's own files through a store (``stores``). The engines that write to an object
store do so through the store they are given (``CheckpointEngine.for_store``, in ``restartbench.engines``); this
package knows no engine.

Its modules, each importing only those before it:

- ``filehash``: the hash a manifest records for each file (SHA-256 in chunks, hashed on several threads)
- ``hashsum``: ``python -m restartbench.storage.hashsum FILE...`` prints it (imported by nothing)
- ``locations``: object-store locations, the settings that reach them (recorded in plan.json), the client check
- ``explain``: object-store errors said in words, secrets redacted
- ``stores``: ``LocalStore``, ``S3Store``, ``FsspecStore``, ``open_store`` and the preflight ``probe``
- ``remote_baseline``: a plain upload and download through each client, for ``baseline.json``

The names the rest of restartbench uses are imported here: ``from restartbench.storage import open_store``.
"""

from restartbench.storage.explain import explain_error
from restartbench.storage.locations import (
    GS_SCHEME,
    OBJECT_SCHEMES,
    S3_CLIENTS,
    S3_SCHEME,
    GCSSettings,
    ObjectLocation,
    S3Settings,
    StorageError,
    check_remote_location,
    is_remote,
    resolve_settings,
    settings_from_plan,
    settings_to_plan,
)
from restartbench.storage.remote_baseline import record_remote_baseline
from restartbench.storage.stores import LocalStore, ObjectStore, open_store, probe

__all__ = [
    "GS_SCHEME", "OBJECT_SCHEMES", "S3_CLIENTS", "S3_SCHEME", "GCSSettings", "LocalStore", "ObjectLocation",
    "ObjectStore", "S3Settings", "StorageError", "check_remote_location", "explain_error", "is_remote", "open_store",
    "probe", "record_remote_baseline", "resolve_settings", "settings_from_plan", "settings_to_plan",
]

"""Object-store errors said in words: which target, what failed, the likely cause (a missing bucket, refused
credentials, an unreachable endpoint) and what to do, with the AWS secrets of the environment redacted.
"""

from __future__ import annotations

import os
import re

from restartbench.storage.locations import GCSSettings, ObjectLocation, S3Settings, StorageError

SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


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

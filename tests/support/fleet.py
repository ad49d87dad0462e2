"""Mirror nodes sharing one S3 bucket (and, with ``--metadata-url``, one PostgreSQL database), as the fleet tests
start them: each node a real ``python -m mirror serve`` process with its own cache dir (hot tier and metadata index),
as separate machines would have. The fixture that makes one per test is ``fleet`` in ``tests/e2e/conftest.py``."""

from __future__ import annotations

import concurrent.futures
import hashlib
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support import s3_server
from tests.support.mirror_proc import MirrorProcess

MODEL = "acme/tiny-model"
BIG = ("dataset", "acme/big-data", "big.bin")
BIG_URL = "/datasets/acme/big-data/resolve/main/big.bin"
BIG_SIZE = 8 * 2**20
EMULATOR_FILES = {"big_file_size": BIG_SIZE}  # the fleet modules' emulator (see ``emu`` in tests/e2e/conftest.py)
NODE_START_SECONDS = 90.0  # a fleet node's startup deadline: several start at once on a loaded 2-core box


class Fleet:
    """Mirror nodes on one bucket prefix (a fresh prefix per test: a fresh, empty shared store)."""

    def __init__(self, s3: s3_server.S3Server, tmp: Path) -> None:
        self.s3 = s3
        self.tmp = tmp
        self.prefix = f"fleet-{uuid.uuid4().hex[:8]}/"
        self.nodes: list[MirrorProcess] = []

    def node(self, upstream: str, *extra: str, env: dict[str, str] | None = None, s3: bool = True) -> MirrorProcess:
        return self.start(1, upstream, *extra, env=env, s3=s3)[0]

    def start(self, count: int, upstream: str, *extra: str, env: dict[str, str] | None = None,
              s3: bool = True) -> list[MirrorProcess]:
        """``count`` nodes, started in parallel (each takes a second or two to come up)."""
        storage = ["--storage", "s3", "--s3-endpoint", self.s3.endpoint, "--s3-bucket", self.s3.bucket,
                   "--s3-prefix", self.prefix] if s3 else []
        procs = []
        for _ in range(count):
            name = f"node{len(self.nodes)}"
            (self.tmp / name).mkdir(parents=True, exist_ok=True)
            proc = MirrorProcess(upstream, self.tmp / name / "cache", *storage, *extra,
                                 env={**self.s3.env, **(env or {})})
            if s3:  # as deployed: each node tells the others where to stream its fills in progress from
                proc.env.setdefault("HF_MIRROR_NODE_URL", proc.url)
            self.nodes.append(proc)
            procs.append(proc)
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda proc: proc.start(timeout=NODE_START_SECONDS), procs))
        return procs

    def bucket_keys(self) -> set[str]:
        listing = self.s3.client().list_objects_v2(Bucket=self.s3.bucket, Prefix=self.prefix)
        return {item["Key"][len(self.prefix):] for item in listing.get("Contents", [])}

    def stop(self) -> None:
        for proc in self.nodes:
            if proc.proc is not None:  # a node left frozen (SIGSTOP) by a failed test must not hold its stop for 30 s
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def get(url: str, timeout: float = 60) -> tuple[int, bytes, dict[str, str]]:
    with httpx.Client(timeout=timeout) as client:
        response = client.get(url)
        return response.status_code, response.content, dict(response.headers)


def node_status(node: MirrorProcess) -> dict[str, Any]:
    return httpx.get(node.url + "/api/mirror/status", timeout=5).json()


def fill_written(node: MirrorProcess) -> int:
    return max((f["written"] for f in node_status(node)["fills"]), default=0)


def fill_active(node: MirrorProcess) -> bool:
    return bool(node_status(node)["fills"])


def wait_until(condition: Any, what: str, timeout: float = 20) -> None:
    """Poll ``condition`` until it is true; fail the test, naming ``what`` it waited for, after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)

"""Test helpers: run the mirror as a real subprocess, and run real HF clients in subprocesses.

The clients read HF_ENDPOINT at import time, so every client run is a fresh ``python -c`` with its own env.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MirrorProcess:
    """``python -m mirror serve`` on a free port; stopped by PID."""

    def __init__(self, upstream: str, cache_dir: Path, *extra: str, port: int | None = None,
                 env: dict[str, str] | None = None, python: str = sys.executable, cwd: Path = REPO_ROOT) -> None:
        self.upstream = upstream
        self.cache_dir = cache_dir
        self.extra = list(extra)
        self.port = port or free_port()
        self.env = env or {}
        self.python = python
        self.cwd = cwd  # the source tree whose ``mirror`` package runs (bench/head.py runs an older one beside it)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = cache_dir.parent / f"mirror-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MirrorProcess:  # generous: a loaded 2-core CI box starts slowly
        env = {**os.environ, **self.env}
        env.pop("HF_TOKEN", None)
        cmd = [self.python, "-m", "mirror", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--upstream", self.upstream, "--cache-dir", str(self.cache_dir), *self.extra]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mirror exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"mirror did not become healthy:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def flushed_log(self, timeout: float = 30.0) -> str:
        """The log once the access log's batch holding every request answered so far is written (lines go out in
        batches): a request marked with an id of its own is sent, and its line waited for. One worker only (each
        worker writes its own batches)."""
        marker = f"log-flushed-{os.urandom(6).hex()}"
        httpx.get(self.url + "/healthz", headers={"x-request-id": marker}, timeout=10)
        wait_for(lambda: marker in self.log(), timeout)
        return self.log()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self._log.close()
        self.proc = None

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> MirrorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client_env(endpoint: str, hf_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(
        HF_ENDPOINT=endpoint, HF_HOME=str(hf_home), HF_HUB_CACHE=str(hf_home / "hub"),
        HF_DATASETS_CACHE=str(hf_home / "datasets"), HF_HUB_DISABLE_TELEMETRY="1", HF_UPDATE_DOWNLOAD_COUNTS="0",
        HF_HUB_DISABLE_XET="1", TOKENIZERS_PARALLELISM="false", HF_HUB_ETAG_TIMEOUT="10",
    )
    env.update(extra)
    return env


# What pyarrow's dataset-scanner threads print when they abort the interpreter's teardown after a streamed parquet load
# (SIGABRT; apache/arrow issue 45214, datasets issue 7566): a client-side crash after the work and its JSON line.
_ARROW_TEARDOWN_ABORT = "terminate called without an active exception"


def run_client(code: str, endpoint: str, hf_home: Path, *, python: str = sys.executable, timeout: float = 120,
               **extra_env: str) -> object:
    """Run client code in a fresh interpreter; the code prints one JSON document as its last stdout line. Only
    pyarrow's known abort in the teardown after that line is let pass (an exception in the code still fails)."""
    hf_home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([python, "-c", code], env=client_env(endpoint, hf_home, **extra_env),
                          capture_output=True, text=True, timeout=timeout, cwd=hf_home)
    arrow_abort = (proc.returncode == -signal.SIGABRT and proc.stderr.strip().endswith(_ARROW_TEARDOWN_ABORT)
                   and "Traceback" not in proc.stderr)
    if proc.returncode != 0 and not (arrow_abort and proc.stdout.strip()):
        raise AssertionError(f"client failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def metric(mirror: MirrorProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples on the mirror's /metrics (``name`` as written there, e.g.
    ``hf_mirror_upstream_bytes_total``), read with prometheus_client's own parser; 0 when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(mirror.url + "/metrics", timeout=5).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def blob(cache: Path, etag: str) -> Path:
    """Where a local cache keeps a blob."""
    return cache / "blobs" / etag[:2] / etag


async def download(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, float, float]:
    """(status, sha256, seconds to first body byte, total seconds)."""
    began = time.monotonic()
    first = 0.0
    digest = hashlib.sha256()
    async with httpx.AsyncClient(timeout=60) as client, client.stream("GET", url, headers=headers) as response:
        async for chunk in response.aiter_raw():
            if not first:
                first = time.monotonic() - began
            digest.update(chunk)
    return response.status_code, digest.hexdigest(), first, time.monotonic() - began


def wait_for(predicate: object, timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")

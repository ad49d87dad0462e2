"""The servers a self-contained bench (and the demo) runs: the sample Hub and mirrors in front of it, each a
subprocess on a free 127.0.0.1 port, started when needed and stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class Service:
    """A server process: its command, its URL (port chosen up front, so passes can be pointed at it before it
    runs), its log; ``proc`` while it runs."""

    name: str
    url: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> None:
        """Start it and wait for ``/healthz`` (the sample Hub may first generate its dataset: hence the timeout)."""
        if self.proc is not None:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=self.log.parent, env=service_env(), stdout=out,
                                         stderr=subprocess.STDOUT)
        _wait_healthy(self.proc, self.url, self.log, timeout)

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the process has used so far, from ``/proc``; None when not running or
        unreadable (not Linux)."""
        if self.proc is None:
            return None
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def stat_cpu_s(stat: Path) -> float:
    """CPU seconds (user + system) in a ``/proc`` stat file (``/proc/PID/stat``, or a thread's
    ``/proc/PID/task/TID/stat``). Raises OSError when unreadable."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """A process's CPU seconds (user + system) from ``/proc/PID/stat``; None when unreadable."""
    try:
        return stat_cpu_s(Path(f"/proc/{pid}/stat"))
    except (OSError, IndexError, ValueError):
        return None


def sample_hub(root: Path, *, size: str | None, seed: int, data_dir: Path | None, rows: int = 4000,
               write_local: Path | None = None, shards: int | None = None) -> Service:
    port = free_port()
    cmd = [sys.executable, "-m", "mirror.demo.sample_hub", "--host", "127.0.0.1", "--port", str(port),
           "--rows", str(rows)]
    if size:
        cmd += ["--size", size, "--seed", str(seed)] + (["--data-dir", str(data_dir)] if data_dir else [])
        cmd += ["--shards", str(shards)] if shards is not None else []
    if write_local:
        cmd += ["--write-local", str(write_local)]
    return Service("sample hub", f"http://127.0.0.1:{port}", cmd, root / "sample-hub.log")


def mirror(root: Path, name: str, upstream: str) -> Service:
    """A mirror with its own empty cache under ``root``: a cold mirror each time one is made."""
    port = free_port()
    cmd = [sys.executable, "-m", "mirror", "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream",
           upstream, "--cache-dir", str(root / f"cache-{name}"), "--log-level", "warning"]
    return Service(f"mirror {name}", f"http://127.0.0.1:{port}", cmd, root / f"{name}.log")


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f}s:\n{log.read_text(errors='replace')}")

"""Start the emulator as a real process on 127.0.0.1 and drive it from a test (stats, faults, outages)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.hub_emulator.fixtures import Fixtures
from tests.support.mirror_proc import REPO_ROOT, free_port


class EmulatorHandle:
    """A running emulator: ``url`` (Hub host), ``cdn_url`` (LFS host), ``files`` (the ground truth)."""

    def __init__(self, workdir: Path, *, page_size: int = 1000, big_file_size: int = 8 << 20,
                 url_ttl: float = 300.0, huge_file_size: int = 0) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        # Also writes the big file (and hashes the generated one) before the server starts.
        self.files = Fixtures(workdir, big_file_size, huge_file_size)
        self.port, self.cdn_port, self.viewer_port = free_port(), free_port(), free_port()
        self.args = ["--page-size", str(page_size), "--big-file-size", str(big_file_size), "--url-ttl", str(url_ttl),
                     "--huge-file-size", str(huge_file_size)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "emulator.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def viewer_url(self) -> str:
        """The dataset viewer's host (what ``datasets-server.<hub>`` is on the real Hub)."""
        return f"http://127.0.0.1:{self.viewer_port}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.cdn_port}"

    def start(self, timeout: float = 30.0) -> EmulatorHandle:
        """Start (or restart after ``stop``) on the same ports; the fixtures are the same, stats start at zero."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child from here on
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hub_emulator", "--port", str(self.port),
             "--cdn-port", str(self.cdn_port), "--viewer-port", str(self.viewer_port), "--workdir", str(self.workdir),
             *self.args],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited: {self.log_path.read_text(errors='replace')}")
            try:
                httpx.get(f"{self.url}/_emulator/stats", timeout=1).raise_for_status()
                httpx.get(f"{self.cdn_url}/_emulator/stats", timeout=1).raise_for_status()
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("emulator did not start")

    def stop(self) -> None:
        """Take the Hub down (both hosts refuse connections) until ``start``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _control(self, action: str, payload: dict[str, Any] | None = None) -> Any:
        response = httpx.post(f"{self.url}/_emulator/{action}", json=payload or {}, timeout=10)
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        """``counts`` (per route kind, ``cdn_requests_with_auth``), ``fetches`` (file bodies served per
        ``type:repo/path``), ``tokens`` (Hub-host requests per bearer token), ``bytes_served``, ``log``,
        ``requests`` (see :meth:`requests`)."""
        return self._control("stats")

    def requests(self) -> list[dict[str, str | None]]:
        """Every request received since the last reset (the last 2000), both hosts, oldest first, control routes
        excluded: ``{"host": "hub"|"cdn", "method", "path" (raw path, plus ``?query`` when present), "auth" (the
        whole ``Authorization`` header, or None), "range", "ua" (the ``User-Agent``: the mirror's is ``hf-mirror/...``;
        a client's would say ``hf_hub`` or ``hf_xet``)}``."""
        return list(self._control("stats")["requests"])


    def cdn_spans(self) -> list[tuple[int, int]]:
        """The byte spans ``[start, end)`` the CDN host was asked for (ranged GETs), sorted."""
        out = []
        for request in self.requests():
            if request["host"] == "cdn" and request["method"] == "GET":
                first, _, last = (request.get("range") or "").removeprefix("bytes=").partition("-")
                out.append((int(first), int(last) + 1))
        return sorted(out)
    def reset_stats(self) -> None:
        self._control("reset")

    def set_faults(self, **faults: Any) -> None:
        """Replace the faults: ``throttle_bps``, ``drop_after_bytes`` + ``drop_count``, ``status_burst`` +
        ``burst_status`` + ``retry_after`` (a 429 burst also sends ``RateLimit``/``RateLimit-Policy``),
        ``corrupt_next``, ``latency_s``, ``expire_urls=True``, ``down``, ``echo_auth_in_error`` (Hub host answers
        400 quoting the request's ``Authorization`` and a cookie in ``X-Error-Message`` and the JSON body)."""
        self._control("faults", faults)

    def clear_faults(self) -> None:
        self._control("faults", {})

    def push(self, repo_type: str, repo_id: str, branch: str, changes: dict[str, bytes]) -> str:
        """A new commit on ``branch`` upstream (and in ``files``); returns its sha."""
        remote = self._control("push", {"type": repo_type, "repo": repo_id, "branch": branch,
                                        "changes": {p: d.decode("latin-1") for p, d in changes.items()}})["sha"]
        local = self.files.push(repo_type, repo_id, branch, changes)
        assert remote == local, (remote, local)
        return local

    def create_repo(self, repo_type: str, repo_id: str, files: dict[str, bytes], *, tags: list[str] | None = None,
                    private: bool = False) -> str:
        """A new repo upstream (and in ``files``) with one commit on ``main``, listed by the list API from now on;
        returns the commit sha."""
        remote = self._control("create-repo", {"type": repo_type, "repo": repo_id, "tags": tags or [],
                                               "private": private,
                                               "files": {p: d.decode("latin-1") for p, d in files.items()}})["sha"]
        local = self.files.create_repo(repo_type, repo_id, files, tags, private)
        assert remote == local, (remote, local)
        return local

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        """Delete a repo upstream (and from ``files``): its routes answer RepoNotFound, the list API omits it."""
        self._control("delete-repo", {"type": repo_type, "repo": repo_id})
        self.files.delete_repo(repo_type, repo_id)

    def fetch_count(self, repo_type: str, repo_id: str, path: str) -> int:
        return int(self.stats()["fetches"].get(f"{repo_type}:{repo_id}/{path}", 0))


@contextlib.contextmanager
def run_emulator(workdir: Path, *, page_size: int = 1000, big_file_size: int = 8 << 20,
                 url_ttl: float = 300.0, huge_file_size: int = 0) -> Iterator[EmulatorHandle]:
    handle = EmulatorHandle(workdir, page_size=page_size, big_file_size=big_file_size, url_ttl=url_ttl,
                            huge_file_size=huge_file_size)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()

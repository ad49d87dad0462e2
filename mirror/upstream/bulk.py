"""The bulk transport: a fill's bytes read by a worker thread through urllib3, in large blocks.

httpx parses a body in 64 KiB pieces on the event loop and tops out near 300 MB/s; urllib3 in a thread reads the
socket in blocks of a MiB at several GB/s, and the event loop stays free for serving.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpx
import urllib3

from mirror import __version__
from mirror.errors import UpstreamUnavailable

USER_AGENT = f"hf-mirror/{__version__}"  # on every request the mirror sends upstream


class BulkBody:
    """A response body read by a worker thread in large blocks, straight from the socket. Blocking methods."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._done = False

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes, waiting for all of them (``b""`` at the end)."""
        return self._read(self._response.read, size)

    def read_some(self, size: int) -> bytes:
        """Up to ``size`` bytes of what has arrived, with one socket read: a slow upstream is not waited for."""
        return self._read(self._response.read1, size)

    def _read(self, method: Callable[..., bytes], size: int) -> bytes:
        try:
            data = method(size, decode_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise UpstreamUnavailable(f"upstream read failed: {type(exc).__name__}: {exc}") from exc
        if not data:
            self._done = True
        return data

    def abort(self) -> None:
        """Wake a thread blocked in :meth:`read` (safe from any thread)."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if not self._done:
            self._response.close()  # a half-read connection must never go back to the pool
        self._response.release_conn()


@dataclass(frozen=True)
class BulkResponse:
    """A bulk GET's final answer inside the upstream package: its head, and the body a thread reads."""

    status_code: int
    headers: httpx.Headers
    body: BulkBody
    url: str  # where the bytes come from, after redirects

    @property
    def reason_phrase(self) -> str:
        return httpx.codes.get_reason_phrase(self.status_code)

    async def aclose(self) -> None:
        self.body.close()


class BulkPools:
    """urllib3 connection pools, one per proxy the environment names (``HTTPS_PROXY``/``NO_PROXY``, as httpx)."""

    def __init__(self, *, connect_timeout: float, read_timeout: float) -> None:
        self._options: dict[str, Any] = dict(
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            retries=False, maxsize=64, ca_certs=certifi.where(), headers={"user-agent": USER_AGENT},
        )
        self._pools: dict[str | None, urllib3.PoolManager] = {}

    def for_url(self, url: str) -> urllib3.PoolManager:
        proxy = _env_proxy(url)
        pool = self._pools.get(proxy)
        if pool is None:
            pool = self._pools.setdefault(proxy, urllib3.ProxyManager(proxy, **self._options)
                                          if proxy else urllib3.PoolManager(**self._options))
        return pool

    def clear(self) -> None:
        for pool in self._pools.values():
            pool.clear()


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``), as httpx uses."""
    scheme = urlsplit(url).scheme
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(urlsplit(url).hostname or ""):
        return proxy
    return None

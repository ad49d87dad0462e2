"""Talks to the upstream Hub (or another mirror) and its CDN hosts.

Two transports, one policy. Metadata and small bodies go through one shared ``httpx.AsyncClient`` (connection pool,
explicit timeouts). The bulk bytes of a fill go through urllib3 in a worker thread (:class:`BulkBody`): it reads
the socket in large blocks at several GB/s where httpx's per-64-KiB async parsing tops out near 300 MB/s, and the
event loop stays free for serving. Redirects are followed by hand so
that the caller's ``Authorization`` goes to the upstream's own origin and never to a CDN host, and so that a
cross-origin redirect's own headers (``X-Linked-Size``, ``X-Linked-Etag``, ``X-Repo-Commit``) can be read, as the
Hub puts the metadata of LFS files on its 302. Upstream errors become the exceptions of :mod:`mirror.errors`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin, urlsplit

import certifi
import httpx
import urllib3

from mirror import hf
from mirror.config import Settings
from mirror.errors import (
    EntryNotFound,
    HubError,
    MirrorError,
    UpstreamTimeout,
    UpstreamUnavailable,
    scrub_secrets,
)
from mirror.metrics import Metrics

log = logging.getLogger("hf_mirror.upstream")

_REDIRECTS = (301, 302, 303, 307, 308)
_RETRY_STATUSES = (429, 500, 502, 503, 504)
_MAX_HOPS = 10
_MAX_ERROR_BODY = 64 * 1024  # an error answer is read this far at most (its message is all the mirror needs)
# Headers of a 429 that tell the client how long to wait (huggingface_hub reads all three).
_RATE_LIMIT_HEADERS = ("Retry-After", "RateLimit", "RateLimit-Policy")

RepoGuard = Callable[[hf.RepoRef], None]  # raises when the caller may not read a repo an upstream redirect leads to


class UrlExpired(MirrorError):
    """A signed CDN URL was refused (403/410): resolve the file again for a fresh one."""


@dataclass(frozen=True)
class UpstreamFileMeta:
    commit: str
    etag: str
    size: int
    cdn_url: str | None  # absolute URL of a cross-origin redirect (the CDN), never shown to clients


@dataclass(frozen=True)
class UpstreamAnswer:
    """A whole, size-bounded upstream answer (API JSON, errors): the mirror's own value, not a transport object."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    reason_phrase: str = ""

    def json(self) -> object:
        return json.loads(self.content)

    async def aclose(self) -> None:
        """Nothing to release: the body is read (retries close every answer alike)."""


@dataclass(frozen=True)
class RelayBody:
    """An upstream answer relayed as it arrives, never held whole: status, headers and the body's chunks."""

    status_code: int
    headers: httpx.Headers
    chunks: AsyncIterator[bytes]


async def _read_capped(response: httpx.Response, cap: int, what: str) -> UpstreamAnswer:
    """Read a streamed response into an :class:`UpstreamAnswer`, refusing one larger than ``cap`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise UpstreamUnavailable(f"Upstream's answer for {what} is larger than the mirror relays ({cap} bytes)")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > cap:
            raise UpstreamUnavailable(f"Upstream's answer for {what} is larger than the mirror relays ({cap} bytes)")
    return UpstreamAnswer(response.status_code, response.headers, bytes(body), response.reason_phrase)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _next_hop(current: str, status: int, location: str | None, follow: str) -> str | None:
    """Where a redirect leads, or ``None`` when this response is the final one (``follow``: all/same-origin/none)."""
    if status not in _REDIRECTS or not location or follow == "none":
        return None
    target = urljoin(current, location)
    if follow == "same-origin" and _origin(target) != _origin(current):
        return None
    return target


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``), as httpx uses."""
    scheme = urlsplit(url).scheme
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(urlsplit(url).hostname or ""):
        return proxy
    return None


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


class _BulkStream(httpx.AsyncByteStream):
    """Lets a bulk response pass for an ``httpx.Response``: errors and checks are then handled in one place."""

    def __init__(self, body: BulkBody) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await asyncio.to_thread(self.body.read, 64 * 1024):
            yield chunk

    async def aclose(self) -> None:
        self.body.close()


def bulk_body(response: httpx.Response) -> BulkBody:
    """The thread-readable body of a response opened by ``stream_file(..., bulk=True)``."""
    body: BulkBody = response.extensions["hf_mirror_bulk_body"]
    return body


class UpstreamClient:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.base = settings.upstream
        self.display = settings.upstream_display  # the URL as messages show it: never its credentials
        self._secrets = tuple(secret for secret in (settings.upstream_token, settings.jwt_secret) if secret)
        self.origin = _origin(self.base)
        self.settings = settings
        self.metrics = metrics
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                settings.read_timeout, connect=settings.connect_timeout, pool=settings.connect_timeout
            ),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
            follow_redirects=False,
            headers={"user-agent": "hf-mirror/0.1"},
        )
        self._bulk_options = dict(
            timeout=urllib3.Timeout(connect=settings.connect_timeout, read=settings.read_timeout),
            retries=False, maxsize=64, ca_certs=certifi.where(), headers={"user-agent": "hf-mirror/0.1"},
        )
        self._bulk_pools: dict[str | None, urllib3.PoolManager] = {}
        self.healthy: bool | None = None  # last observed state, for the status page
        self.last_error: str | None = None

    async def aclose(self) -> None:
        await self.client.aclose()
        for pool in self._bulk_pools.values():
            pool.clear()

    def _headers(self, url: str, token: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if token and _origin(url) == self.origin:
            headers["authorization"] = f"Bearer {token}"
        return headers

    async def _send(
        self, method: str, url: str, *, token: str | None, headers: dict[str, str] | None = None,
        follow: str = "all", stream: bool = False, data: list[tuple[str, str]] | None = None,
        guard: RepoGuard | None = None,
    ) -> tuple[httpx.Response, str]:
        """Send one request, following redirects by hand. ``follow``: ``all``, ``same-origin`` or ``none``.

        Returns the final response and its URL. Auth is only sent to the upstream's origin. A redirect within the
        upstream to another repo (a renamed repo, a case variant) passes ``guard`` under that repo's id first.
        """
        current = url
        body: bytes | None = None
        if data is not None:
            body = urlencode(data).encode()
            headers = {**(headers or {}), "content-type": "application/x-www-form-urlencoded"}
        for _ in range(_MAX_HOPS):
            request = self.client.build_request(
                method, current, headers=self._headers(current, token, headers), content=body
            )
            started = time.perf_counter()
            try:
                response = await self.client.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                self._mark(False, f"timeout: {exc!r}")
                raise UpstreamTimeout(f"Upstream {self.display} timed out ({type(exc).__name__})") from exc
            except httpx.HTTPError as exc:
                self._mark(False, f"{type(exc).__name__}: {exc}")
                # 504, like a timeout: the gateway could not get an answer (502 is kept for bad answers).
                raise UpstreamTimeout(f"Upstream {self.display} is unreachable: {type(exc).__name__}") from exc
            self._observe(response.status_code, started)
            target = _next_hop(current, response.status_code, response.headers.get("location"), follow)
            if target is None:
                return response, current
            await response.aclose()
            if guard is not None and _origin(target) == self.origin:
                moved_to = hf.repo_of_path(urlsplit(target).path)
                if moved_to is not None:
                    guard(moved_to)
            current = target
            if method == "POST" and response.status_code == 303:
                method, body = "GET", None
        raise UpstreamUnavailable(f"Upstream {self.display} redirected too many times")

    def _send_bulk(self, url: str, token: str | None, headers: dict[str, str],
                   observe: bool = True) -> tuple[httpx.Response, str]:
        """Blocking (run it in a thread): a GET whose body :class:`BulkBody` reads; redirects as in :meth:`_send`.

        ``observe``: count the request as upstream traffic (metrics and the status page's health).
        """
        current = url
        for _ in range(_MAX_HOPS):
            proxy = _env_proxy(current)
            pool = self._bulk_pools.get(proxy)
            if pool is None:
                pool = self._bulk_pools.setdefault(proxy, urllib3.ProxyManager(proxy, **self._bulk_options)
                                                   if proxy else urllib3.PoolManager(**self._bulk_options))
            started = time.perf_counter()
            try:
                raw = pool.request("GET", current, headers=self._headers(current, token, headers), redirect=False,
                                   preload_content=False, decode_content=False)
            except urllib3.exceptions.HTTPError as exc:
                if not observe:  # a peer node: its address is no secret (a CDN URL's signature is)
                    raise UpstreamUnavailable(f"{current} is unreachable: {type(exc).__name__}") from exc
                self._mark(False, f"{type(exc).__name__}: {exc}")
                raise UpstreamTimeout(f"Upstream {self.display} is unreachable: {type(exc).__name__}") from exc
            if observe:
                self._observe(raw.status, started)
            target = _next_hop(current, raw.status, raw.headers.get("location"), "all")
            if target is None:
                body = BulkBody(raw)
                response = httpx.Response(raw.status, headers=list(raw.headers.items()), stream=_BulkStream(body),
                                          request=httpx.Request("GET", current),
                                          extensions={"hf_mirror_bulk_body": body})
                return response, current
            raw.drain_conn()
            raw.release_conn()
            current = target
        raise UpstreamUnavailable(f"Upstream {self.display} redirected too many times")

    def _observe(self, status: int, started: float) -> None:
        self.metrics.upstream_latency.observe(time.perf_counter() - started)
        self.metrics.upstream_requests.labels(status=str(status // 100) + "xx").inc()
        if status < 500:
            self._mark(True, None)

    def _mark(self, healthy: bool, error: str | None) -> None:
        self.healthy = healthy
        if error:
            self.last_error = self.scrub(error)

    def scrub(self, text: str) -> str:
        """``text`` without credentials: the service token, bearer values, URL passwords, cookies."""
        return scrub_secrets(text, self._secrets)

    def error(self, response: httpx.Response | UpstreamAnswer, *, resolve: bool) -> MirrorError:
        """The Hub-shaped error for an upstream error answer, scrubbed of credentials (an upstream may echo them)."""
        error = hub_error(response, resolve=resolve)
        error.message = self.scrub(error.message)
        error.args = (error.message,)
        return error

    async def _with_retries(self, attempt: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """Retry 429/5xx with bounded backoff (``Retry-After`` honoured up to ``retry_backoff_max``).

        A 429 is tried once more at most, then relayed with its rate-limit headers: the client knows its own budget,
        and hammering a rate-limited upstream only spends the whole mirror's.
        """
        retries = self.settings.upstream_retries
        for number in range(retries + 1):
            response = await attempt()
            if response.status_code not in _RETRY_STATUSES or number == retries:
                return response
            if response.status_code == 429 and number >= 1:
                return response
            delay = min(0.25 * 2**number, self.settings.retry_backoff_max)
            retry_after = response.headers.get("retry-after")
            if retry_after and retry_after.isdigit():
                delay = min(float(retry_after), self.settings.retry_backoff_max)
            await response.aclose()
            log.info("upstream answered %s, retrying in %.2fs", response.status_code, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # --- files ----------------------------------------------------------------------------------------------------

    async def head_file(self, repo: hf.RepoRef, revision: str, path: str, token: str | None,
                        guard: RepoGuard | None = None) -> UpstreamFileMeta:
        """The metadata of a file, the way ``hf_hub_download`` reads it: follows same-origin redirects only."""
        url = self.base + repo.resolve_path(revision, path)

        async def attempt() -> httpx.Response:
            response, _ = await self._send(
                "HEAD", url, token=token, headers={"accept-encoding": "identity"}, follow="same-origin", guard=guard
            )
            return response

        response = await self._with_retries(attempt)
        if response.status_code >= 400:
            raise self.error(response, resolve=True)
        commit = response.headers.get(hf.H_REPO_COMMIT)
        etag = hf.parse_etag(response.headers.get(hf.H_LINKED_ETAG) or response.headers.get("etag"))
        size_header = response.headers.get(hf.H_LINKED_SIZE)
        if size_header is None and response.status_code not in _REDIRECTS:
            size_header = response.headers.get("content-length")
        if not commit or not etag or size_header is None or not size_header.isdigit():
            raise UpstreamUnavailable(
                f"Upstream {self.display} answered {response.status_code} for {path!r} without the file metadata "
                "(X-Repo-Commit, ETag, size)"
            )
        cdn_url = None
        location = response.headers.get("location")
        if response.status_code in _REDIRECTS and location:
            cdn_url = urljoin(url, location)
        return UpstreamFileMeta(commit=commit, etag=etag, size=int(size_header), cdn_url=cdn_url)

    @asynccontextmanager
    async def stream_file(
        self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int = 0, end: int | None = None,
        cdn_url: str | None = None, bulk: bool = False,
    ) -> AsyncIterator[tuple[httpx.Response, str]]:
        """Open the bytes ``start..end`` (inclusive) of a file; yields (response, the URL the bytes came from).

        ``bulk``: the body is for a worker thread to read with :func:`bulk_body` (the fill engine's path).

        With ``cdn_url`` the CDN is asked directly (saving the Hub a request on resume); a refusal there raises
        :class:`UrlExpired` so the caller re-resolves. The response is 200 or 206, checked to start at ``start``.
        """
        headers = {"accept-encoding": "identity"}
        if start or end is not None:
            headers["range"] = f"bytes={start}-{'' if end is None else end}"
        url = cdn_url or self.base + repo.resolve_path(commit, path)

        async def attempt() -> httpx.Response:
            if bulk:
                response, final = await asyncio.to_thread(self._send_bulk, url, token, headers)
            else:
                response, final = await self._send("GET", url, token=token, headers=headers, stream=True)
            response.extensions["hf_mirror_final_url"] = final
            return response

        response = await self._with_retries(attempt)
        final_url: str = response.extensions.get("hf_mirror_final_url", url)
        try:
            if response.status_code in (403, 410) and _origin(final_url) != self.origin:
                raise UrlExpired(f"signed URL refused with {response.status_code}")
            if response.status_code >= 400:
                raise self.error(await _read_error(response), resolve=True)
            if start and response.status_code != 206:
                raise UpstreamUnavailable(f"Upstream ignored Range for {path!r} (status {response.status_code})")
            yield response, final_url
        finally:
            await response.aclose()

    @asynccontextmanager
    async def stream_peer(self, url: str, token: str, start: int) -> AsyncIterator[BulkBody]:
        """Open another mirror node's fill in progress (``/_mirror/fills/<etag>``) from byte ``start``."""
        headers = {"accept-encoding": "identity", hf.H_PEER_TOKEN.lower(): token}
        if start:
            headers["range"] = f"bytes={start}-"
        response, _ = await asyncio.to_thread(self._send_bulk, url, None, headers, False)
        try:
            if response.status_code != (206 if start else 200):
                raise UpstreamUnavailable(f"peer {url} answered {response.status_code}")
            yield bulk_body(response)
        finally:
            await response.aclose()

    # --- API ------------------------------------------------------------------------------------------------------

    async def api(
        self, method: str, path_qs: str, token: str | None, form: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None, guard: RepoGuard | None = None,
    ) -> UpstreamAnswer:
        """An API request, its body read up to ``max_api_body``. ``path_qs``: the raw path plus query string."""
        url = self.base + path_qs

        async def attempt() -> UpstreamAnswer:
            response, _ = await self._send(method, url, token=token, headers=headers, data=form, stream=True,
                                           guard=guard)
            try:
                return await _read_capped(response, self.settings.max_api_body, path_qs.split("?")[0])
            finally:
                await response.aclose()

        return await self._with_retries(attempt)  # type: ignore[arg-type,return-value]

    @asynccontextmanager
    async def relay(self, path_qs: str, token: str | None) -> AsyncIterator[RelayBody]:
        """A read route relayed as it arrives (bounded memory); errors are raised Hub-shaped, scrubbed."""
        url = self.base + path_qs

        async def attempt() -> httpx.Response:
            response, _ = await self._send("GET", url, token=token, stream=True, follow="same-origin")
            return response

        response = await self._with_retries(attempt)  # type: ignore[arg-type]
        try:
            if response.status_code >= 400:
                raise self.error(await _read_error(response), resolve=False)
            yield RelayBody(response.status_code, response.headers, response.aiter_bytes())
        finally:
            await response.aclose()


async def _read_error(response: httpx.Response) -> UpstreamAnswer:
    """An error answer's head and the start of its body (enough for the message; a huge one is not held)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= _MAX_ERROR_BODY:
            break
    return UpstreamAnswer(response.status_code, response.headers, bytes(body[:_MAX_ERROR_BODY]),
                          response.reason_phrase)


def hub_error(response: httpx.Response | UpstreamAnswer, *, resolve: bool) -> MirrorError:
    """Map an upstream error response to a HubError that keeps its status, code, message and commit."""
    code = response.headers.get(hf.H_ERROR_CODE)
    message = response.headers.get(hf.H_ERROR_MESSAGE) or _json_error(response) or response.reason_phrase
    commit = response.headers.get(hf.H_REPO_COMMIT)
    status = response.status_code
    if status in _RETRY_STATUSES and status != 429:
        return UpstreamUnavailable(f"Upstream answered {status}: {message}")
    if code == "EntryNotFound":
        return EntryNotFound(commit, message)
    if code is None:  # The mirror always sends a code (clients need one over http://); infer the Hub's.
        code = {401: "RepoNotFound", 403: "GatedRepo", 404: "EntryNotFound" if resolve else "RepoNotFound"}.get(
            status
        )
        if code == "EntryNotFound":
            return EntryNotFound(commit, message)
    headers = {hf.H_REPO_COMMIT: commit} if commit else {}
    if status == 429:
        headers.update({name: response.headers[name] for name in _RATE_LIMIT_HEADERS if name in response.headers})
    return HubError(status, code, message, headers=headers)


def _json_error(response: httpx.Response | UpstreamAnswer) -> str | None:
    try:
        body = response.json()
    except (ValueError, httpx.ResponseNotRead, UnicodeDecodeError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, list):
        return "; ".join(map(str, error))
    return str(error) if error else None

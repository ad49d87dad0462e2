"""The upstream client: talks to the upstream Hub (or another mirror) and its CDN hosts.

Two transports, one policy. Metadata and small bodies go through one shared ``httpx.AsyncClient`` (connection pool,
explicit timeouts). The bulk bytes of a fill go through urllib3 in a worker thread (:mod:`mirror.upstream.bulk`).
Redirects are followed by hand so that the caller's ``Authorization`` goes to the upstream's own origin and never to
a CDN host, and so that a cross-origin redirect's own headers (``X-Linked-Size``, ``X-Linked-Etag``,
``X-Repo-Commit``) can be read, as the Hub puts the metadata of LFS files on its 302. Every answer leaves as a value
of :mod:`mirror.upstream.values`; upstream errors become the exceptions of :mod:`mirror.errors`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from urllib.parse import urlencode, urljoin, urlsplit

import httpx
import urllib3

from mirror import hf
from mirror.config import Settings
from mirror.errors import MirrorError, UpstreamTimeout, UpstreamUnavailable, scrub_secrets
from mirror.metrics import Metrics
from mirror.upstream.bulk import USER_AGENT, BulkBody, BulkPools, BulkResponse
from mirror.upstream.errors import hub_error
from mirror.upstream.rate import RateLimit, sync_rate_now
from mirror.upstream.retry import A, with_retries
from mirror.upstream.values import (
    FileBody,
    RangeIgnored,
    RelayBody,
    UpstreamAnswer,
    UpstreamFileMeta,
    UrlExpired,
)

log = logging.getLogger("hf_mirror.upstream")

_REDIRECTS = (301, 302, 303, 307, 308)
# Bulk requests wait a round trip (two, through a redirect) in a thread: their own pool, so that many fills at
# once (a snapshot of many small files; the windows of large ones) never queue in the loop's small default one.
_SEND_POOL = ThreadPoolExecutor(max_workers=128, thread_name_prefix="upstream-send")
_MAX_HOPS = 10
_MAX_ERROR_BODY = 64 * 1024  # an error answer is read this far at most (its message is all the mirror needs)

RepoGuard = Callable[[hf.RepoRef], None]  # raises when the caller may not read a repo an upstream redirect leads to


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
            headers={"user-agent": USER_AGENT},
        )
        self._bulk = BulkPools(connect_timeout=settings.connect_timeout, read_timeout=settings.read_timeout)
        # Every fill's bytes pass this bucket (``upstream_rate``; the sync command switches to ``sync_rate``).
        self.rate = RateLimit(lambda: float(settings.upstream_rate))
        self.healthy: bool | None = None  # last observed state, for the status page
        self.last_error: str | None = None

    def use_sync_rate(self) -> None:
        """This process is the nightly sync: its fills run under ``sync_rate`` during ``sync_hours``."""
        self.rate = RateLimit(lambda: sync_rate_now(self.settings))

    async def aclose(self) -> None:
        await self.client.aclose()
        self._bulk.clear()

    def _headers(self, url: str, token: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        # The mirror's own User-Agent on every request: urllib3 replaces a pool's default headers with a request's.
        headers = {"user-agent": USER_AGENT, **(extra or {})}
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
                   observe: bool = True) -> BulkResponse:
        """Blocking (run it in a thread): a GET whose body :class:`BulkBody` reads; redirects as in :meth:`_send`.

        ``observe``: count the request as upstream traffic (metrics and the status page's health).
        """
        current = url
        for _ in range(_MAX_HOPS):
            pool = self._bulk.for_url(current)
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
                return BulkResponse(raw.status, httpx.Headers(list(raw.headers.items())), BulkBody(raw), current)
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

    async def _with_retries(self, attempt: Callable[[], Awaitable[A]]) -> A:
        return await with_retries(attempt, retries=self.settings.upstream_retries,
                                  backoff_max=self.settings.retry_backoff_max)

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
        return UpstreamFileMeta(commit=commit, etag=etag, size=int(size_header), cdn_url=cdn_url,
                                xet_hash=response.headers.get("x-xet-hash"))

    @asynccontextmanager
    async def open_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int = 0,
                        cdn_url: str | None = None, end: int | None = None) -> AsyncIterator[FileBody]:
        """Open the bytes of a file from ``start`` (to ``end``, exclusive) for a fill: a body a worker thread reads
        in large blocks.

        With ``cdn_url`` the CDN is asked directly (saving the Hub a request on resume); a refusal there raises
        :class:`UrlExpired` so the caller re-resolves. The answer is checked to be 200, or 206 from ``start``
        (always 206 for a window with an ``end``: :class:`RangeIgnored` otherwise).
        """
        headers = self._range_headers(start, None if end is None else end - 1)
        hub_url = self.base + repo.resolve_path(commit, path)
        url = cdn_url or hub_url

        async def attempt() -> BulkResponse:
            return await _in_send_pool(self._send_bulk, url, token, headers)

        response = await self._with_retries(attempt)
        try:
            self._check_signed_url(response.status_code, response.url)
            if response.status_code >= 400:
                body = await asyncio.to_thread(response.body.read, _MAX_ERROR_BODY)
                answer = UpstreamAnswer(response.status_code, response.headers, body, response.reason_phrase)
                raise self.error(answer, resolve=True)
            if end is not None and response.status_code != 206:
                raise RangeIgnored(f"Upstream ignored Range for {path!r} (status {response.status_code})")
            self._check_range(response.status_code, start, path)
            yield FileBody(response.body, None if response.url == hub_url else response.url, self.rate)
        finally:
            await response.aclose()

    @asynccontextmanager
    async def stream_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int, end: int,
                          chunk_size: int) -> AsyncIterator[RelayBody]:
        """Relay the bytes ``start..end`` (inclusive) of a file as they arrive, in chunks of up to ``chunk_size``.

        A transport failure in the middle of the body is raised as :class:`UpstreamUnavailable`.
        """
        headers = self._range_headers(start, end)
        url = self.base + repo.resolve_path(commit, path)

        async def attempt() -> httpx.Response:
            response, _ = await self._send("GET", url, token=token, headers=headers, stream=True)
            return response

        response = await self._with_retries(attempt)
        try:
            self._check_signed_url(response.status_code, str(response.request.url))
            if response.status_code >= 400:
                raise self.error(await _read_error(response), resolve=True)
            self._check_range(response.status_code, start, path)
            yield RelayBody(response.status_code, response.headers, _chunks(response.aiter_raw(chunk_size)))
        finally:
            await response.aclose()

    @staticmethod
    def _range_headers(start: int, end: int | None) -> dict[str, str]:
        headers = {"accept-encoding": "identity"}
        if start or end is not None:
            headers["range"] = f"bytes={start}-{'' if end is None else end}"
        return headers

    def _check_signed_url(self, status: int, final_url: str) -> None:
        if status in (403, 410) and _origin(final_url) != self.origin:
            raise UrlExpired(f"signed URL refused with {status}")

    @staticmethod
    def _check_range(status: int, start: int, path: str) -> None:
        if start and status != 206:
            raise UpstreamUnavailable(f"Upstream ignored Range for {path!r} (status {status})")

    @asynccontextmanager
    async def stream_peer(self, url: str, token: str, start: int) -> AsyncIterator[BulkBody]:
        """Open another mirror node's fill in progress (``/_mirror/fills/<etag>``) from byte ``start``."""
        headers = {"accept-encoding": "identity", hf.H_PEER_TOKEN.lower(): token}
        if start:
            headers["range"] = f"bytes={start}-"
        response = await _in_send_pool(self._send_bulk, url, None, headers, False)
        try:
            if response.status_code != (206 if start else 200):
                raise UpstreamUnavailable(f"peer {url} answered {response.status_code}")
            yield response.body
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

        return await self._with_retries(attempt)

    @asynccontextmanager
    async def relay(self, path_qs: str, token: str | None) -> AsyncIterator[RelayBody]:
        """A read route relayed as it arrives (bounded memory); errors are raised Hub-shaped, scrubbed."""
        url = self.base + path_qs

        async def attempt() -> httpx.Response:
            response, _ = await self._send("GET", url, token=token, stream=True, follow="same-origin")
            return response

        response = await self._with_retries(attempt)
        try:
            if response.status_code >= 400:
                raise self.error(await _read_error(response), resolve=False)
            yield RelayBody(response.status_code, response.headers, response.aiter_bytes())
        finally:
            await response.aclose()


async def _in_send_pool(function: Callable[..., BulkResponse], *args: object) -> BulkResponse:
    return await asyncio.get_running_loop().run_in_executor(_SEND_POOL, function, *args)


async def _read_error(response: httpx.Response) -> UpstreamAnswer:
    """An error answer's head and the start of its body (enough for the message; a huge one is not held)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= _MAX_ERROR_BODY:
            break
    return UpstreamAnswer(response.status_code, response.headers, bytes(body[:_MAX_ERROR_BODY]),
                          response.reason_phrase)


async def _chunks(raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A body's chunks, a transport failure on the way raised as the mirror's own error."""
    try:
        async for chunk in raw:
            yield chunk
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(f"upstream read failed: {type(exc).__name__}: {exc}") from exc

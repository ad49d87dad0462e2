"""The connection to the upstream Hub (or another mirror) and its CDN hosts: two transports, one policy.

Metadata and small bodies go through one shared ``httpx.AsyncClient`` (connection pool, explicit timeouts). The bulk
bytes of a fill go through urllib3 in a worker thread (:mod:`mirror.upstream.bulk`). Redirects are followed by hand
so that the caller's ``Authorization`` goes to the upstream's own origin and never to a CDN host, and so that a
cross-origin redirect's own headers (``X-Linked-Size``, ``X-Linked-Etag``, ``X-Repo-Commit``) can be read, as the Hub
puts the metadata of LFS files on its 302. It keeps upstream's health for the status page and scrubs credentials from
every message; upstream errors become the exceptions of :mod:`mirror.errors`. The requests themselves are
:class:`mirror.upstream.client.UpstreamClient`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
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
from mirror.upstream.values import UpstreamAnswer

log = logging.getLogger("hf_mirror.upstream")

REDIRECTS = (301, 302, 303, 307, 308)
# Bulk requests wait a round trip (two, through a redirect) in a thread: their own pool, so that many fills at
# once (a snapshot of many small files; the windows of large ones) never queue in the loop's small default one.
_SEND_POOL = ThreadPoolExecutor(max_workers=128, thread_name_prefix="upstream-send")
_MAX_HOPS = 10
MAX_ERROR_BODY = 64 * 1024  # an error answer is read this far at most (its message is all the mirror needs)

RepoGuard = Callable[[hf.RepoRef], None]  # raises when the caller may not read a repo an upstream redirect leads to


async def read_capped(response: httpx.Response, cap: int, what: str) -> UpstreamAnswer:
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


def origin_of(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _next_hop(current: str, status: int, location: str | None, follow: str) -> str | None:
    """Where a redirect leads, or ``None`` when this response is the final one (``follow``: all/same-origin/none)."""
    if status not in REDIRECTS or not location or follow == "none":
        return None
    target = urljoin(current, location)
    if follow == "same-origin" and origin_of(target) != origin_of(current):
        return None
    return target


class UpstreamConnection:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.base = settings.upstream
        self.display = settings.upstream_display  # the URL as messages show it: never its credentials
        self._secrets = tuple(secret for secret in (settings.upstream_token, settings.jwt_secret) if secret)
        self.origin = origin_of(self.base)
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
        if token and origin_of(url) == self.origin:
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
            if guard is not None and origin_of(target) == self.origin:
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
        if not healthy:  # no answer at all (refused, reset, timed out): the status class "error"
            self.metrics.upstream_requests.labels(status="error").inc()

    def scrub(self, text: str) -> str:
        """``text`` without credentials: the service token, bearer values, URL passwords, cookies."""
        return scrub_secrets(text, self._secrets)

    def error(self, response: httpx.Response | UpstreamAnswer, *, resolve: bool, infer: bool = True) -> MirrorError:
        """The Hub-shaped error for an upstream error answer, scrubbed of credentials (an upstream may echo them)."""
        error = hub_error(response, resolve=resolve, infer=infer)
        error.message = self.scrub(error.message)
        error.args = (error.message,)
        return error

    async def _with_retries(self, attempt: Callable[[], Awaitable[A]]) -> A:
        return await with_retries(attempt, retries=self.settings.upstream_retries,
                                  backoff_max=self.settings.retry_backoff_max)


async def in_send_pool(function: Callable[..., BulkResponse], *args: object) -> BulkResponse:
    return await asyncio.get_running_loop().run_in_executor(_SEND_POOL, function, *args)


async def read_error(response: httpx.Response) -> UpstreamAnswer:
    """An error answer's head and the start of its body (enough for the message; a huge one is not held)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= MAX_ERROR_BODY:
            break
    return UpstreamAnswer(response.status_code, response.headers, bytes(body[:MAX_ERROR_BODY]),
                          response.reason_phrase)


async def checked_chunks(raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A body's chunks, a transport failure on the way raised as the mirror's own error."""
    try:
        async for chunk in raw:
            yield chunk
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(f"upstream read failed: {type(exc).__name__}: {exc}") from exc

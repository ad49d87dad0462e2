"""``HEAD``/``GET`` of ``/{prefix}{repo}/resolve/{rev}/{path}`` and ``/api/resolve-cache/...``.

A plain ASGI handler (no framework objects): it is the hot path of the mirror. The mirror answers with the bytes
itself (200/206), carrying the headers the clients read on the Hub's responses, so no ``Location`` ever leaves the
mirror and no CDN address or Xet header reaches a client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from urllib.parse import quote

from mirror import hf
from mirror.access import Caller
from mirror.errors import MirrorError
from mirror.fill import Fill, FillManager
from mirror.index import FileEntry
from mirror.metrics import Metrics
from mirror.routes.common import Receive, Scope, Send, header, parse_range, send_error
from mirror.routes.sendfile import send_fd_range, send_file_range
from mirror.service import MirrorService, ResolvedFile
from mirror.upstream import UpstreamClient

log = logging.getLogger("hf_mirror.resolve")

# A Range starting this far past the bytes a fill has written is fetched from upstream directly instead of waiting.
_RANGE_PASSTHROUGH_GAP = 16 * 1024 * 1024


@functools.lru_cache(maxsize=8192)  # entries are immutable values: precompute the headers of hot files
def _entry_headers(entry: FileEntry, outcome: str) -> tuple[tuple[bytes, bytes], ...]:
    name = entry.path.rsplit("/", 1)[-1]
    headers = [
        (b"x-repo-commit", entry.commit.encode()),
        (b"etag", f'"{entry.etag}"'.encode()),
        (b"accept-ranges", b"bytes"),
        (b"content-type", b"application/octet-stream"),
        (b"content-disposition",
         f"inline; filename*=UTF-8''{quote(name)}; filename=\"{quote(name, safe=' ')}\"".encode("latin-1")),
        (hf.H_MIRROR_CACHE.lower().encode(), outcome.encode()),
    ]
    if entry.lfs:
        headers += [(b"x-linked-etag", f'"{entry.etag}"'.encode()), (b"x-linked-size", str(entry.size).encode())]
    if outcome == "stale":
        headers.append((b"warning", b'110 - "Response is stale"'))
    return tuple(headers)


def file_headers(resolved: ResolvedFile, outcome: str | None = None) -> list[tuple[bytes, bytes]]:
    """The Hub's headers for a file (commit, etag, linked size/etag, disposition) plus the mirror's cache outcome."""
    return list(_entry_headers(resolved.entry, outcome or resolved.outcome))


class ResolveHandler:
    def __init__(self, service: MirrorService, fills: FillManager, upstream: UpstreamClient, metrics: Metrics,
                 *, chunk_size: int, accel_redirect: str | None) -> None:
        self.service = service
        self.fills = fills
        self.upstream = upstream
        self.metrics = metrics
        self.chunk_size = chunk_size
        self.accel_redirect = accel_redirect

    async def __call__(self, scope: Scope, receive: Receive, send: Send, target: hf.ResolveTarget,
                       caller: Caller) -> str:
        """Serve the request; returns the outcome for the access log."""
        method = scope["method"]
        head = method == "HEAD"
        try:
            resolved = await self.service.resolve_file(target, caller)
            entry = resolved.entry
            byte_range = parse_range(header(scope, b"range"), entry.size)
            range_headers: list[tuple[bytes, bytes]] = []
            if byte_range is None:
                start, end, status = 0, entry.size - 1, 200
            else:
                start, end = byte_range
                status = 206
                range_headers.append((b"content-range", f"bytes {start}-{end}/{entry.size}".encode()))
            length = end - start + 1
            if head:
                outcome = resolved.outcome
                if outcome == "hit" and not await self.service.has_blob(entry.etag):
                    outcome = "miss"  # the metadata is known, the bytes would have to be fetched
                headers = (file_headers(resolved, outcome) + range_headers
                           + [(b"content-length", str(length).encode())])
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                self.metrics.requests.labels(route="resolve", outcome=outcome).inc()
                return outcome
            source = await self.service.open_blob(resolved, caller)
        except MirrorError as exc:
            self.metrics.requests.labels(route="resolve", outcome="error").inc()
            await send_error(send, exc, head=head)
            return "error"
        if resolved.outcome == "stale":
            outcome = "stale"
        else:
            outcome = "hit" if source.path else ("miss" if source.fill else "passthrough")
        self.metrics.requests.labels(route="resolve", outcome=outcome).inc()
        headers = file_headers(resolved, outcome)
        if source.path and self.accel_redirect:
            # nginx serves the bytes (sendfile, Range); the app keeps every decision.
            location = f"{self.accel_redirect.rstrip('/')}/{entry.etag[:2]}/{entry.etag}"
            headers.append((b"x-accel-redirect", location.encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return outcome
        headers += range_headers + [(b"content-length", str(length).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if length == 0:
            await send({"type": "http.response.body", "body": b""})
            return outcome
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(watch_disconnect(receive, disconnected))
        try:
            if source.path:
                sent = await send_file_range(send, source.path, start, length, self.chunk_size, disconnected,
                                             raw_send=scope.get("hf_mirror.raw_send"))
                self.metrics.bytes_served.labels(source="cache").inc(sent)
            elif source.fill is None:  # no room on disk: relayed, not stored
                await self._send_upstream_range(send, resolved, caller, start, end, disconnected)
            else:
                fill = source.fill
                if start > fill.written + _RANGE_PASSTHROUGH_GAP and not self.service.settings.offline:
                    await self._send_upstream_range(send, resolved, caller, start, end, disconnected)
                else:
                    sent = await send_fill_range(scope, send, self.fills, fill, start, length, self.chunk_size,
                                                 disconnected)
                    self.metrics.bytes_served.labels(source="fill").inc(sent)
        except Exception as exc:  # noqa: BLE001 - headers are gone: the only honest signal left is a cut connection
            # Returning with the body incomplete makes the server close the connection: the client sees a
            # truncated transfer (and resumes with Range), never a short file that looks whole.
            log.warning("aborting response for %s %s: %s", target.repo.key, target.path, exc)
            return "aborted"
        finally:
            watcher.cancel()
        return outcome

    async def _send_upstream_range(self, send: Send, resolved: ResolvedFile, caller: Caller, start: int, end: int,
                                   disconnected: asyncio.Event) -> None:
        """A Range far beyond what the fill has: relay it from upstream while the fill goes on."""
        entry = resolved.entry
        async with self.upstream.stream_file(resolved.repo, entry.commit, entry.path, caller.token,
                                             start=start, end=end) as (response, _):
            remaining = end - start + 1
            async for data in response.aiter_raw(self.chunk_size):
                if disconnected.is_set():
                    return
                data = data[:remaining]
                remaining -= len(data)
                await send({"type": "http.response.body", "body": data, "more_body": True})
                self.metrics.bytes_served.labels(source="upstream").inc(len(data))
                if remaining <= 0:
                    break
            if remaining > 0:
                raise MirrorError(f"upstream range ended {remaining} bytes short")
        await send({"type": "http.response.body", "body": b""})


async def send_fill_range(scope: Scope, send: Send, fills: FillManager, fill: Fill, start: int, length: int,
                          chunk_size: int, disconnected: asyncio.Event) -> int:
    """Send bytes of a fill in progress as they are written (its last byte once verified); returns bytes sent."""
    async with fills.reading(fill) as fd:
        return await send_fd_range(send, fd, start, length, chunk_size, disconnected,
                                   raw_send=scope.get("hf_mirror.raw_send"),
                                   available=functools.partial(fills.readable, fill))


async def watch_disconnect(receive: Receive, event: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            event.set()
            return


"""``HEAD``/``GET`` of ``/{prefix}{repo}/resolve/{rev}/{path}`` and ``/api/resolve-cache/...``.

A plain ASGI handler (no framework objects): it is the hot path of the mirror. The mirror answers with the bytes
itself (200/206), carrying the headers the clients read on the Hub's responses, so no ``Location`` ever leaves the
mirror and no CDN address or Xet header reaches a client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from urllib.parse import quote

from prometheus_client import Counter

from mirror import hf
from mirror.access import Caller
from mirror.asgi import Receive, Scope, Send, watch_disconnect
from mirror.errors import MirrorError, PolicyBlocked
from mirror.fill import FillManager
from mirror.layout import blob_name
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import header, outcome_headers, parse_range, send_error
from mirror.routes.sendfile import send_file_range, send_fill_range
from mirror.service import MirrorService
from mirror.service.answers import Cached, FileEntry, Filling, Relay, ResolvedFile

log = logging.getLogger("hf_mirror.resolve")



@functools.lru_cache(maxsize=8192)  # entries are immutable values: precompute the headers of hot files
def _entry_headers(entry: FileEntry, outcome: Outcome) -> tuple[tuple[bytes, bytes], ...]:
    name = entry.path.rsplit("/", 1)[-1]
    headers = [
        (b"x-repo-commit", entry.commit.encode()),
        (b"etag", f'"{entry.etag}"'.encode()),
        (b"accept-ranges", b"bytes"),
        (b"content-type", b"application/octet-stream"),
        (b"content-disposition",
         f"inline; filename*=UTF-8''{quote(name)}; filename=\"{quote(name, safe=' ')}\"".encode("latin-1")),
        *outcome_headers(outcome),
    ]
    if entry.lfs:
        headers += [(b"x-linked-etag", f'"{entry.etag}"'.encode()), (b"x-linked-size", str(entry.size).encode())]
    return tuple(headers)


def file_headers(resolved: ResolvedFile, outcome: Outcome | None = None) -> list[tuple[bytes, bytes]]:
    """The Hub's headers for a file (commit, etag, linked size/etag, disposition) plus the mirror's cache outcome."""
    return list(_entry_headers(resolved.entry, outcome or resolved.outcome))


class ResolveHandler:
    """Sends what the service decided: a cached file, a fill in progress, or bytes it relays from upstream."""

    def __init__(self, service: MirrorService, fills: FillManager, metrics: Metrics,
                 *, chunk_size: int, accel_redirect: str | None,
                 xet_headers: Callable[[Scope, ResolvedFile], list[tuple[bytes, bytes]]] | None = None) -> None:
        self.service = service
        self.fills = fills
        self.metrics = metrics
        self.chunk_size = chunk_size
        self.accel_redirect = accel_redirect
        self._counted: dict[Outcome, Counter] = {}  # the labelled counters, made on first use (as labels() would)
        # Xet (mirror.routes.xet): X-Xet-Hash and the mirror's xet-auth link for files upstream marks as Xet-backed.
        self.xet_headers = xet_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send, target: hf.ResolveTarget,
                       caller: Caller) -> Outcome:
        """Serve the request; returns the outcome for the access log."""
        method = scope["method"]
        head = method == "HEAD"
        resolved: ResolvedFile | None = None
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
                if self.service.admission is not None:  # the admission policy (a GET's: in open_blob)
                    await self.service.admit_bytes(resolved, caller)
                outcome = await self.service.head_outcome(resolved)
                headers = (file_headers(resolved, outcome) + range_headers
                           + [(b"content-length", str(length).encode())])
                if self.xet_headers is not None:
                    headers += self.xet_headers(scope, resolved)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                self._count(outcome)
                return outcome
            source = await self.service.open_blob(resolved, caller, start, end)
        except PolicyBlocked as exc:
            # The file is known: its refusal names the commit too (the audit log's event of it, and the client's).
            if resolved is not None:
                exc.headers.setdefault(hf.H_REPO_COMMIT, resolved.entry.commit)
            self._count(Outcome.ERROR)
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        except MirrorError as exc:
            self._count(Outcome.ERROR)
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        outcome = source.outcome
        self._count(outcome)
        headers = file_headers(resolved, outcome)
        if self.xet_headers is not None:
            headers += self.xet_headers(scope, resolved)
        if self.accel_redirect and type(source) is Cached:
            # nginx serves the bytes (sendfile, Range); the app keeps every decision.
            location = f"{self.accel_redirect.rstrip('/')}/{blob_name(entry.etag)}"
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
            with self.service.reading(entry.etag):  # no node of a fleet evicts it from the shared store meanwhile
                if type(source) is Cached:
                    sent = await send_file_range(send, source.path, start, length, self.chunk_size, disconnected,
                                                 raw_send=scope.get("hf_mirror.raw_send"))
                    self.metrics.bytes_served.labels(source="cache").inc(sent)
                elif type(source) is Filling:
                    sent = await send_fill_range(scope, send, self.fills, source.fill, start, length,
                                                 self.chunk_size, disconnected)
                    self.metrics.bytes_served.labels(source="fill").inc(sent)
                else:
                    assert isinstance(source, Relay)
                    await self._send_relay(send, source, disconnected)
        except Exception as exc:  # noqa: BLE001 - headers are gone: the only honest signal left is a cut connection
            # Returning with the body incomplete makes the server close the connection: the client sees a
            # truncated transfer (and resumes with Range), never a short file that looks whole.
            log.warning("aborting response for %s %s: %s", target.repo.key, target.path, exc)
            return Outcome.ABORTED
        finally:
            watcher.cancel()
        return outcome

    def _count(self, outcome: Outcome) -> None:
        counter = self._counted.get(outcome)
        if counter is None:
            counter = self._counted[outcome] = self.metrics.requests.labels(route="resolve", outcome=outcome)
        counter.inc()

    async def _send_relay(self, send: Send, relay: Relay, disconnected: asyncio.Event) -> None:
        """Bytes the service relays from upstream (no disk room, or a Range far beyond the fill)."""
        counter = self.metrics.bytes_served.labels(source="upstream")
        async with self.service.relay_file(relay, self.chunk_size) as chunks:
            remaining = relay.end - relay.start + 1
            async for data in chunks:
                if disconnected.is_set():
                    return
                data = data[:remaining]
                remaining -= len(data)
                await send({"type": "http.response.body", "body": data, "more_body": True})
                counter.inc(len(data))
                if remaining <= 0:
                    break
            if remaining > 0:
                raise MirrorError(f"upstream range ended {remaining} bytes short")
        await send({"type": "http.response.body", "body": b""})

"""``GET /_mirror/fills/<etag>``: a fill in progress, for the other nodes of a fleet on one bucket.

The node that holds a fill's lease publishes its ``--node-url`` and a random token in the lease object. A node that
follows the fill streams it from here into its own partial file, so its clients get bytes as fast as the leader's
do instead of waiting for the commit. Like a client of the fill, a peer gets the last byte only once the blob is
verified. Without the token of a fill in progress on this node the answer is a 404 that tells nothing more, and
the token is only readable by whoever can read the bucket (which holds the blobs anyway). A peer's connection may
land on any worker process of the node; the query names the file, so that a worker which is not the one filling
follows its sibling's partial file and serves the peer all the same.

A node that is asked a Range of a file another node fills (a sparse fill there: the windows of ranged reads) relays
the Range from here instead of fetching it upstream again: a bounded ``Range`` is answered from the windows this
node holds, and the ones it lacks are fetched here once (:meth:`~mirror.fill.FillManager.peer_for_range`).

Once that sparse fill paused (its lease given back), the windows it left are recorded in the fleet's database with a
token of their own (:mod:`mirror.metadata.held`): a bounded Range they hold wholly is answered from the partial file
to that token (no upstream fetch here); anything else is the same 404 as any unknown fill.
"""

from __future__ import annotations

import asyncio
import logging
import re

from mirror import hf
from mirror.asgi import Receive, Scope, Send, watch_disconnect
from mirror.errors import EntryNotFound, MethodNotAllowed, MirrorError
from mirror.fill import Fill, FillManager, FillSpec
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import header, parse_range, query_pairs, send_error
from mirror.routes.sendfile import send_fd_range, send_fill_range

log = logging.getLogger("hf_mirror.peer")

_TOKEN_HEADER = hf.H_PEER_TOKEN.lower().encode()
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # blob names: git sha1 or sha256, nothing path-like


_NO_FILL = "No fill of this blob is in progress on this node"  # the one 404 of this route, whatever the reason


def _bounded(range_header: str | None) -> bool:
    """A Range with an end (a Range read relayed for another node's reader), not a follower's ``bytes=N-``."""
    return bool(range_header) and not range_header.rstrip().endswith("-")


class PeerFillHandler:
    def __init__(self, fills: FillManager, metrics: Metrics, *, chunk_size: int) -> None:
        self.fills = fills
        self.metrics = metrics
        self.chunk_size = chunk_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send, etag: str) -> Outcome:
        fill = self.fills.get(etag)
        token = header(scope, _TOKEN_HEADER)
        try:
            if scope["method"] != "GET":
                raise MethodNotAllowed(f"{scope['method']} is not allowed here")
            if not _ETAG.fullmatch(etag):
                fill = None
            elif fill is None and token:
                fill = await self._join(scope, etag, token)
            if fill is None or not token or not await self.fills.opens_to_peer(fill, token):
                if token and _ETAG.fullmatch(etag):
                    # No fill of it that this token opens: the windows a paused sparse fill left, as recorded.
                    return await self._send_held(scope, receive, send, etag, token)
                raise EntryNotFound(None, _NO_FILL)
            size = fill.spec.size
            range_header = header(scope, b"range")
            byte_range = parse_range(range_header, size)
        except MirrorError as exc:
            await send_error(send, exc)
            return Outcome.ERROR
        start, end = byte_range or (0, size - 1)
        if byte_range is not None and fill.sparse and _bounded(range_header):
            # A bounded Range relayed for another node's reader (FillManager.peer_for_range): served from the windows
            # held; the ones not held yet are asked at once, with the read-ahead, as for a Range of our own clients
            # (a follower's open-ended stream asks them as it goes, as before).
            fill.ask(start, end)
        headers = [(b"content-type", b"application/octet-stream"), (b"etag", f'"{etag}"'.encode()),
                   (b"content-length", str(end - start + 1).encode())]
        if byte_range is not None:
            headers.append((b"content-range", f"bytes {start}-{end}/{size}".encode()))
        await send({"type": "http.response.start", "status": 206 if byte_range else 200, "headers": headers})
        if size == 0:
            await send({"type": "http.response.body", "body": b""})
            return Outcome.PEER
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(watch_disconnect(receive, disconnected))
        try:
            sent = await send_fill_range(scope, send, self.fills, fill, start, end - start + 1, self.chunk_size,
                                         disconnected)
            self.metrics.bytes_served.labels(source="peer").inc(sent)
        except Exception as exc:  # noqa: BLE001 - cut the connection: the peer resumes or falls back
            log.info("peer stream of %s ended early: %s", etag, exc)
            return Outcome.ABORTED
        finally:
            watcher.cancel()
        return Outcome.PEER

    async def _send_held(self, scope: Scope, receive: Receive, send: Send, etag: str, token: str) -> Outcome:
        """A bounded Range of the windows this node's sparse partial file holds, for the token its record of them
        carries (:meth:`~mirror.fill.FillManager.reading_held`): from the file only, never from upstream. Anything
        else is the 404 of any unknown fill (the asking node fills the Range itself)."""
        range_header = header(scope, b"range")
        try:
            size = int(dict(query_pairs(scope)).get("size", ""))
        except ValueError:
            size = -1
        try:
            byte_range = parse_range(range_header, size) if size > 0 and _bounded(range_header) else None
        except MirrorError:
            byte_range = None
        if byte_range is None:
            await send_error(send, EntryNotFound(None, _NO_FILL))
            return Outcome.ERROR
        start, end = byte_range
        async with self.fills.reading_held(etag, token, start, end) as fd:
            if fd is None:
                await send_error(send, EntryNotFound(None, _NO_FILL))
                return Outcome.ERROR
            await send({"type": "http.response.start", "status": 206, "headers": [
                (b"content-type", b"application/octet-stream"), (b"etag", f'"{etag}"'.encode()),
                (b"content-length", str(end - start + 1).encode()),
                (b"content-range", f"bytes {start}-{end}/{size}".encode())]})
            disconnected = asyncio.Event()
            watcher = asyncio.create_task(watch_disconnect(receive, disconnected))
            try:
                sent = await send_fd_range(send, fd, start, end - start + 1, self.chunk_size, disconnected,
                                           raw_send=scope.get("hf_mirror.raw_send"))
                self.metrics.bytes_served.labels(source="peer").inc(sent)
            except Exception as exc:  # noqa: BLE001 - cut the connection: the peer falls back
                log.info("peer read of the held windows of %s ended early: %s", etag, exc)
                return Outcome.ABORTED
            finally:
                watcher.cancel()
        return Outcome.PEER

    async def _join(self, scope: Scope, etag: str, token: str) -> Fill | None:
        """No fill of ``etag`` in this worker: follow the one a sibling worker leads, as the query describes it."""
        query = dict(query_pairs(scope))
        try:
            repo_type, _, repo_id = query["repo"].partition(":")
            spec = FillSpec(hf.RepoRef(hf.RepoType(repo_type), repo_id), query["commit"], query["path"], etag,
                            int(query["size"]))
        except (KeyError, ValueError):
            return None
        if not hf.is_commit(spec.commit) or spec.size < 0:
            return None
        return await self.fills.join_for_peer(spec, token)

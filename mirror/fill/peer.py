"""Following a fill that another process leads: on this host by its partial file, on another node of a fleet by
streaming it from that node (whose URL and a token the lease publishes) into our own partial file, hashed too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from mirror.errors import IntegrityError, MirrorError, UpstreamUnavailable
from mirror.fill.copy import Hashing, Span, held_windows, on_disk_prefix
from mirror.fill.copy import copy as copy_body
from mirror.fill.state import Fill, FillSpec
from mirror.fill.threads import FillThreads
from mirror.integrity import BlobHasher
from mirror.layout import CacheLayout
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore, Lease, PeerAddress
from mirror.upstream import UpstreamClient

log = logging.getLogger("hf_mirror.fill")

PEER_ROUTE = "/_mirror/fills/"  # + etag: a fill in progress, for the other nodes (mirror.routes.peer)
_FOLLOW_POLL = 0.02  # seconds between looks at a partial file another process writes
_PEER_TRIES = 3  # peer streams that end without progress before a follower just waits for the commit


def fill_url(peer: PeerAddress, spec: FillSpec) -> str:
    """The peer route of ``spec``'s fill on ``peer``. What the fill is rides along in the query, so that any worker
    process of the peer node can follow it for us."""
    query = urlencode({"repo": spec.repo.key, "commit": spec.commit, "path": spec.path, "size": spec.size})
    return f"{peer.url}{PEER_ROUTE}{spec.etag}?{query}"


class PeerCopy:
    """A follower's copy of a fill streamed from the node holding its lease; kept across reconnects."""

    def __init__(self, etag: str, size: int) -> None:
        self.hasher = BlobHasher(etag, size)
        self.offset = 0
        self.failures = 0
        self.verified = False


class Follower:
    """Follows the fills that another process (on this host, or on another node) holds the lease of."""

    def __init__(self, store: BlobStore, upstream: UpstreamClient, metrics: Metrics, threads: FillThreads, *,
                 chunk_size: int, node_url: str | None) -> None:
        self.store = store
        self.upstream = upstream
        self.metrics = metrics
        self.threads = threads
        self.chunk_size = chunk_size
        self.node_url = node_url

    async def follow(self, fill: Fill, copy: PeerCopy) -> None:
        """Another process holds the lease: follow its fill until it commits or its lease goes away."""
        watch = self.store.watch_lease
        if watch is not None:
            await self._follow_told(fill, copy, watch)
            return
        etag = fill.spec.etag
        lease_check_every = max(1, int(0.5 / _FOLLOW_POLL))
        ticks = 0
        lease = await self.store.read_lease(etag)
        while lease is not None:
            if await self.store.stat(etag) is not None:
                return
            if not self._on_another_node(lease):
                self._same_node(fill)
            elif lease.peer is not None and not copy.verified and copy.failures < _PEER_TRIES:
                await self._copy_from_peer(fill, lease.peer, copy)
            ticks += 1
            if ticks % lease_check_every == 0:
                lease = await self.store.read_lease(etag)
            await asyncio.sleep(_FOLLOW_POLL)

    async def _follow_told(self, fill: Fill, copy: PeerCopy, watch: Any) -> None:
        """Follow with a store that announces lease changes (a fleet database): no polling of the bucket. Each round
        waits for an announcement (a grant, release or commit anywhere) or for the lease's expiry on the store's
        clock, whichever is first; a peer stream in progress is cut then, so a frozen holder's followers move on
        within its lease, never held by a stalled stream."""
        etag = fill.spec.etag
        holder: PeerAddress | None = None
        while True:
            async with watch(etag) as change:  # subscribed before reading: no change is missed in between
                lease = await self.store.read_lease(etag)
                if lease is None or await self.store.stat(etag) is not None:
                    return
                if lease.peer != holder:  # a new holder (a takeover): stream from it, from where we are
                    holder, copy.failures = lease.peer, 0
                remaining = max(lease.expires - time.time(), 0.0) + 0.05
                if not self._on_another_node(lease):
                    self._same_node(fill)
                    await change.wait(min(remaining, _FOLLOW_POLL))
                elif lease.peer is not None and not copy.verified and copy.failures < _PEER_TRIES:
                    await self._copy_until_change(fill, lease, copy, change)
                else:
                    await change.wait(remaining)

    async def _copy_until_change(self, fill: Fill, lease: Lease, copy: PeerCopy, change: Any) -> None:
        """Stream from the holder while its lease lives; cut the stream at an announcement or when the lease is no
        longer the same live one (expired, released, taken over)."""
        assert lease.peer is not None
        streaming = asyncio.create_task(self._copy_from_peer(fill, lease.peer, copy),
                                        name=f"peer:{fill.spec.etag[:12]}")
        try:
            while not streaming.done():
                waiting = asyncio.create_task(change.wait(max(lease.expires - time.time(), 0.0) + 0.05))
                try:
                    await asyncio.wait({streaming, waiting}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiting.cancel()
                    await asyncio.wait({waiting})
                if streaming.done():
                    break
                # Announced, or the lease's time is up: cut the stream only if the holder changed or is gone
                # (a commit is announced too, and the stream then ends by itself).
                current = await self.store.read_lease(fill.spec.etag)
                if current is None or current.owner != lease.owner or current.peer != lease.peer:
                    break
                lease = current  # renewed by a live holder: keep streaming
        finally:
            streaming.cancel()
            await asyncio.wait({streaming})
        if not streaming.cancelled():
            streaming.result()  # a copy that failed its hash

    @staticmethod
    def _same_node(fill: Fill) -> None:
        """Another process of this host fills it, into the very partial file we read: its contiguous prefix, and the
        windows its map lists when the fill is sparse (read again when the map changed)."""
        with contextlib.suppress(FileNotFoundError):
            fill.advance(on_disk_prefix(fill.partial))
        if fill.sparse:
            try:
                changed = os.stat(CacheLayout.windows_map(fill.partial)).st_mtime_ns
            except FileNotFoundError:
                return
            if changed != fill.windows_seen:
                fill.windows_seen = changed
                fill.follow_windows(held_windows(fill.partial))

    def _on_another_node(self, lease: Lease) -> bool:
        return lease.peer is not None and lease.peer.url != self.node_url

    async def _copy_from_peer(self, fill: Fill, peer: PeerAddress, copy: PeerCopy) -> None:
        """Stream the fill from the node that holds its lease into our partial file, from where we left off."""
        spec = fill.spec
        before = copy.offset
        fd = os.open(fill.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            async with self.upstream.stream_peer(fill_url(peer, spec), peer.token, copy.offset) as body:
                span = Span(copy.offset, spec.size, copy.offset, bounded=False)
                try:
                    await copy_body(body, fd, span, self.threads.streams, counter=self.metrics.bytes_from_peers,
                                    block_size=self.chunk_size, on_progress=fill.advance,
                                    hashing=Hashing(copy.hasher, self.threads.hashes))
                finally:
                    copy.offset = span.done
        except MirrorError as exc:
            copy.failures = 0 if copy.offset > before else copy.failures + 1
            log.info("streaming %s from peer %s stopped at %d/%d: %s", spec.path, peer.url, copy.offset, spec.size,
                     exc)
            await asyncio.sleep(0.2)
            return
        finally:
            os.close(fd)
        if copy.offset < spec.size:
            copy.failures += 1
            return
        if not copy.hasher.matches():  # the leader verified these bytes: they were damaged on the way
            fill.partial.unlink(missing_ok=True)
            raise IntegrityError(f"{spec.repo.key} {spec.path}: bytes from peer {peer.url} do not match {spec.etag}")
        copy.verified = True
        fill.verify()

    async def local_copy(self, fill: Fill, copy: PeerCopy) -> Path:
        """This node's file of a blob just committed: the verified copy streamed from a peer, else the store's."""
        if copy.verified:
            adopted = await self.store.adopt(fill.spec.etag, fill.partial)
            if adopted is not None:
                return adopted
        elif copy.offset:
            # Our readers follow the partial copy a broken peer stream left: cut them (they resume by Range and
            # find the blob) rather than move them to another file in the middle of a read.
            raise UpstreamUnavailable("the stream of this blob from its filling node broke before the commit")
        path = await self.store.local_path(fill.spec.etag, progress=fill.follow_copy)
        if path is None:
            raise MirrorError(f"blob {fill.spec.etag} vanished from the store")
        return path

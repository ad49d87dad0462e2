"""The fill engine: one upstream download per blob, streamed to every waiting client while it is stored.

A fill is *stream + hash + verify + atomic commit*. It runs as its own task, owned by :class:`FillManager` and
detached from the request that started it (a server cancels a streaming response when its client hangs up, so a
commit placed after a tee loop would never run). Followers read the growing partial file.

One fill per blob (single flight):
- in this process, by the ``_fills`` table;
- across processes and nodes, by the store's lease. A process that does not hold the lease follows the fill
  (:mod:`mirror.fill.peer`), and takes over (resuming from its partial's size) when the lease is freed or expires.

Nothing bad is served: readers of a fill in progress are held back from its last byte until the blob is verified
(:mod:`mirror.fill.download`), so a client never completes a download of bytes that failed verification.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from mirror.errors import FillPaused, LeaseLost, MirrorError, NoDiskRoom, UpstreamUnavailable
from mirror.fill.copy import covers, held_at, held_windows, touch_windows
from mirror.fill.download import download
from mirror.fill.peer import Follower, PeerCopy
from mirror.fill.state import Fill, FillSpec
from mirror.fill.threads import FillThreads
from mirror.fill.windows import in_windows
from mirror.metadata.busy import BusyMarks
from mirror.metadata.held import HeldWindows
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore, PeerAddress
from mirror.upstream import UpstreamClient

log = logging.getLogger("hf_mirror.fill")

_EVICTION_POLL = 0.2  # seconds between looks at a blob whose eviction is under way (its delete takes milliseconds)


class FillManager:
    def __init__(self, store: BlobStore, upstream: UpstreamClient, metrics: Metrics, *, chunk_size: int,
                 lease_ttl: float, cancel_on_disconnect: bool, node_url: str | None = None,
                 busy: BusyMarks | None = None, held: HeldWindows | None = None,
                 make_room: Callable[[int, int], Awaitable[bool]] | None = None) -> None:
        self.store = store
        self.upstream = upstream
        self.metrics = metrics
        self.chunk_size = chunk_size
        self.lease_ttl = lease_ttl
        self.cancel_on_disconnect = cancel_on_disconnect
        self.node_url = node_url.rstrip("/") if node_url else None
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._fills: dict[str, Fill] = {}
        self.threads = FillThreads()  # every fill's worker threads: this manager's, shut down in its aclose
        self._follower = Follower(store, upstream, metrics, self.threads, chunk_size=chunk_size,
                                  node_url=self.node_url)
        self.on_commit: list[Callable[[FillSpec], None]] = []
        # The quota's make_room(size, reserved). Completing a sparse file (its share policy, the sync, a warm)
        # reserves the rest of it first, as a new fill does. None: no quota to ask.
        self.make_room = make_room
        # The fleet's busy marks (a fleet database): a blob this process fills is never evicted by any node.
        self.busy = busy
        # The fleet's record of the windows paused sparse fills left, by node (a fleet database and --node-url).
        self.held = held
        self._background: set[asyncio.Task[None]] = set()  # the records' removals under way (referenced till done)

    @property
    def active(self) -> list[Fill]:
        return list(self._fills.values())

    def is_filling(self, etag: str) -> bool:
        return etag in self._fills

    @property
    def bytes_to_write(self) -> int:
        """Disk that the fills in progress will still take (a sparse fill: the Ranges it was asked, counted when
        they were: :meth:`room_for`)."""
        return sum(max(fill.spec.size - fill.written, 0) for fill in self._fills.values() if not fill.sparse)

    def room_for(self, size: int, start: int, end: int) -> int:
        """Disk a read of bytes ``start..end`` of a file of ``size`` bytes not stored makes a fill take: the whole
        file, or for a Range that makes a sparse fill, its windows (one more at each edge) and the read-ahead."""
        if not self._ranged(size, (start, end)):
            return size
        settings = self.upstream.settings
        return min(size, end - start + 1 + 2 * settings.fill_window + settings.sparse_read_ahead)

    def get(self, etag: str) -> Fill | None:
        return self._fills.get(etag)

    async def opens_to_peer(self, fill: Fill, token: str) -> bool:
        """``token`` is the one our lease on the fill publishes (or, if another process here holds it, its)."""
        if fill.leading:
            return hmac.compare_digest(fill.peer_token, token)
        return await self._published_peer(fill.spec.etag, token) is not None

    async def _published_peer(self, etag: str, token: str) -> PeerAddress | None:
        """The peer address the live lease of ``etag`` publishes, if ``token`` is its token."""
        lease = await self.store.read_lease(etag)
        if lease is None or lease.peer is None or not hmac.compare_digest(lease.peer.token, token):
            return None
        return lease.peer

    async def join_for_peer(self, spec: FillSpec, token: str) -> Fill | None:
        """A peer asks this process for a fill that another process of this node leads (a peer's connection
        lands on any worker): follow it here too, once the lease shows the token is good."""
        if not self.store.partial_path(spec.etag).exists():  # nothing is being filled here: no store round trip
            return None
        peer = await self._published_peer(spec.etag, token)
        if peer is None or peer.url != self.node_url:
            return None
        return await self.start(spec)

    async def peer_for_range(self, spec: FillSpec, start: int, end: int) -> PeerAddress | None:
        """The node of the fleet that fills ``spec`` now, when bytes ``start..end`` are a Range that would make a
        sparse fill here, none runs here and this node's partial file does not hold them all: the Range is relayed
        from that node (its held windows, or the windows it fetches for it), so each byte comes from upstream once
        across the fleet and this node keeps nothing it would fetch again. With no fill anywhere, the node whose paused
        sparse fill left windows that hold the whole Range (the fleet's record, :mod:`mirror.metadata.held`) answers it
        from its partial file. ``None``: fill here as usual."""
        if self.node_url is None or spec.etag in self._fills or not self._ranged(spec.size, (start, end)):
            return None
        if covers(await asyncio.to_thread(held_windows, self.store.partial_path(spec.etag)), start, end):
            return None  # held here: the sparse fill's hit
        try:
            lease = await self.store.read_lease(spec.etag)
        except MirrorError:  # the lease store is down: the fill decides, and reports it, as it always did
            return None
        if lease is not None and lease.peer is not None and lease.peer.url != self.node_url \
                and lease.expires > time.time():
            return lease.peer
        if lease is None and self.held is not None:
            # No fill anywhere: a node whose paused sparse fill left windows that hold the whole Range answers it
            # from its partial file (FillManager.reading_held there).
            for record in await self.held.others(spec.etag):
                if covers(list(record.held), start, end):
                    return record.peer
        return None

    @contextlib.asynccontextmanager
    async def reading_held(self, etag: str, token: str, start: int, end: int) -> AsyncIterator[int | None]:
        """An fd on this node's sparse partial file of ``etag`` when ``token`` is the one this node's record of its
        held windows carries (:mod:`mirror.metadata.held`) and they hold every byte of ``start..end``; else
        ``None``. Nothing is fetched: the peer asking fills a Range refused here itself."""
        partial = self.store.partial_path(etag)
        # No partial file here, no database question: a caller guessing etags and tokens costs a stat, not a query.
        if self.held is None or not partial.exists() or not await self.held.opens(etag, token):
            yield None
            return
        fd, held = await asyncio.to_thread(_open_held, partial, start, end)
        if fd is None:
            if not held:
                await self.held.forget(etag)  # the windows went without their record (a crash between the two)
            yield None
            return
        try:
            touch_windows(partial)  # read: the quota's LRU keeps them longer
            yield fd
        finally:
            os.close(fd)

    async def peer_refused(self, etag: str, peer: PeerAddress) -> None:
        """``peer`` did not answer a Range relayed from it: if it was named by its held windows' record, that record
        is forgotten (the node no longer honours it; a lease's token names no record)."""
        if self.held is not None:
            await self.held.refused(etag, peer)

    async def start(self, spec: FillSpec, reading: tuple[int, int] | None = None) -> Fill | None:
        """Join or start the fill of ``spec.etag``; ``None`` when the blob is already on this node's disk.

        ``reading``: the bytes (``start``, ``end`` inclusive) the caller reads; a Range on a large file makes a sparse
        fill (only the windows read, :mod:`mirror.fill.windows`); ``None`` or the whole file: every byte.
        A blob committed in a remote store but not on this disk is a fill too: readers follow its copy.
        """
        fill = self._fills.get(spec.etag)
        if fill is not None:
            if not self._ranged(spec.size, reading):
                fill.wants_whole()
            elif fill.sparse and reading is not None:
                fill.ask(*reading)  # the Range's windows and the read-ahead after it, at once
            return fill
        if self.store.cached_path(spec.etag) is not None:
            return None
        fill = Fill(spec, self.store.partial_path(spec.etag))
        if in_windows(self.upstream.settings, spec.size):
            fill.windowed = None  # windows, if this process leads the fill (known once it holds the lease)
            fill.sparse = self._ranged(spec.size, reading)
            if fill.sparse and reading is not None:
                fill.ask(*reading)
                fill.follow_windows(held_windows(fill.partial))  # held already: readable before the lease is known
                touch_windows(fill.partial)  # its held windows were used: the quota's LRU keeps them longer
        self._fills[spec.etag] = fill
        if self.busy is not None:
            self.busy.begin(spec.etag)  # ended in _drive's finally
        fill.task = asyncio.create_task(self._drive(fill), name=f"fill:{spec.etag[:12]}")
        return fill

    def _ranged(self, size: int, reading: tuple[int, int] | None) -> bool:
        """Whether a read of ``reading`` is a Range of a file (of ``size`` bytes) large enough to be filled sparse."""
        threshold = getattr(self.upstream.settings, "sparse_fill_threshold", 0)
        return bool(reading is not None and threshold and size >= threshold and in_windows(self.upstream.settings, size)
                    and (reading[0] > 0 or reading[1] < size - 1))

    async def fetch(self, spec: FillSpec) -> Path:
        """Make sure the blob is committed (sync and prefetch use this); returns its local path. Completing a sparse
        file (a sparse fill here, or the windows a paused one left) reserves room for the rest of it first."""
        if self.make_room is not None and self.store.cached_path(spec.etag) is None:
            rest = await self._sparse_rest(spec)
            if rest and not await self._room(rest):
                log.warning("no disk room to complete sparse file %s %s (%d more bytes): not completed",
                            spec.repo.key, spec.path, rest)
                raise NoDiskRoom(f"{spec.path}: no disk room for the {rest} bytes that would complete it")
        fill = await self.start(spec)
        if fill is not None:
            while not fill.finished:
                await fill.wait_beyond(fill.spec.size)
            if fill.error is not None:
                raise fill.error
        path = await self.store.local_path(spec.etag)
        if path is None:
            raise MirrorError(f"blob {spec.etag} vanished after its fill")
        return path

    async def _sparse_rest(self, spec: FillSpec) -> int:
        """The bytes a sparse file of ``spec`` still lacks (0: no sparse fill or sparse partial file here)."""
        running = self._fills.get(spec.etag)
        if running is not None and not running.sparse:
            return 0  # a whole fill already: its room was made when it began
        held = await asyncio.to_thread(held_windows, self.store.partial_path(spec.etag))
        if running is None and not held:
            return 0
        return max(spec.size - sum(done - start for start, done in held), 0)

    async def _room(self, size: int) -> bool:
        """Room for ``size`` more bytes beside what the fills in progress will still write (the quota's make_room)."""
        return self.make_room is None or await self.make_room(size, self.bytes_to_write)

    async def aclose(self, grace: float) -> None:
        """Graceful shutdown: let fills finish within ``grace`` seconds, then cancel (they stay resumable); then
        the fills' worker threads go."""
        tasks = [f.task for f in self._fills.values() if f.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        self.threads.shutdown()

    # --- readers ---------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reading(self, fill: Fill) -> AsyncIterator[int]:
        """An fd on the fill's bytes (the partial file; its inode becomes the blob), counted as one reader.

        When the last reader of a non-detached fill leaves before it ends, the fill is cancelled.
        """
        # The file may not exist yet, or may be renamed into place between a progress report and the commit.
        while (fd := self._open_partial_or_blob(fill)) is None:
            if fill.finished:
                raise fill.error or MirrorError("the blob's file vanished")
            await fill.changed()
        fill.readers += 1
        try:
            yield fd
        finally:
            fill.readers -= 1
            os.close(fd)
            if fill.readers == 0 and self.cancel_on_disconnect and not fill.spec.detached and not fill.finished:
                if fill.task is not None:
                    fill.task.cancel()

    @staticmethod
    async def readable(fill: Fill, position: int) -> int:
        """Wait until bytes beyond ``position`` may be read; returns the readable end (exclusive)."""
        await fill.wait_beyond(position)
        if fill.error is not None:
            raise fill.error
        return fill.readable_at(position)

    def _open_partial_or_blob(self, fill: Fill) -> int | None:
        for path in (fill.source, fill.committed):
            if path is None:
                continue
            try:
                return os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
        return None

    # --- the fill task ---------------------------------------------------------------------------------------------

    async def _release(self, spec: FillSpec) -> None:
        """Give the fill lease back. A failure is logged, never the fill's: its blob may already be committed, and a
        lease not given back only expires (``lease_ttl``), after which another node finds the blob in the store."""
        try:
            await self.store.release_lease(spec.etag, self.owner)
        except MirrorError as exc:
            log.warning("could not give back the fill lease of %s %s (it expires in %ss): %s", spec.repo.key,
                        spec.path, self.lease_ttl, exc)

    async def _drive(self, fill: Fill) -> None:
        spec = fill.spec
        peer = PeerAddress(self.node_url, fill.peer_token) if self.node_url else None
        copy = PeerCopy(spec.etag, spec.size)
        self.metrics.fills_in_flight.inc()
        try:
            while True:
                if await self._in_store(spec.etag):
                    fill.windowed = False  # a copy of a committed blob, in order
                    fill.finish(await self._follower.local_copy(fill, copy))
                    break
                fill.source = fill.partial
                if await self.store.acquire_lease(spec.etag, self.owner, self.lease_ttl, peer):
                    fill.leading = True
                    try:
                        done = await self._download_while_leased(fill)
                    except FillPaused:
                        await self._publish_held(fill)  # before the lease goes: the fleet sees one or the other
                        raise
                    finally:
                        await self._release(spec)
                    if done:
                        break
                    # The lease went to another node: follow it (or find the blob it committed).
                    fill.leading = False
                    fill.run_end = fill.want = None
                    continue
                fill.windowed = False  # another process or node fills it: its contiguous prefix is what we see
                await self._follower.follow(fill, copy)
            self.metrics.fills.labels(result="ok").inc()
            if self.held is not None and self._ranged(spec.size, (1, 1)):  # a file that may have been held sparse
                # Every node's record of its windows goes, in the background: the fill's readers are done.
                forget = asyncio.create_task(self.held.committed(spec.etag), name=f"held:{spec.etag[:12]}")
                self._background.add(forget)
                forget.add_done_callback(self._background.discard)
            for callback in self.on_commit:
                callback(spec)
        except FillPaused as exc:
            log.info("sparse fill paused: %s", exc)
            fill.finish(None, UpstreamUnavailable(f"the sparse fill paused ({exc}); it resumes on the next request"))
            self.metrics.fills.labels(result="paused").inc()
        except asyncio.CancelledError:
            fill.finish(None, UpstreamUnavailable("the fill was cancelled; it resumes on the next request"))
            self.metrics.fills.labels(result="cancelled").inc()
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the readers
            log.warning("fill of %s %s failed: %s", spec.repo.key, spec.path, exc)
            fill.finish(None, exc)
            self.metrics.fills.labels(result="error").inc()
        finally:
            self.metrics.fills_in_flight.dec()
            self._fills.pop(spec.etag, None)
            if self.busy is not None:
                self.busy.end(spec.etag)

    async def _publish_held(self, fill: Fill) -> None:
        """A sparse fill pauses: the windows its partial file holds are recorded for the fleet's other nodes."""
        if self.held is None or not fill.sparse:
            return
        held = await asyncio.to_thread(held_windows, fill.partial)
        if held:
            await self.held.publish(fill.spec.etag, held)

    async def _in_store(self, etag: str) -> bool:
        """The blob is committed in the store, ours to copy. With the fleet's busy marks, the fleet sees our mark
        first; a blob whose eviction is under way is not copied: we wait until it is gone (then fill it as any
        other) or the eviction is given up."""
        stored = await self.store.stat(etag) is not None
        if self.busy is None or not stored:  # not stored: nothing to evict, no claim needed
            return stored
        while not await self.busy.claim(etag):
            if await self.store.stat(etag) is None:
                return False
            await asyncio.sleep(_EVICTION_POLL)
        return await self.store.stat(etag) is not None

    async def _download_while_leased(self, fill: Fill) -> bool:
        """Download and commit under the lease; False when the lease was lost first (then nothing was committed).

        A store whose leases can be lost (a fleet database's) says so by an event: the download stops at once,
        so a holder that cannot renew stops fetching within one renewal interval."""
        lost = self.store.lease_lost(fill.spec.etag)
        try:
            if lost is None:
                await self._download(fill)
                return True
            download = asyncio.create_task(self._download(fill), name=f"download:{fill.spec.etag[:12]}")
            signal = asyncio.create_task(lost.wait())
            try:
                await asyncio.wait({download, signal}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (download, signal):
                    task.cancel()
                await asyncio.wait({download, signal})
            if download.cancelled():
                raise LeaseLost(f"the fill lease of {fill.spec.etag} was lost")
            download.result()
            return True
        except LeaseLost as exc:
            log.warning("fill of %s stopped: %s", fill.spec.path, exc)
            return False

    async def _download(self, fill: Fill) -> None:
        """Download ``fill`` from upstream (this process holds its lease) and commit it."""
        await download(fill, self.store, self.upstream, self.metrics, self.threads, self.chunk_size,
                       room=self._room if self.make_room is not None else None)


def _open_held(partial: Path, start: int, end: int) -> tuple[int | None, list[tuple[int, int]]]:
    """The spans ``partial``'s windows map holds (read against the fd: the same file), and an fd on it when they hold
    ``start..end`` (else None)."""
    try:
        fd = os.open(partial, os.O_RDONLY)
    except FileNotFoundError:
        return None, []
    held = held_at(partial, fd)
    if not covers(held, start, end):
        os.close(fd)
        return None, held
    return fd, held

"""The fill engine: one upstream download per blob, streamed to every waiting client while it is stored.

A fill is *stream + hash + verify + atomic commit*. It runs as its own task, owned by :class:`FillManager` and
detached from the request that started it (Starlette cancels a streaming response's generator when its client
hangs up, so a commit placed after a tee loop would never run). Followers read the growing partial file.

One fill per blob:
- in this process, by the ``_fills`` table;
- across processes and nodes, by the store's lease. A process that does not hold the lease follows the fill: on
  the holder's host it reads the partial file the holder writes; on another node of a fleet it streams the fill
  from the holder (whose URL and a token the lease publishes) into its own partial file, hashing it too. Either
  way it takes over (resuming from its partial's size) when the lease is freed or expires.

Nothing bad is served: size and hash (sha256 for LFS, git blob sha1 for regular files) are checked before the blob
is committed, and readers of a fill in progress are held back from its last byte until the blob is committed, so
a client never completes a download of bytes that failed verification.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import httpx
from prometheus_client import Counter

from mirror import hf
from mirror.errors import IntegrityError, MirrorError, UpstreamUnavailable
from mirror.integrity import BlobHasher
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore, Lease, PeerAddress
from mirror.upstream import BulkBody, UpstreamClient, UrlExpired, bulk_body

log = logging.getLogger("hf_mirror.fill")

_FOLLOW_POLL = 0.02  # seconds between looks at a partial file another process writes
_MAX_ATTEMPTS_WITHOUT_PROGRESS = 6
# Hashing runs beside the socket reads and disk writes (hashlib drops the GIL on large blocks), so a fill costs
# max(read + write, hash) instead of their sum.
_HASH_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fill-hash")
_COPY_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fill-copy")  # one thread per running fill
_BLOCK_SECONDS = 0.01  # a slow upstream's bytes reach readers at least this often
_READ_SIZE = 1024 * 1024  # per socket read: larger reads allocate more than they fill (measured ~3 GB/s at 1 MiB)
_PEER_TRIES = 3  # peer streams that end without progress before a follower just waits for the commit
PEER_ROUTE = "/_mirror/fills/"  # + etag: a fill in progress, for the other nodes (mirror.routes.peer)


@dataclass(frozen=True)
class FillSpec:
    """What to download: a file at a commit, which becomes blob ``etag`` of ``size`` bytes."""

    repo: hf.RepoRef
    commit: str
    path: str
    etag: str
    size: int
    token: str | None = None
    cdn_url: str | None = None
    detached: bool = True  # False: the fill may be cancelled when its last reader leaves (fill_on_disconnect=cancel)


class Fill:
    """The shared state of one blob fill: how many bytes are on disk, and how it ended."""

    def __init__(self, spec: FillSpec, partial: Path) -> None:
        self.spec = spec
        self.partial = partial  # where this process's download (or copy from a peer) of the blob is written
        # The file readers follow while the fill runs: ``partial`` once the fill knows it downloads or follows;
        # for a blob already committed in a remote store, the file the store copies it into (see follow_copy).
        self.source: Path | None = None
        self.written = 0
        self.committed: Path | None = None
        self.verified = False  # every byte written and hashed against the etag: readers may take the last byte
        self.error: BaseException | None = None
        self.readers = 0
        self.task: asyncio.Task[None] | None = None
        self.peer_token = secrets.token_urlsafe(24)  # published in our lease: opens this fill to the other nodes
        self.leading = False  # this process holds the lease and downloads
        self._progress = asyncio.Event()

    @property
    def finished(self) -> bool:
        return self.committed is not None or self.error is not None

    def advance(self, written: int) -> None:
        self.written = written
        self._wake()

    def finish(self, committed: Path | None, error: BaseException | None = None) -> None:
        self.committed, self.error = committed, error
        if committed is not None:
            self.written = self.spec.size
        self._wake()

    def follow_copy(self, file: Path, written: int) -> None:
        """The store's progress report while it copies a committed blob onto this node's disk."""
        self.source = file
        self.advance(written)

    def verify(self) -> None:
        self.verified = True
        self._wake()

    def _wake(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def changed(self) -> None:
        """Return at the next progress report, verification or end."""
        await self._progress.wait()

    async def wait_beyond(self, offset: int) -> None:
        """Return once more than ``offset`` bytes are readable, or the fill has finished."""
        while self.readable_end() <= offset and not self.finished:
            await self._progress.wait()

    def readable_end(self) -> int:
        """Bytes a reader may take: all once verified; before, all but the last, which waits for verification.

        The last byte does not wait for the commit's fsync: the bytes in the page cache are the ones just hashed.
        """
        if self.verified or self.committed is not None:
            return self.spec.size
        return min(self.written, max(self.spec.size - 1, 0))


class FillManager:
    def __init__(self, store: BlobStore, upstream: UpstreamClient, metrics: Metrics, *, chunk_size: int,
                 lease_ttl: float, cancel_on_disconnect: bool, node_url: str | None = None) -> None:
        self.store = store
        self.upstream = upstream
        self.metrics = metrics
        self.chunk_size = chunk_size
        self.lease_ttl = lease_ttl
        self.cancel_on_disconnect = cancel_on_disconnect
        self.node_url = node_url.rstrip("/") if node_url else None
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._fills: dict[str, Fill] = {}
        self.on_commit: list[Callable[[FillSpec], None]] = []

    @property
    def active(self) -> list[Fill]:
        return list(self._fills.values())

    def is_filling(self, etag: str) -> bool:
        return etag in self._fills

    @property
    def bytes_to_write(self) -> int:
        """Disk that the fills in progress will still take."""
        return sum(max(fill.spec.size - fill.written, 0) for fill in self._fills.values())

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

    async def start(self, spec: FillSpec) -> Fill | None:
        """Join or start the fill of ``spec.etag``; ``None`` when the blob is already on this node's disk.

        A blob committed in a remote store but not on this disk is a fill too: readers follow its copy.
        """
        fill = self._fills.get(spec.etag)
        if fill is not None:
            return fill
        if self.store.cached_path(spec.etag) is not None:
            return None
        fill = Fill(spec, self.store.partial_path(spec.etag))
        self._fills[spec.etag] = fill
        fill.task = asyncio.create_task(self._drive(fill), name=f"fill:{spec.etag[:12]}")
        return fill

    async def fetch(self, spec: FillSpec) -> Path:
        """Make sure the blob is committed (sync and prefetch use this); returns its local path."""
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

    async def aclose(self, grace: float) -> None:
        """Graceful shutdown: let fills finish within ``grace`` seconds, then cancel (they stay resumable)."""
        tasks = [f.task for f in self._fills.values() if f.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)

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
        return fill.readable_end()

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

    async def _drive(self, fill: Fill) -> None:
        spec = fill.spec
        peer = PeerAddress(self.node_url, fill.peer_token) if self.node_url else None
        copy = _PeerCopy(spec.etag, spec.size)
        self.metrics.fills_in_flight.inc()
        try:
            while True:
                if await self.store.stat(spec.etag) is not None:
                    fill.finish(await self._local_copy(fill, copy))
                    break
                fill.source = fill.partial
                if await self.store.acquire_lease(spec.etag, self.owner, self.lease_ttl, peer):
                    fill.leading = True
                    try:
                        await self._download(fill)
                    finally:
                        await self.store.release_lease(spec.etag, self.owner)
                    break
                await self._follow(fill, copy)
            self.metrics.fills.labels(result="ok").inc()
            for callback in self.on_commit:
                callback(spec)
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

    async def _follow(self, fill: Fill, copy: _PeerCopy) -> None:
        """Another process holds the lease: follow its fill until it commits or its lease goes away."""
        etag = fill.spec.etag
        lease_check_every = max(1, int(0.5 / _FOLLOW_POLL))
        ticks = 0
        lease = await self.store.read_lease(etag)
        while lease is not None:
            if await self.store.stat(etag) is not None:
                return
            if not self._on_another_node(lease):
                with contextlib.suppress(FileNotFoundError):  # the holder writes the very partial file we read
                    fill.advance(os.stat(fill.partial).st_size)
            elif lease.peer is not None and not copy.verified and copy.failures < _PEER_TRIES:
                await self._copy_from_peer(fill, lease.peer, copy)
            ticks += 1
            if ticks % lease_check_every == 0:
                lease = await self.store.read_lease(etag)
            await asyncio.sleep(_FOLLOW_POLL)

    def _on_another_node(self, lease: Lease) -> bool:
        return lease.peer is not None and lease.peer.url != self.node_url

    async def _copy_from_peer(self, fill: Fill, peer: PeerAddress, copy: _PeerCopy) -> None:
        """Stream the fill from the node that holds its lease into our partial file, from where we left off."""
        spec = fill.spec
        before = copy.offset
        fd = os.open(fill.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # What the fill is rides along, so that any worker process of the peer node can follow it for us.
            query = urlencode({"repo": spec.repo.key, "commit": spec.commit, "path": spec.path, "size": spec.size})
            url = f"{peer.url}{PEER_ROUTE}{spec.etag}?{query}"
            async with self.upstream.stream_peer(url, peer.token, copy.offset) as body:
                cursor = _Cursor(copy.offset)
                try:
                    await self._pump(fill, body, fd, cursor, copy.hasher, self.metrics.bytes_from_peers)
                finally:
                    copy.offset = cursor.offset
        except (MirrorError, httpx.HTTPError) as exc:
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

    async def _local_copy(self, fill: Fill, copy: _PeerCopy) -> Path:
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

    async def _download(self, fill: Fill) -> None:
        spec = fill.spec
        partial = fill.partial
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            hasher = BlobHasher(spec.etag, spec.size)
            offset = await asyncio.to_thread(_resume_offset, fd, spec.size, hasher, self.chunk_size)
            fill.advance(offset)
            if offset:
                log.info("resuming fill of %s at byte %d of %d", spec.path, offset, spec.size)
            cdn_url = spec.cdn_url
            failures = 0
            while offset < spec.size:
                before = offset
                try:
                    async with self.upstream.stream_file(
                        spec.repo, spec.commit, spec.path, spec.token, start=offset, cdn_url=cdn_url, bulk=True
                    ) as (response, final_url):
                        if final_url != self.upstream.base + spec.repo.resolve_path(spec.commit, spec.path):
                            cdn_url = final_url
                        cursor = _Cursor(offset)
                        try:
                            await self._pump(fill, bulk_body(response), fd, cursor, hasher,
                                             self.metrics.bytes_fetched)
                        finally:
                            offset = cursor.offset
                    if offset < spec.size:
                        raise UpstreamUnavailable(f"upstream closed after {offset} of {spec.size} bytes")
                except UrlExpired:
                    log.info("signed URL for %s expired; resolving again", spec.path)
                    cdn_url = None
                    failures += 1
                except (httpx.HTTPError, UpstreamUnavailable) as exc:
                    failures = 0 if offset > before else failures + 1
                    if failures >= _MAX_ATTEMPTS_WITHOUT_PROGRESS:
                        raise UpstreamUnavailable(
                            f"giving up on {spec.path} after {failures} failed tries: {exc}"
                        ) from exc
                    log.info("fill of %s interrupted at %d/%d (%s); resuming", spec.path, offset, spec.size, exc)
                    await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                if failures >= _MAX_ATTEMPTS_WITHOUT_PROGRESS:
                    raise UpstreamUnavailable(f"giving up on {spec.path}: signed URLs keep expiring")
            if not hasher.matches():
                self.metrics.integrity_failures.inc()
                os.ftruncate(fd, 0)
                partial.unlink(missing_ok=True)
                raise IntegrityError(f"{spec.repo.key} {spec.path}: content does not match etag {spec.etag}")
            fill.verify()
        finally:
            os.close(fd)
        committed = await self.store.commit(spec.etag, partial)
        fill.finish(committed)
        log.info("committed %s %s (%d bytes) as %s", spec.repo.key, spec.path, spec.size, spec.etag)


    async def _pump(self, fill: Fill, body: BulkBody, fd: int, cursor: _Cursor, hasher: BlobHasher,
                    counter: Counter) -> None:
        """Copy the body into the partial file in a worker thread, announcing progress to the readers.

        The thread owns ``fd`` until it returns: on cancellation it is told to stop and awaited, never abandoned.
        """
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def progress(offset: int) -> None:
            if offset == cursor.reported:
                return
            counter.inc(offset - cursor.reported)
            cursor.reported = offset
            with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is left to tell
                loop.call_soon_threadsafe(fill.advance, offset)

        def run() -> None:
            _copy_body(body, fd, cursor, fill.spec.size, hasher, self.chunk_size, stop, progress)

        done = asyncio.wrap_future(_COPY_POOL.submit(run))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            stop.set()
            body.abort()
            await asyncio.wait([done])
            raise


class _PeerCopy:
    """A follower's copy of a fill streamed from the node holding its lease; kept across reconnects."""

    def __init__(self, etag: str, size: int) -> None:
        self.hasher = BlobHasher(etag, size)
        self.offset = 0
        self.failures = 0
        self.verified = False


class _Cursor:
    """How far a copy thread got, readable after it ends however it ended."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.reported = offset


def _copy_body(body: BulkBody, fd: int, cursor: _Cursor, size: int, hasher: BlobHasher, block_size: int,
               stop: threading.Event, progress: Callable[[int], None]) -> None:
    """Blocking: socket → partial file until ``size`` bytes or EOF.

    Each read takes what has arrived, so a slow upstream's first bytes reach readers at once. Hashing and progress
    go by blocks (``block_size`` bytes or ``_BLOCK_SECONDS``), the hash of one block beside the reads of the next.
    On any exit the hash covers exactly the bytes up to ``cursor.offset``, so a resume can continue from there.
    """
    pending: Future[None] | None = None
    block: list[bytes] = []
    block_bytes, block_began = 0, time.monotonic()
    try:
        while cursor.offset < size and not stop.is_set():
            data = body.read_some(min(_READ_SIZE, size - cursor.offset + 1))  # +1: notice an upstream sending more
            if not data:
                break
            if cursor.offset + len(data) > size:
                raise IntegrityError(f"upstream sent more than {size} bytes")
            _write_all(fd, data, cursor.offset)
            cursor.offset += len(data)
            block.append(data)
            block_bytes += len(data)
            if block_bytes >= block_size or time.monotonic() - block_began >= _BLOCK_SECONDS:
                if pending is not None:
                    pending.result()
                pending = _HASH_POOL.submit(_hash_all, hasher, block)
                block, block_bytes, block_began = [], 0, time.monotonic()
                progress(cursor.offset)
    finally:
        if pending is not None:
            pending.result()
        _hash_all(hasher, block)
        progress(cursor.offset)


def _hash_all(hasher: BlobHasher, pieces: list[bytes]) -> None:
    for piece in pieces:
        hasher.update(piece)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _resume_offset(fd: int, size: int, hasher: BlobHasher, chunk_size: int) -> int:
    """Hash what a previous fill left in the partial file, and continue after it."""
    existing = os.fstat(fd).st_size
    if existing > size:
        os.ftruncate(fd, 0)
        return 0
    offset = 0
    while offset < existing:
        data = os.pread(fd, min(chunk_size, existing - offset), offset)
        if not data:
            break
        hasher.update(data)
        offset += len(data)
    return offset

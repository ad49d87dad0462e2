"""Local-disk blob store, in the cache's layout (:class:`mirror.layout.CacheLayout`)::

    blobs/<etag[:2]>/<etag>     committed blobs (mtime = last access, for LRU)
    partials/<etag>.part        fills in progress
    partials/<etag>.lease       fill leases: an flock held by the filling process

Leases use ``flock``: the kernel drops the lock when the owner dies (even on ``kill -9``), so a dead filler's
lease is free at once and no expiry heuristic is needed on one host.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from mirror.integrity import hash_file
from mirror.layout import CacheLayout, blob_name
from mirror.storage.base import BlobInfo, CopyProgress, Lease, PeerAddress

_TOUCH_EVERY = 60.0  # seconds: a blob's last-access time is refreshed at most this often


class LocalBlobStore:
    has_hot_tier = False  # the disk is the store

    def __init__(self, layout: CacheLayout) -> None:
        self.layout = layout
        self.root = layout.root
        self.blobs_dir = layout.blobs_dir
        # Hot files are looked up on every hit and cached HEAD: keep their Path objects (pathlib joins cost ~10 µs).
        self._hot_paths = functools.lru_cache(maxsize=8192)(self.blob_path)
        self.partials_dir = layout.partials_dir
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.partials_dir.mkdir(parents=True, exist_ok=True)
        self._lease_fds: dict[str, int] = {}

    def blob_path(self, etag: str) -> Path:
        return self.layout.blob(etag)

    def relative_blob_path(self, etag: str) -> str:
        """The blob's path under ``blobs/`` (what an nginx ``X-Accel-Redirect`` location serves)."""
        return blob_name(etag)

    def stat_sync(self, etag: str) -> BlobInfo | None:
        try:
            st = os.stat(self.blob_path(etag))
        except FileNotFoundError:
            return None
        return BlobInfo(etag, st.st_size, _last_access(st))

    async def stat(self, etag: str) -> BlobInfo | None:
        return self.stat_sync(etag)

    def cached_path(self, etag: str) -> Path | None:
        path = self._hot_paths(etag)
        try:
            os.stat(path)
        except FileNotFoundError:
            return None
        return path

    async def local_path(self, etag: str, progress: CopyProgress | None = None) -> Path | None:
        return self.cached_path(etag)  # the disk is the store: nothing is ever copied in

    def partial_path(self, etag: str) -> Path:
        return self.layout.partial(etag)

    async def commit(self, etag: str, partial: Path) -> Path:
        target = self.blob_path(etag)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(_fsync_file, partial)
        os.replace(partial, target)
        _fsync_dir(target.parent)
        return target

    async def adopt(self, etag: str, copy: Path) -> Path | None:
        target = self.cached_path(etag)
        if target is None:
            return None
        if copy != target:
            copy.unlink(missing_ok=True)  # the blob is already on this disk
        return target

    async def delete(self, etag: str) -> bool:
        try:
            self.blob_path(etag).unlink()
        except FileNotFoundError:
            return False
        return True

    def drop_local(self, etag: str) -> bool:
        return False  # the disk is the store: this node's file is the shared copy itself

    async def verify_shared(self, etag: str, pace: Callable[[int], None] | None = None) -> bool | None:
        path = self.blob_path(etag)
        try:
            return await asyncio.to_thread(hash_file, path, etag, os.stat(path).st_size, pace=pace)
        except FileNotFoundError:
            return None

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        # Directory scans run in a thread, one shard at a time: a million blobs must not stall the event loop.
        shards = await asyncio.to_thread(self._shards)
        for shard in shards:
            for info in await asyncio.to_thread(_scan_shard, shard):
                yield info

    def _shards(self) -> list[Path]:
        if not self.blobs_dir.exists():
            return []
        return sorted(shard for shard in self.blobs_dir.iterdir() if shard.is_dir())

    async def touch(self, etag: str) -> None:
        """A hit: the blob's last use is now (at most once a minute). Only the access time moves: the modification
        time stays the commit's, so the scrub knows this file as the one it checked."""
        path = self.blob_path(etag)
        try:
            st = os.stat(path)
            now = time.time()
            if now - _last_access(st) > _TOUCH_EVERY:
                os.utime(path, (now, st.st_mtime))
        except OSError:
            pass

    # --- leases ---------------------------------------------------------------------------------------------------

    def _lease_path(self, etag: str) -> Path:
        return self.layout.lease(etag)

    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        # ``peer`` is not kept: on one host, followers read the partial file itself.
        if etag in self._lease_fds:
            return True
        fd = os.open(self._lease_path(etag), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if not _same_file(fd, self._lease_path(etag)):
            # The previous owner unlinked this file between our open and our lock: try again on the new file.
            os.close(fd)
            return await self.acquire_lease(etag, owner, ttl, peer)
        record = json.dumps({"owner": owner, "pid": os.getpid(), "started": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        self._lease_fds[etag] = fd
        return True

    async def refresh_lease(self, etag: str, owner: str, ttl: float) -> bool:
        return etag in self._lease_fds

    async def release_lease(self, etag: str, owner: str) -> None:
        fd = self._lease_fds.pop(etag, None)
        if fd is None:
            return
        try:
            # Unlink while still holding the lock, so nobody locks a file that is about to vanish.
            self._lease_path(etag).unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _held_lease_record(self, etag: str) -> bytes | None:
        """The lease file's record while a live process (this one included) holds its flock; None when nobody
        does. Sync: the kernel answers at once."""
        try:
            fd = os.open(self._lease_path(etag), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return os.pread(fd, 4096, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it: a leftover file of a dead filler
        finally:
            os.close(fd)

    watch_lease = None  # leases are flocks on this host: a follower polls them

    async def open(self) -> None:
        """Nothing to connect to: the directories exist from the constructor on."""

    async def aclose(self) -> None:
        """Nothing to close: a flock goes with its file descriptor, which each fill closes itself."""

    def lease_lost(self, etag: str) -> asyncio.Event | None:
        return None  # a flock cannot be taken from its holder

    def lease_held(self, etag: str) -> bool:
        """A fill (in any process on this host) holds the blob's lease: leave the blob alone."""
        return self._held_lease_record(etag) is not None

    async def read_lease(self, etag: str) -> Lease | None:
        raw = self._held_lease_record(etag)
        if raw is None:
            return None
        try:
            owner = json.loads(raw or b"{}").get("owner", "?")
        except ValueError:
            owner = "?"
        return Lease(etag, owner, float("inf"))


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _scan_shard(shard: Path) -> list[BlobInfo]:
    found = []
    for entry in os.scandir(shard):
        if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
            st = entry.stat(follow_symlinks=False)
            found.append(BlobInfo(entry.name, st.st_size, _last_access(st)))
    return found


def _last_access(st: os.stat_result) -> float:
    """When a blob was last used: its commit (mtime) or its last hit (atime, set by ``touch``)."""
    return max(st.st_atime, st.st_mtime)

"""The hot tier: this node's bounded local-disk copy of bucket blobs, least recently used evicted first.

It holds whole committed blobs only, so a local file there is always servable (sendfile, nginx ``X-Accel-Redirect``
from ``<cache_dir>/blobs/``, the same layout as the local backend)::

    <cache_dir>/blobs/<etag[:2]>/<etag>             local copies of bucket blobs, LRU by mtime, bounded
    <cache_dir>/hot-tmp/                            hot-tier downloads in progress
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from mirror.layout import CacheLayout
from mirror.storage.base import BlobInfo

log = logging.getLogger("hf_mirror.storage.s3")

_TOUCH_EVERY = 60.0  # seconds: a hot blob's mtime (its LRU age) is refreshed at most this often
_HOT_TMP_MAX_AGE = 3600.0  # leftover hot-tier downloads of a killed process are removed at startup after this


class HotTier:
    def __init__(self, layout: CacheLayout, *, max_size: int | None) -> None:
        self.layout = layout
        self.blobs_dir = layout.blobs_dir
        self.tmp_dir = layout.hot_tmp_dir
        self.max_size = max_size
        self._busy: set[str] = set()  # etags entering the hot tier right now: never evicted
        self._bytes: int | None = None  # this process's estimate; rescanned before evicting

    def path(self, etag: str) -> Path:
        return self.layout.blob(etag)

    def info(self, etag: str) -> BlobInfo | None:
        try:
            st = os.stat(self.path(etag))
        except FileNotFoundError:
            return None
        return BlobInfo(etag, st.st_size, st.st_mtime)

    def touch(self, path: Path, mtime: float) -> None:
        now = time.time()
        if now - mtime > _TOUCH_EVERY:
            with contextlib.suppress(OSError):
                os.utime(path, (now, now))

    def tmp_path(self, etag: str) -> Path:
        """A fresh name for a download of ``etag`` into the hot tier."""
        return self.layout.hot_download(etag)

    @contextlib.contextmanager
    def entering(self, etag: str) -> Iterator[None]:
        """Marks ``etag`` busy (never evicted) while it is on its way in."""
        self._busy.add(etag)
        try:
            yield
        finally:
            self._busy.discard(etag)

    async def enter(self, etag: str, source: Path, size: int) -> Path:
        """Move a whole, verified file of the blob into the hot tier (inside :meth:`entering`)."""
        target = self.path(etag)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)  # readers hold descriptors on the source: a rename keeps them valid
        if self._bytes is not None:
            self._bytes += size
        await self._evict(keep=etag)
        return target

    def remove(self, etag: str) -> bool:
        """Drop this node's copy; whether there was one."""
        try:
            self.path(etag).unlink()
        except FileNotFoundError:
            return False
        self._bytes = None
        return True

    def usage(self) -> tuple[int, int]:
        """(bytes, blobs) in this node's hot tier."""
        entries = self.scan()
        return sum(size for _, size, _ in entries), len(entries)

    def scan(self) -> list[tuple[Path, int, float]]:
        out: list[tuple[Path, int, float]] = []
        for shard in os.scandir(self.blobs_dir):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(shard.path):
                if entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
                        out.append((Path(entry.path), st.st_size, st.st_mtime))
        return out

    async def _evict(self, keep: str) -> None:
        """Bring the hot tier under its bound, least recently used first. The bucket keeps every blob; a blob being
        served stays readable (open descriptors survive an unlink), and the newest arrival is never evicted, even
        when it alone is over the bound."""
        limit = self.max_size
        if not limit or (self._bytes is not None and self._bytes <= limit):
            return
        # Several workers share the hot tier: the estimate is only a trigger, the scan is the truth.
        entries = await asyncio.to_thread(self.scan)
        total = sum(size for _, size, _ in entries)
        for path, size, _ in sorted(entries, key=lambda e: e[2]):
            if total <= limit:
                break
            if path.name == keep or path.name in self._busy:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                total -= size
                log.debug("hot tier: evicted %s (%d bytes)", path.name, size)
        self._bytes = total

    def sweep_tmp(self) -> None:
        now = time.time()
        for entry in os.scandir(self.tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime > _HOT_TMP_MAX_AGE:
                    os.unlink(entry.path)

"""The scrub: re-hash stored blobs in the background at a bounded disk-read rate, so a blob corrupted on disk after
it was stored is served at most until its check ends, then removed and fetched again on the next request.

A blob is checked after its first hit in a process (a fill's own commit counts as checked), and the whole store
every ``_SCRUB_CYCLE_PAUSE``; the file's identity (inode, size, mtime) tells a rewrite from the file it checked.

The scrub reads this node's disk only. A bad copy there is a local fault: on a shared store (S3) only this node's copy
is removed, and the bucket object is deleted only if it fails a check of its own
(:func:`mirror.storage.base.discard_bad_copy`); on the local backend the file is the blob, and it is removed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from mirror.errors import MirrorError
from mirror.integrity import hash_file
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore, discard_bad_copy

log = logging.getLogger("hf_mirror.scrub")

_SCRUB_FIRST_SWEEP = 300.0  # seconds after start before the first sweep
_SCRUB_CYCLE_PAUSE = 6 * 3600.0  # between two sweeps of the whole store (first hits are checked meanwhile)
_SCRUB_QUEUE = 10_000  # blobs waiting for their first-hit check; more are left to the next sweep
_SCRUB_REMEMBERED = 200_000  # blobs known good in this process (then forgotten, and checked again by a sweep)


class _Pacer:
    """Keeps a thread's reads under ``rate`` bytes per second (it sleeps in the scrub's thread, not the loop)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n
        ahead = self.done / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(min(ahead, 5.0))
        elif ahead < -1.0:  # idle for a while: no burst to catch up
            self.started, self.done = time.monotonic(), 0


class Scrubber:
    def __init__(self, store: BlobStore, metrics: Metrics, *, is_busy: Callable[[str], bool]) -> None:
        self.store = store
        self.metrics = metrics
        self.is_busy = is_busy
        # Blobs checked good in this process, and blobs served for the first time, waiting for a check.
        self._scrubbed: set[tuple[str, int, int, int]] = set()  # (etag, mtime_ns, size, inode): a rewrite shows
        self._suspects: dict[str, None] = {}
        self._suspect_added = asyncio.Event()

    def suspect(self, etag: str) -> None:
        """A stored blob was just served: have the scrub check it soon, once per process (cheap when already done)."""
        if etag in self._suspects or len(self._suspects) >= _SCRUB_QUEUE:
            return
        self._suspects[etag] = None
        self._suspect_added.set()

    def verified(self, etag: str) -> None:
        """This very file was just hashed (a fill's commit): its first hit needs no check."""
        path = self.store.cached_path(etag)
        if path is None:
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        self._remember_good((etag, st.st_mtime_ns, st.st_size, st.st_ino))

    def _remember_good(self, key: tuple[str, int, int, int]) -> None:
        if len(self._scrubbed) >= _SCRUB_REMEMBERED:
            self._scrubbed.clear()
        self._scrubbed.add(key)

    async def run(self, rate: int) -> None:
        """Forever: re-hash every stored blob at most ``rate`` bytes/s, first-hit suspects before the sweep goes on;
        a blob that does not match its etag is removed (it is fetched again on the next request)."""
        pacer = _Pacer(rate)
        pause = _SCRUB_FIRST_SWEEP  # a start (often a deploy, or a benchmark) is not the time for a full sweep
        while True:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + pause
            while (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self._suspect_added.wait(), timeout=left)
                except TimeoutError:
                    break
                await self._scrub_suspects(pacer)
            try:
                async for blob in self.store.list_blobs():
                    await self._scrub_suspects(pacer)
                    await self._scrub(blob.etag, pacer, sweep=True)
            except Exception:  # noqa: BLE001 - the scrub must survive a bad sweep
                log.exception("scrub sweep failed")
            pause = _SCRUB_CYCLE_PAUSE

    async def _scrub_suspects(self, pacer: _Pacer) -> None:
        self._suspect_added.clear()
        while self._suspects:
            etag = next(iter(self._suspects))
            del self._suspects[etag]
            await self._scrub(etag, pacer)

    async def _scrub(self, etag: str, pacer: _Pacer, *, sweep: bool = False) -> None:
        """Check one blob; a first-hit check is skipped when this very file (same inode, size, mtime) passed."""
        if self.is_busy(etag):
            return
        path = self.store.cached_path(etag)  # this disk's copy only: the scrub never downloads
        if path is None:
            return
        try:
            st = os.stat(path)
            key = (etag, st.st_mtime_ns, st.st_size, st.st_ino)
            if key in self._scrubbed and not sweep:
                return
            ok = await asyncio.to_thread(hash_file, path, etag, st.st_size, pace=pacer)
        except FileNotFoundError:
            return  # evicted meanwhile
        if ok:
            self._remember_good(key)
            return
        self.metrics.integrity_failures.inc()
        log.error("scrub: stored blob %s does not match its etag (corrupted on disk)", etag)
        try:
            discarded = await discard_bad_copy(self.store, etag, pace=pacer)
        except MirrorError as exc:  # the shared store is down: this blob is checked again by the next sweep
            log.error("scrub: could not check the shared copy of blob %s: %s", etag, exc)
            return
        if discarded.shared:
            log.error("scrub: blob %s removed from the store (the next request fetches it again)", etag)
        else:
            log.warning("scrub: this node's copy of blob %s removed; the shared copy passed its check (the next "
                        "request copies it from there)", etag)

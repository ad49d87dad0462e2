"""The cache's quota: least recently used, unpinned, idle blobs are evicted so that blobs stay under ``max_size``
as fills start (not only at the periodic pass) and a fill leaves ``min_free_space`` on the disk.

With a fleet's database (``metadata_url``) every eviction (the quota's, ``cache gc``, ``cache rm``, an operator's)
is the fleet's decision (:meth:`mirror.metadata.base.MetadataStore.decide_eviction`): a blob pinned anywhere, busy on
any node (read or filled: :mod:`mirror.metadata.busy`) or leased for a fill is kept, the least recently read in the
fleet goes first, and every node drops its own copy of what was deleted (:meth:`CacheManager.dropped`)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mirror.cache.maintenance import Maintenance
from mirror.cache.usage import UsageReports, UsageSnapshot
from mirror.errors import MirrorError
from mirror.fill.copy import SparsePartial, drop_partial, sparse_partials
from mirror.index import MetadataIndex
from mirror.layout import CacheLayout
from mirror.metadata import MetadataStore
from mirror.metadata.base import EVICTION_DELETE_WINDOW
from mirror.metadata.busy import BusyMarks
from mirror.metadata.held import HeldWindows
from mirror.metrics import Metrics
from mirror.storage.base import BlobInfo, BlobStore

log = logging.getLogger("hf_mirror.cache")

# A fill that would pass the quota evicts down to this share of it: one pass makes room for several fills.
_QUOTA_LOW_WATER = 0.95
_EVICTOR = f"gc:{os.getpid()}"  # the owner named in the lease taken to evict a sparse partial file
_EVICT_LEASE_SECONDS = 60.0


@dataclass(frozen=True)
class GcReport:
    evicted: int
    freed_bytes: int
    total_bytes: int


class CacheManager(UsageReports, Maintenance):
    def __init__(self, store: BlobStore, index: MetadataIndex, metrics: Metrics, *, max_size: int | None,
                 is_busy: Callable[[str], bool], layout: CacheLayout, min_free_space: int = 0,
                 evicts_for_disk: bool = True, metadata: MetadataStore | None = None,
                 busy: BusyMarks | None = None, held: HeldWindows | None = None) -> None:
        self.store = store
        self.layout = layout  # where this node's partial files are (swept at startup, counted by ``cache du``)
        self.root = layout.root  # the disk fills write to
        self.min_free_space = min_free_space
        # Local storage: blobs on this disk can go to make room. A shared bucket is not this disk's to evict.
        self.evicts_for_disk = evicts_for_disk
        self.index = index
        self.metrics = metrics
        self.max_size = max_size
        metrics.quota_bytes.set(max_size or 0)
        self.is_busy = is_busy
        self._lock = asyncio.Lock()
        # Blob bytes as this process knows them: set by every scan, raised by each fill it lets start, lowered by
        # each eviction. Other workers' fills show up at the next scan (the periodic pass, or a status snapshot).
        self._used: int | None = None
        self._snapshot: UsageSnapshot | None = None
        self._snapshot_task: asyncio.Task[UsageSnapshot] | None = None
        self._scan_seconds: float | None = None  # how long this process's last usage count took
        self._stored_scan = 0.0  # how long the count of the snapshot kept by the last run took
        self._generation, self._snapshot_generation = 0, -1
        # The fleet's database (metadata_url): pins are the fleet's, and gc keeps a blob pinned through any node.
        self.metadata = metadata
        # This process's busy marks (with the database): evictions are then decided for the fleet, as this node.
        self.busy = busy
        # The fleet's record of the windows this node holds (a database and --node-url): evicted windows leave it.
        self.held = held

    async def _fleet_pinned_blobs(self) -> set[str] | None:
        """The blobs of repos pinned anywhere in the fleet (empty without a database); None when it cannot say."""
        if self.metadata is None:
            return set()
        try:
            return await self.metadata.pinned_blobs()
        except MirrorError:
            return None

    async def blobs(self) -> list[BlobInfo]:
        return [info async for info in self.store.list_blobs()]

    async def sparse(self) -> list[SparsePartial]:
        """The partial files holding windows of files never completed (sparse fills): in the quota like blobs."""
        found = await asyncio.to_thread(sparse_partials, self.store.partials_dir)
        self.metrics.sparse_files.set(len(found))
        self.metrics.sparse_bytes.set(sum(s.held for s in found))
        return found

    async def _drop_sparse(self, item: SparsePartial) -> bool:
        """Evict a sparse partial file nobody fills: under its lease, so no fill opens it meanwhile."""
        if self.is_busy(item.etag) or not await self.store.acquire_lease(item.etag, _EVICTOR, _EVICT_LEASE_SECONDS):
            return False
        try:
            if self.held is not None:
                await self.held.forget(item.etag)  # first: no node is sent here for windows about to go
            drop_partial(item.partial)  # three unlinks, on the loop: no fill of this process starts in between
        finally:
            await self.store.release_lease(item.etag, _EVICTOR)
        log.info("evicted the windows of %s (%d bytes held, a sparse file never completed)", item.etag, item.held)
        return True

    def blob_repos(self) -> dict[str, set[tuple[str, str]]]:
        """etag -> the repos whose cached file entries name it. A scan of the index: call it in a thread."""
        owners: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for repo_type, repo_id, entry in self.index.iter_files():
            if entry.etag:
                owners[entry.etag].add((repo_type, repo_id))
        return owners

    async def collect(self, max_size: int | None = None, *, free: int = 0) -> GcReport:
        """Evict least-recently-used unpinned, idle blobs until the total is under the quota, or ``free`` bytes
        under what it is now (whichever is lower)."""
        limit = max_size if max_size is not None else self._blob_quota()
        async with self._lock:
            blobs = await self.blobs()
            sparse = await self.sparse()
            total = sum(b.size for b in blobs) + sum(s.held for s in sparse)
            if free > 0:
                limit = max(min(limit or total, total - free), 1)
            self._update_gauges(blobs)
            self._used = total
            if not limit or total <= limit:
                return GcReport(0, 0, total)
            pinned = self.index.pinned_repos()
            fleet_pinned = await self._fleet_pinned_blobs()
            if fleet_pinned is None:
                log.warning("gc skipped: the fleet's pins cannot be read (its database is down)")
                return GcReport(0, 0, total)
            owners = await asyncio.to_thread(self.blob_repos)
            # Blobs and the windows of sparse files never completed, least recently used first, alike: runs of
            # blobs go to evict_blobs (the fleet decides those), a sparse file's windows are this node's own.
            gone: list[BlobInfo] = []
            dropped = 0
            run: list[BlobInfo] = []
            for item in sorted([*blobs, *sparse], key=lambda b: b.last_access):
                if owners.get(item.etag, set()) & pinned or item.etag in fleet_pinned:
                    continue
                if not isinstance(item, SparsePartial):
                    run.append(item)
                    continue
                evicted_run = await self._evict_run(run, total - limit)
                gone += evicted_run
                total -= sum(b.size for b in evicted_run)
                if total <= limit:
                    break
                if not self.is_busy(item.etag) and await self._drop_sparse(item):
                    dropped += item.held
                    total -= item.held
                    self.metrics.evictions.inc()
            evicted_run = await self._evict_run(run, total - limit)
            gone += evicted_run
            total -= sum(b.size for b in evicted_run)
            evicted, freed = len(gone), sum(b.size for b in gone)
            self.metrics.evictions.inc(evicted)
            if gone:
                self.evicted(gone, owners)
            if dropped:
                await self.sparse()  # the gauges
            if total > limit:
                log.warning("cache is %d bytes, over the %d quota: the rest is pinned or in use", total, limit)
            self.metrics.cache_bytes.set(total - sum(s.held for s in sparse) + dropped)
            self._used = total
            return GcReport(evicted, freed + dropped, total)

    async def _evict_run(self, run: list[BlobInfo], need: int) -> list[BlobInfo]:
        """Evict from ``run`` (emptied) while ``need`` bytes are still over the quota."""
        candidates, run[:] = list(run), []
        return await self.evict_blobs(candidates, need) if candidates and need > 0 else []

    async def evict_blobs(self, candidates: Sequence[BlobInfo], need: int | None) -> list[BlobInfo]:
        """Delete ``candidates`` (least recently used first) until ``need`` bytes are gone (None: every one allowed),
        never one that is busy; returns those deleted. With a fleet's database the fleet decides which (its pins, its
        busy marks, its leases, its read times) and every node is told of the deletes."""
        if self.metadata is None or self.busy is None:
            gone: list[BlobInfo] = []
            freed = 0
            for blob in candidates:
                if need is not None and freed >= need:
                    break
                if self.is_busy(blob.etag):
                    continue
                if await self.store.delete(blob.etag):
                    gone.append(blob)
                    freed += blob.size
            return gone
        return await self._evict_for_the_fleet(candidates, need)

    async def _evict_for_the_fleet(self, candidates: Sequence[BlobInfo], need: int | None) -> list[BlobInfo]:
        assert self.metadata is not None and self.busy is not None
        by_etag = {blob.etag: blob for blob in candidates if not self.is_busy(blob.etag)}
        decided_at = time.monotonic()
        chosen = await self.metadata.decide_eviction(self.busy.node, list(by_etag.values()), need)
        gone: list[BlobInfo] = []
        deleted: list[str] = []
        failure: MirrorError | None = None
        for at, etag in enumerate(chosen):
            if time.monotonic() - decided_at > EVICTION_DELETE_WINDOW:
                # Past the window the fleet no longer holds these for us: readers may be copying them now.
                log.warning("eviction: %d blobs left undeleted (the decision is too old)", len(chosen) - at)
                break
            try:
                existed = await self.store.delete(etag)
            except MirrorError as exc:
                failure = exc
                break
            deleted.append(etag)
            if existed:
                gone.append(by_etag[etag])
        kept = chosen[len(deleted):]
        await self.metadata.finish_eviction(self.busy.node, deleted, kept)
        if failure is not None:
            raise failure
        return gone

    def dropped(self, etag: str) -> None:
        """Another node evicted ``etag`` from the shared store: this node's copy goes too (its readers keep theirs)."""
        if self.store.drop_local(etag):
            log.info("dropped this node's copy of %s: evicted from the shared store", etag)
        self.changed()

    async def make_room(self, size: int, reserved: int) -> bool:
        """Room for a new blob of ``size`` bytes beside ``reserved`` bytes that fills in progress have yet to write:
        under ``max_size`` (the quota holds while serving, not only at the periodic pass), and leaving
        ``min_free_space`` on the disk; evicts least recently used, unpinned, idle blobs to get it. False: no disk
        room (the caller relays the file without storing it; the quota alone never refuses a file)."""
        if self.max_size:
            if self._used is None:
                self._used = sum(b.size for b in await self.blobs()) + sum(s.held for s in await self.sparse())
            over = self._used + reserved + size - (self._blob_quota() or 0)
            if over > 0:
                report = await self.collect(free=over + int(self.max_size * (1 - _QUOTA_LOW_WATER)))
                log.info("quota: evicted %d blobs (%d bytes) for a new %d-byte fill", report.evicted,
                         report.freed_bytes, size)
        shortfall = self._shortfall(size + reserved)
        if shortfall > 0 and self.evicts_for_disk:
            report = await self.collect(free=shortfall)
            log.warning("disk short by %d bytes for a new fill: evicted %d blobs (%d bytes)", shortfall,
                        report.evicted, report.freed_bytes)
            shortfall = self._shortfall(size + reserved)
        if shortfall > 0:
            return False
        if self._used is not None:
            self._used += size
        return True

    def _blob_quota(self) -> int | None:
        """``max_size`` less the bytes of the index's negative entries (remembered 404s: bounded, and counted in the
        cache's usage so that anyone's 404s cannot grow it past the quota); this process's running count, no SQL."""
        if not self.max_size:
            return self.max_size
        return max(self.max_size - self.index.negative_usage(exact=False)[1], 1)

    def _shortfall(self, need: int) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        return need + self.min_free_space - shutil.disk_usage(self.root).free

    async def run_periodically(self, interval: float) -> None:
        """The periodic pass (``gc_interval``): the quota against what every worker wrote, and expired index entries
        (remembered 404s, access records) dropped."""
        while True:
            try:
                if self.max_size:
                    report = await self.collect()
                    if report.evicted:
                        log.info("gc evicted %d blobs (%d bytes)", report.evicted, report.freed_bytes)
                await asyncio.to_thread(self.index.cull_expired)
            except Exception:  # noqa: BLE001 - the loop must survive a bad pass
                log.exception("gc pass failed")
            await asyncio.sleep(interval)

    def _update_gauges(self, blobs: list[BlobInfo]) -> None:
        self.metrics.cache_bytes.set(sum(b.size for b in blobs))
        self.metrics.cache_blobs.set(len(blobs))

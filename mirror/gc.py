"""Disk management: quota with LRU eviction of unpinned blobs, stale-partial sweep, verification, usage reports.

Eviction never removes a blob that a pinned repo (a sync manifest's) references, nor one being filled. A blob
being *served* is safe too: readers hold an open file descriptor, and unlinking a file leaves open descriptors
valid on POSIX, so an in-flight download completes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirror.errors import IntegrityError
from mirror.hf import RepoRef, RepoType
from mirror.index import MetadataIndex
from mirror.integrity import hash_file
from mirror.metrics import Metrics
from mirror.storage.base import BlobInfo, BlobStore

if TYPE_CHECKING:
    from mirror.config import Settings
    from mirror.fill import FillManager
    from mirror.upstream import UpstreamClient

log = logging.getLogger("hf_mirror.gc")

_PARTIAL_MAX_AGE = 7 * 24 * 3600.0  # a partial nobody resumed for a week is dropped


@dataclass(frozen=True)
class RepoUsage:
    type: str
    repo_id: str
    files: int
    bytes: int
    commits: tuple[str, ...]
    last_access: float
    pinned: bool


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    checked_bytes: int
    corrupt: tuple[BlobInfo, ...]
    removed: bool


@dataclass(frozen=True)
class GcReport:
    evicted: int
    freed_bytes: int
    total_bytes: int


class CacheManager:
    def __init__(self, store: BlobStore, index: MetadataIndex, metrics: Metrics, *, max_size: int | None,
                 is_busy: Callable[[str], bool], root: Path, min_free_space: int = 0,
                 evicts_for_disk: bool = True) -> None:
        self.store = store
        self.root = root  # the disk fills write to
        self.min_free_space = min_free_space
        # Local storage: blobs on this disk can go to make room. A shared bucket is not this disk's to evict.
        self.evicts_for_disk = evicts_for_disk
        self.index = index
        self.metrics = metrics
        self.max_size = max_size
        self.is_busy = is_busy
        self._lock = asyncio.Lock()

    async def blobs(self) -> list[BlobInfo]:
        return [info async for info in self.store.list_blobs()]

    def blob_repos(self) -> dict[str, set[tuple[str, str]]]:
        """etag -> the repos whose cached file entries name it."""
        owners: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for repo_type, repo_id, entry in self.index.iter_files():
            if entry.etag:
                owners[entry.etag].add((repo_type, repo_id))
        return owners

    async def usage(self) -> list[RepoUsage]:
        blobs = {b.etag: b for b in await self.blobs()}
        pinned = self.index.pinned_repos()
        per_repo: dict[tuple[str, str], dict[str, Any]] = defaultdict(
            lambda: {"etags": set(), "commits": set(), "last": 0.0}
        )
        for repo_type, repo_id, entry in self.index.iter_files():
            info = blobs.get(entry.etag) if entry.etag else None
            if info is None:
                continue
            record = per_repo[(repo_type, repo_id)]
            record["etags"].add(entry.etag)
            record["commits"].add(entry.commit)
            record["last"] = max(record["last"], info.last_access)
        return sorted(
            (RepoUsage(t, r, len(v["etags"]), sum(blobs[e].size for e in v["etags"]), tuple(sorted(v["commits"])),
                       v["last"], (t, r) in pinned)
             for (t, r), v in per_repo.items()),
            key=lambda u: (u.type, u.repo_id),
        )

    async def collect(self, max_size: int | None = None, *, free: int = 0) -> GcReport:
        """Evict least-recently-used unpinned, idle blobs until the total is under the quota, or ``free`` bytes
        under what it is now (whichever is lower)."""
        limit = max_size if max_size is not None else self.max_size
        async with self._lock:
            blobs = await self.blobs()
            total = sum(b.size for b in blobs)
            if free > 0:
                limit = max(min(limit or total, total - free), 1)
            self._update_gauges(blobs)
            if not limit or total <= limit:
                return GcReport(0, 0, total)
            pinned = self.index.pinned_repos()
            owners = self.blob_repos()
            evicted = freed = 0
            for blob in sorted(blobs, key=lambda b: b.last_access):
                if total <= limit:
                    break
                if self.is_busy(blob.etag) or owners.get(blob.etag, set()) & pinned:
                    continue
                if await self.store.delete(blob.etag):
                    total -= blob.size
                    freed += blob.size
                    evicted += 1
                    self.metrics.evictions.inc()
            if total > limit:
                log.warning("cache is %d bytes, over the %d quota: the rest is pinned or in use", total, limit)
            self.metrics.cache_bytes.set(total)
            return GcReport(evicted, freed, total)

    async def make_room(self, size: int, reserved: int) -> bool:
        """Disk for a new blob of ``size`` bytes beside ``reserved`` bytes that fills in progress have yet to write,
        leaving ``min_free_space``; evicts least recently used blobs (local storage) to get it. False: no room."""
        shortfall = self._shortfall(size + reserved)
        if shortfall <= 0:
            return True
        if self.evicts_for_disk:
            report = await self.collect(free=shortfall)
            log.warning("disk short by %d bytes for a new fill: evicted %d blobs (%d bytes)", shortfall,
                        report.evicted, report.freed_bytes)
            shortfall = self._shortfall(size + reserved)
        return shortfall <= 0

    def _shortfall(self, need: int) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        return need + self.min_free_space - shutil.disk_usage(self.root).free

    async def run_periodically(self, interval: float) -> None:
        while True:
            try:
                report = await self.collect()
                if report.evicted:
                    log.info("gc evicted %d blobs (%d bytes)", report.evicted, report.freed_bytes)
            except Exception:  # noqa: BLE001 - the loop must survive a bad pass
                log.exception("gc pass failed")
            await asyncio.sleep(interval)

    async def remove_repo(self, repo: RepoRef) -> tuple[int, int]:
        """Drop a repo's index entries and the blobs no other repo uses; returns (blobs removed, bytes)."""
        owners = self.blob_repos()
        mine = {e for e, repos in owners.items() if (repo.type.value, repo.repo_id) in repos}
        removed = freed = 0
        for etag in mine:
            if owners[etag] - {(repo.type.value, repo.repo_id)} or self.is_busy(etag):
                continue
            info = await self.store.stat(etag)
            if info and await self.store.delete(etag):
                removed += 1
                freed += info.size
        self.index.delete_repo(repo)
        return removed, freed

    async def sweep_partials(self) -> int:
        """Delete partial files nobody holds a lease on and nobody touched for a week (others are resumed)."""
        partials_dir = getattr(self.store, "partials_dir", None)
        if partials_dir is None or not os.path.isdir(partials_dir):
            return 0
        removed = 0
        now = time.time()
        for entry in os.scandir(partials_dir):
            if not entry.name.endswith(".part"):
                continue
            etag = entry.name[: -len(".part")]
            if await self.store.stat(etag) is not None or now - entry.stat().st_mtime > _PARTIAL_MAX_AGE:
                if await self.store.read_lease(etag) is None:
                    os.unlink(entry.path)
                    removed += 1
        return removed

    async def verify(self, *, remove: bool = True, jobs: int = 4,
                     on_result: Callable[[BlobInfo, bool], None] | None = None) -> VerifyReport:
        """Re-hash every committed blob against its etag; corrupt ones are deleted when ``remove`` (the next request
        fills them again). Idle blobs only: a blob being filled is not committed yet, so it is never listed."""
        sizes: dict[str, int] = {}
        for _type, _repo, entry in self.index.iter_files():
            if entry.etag and not entry.missing:
                sizes[entry.etag] = entry.size
        blobs = await self.blobs()
        semaphore = asyncio.Semaphore(max(1, jobs))
        corrupt: list[BlobInfo] = []
        checked = 0
        checked_bytes = 0

        async def check(blob: BlobInfo) -> None:
            nonlocal checked, checked_bytes
            async with semaphore:
                try:
                    path = await self.store.local_path(blob.etag)
                except IntegrityError:  # a bucket blob is hashed on its way to this disk: the stored one is bad
                    ok = False
                else:
                    if path is None:
                        return  # evicted or removed meanwhile
                    size = sizes.get(blob.etag, blob.size)
                    try:
                        ok = await asyncio.to_thread(hash_file, path, blob.etag, size)
                    except FileNotFoundError:
                        return
                checked += 1
                checked_bytes += blob.size
                if not ok:
                    corrupt.append(blob)
                    self.metrics.integrity_failures.inc()
                    if remove:
                        await self.store.delete(blob.etag)
                if on_result is not None:
                    on_result(blob, ok)

        await asyncio.gather(*(check(b) for b in blobs))
        return VerifyReport(checked, checked_bytes, tuple(corrupt), removed=remove)

    def _update_gauges(self, blobs: list[BlobInfo]) -> None:
        self.metrics.cache_bytes.set(sum(b.size for b in blobs))
        self.metrics.cache_blobs.set(len(blobs))

    async def status(self, settings: Settings, upstream: UpstreamClient, fills: FillManager) -> dict[str, Any]:
        blobs = await self.blobs()
        self._update_gauges(blobs)
        counts: dict[str, float] = defaultdict(float)
        for metric in self.metrics.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["outcome"]] += sample.value
        served = counts["hit"] + counts["miss"] + counts["stale"]
        return {
            "upstream": {"url": settings.upstream_display, "healthy": upstream.healthy,
                         "last_error": upstream.last_error},
            "offline": settings.offline,
            "cache_bytes": sum(b.size for b in blobs),
            "cache_blobs": len(blobs),
            "max_size": settings.max_size,
            "hits": int(counts["hit"]), "misses": int(counts["miss"]), "stale": int(counts["stale"]),
            "hit_ratio": (counts["hit"] / served) if served else 0.0,
            "fills": [{"repo": f.spec.repo.key, "path": f.spec.path, "written": f.written, "size": f.spec.size}
                      for f in fills.active],
            "repos": [{"type": u.type, "id": u.repo_id, "bytes": u.bytes, "files": u.files, "pinned": u.pinned,
                       "last_access": time.strftime("%Y-%m-%d %H:%M", time.localtime(u.last_access))}
                      for u in await self.usage()],
        }


def repo_from_spec(spec: str, default_type: str = "model") -> RepoRef:
    """``model:acme/x``, ``datasets/acme/x`` or ``acme/x`` -> RepoRef."""
    repo_type = default_type
    if ":" in spec:
        repo_type, spec = spec.split(":", 1)
    elif spec.startswith(("datasets/", "spaces/", "models/")):
        plural, spec = spec.split("/", 1)
        repo_type = plural[:-1]
    return RepoRef(RepoType(repo_type), spec)

"""What the cache holds, per repo, for the status page, ``/metrics`` and ``cache ls``: a usage snapshot taken off
the event loop (one SQL pass over the index, a thread per blob shard), served stale while the next one is taken."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mirror.hf import RepoRef
from mirror.storage.base import BlobInfo

if TYPE_CHECKING:
    from mirror.index import MetadataIndex
    from mirror.metrics import Metrics

# Status pages and /metrics answer from a usage snapshot at most this old (or ten times the last scan's duration).
_SNAPSHOT_MAX_AGE = 2.0


@dataclass(frozen=True)
class UsageSnapshot:
    taken_at: float
    total_bytes: int
    total_blobs: int
    repos: tuple[RepoUsage, ...]


@dataclass(frozen=True)
class RepoUsage:
    type: str
    repo_id: str
    files: int
    bytes: int
    commits: tuple[str, ...]
    last_access: float
    pinned: bool


class UsageReports:
    """The usage half of :class:`mirror.cache.manager.CacheManager` (it holds the state these methods share)."""

    index: MetadataIndex
    metrics: Metrics
    _used: int | None
    _snapshot: UsageSnapshot | None
    _snapshot_task: asyncio.Task[UsageSnapshot] | None

    async def usage(self, blob_list: list[BlobInfo] | None = None) -> list[RepoUsage]:
        blobs = {b.etag: b for b in (blob_list if blob_list is not None else await self.blobs())}
        return await asyncio.to_thread(self._scan_usage, blobs)

    async def current_snapshot(self) -> UsageSnapshot:
        """The usage snapshot for a request path: the last one at once (stale while a refresh runs in a thread);
        only the very first call waits for a scan. Refreshes are spaced by at least ten times the last scan's own
        duration, so a large cache is never scanned back to back (a 5-s scan runs at most every 50 s)."""
        current = self._snapshot
        age_limit = max(_SNAPSHOT_MAX_AGE, 10 * getattr(self, "_scan_seconds", 0.0))
        if current is not None and time.time() - current.taken_at < age_limit:
            return current
        if self._snapshot_task is None or self._snapshot_task.done():
            self._snapshot_task = asyncio.create_task(self._take_fast_snapshot())
        if current is not None:
            return current
        return await asyncio.shield(self._snapshot_task)

    async def _take_fast_snapshot(self) -> UsageSnapshot:
        started = time.monotonic()
        blobs = {b.etag: b for b in await self.blobs()}  # a thread per shard (the store's list_blobs)
        repos = await asyncio.to_thread(self._scan_usage, blobs)
        total = sum(b.size for b in blobs.values())
        self.metrics.cache_bytes.set(total)
        self.metrics.cache_blobs.set(len(blobs))
        self._used = total
        self._snapshot = UsageSnapshot(time.time(), total, len(blobs), tuple(repos))
        self._scan_seconds = time.monotonic() - started
        return self._snapshot

    def _scan_usage(self, blobs: dict[str, BlobInfo]) -> list[RepoUsage]:
        """Per-repo usage in one SQL pass over the file entries (``index.iter_files``); blobs counted once each."""
        pinned = set(self.index.pin_sources())
        per_repo: dict[tuple[str, str], list[Any]] = {}
        for repo_type, repo_id, entry in self.index.iter_files():
            info = blobs.get(entry.etag) if entry.etag else None
            if info is None:
                continue
            record = per_repo.get((repo_type, repo_id))
            if record is None:
                record = per_repo[(repo_type, repo_id)] = [set(), set(), 0.0]
            record[0].add(entry.etag)
            record[1].add(entry.commit)
            if info.last_access > record[2]:
                record[2] = info.last_access
        return sorted(
            (RepoUsage(t, r, len(etags), sum(blobs[e].size for e in etags), tuple(sorted(commits)), last,
                       (t, r) in pinned)
             for (t, r), (etags, commits, last) in per_repo.items()),
            key=lambda u: (u.type, u.repo_id),
        )

    def _patch_snapshot(self, repo: RepoRef, *, pinned: bool | None = None, freed: tuple[int, int] | None = None,
                        ) -> None:
        """Keep the last snapshot true after an operator's action, without a scan: the page shows it at once."""
        snap = self._snapshot
        if snap is None:
            return
        key = (repo.type.value, repo.repo_id)
        repos = []
        for usage in snap.repos:
            if (usage.type, usage.repo_id) == key:
                if freed is not None:
                    continue  # evicted: its blobs are gone (a blob another repo shares comes back on its next use)
                if pinned is not None:
                    usage = RepoUsage(usage.type, usage.repo_id, usage.files, usage.bytes, usage.commits,
                                      usage.last_access, pinned)
            repos.append(usage)
        blobs, freed_bytes = freed or (0, 0)
        self._snapshot = UsageSnapshot(snap.taken_at, snap.total_bytes - freed_bytes, snap.total_blobs - blobs,
                                       tuple(repos))

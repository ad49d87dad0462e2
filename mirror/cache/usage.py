"""What the cache holds, per repo, for the status page, ``/metrics`` and ``cache ls``: a usage snapshot taken off
the event loop (one SQL pass over the index, a thread per blob shard), kept true between counts by a tally of each
commit and eviction, and kept in the index so that a restart answers from the last one at once."""

from __future__ import annotations

import asyncio
import bisect
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
# A scan at most this long is waited for when the blobs changed since the last one (a small cache: exact answers).
_QUICK_SCAN = 0.25
# The longest a request waits for the first scan of a cache (then it gets an empty answer: still counting).
_FIRST_SCAN_WAIT = 2.0


@dataclass(frozen=True)
class UsageSnapshot:
    taken_at: float
    total_bytes: int
    total_blobs: int
    repos: tuple[RepoUsage, ...]
    # Partial files holding windows of files never completed (sparse fills), and the bytes they hold: apart from the
    # blobs (not in ``total_bytes``), in the quota all the same.
    sparse_files: int = 0
    sparse_bytes: int = 0


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
    _generation: int  # bumped by every change of the blobs this process makes (see changed)
    _snapshot_generation: int
    _scan_seconds: float | None
    _stored_scan: float

    async def usage(self, blob_list: list[BlobInfo] | None = None) -> list[RepoUsage]:
        blobs = {b.etag: b for b in (blob_list if blob_list is not None else await self.blobs())}
        return await asyncio.to_thread(self._scan_usage, blobs)

    async def current_snapshot(self) -> UsageSnapshot:
        """The usage snapshot for a request path, never a scan on the event loop.

        A small cache (its scan takes under ``_QUICK_SCAN``) is counted again when it is older than
        ``_SNAPSHOT_MAX_AGE`` or its blobs changed: exact answers. A large one answers from the last snapshot at once
        while a refresh runs in a thread, refreshes spaced by ten times the last scan's own duration (a 5-s scan runs
        at most every 50 s). Before this process's first count ends (a server starts it at startup: :meth:`prime`),
        a request gets the snapshot the last run kept in the index when that count was long, else waits at most
        ``_FIRST_SCAN_WAIT`` seconds for this one, then gets an empty snapshot with ``taken_at`` 0 (still counting)."""
        if self._scan_seconds is None:
            self.prime()
            assert self._snapshot_task is not None
            if self._snapshot is None:
                stored, stored_scan = await asyncio.to_thread(self._stored_snapshot)
                if self._snapshot is None:  # this run's count may have ended during that read: it wins
                    self._snapshot, self._stored_scan = stored, stored_scan
            if self._snapshot is not None and self._stored_scan > _QUICK_SCAN:
                return self._snapshot  # a large cache: the last run's count, while this run's is taken
            try:
                await asyncio.wait_for(asyncio.shield(self._snapshot_task), _FIRST_SCAN_WAIT)
            except TimeoutError:
                return self._snapshot or UsageSnapshot(0.0, self._used or 0, 0, ())
        for _ in range(2):  # a count that started before the last change is followed by one more
            current, scan = self._snapshot, self._scan_seconds
            assert current is not None
            quick, changed = scan <= _QUICK_SCAN, self._generation != self._snapshot_generation
            if time.time() - current.taken_at < max(_SNAPSHOT_MAX_AGE, 10 * scan) and not (quick and changed):
                return current
            self.prime()
            assert self._snapshot_task is not None
            if not quick:
                return current
            await asyncio.shield(self._snapshot_task)
        assert self._snapshot is not None
        return self._snapshot

    def prime(self) -> None:
        """Start a usage scan in the background unless one runs (a server does it at startup)."""
        if self._snapshot_task is None or self._snapshot_task.done():
            self._snapshot_task = asyncio.create_task(self._take_fast_snapshot())

    def changed(self) -> None:
        """The blobs changed (a commit, an eviction): the next answer of a small cache counts them again."""
        self._generation += 1

    def committed(self, repo: RepoRef, commit: str, etag: str, size: int) -> None:
        """A fill stored a new blob for ``repo``: the tally (totals, gauges, the repo's row) counts it at once, so a
        large cache's figures do not wait for its next count (which replaces the tally with exact figures)."""
        self.changed()
        self.metrics.cache_grew(size)
        snap = self._snapshot
        if snap is None:
            return
        key = (repo.type.value, repo.repo_id)
        repos = list(snap.repos)
        at = bisect.bisect_left(repos, key, key=lambda u: (u.type, u.repo_id))
        now = time.time()
        if at < len(repos) and (repos[at].type, repos[at].repo_id) == key:
            u = repos[at]
            commits = u.commits if commit in u.commits else tuple(sorted((*u.commits, commit)))
            repos[at] = RepoUsage(u.type, u.repo_id, u.files + 1, u.bytes + size, commits, now, u.pinned)
        else:
            repos.insert(at, RepoUsage(key[0], key[1], 1, size, (commit,), now, False))
        self._snapshot = UsageSnapshot(snap.taken_at, snap.total_bytes + size, snap.total_blobs + 1, tuple(repos),
                                       snap.sparse_files, snap.sparse_bytes)

    def evicted(self, gone: list[BlobInfo], owners: dict[str, set[tuple[str, str]]]) -> None:
        """Blobs were evicted (``owners``: etag -> the repos naming it): the tally drops them at once."""
        self.changed()
        snap = self._snapshot
        if snap is None or not gone:
            return
        lost: dict[tuple[str, str], list[int]] = {}
        for blob in gone:
            for key in owners.get(blob.etag, ()):
                record = lost.setdefault(key, [0, 0])
                record[0] += 1
                record[1] += blob.size
        repos = []
        for u in snap.repos:
            files, size = lost.get((u.type, u.repo_id), (0, 0))
            if files >= u.files:
                continue  # none of its blobs left
            if files:
                u = RepoUsage(u.type, u.repo_id, u.files - files, u.bytes - size, u.commits, u.last_access, u.pinned)
            repos.append(u)
        freed = sum(b.size for b in gone)
        self._snapshot = UsageSnapshot(snap.taken_at, max(0, snap.total_bytes - freed),
                                       max(0, snap.total_blobs - len(gone)), tuple(repos), snap.sparse_files,
                                       snap.sparse_bytes)

    def _stored_snapshot(self) -> tuple[UsageSnapshot | None, float]:
        """The snapshot the last run kept in the index, and how long its count took."""
        stored = self.index.get_usage()
        if isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[0], UsageSnapshot):
            return stored[0], float(stored[1])
        return None, 0.0  # none, or another version's

    async def _take_fast_snapshot(self) -> UsageSnapshot:
        started, generation = time.monotonic(), self._generation
        blobs = {b.etag: b for b in await self.blobs()}  # a thread per shard (the store's list_blobs)
        repos = await asyncio.to_thread(self._scan_usage, blobs)
        sparse = await self.sparse()
        total, held = sum(b.size for b in blobs.values()), sum(s.held for s in sparse)
        self.metrics.cache_bytes.set(total)
        self.metrics.cache_blobs.set(len(blobs))
        self._used = total + held
        snapshot = self._snapshot = UsageSnapshot(time.time(), total, len(blobs), tuple(repos), len(sparse), held)
        self._scan_seconds, self._snapshot_generation = time.monotonic() - started, generation
        await asyncio.to_thread(self.index.put_usage, (snapshot, self._scan_seconds))
        return snapshot

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
                                       tuple(repos), snap.sparse_files, snap.sparse_bytes)

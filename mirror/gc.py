"""Disk management: quota with LRU eviction of unpinned blobs, stale-partial sweep, verification, usage reports.

Eviction never removes a blob that a pinned repo (a sync manifest's) references, nor one being filled. A blob
being *served* is safe too: readers hold an open file descriptor, and unlinking a file leaves open descriptors
valid on POSIX, so an in-flight download completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirror.errors import IntegrityError, MirrorError
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
# Status pages and /metrics answer from a usage snapshot at most this old: a flood of them costs one scan (in a
# thread, off the event loop) per period, whatever the size of the cache.
_SNAPSHOT_MAX_AGE = 2.0
# A fill that would pass the quota evicts down to this share of it: one pass makes room for several fills.
_QUOTA_LOW_WATER = 0.95
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
        # Blob bytes as this process knows them: set by every scan, raised by each fill it lets start, lowered by
        # each eviction. Other workers' fills show up at the next scan (the periodic pass, or a status snapshot).
        self._used: int | None = None
        self._snapshot: UsageSnapshot | None = None
        self._snapshot_task: asyncio.Task[UsageSnapshot] | None = None
        # The scrub: blobs checked good in this process, and blobs served for the first time, waiting for a check.
        self._scrubbed: set[tuple[str, int, int, int]] = set()  # (etag, mtime_ns, size, inode): a rewrite shows
        self._suspects: dict[str, None] = {}
        self._suspect_added = asyncio.Event()

    async def blobs(self) -> list[BlobInfo]:
        return [info async for info in self.store.list_blobs()]

    def blob_repos(self) -> dict[str, set[tuple[str, str]]]:
        """etag -> the repos whose cached file entries name it. A scan of the index: call it in a thread."""
        owners: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for repo_type, repo_id, entry in self.index.iter_files():
            if entry.etag:
                owners[entry.etag].add((repo_type, repo_id))
        return owners

    async def usage(self, blob_list: list[BlobInfo] | None = None) -> list[RepoUsage]:
        blobs = {b.etag: b for b in (blob_list if blob_list is not None else await self.blobs())}
        return await asyncio.to_thread(self._usage, blobs)

    def _usage(self, blobs: dict[str, BlobInfo]) -> list[RepoUsage]:
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
            self._used = total
            if not limit or total <= limit:
                return GcReport(0, 0, total)
            pinned = self.index.pinned_repos()
            owners = await asyncio.to_thread(self.blob_repos)
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
            self._used = total
            return GcReport(evicted, freed, total)

    async def make_room(self, size: int, reserved: int) -> bool:
        """Room for a new blob of ``size`` bytes beside ``reserved`` bytes that fills in progress have yet to write:
        under ``max_size`` (the quota holds while serving, not only at the periodic pass), and leaving
        ``min_free_space`` on the disk; evicts least recently used, unpinned, idle blobs to get it. False: no disk
        room (the caller relays the file without storing it; the quota alone never refuses a file)."""
        if self.max_size:
            if self._used is None:
                self._used = sum(b.size for b in await self.blobs())
            over = self._used + reserved + size - self.max_size
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
            if entry.name.endswith(".part.prefix"):  # a parallel fill's progress note, orphaned by a crash
                if not os.path.exists(entry.path[: -len(".prefix")]):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                continue
            if not entry.name.endswith(".part"):
                continue
            etag = entry.name[: -len(".part")]
            if await self.store.stat(etag) is not None or now - entry.stat().st_mtime > _PARTIAL_MAX_AGE:
                if await self.store.read_lease(etag) is None:
                    os.unlink(entry.path)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path + ".prefix")
                    removed += 1
        return removed

    async def verify(self, *, remove: bool = True, jobs: int = 4,
                     on_result: Callable[[BlobInfo, bool], None] | None = None) -> VerifyReport:
        """Re-hash every committed blob against its etag; corrupt ones are deleted when ``remove`` (the next request
        fills them again). Idle blobs only: a blob being filled is not committed yet, so it is never listed."""
        sizes = await asyncio.to_thread(self._expected_sizes)
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

    def _expected_sizes(self) -> dict[str, int]:
        return {entry.etag: entry.size for _t, _r, entry in self.index.iter_files() if entry.etag and not entry.missing}

    async def snapshot(self) -> UsageSnapshot:
        """Blob totals and per-repo usage, at most ``_SNAPSHOT_MAX_AGE`` old; one scan at a time, off the loop."""
        current = self._snapshot
        if current is not None and time.time() - current.taken_at < _SNAPSHOT_MAX_AGE:
            return current
        if self._snapshot_task is None or self._snapshot_task.done():
            self._snapshot_task = asyncio.create_task(self._take_snapshot())
        return await asyncio.shield(self._snapshot_task)

    async def _take_snapshot(self) -> UsageSnapshot:
        blobs = await self.blobs()
        repos = await self.usage(blobs)
        self._update_gauges(blobs)
        total = sum(b.size for b in blobs)
        self._used = total
        self._snapshot = UsageSnapshot(time.time(), total, len(blobs), tuple(repos))
        return self._snapshot

    # --- the scrub ----------------------------------------------------------------------------------------------

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

    async def run_scrub(self, rate: int) -> None:
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
        log.error("scrub: stored blob %s does not match its etag (corrupted on disk): removed, the next request "
                  "fetches it again", etag)
        await self.store.delete(etag)

    def _update_gauges(self, blobs: list[BlobInfo]) -> None:
        self.metrics.cache_bytes.set(sum(b.size for b in blobs))
        self.metrics.cache_blobs.set(len(blobs))

    async def status(self, settings: Settings, upstream: UpstreamClient, fills: FillManager) -> dict[str, Any]:
        usage = await self.snapshot()
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
            "cache_bytes": usage.total_bytes,
            "cache_blobs": usage.total_blobs,
            "index_bytes": self.index.volume(),
            "max_size": settings.max_size,
            "hits": int(counts["hit"]), "misses": int(counts["miss"]), "stale": int(counts["stale"]),
            "hit_ratio": (counts["hit"] / served) if served else 0.0,
            "fills": [{"repo": f.spec.repo.key, "path": f.spec.path, "written": f.written, "size": f.spec.size}
                      for f in fills.active],
            "repos": [{"type": u.type, "id": u.repo_id, "bytes": u.bytes, "files": u.files, "pinned": u.pinned,
                       "last_access": time.strftime("%Y-%m-%d %H:%M", time.localtime(u.last_access))}
                      for u in usage.repos],
        }


    # --- the status page and the operator's actions (issue 19: added methods, the ones above are unchanged) -----

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

    async def pin_repo(self, repo: RepoRef) -> None:
        """Pin one repo from the status page or the API (``operator``); eviction keeps its blobs."""
        await asyncio.to_thread(self.index.pin_repo, repo, "operator")
        self._patch_snapshot(repo, pinned=True)

    async def unpin_repo(self, repo: RepoRef) -> str | None:
        """Unpin one repo; returns what had pinned it (a sync manifest pins it again at its next run)."""
        source = await asyncio.to_thread(self.index.unpin_repo, repo)
        self._patch_snapshot(repo, pinned=False)
        return source

    async def evict_repo(self, repo: RepoRef) -> tuple[int, int]:
        """Evict one unpinned repo's blobs now (its metadata stays: the next request fetches the files again); a
        blob a pinned repo also uses, or one being filled, is kept. Reads only this repo's and the pinned repos'
        index entries (range queries), never the whole index. Returns (blobs removed, bytes freed)."""
        key = (repo.type.value, repo.repo_id)
        async with self._lock:
            pinned = set(await asyncio.to_thread(self.index.pin_sources))  # a range query over the pins only
            if key in pinned:
                raise RepoPinned(f"{repo.type.value} {repo.repo_id} is pinned: unpin it first")

            def etags() -> tuple[set[str], set[str]]:
                mine = {e.etag for e in self.index.repo_files(repo) if e.etag and not e.missing}
                kept: set[str] = set()
                for repo_type, repo_id in pinned:
                    kept.update(e.etag for e in self.index.repo_files(RepoRef(RepoType(repo_type), repo_id))
                                if e.etag)
                return mine, kept

            mine, kept = await asyncio.to_thread(etags)
            removed = freed = 0
            for etag in sorted(mine - kept):
                if self.is_busy(etag):
                    continue
                info = await self.store.stat(etag)
                if info is not None and await self.store.delete(etag):
                    removed += 1
                    freed += info.size
                    self.metrics.evictions.inc()
            if self._used is not None:
                self._used = max(0, self._used - freed)
        self._patch_snapshot(repo, freed=(removed, freed))
        log.info("operator evicted %s %s: %d blobs (%d bytes)", repo.type.value, repo.repo_id, removed, freed)
        return removed, freed


class RepoPinned(MirrorError):
    """An operator asked to evict a pinned repo (``409``: unpin it first)."""

    status = 409
    code = "RepoPinned"

def repo_from_spec(spec: str, default_type: str = "model") -> RepoRef:
    """``model:acme/x``, ``datasets/acme/x`` or ``acme/x`` -> RepoRef."""
    repo_type = default_type
    if ":" in spec:
        repo_type, spec = spec.split(":", 1)
    elif spec.startswith(("datasets/", "spaces/", "models/")):
        plural, spec = spec.split("/", 1)
        repo_type = plural[:-1]
    return RepoRef(RepoType(repo_type), spec)

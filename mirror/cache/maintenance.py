"""Cache maintenance: verify every blob against its etag, sweep stale partial files, remove or evict a repo, pin
and unpin. Eviction never removes a blob a pinned repo references, nor one being filled; a blob being served is
safe too (readers hold an open descriptor, and unlinking leaves it valid on POSIX). With a fleet's database, the
fleet decides (``CacheManager.evict_blobs``): pins, fills and reads anywhere keep a blob."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mirror.errors import BadRequest, ConfigError, RepoPinned
from mirror.fill.copy import drop_partial
from mirror.hf import RepoRef, RepoType, validate_repo_id, validate_revision
from mirror.integrity import hash_file
from mirror.layout import CacheLayout
from mirror.storage.base import BlobInfo

log = logging.getLogger("hf_mirror.cache")

_PARTIAL_MAX_AGE = 7 * 24 * 3600.0  # a partial nobody resumed for a week is dropped


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    checked_bytes: int
    corrupt: tuple[BlobInfo, ...]  # the stored (shared) copy fails its check
    removed: bool
    # This node's own copy failed its check, the shared copy passed its own (S3: a hot-tier copy, the bucket good).
    bad_local: tuple[BlobInfo, ...] = ()


def repo_from_spec(spec: str, default_type: str = "model") -> RepoRef:
    """``model:acme/x``, ``datasets/acme/x`` or ``acme/x`` -> RepoRef."""
    repo_type = default_type
    if ":" in spec:
        repo_type, spec = spec.split(":", 1)
    elif spec.startswith(("datasets/", "spaces/", "models/")):
        plural, spec = spec.split("/", 1)
        repo_type = plural[:-1]
    return RepoRef(RepoType(repo_type), spec)


def repo_at_revision(text: str, default_type: str = "model") -> tuple[RepoRef, str]:
    """``acme/x@rev``, ``datasets/acme/x`` or ``model:acme/x@<sha>`` -> the repo and its revision (``main`` when none
    is named); a ConfigError that names the input for anything else (the commands that take ``REPO[@REV]``)."""
    spec, at, revision = text.rpartition("@")
    spec, revision = (spec, revision) if at else (text, "main")
    try:
        repo = repo_from_spec(spec, default_type)
        validate_repo_id(repo.repo_id)
        validate_revision(revision)
    except (ValueError, BadRequest) as exc:
        raise ConfigError(f"not a repo: {text!r} (use acme/x@rev, datasets/acme/x or model:acme/x)") from exc
    return repo, revision


def _last_use(partial: str) -> float:
    """When a partial file was last written, or (a sparse one) its windows last read: its map's mtime."""
    times = []
    for path in (partial, CacheLayout.windows_map(Path(partial))):
        with contextlib.suppress(FileNotFoundError):
            times.append(os.stat(path).st_mtime)
    return max(times, default=0.0)


class Maintenance:
    """The maintenance half of :class:`mirror.cache.manager.CacheManager` (it holds the state these share)."""

    async def remove_repo(self, repo: RepoRef) -> tuple[int, int]:
        """Drop a repo's index entries and the blobs no other repo uses; returns (blobs removed, bytes)."""
        owners = self.blob_repos()
        mine = {e for e, repos in owners.items() if (repo.type.value, repo.repo_id) in repos}
        candidates = []
        for etag in mine:
            if owners[etag] - {(repo.type.value, repo.repo_id)}:
                continue
            info = await self.store.stat(etag)
            if info is not None:
                candidates.append(info)
        gone = await self.evict_blobs(candidates, None)
        self.index.delete_repo(repo)
        return len(gone), sum(info.size for info in gone)

    async def sweep_partials(self) -> int:
        """Delete partial files nobody holds a lease on and nobody touched for a week (others are resumed), with
        their notes, and the notes a crash left without their partial file."""
        partials_dir = self.layout.partials_dir
        if not os.path.isdir(partials_dir):
            return 0
        removed = 0
        now = time.time()
        for entry in os.scandir(partials_dir):
            owner = CacheLayout.partial_of_note(entry.name)
            if owner is not None:  # a parallel or sparse fill's note (or one half written), orphaned by a crash
                if not os.path.exists(partials_dir / owner):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                continue
            etag = CacheLayout.etag_of_partial(entry.name)
            if etag is None:
                continue
            # A sparse file's windows are the quota's to evict (least recently used, like blobs), not a week's.
            if await self.store.stat(etag) is not None or now - _last_use(entry.path) > _PARTIAL_MAX_AGE:
                if await self.store.read_lease(etag) is None:
                    if self.held is not None:
                        await self.held.forget(etag)  # its windows, if the fleet was told of them
                    drop_partial(Path(entry.path))
                    removed += 1
        return removed

    async def verify(self, *, remove: bool = True, jobs: int = 4,
                     on_result: Callable[[BlobInfo, bool], None] | None = None) -> VerifyReport:
        """Re-hash every committed blob against its etag. Idle blobs only: a blob being filled is not committed yet,
        so it is never listed.

        The stored copy is hashed (on S3 the bucket object, streamed past the hot tier), and this node's own copy
        where it keeps one (S3's hot tier). With ``remove``, a bad local copy is dropped, and the stored copy is
        deleted only when it fails its own check (the next request fills it again): a local fault never destroys
        the copy the other nodes read."""
        sizes = await asyncio.to_thread(self._expected_sizes)
        blobs = await self.blobs()
        semaphore = asyncio.Semaphore(max(1, jobs))
        corrupt: list[BlobInfo] = []
        bad_local: list[BlobInfo] = []
        checked = 0
        checked_bytes = 0

        async def check(blob: BlobInfo) -> None:
            nonlocal checked, checked_bytes
            async with semaphore:
                local_ok = True
                path = self.store.cached_path(blob.etag) if self.store.has_hot_tier else None
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                        local_ok = await asyncio.to_thread(hash_file, path, blob.etag,
                                                           sizes.get(blob.etag, blob.size))
                shared_ok = await self.store.verify_shared(blob.etag)
                if shared_ok is None:
                    if not local_ok and remove:
                        self.store.drop_local(blob.etag)
                    return  # removed meanwhile
                checked += 1
                checked_bytes += blob.size
                if not shared_ok:
                    corrupt.append(blob)
                    if remove:
                        await self.store.delete(blob.etag)  # every node's copy goes with it
                elif not local_ok:
                    bad_local.append(blob)
                    if remove:
                        self.store.drop_local(blob.etag)
                if not (shared_ok and local_ok):
                    self.metrics.integrity_failures.inc()
                if on_result is not None:
                    on_result(blob, shared_ok and local_ok)

        await asyncio.gather(*(check(b) for b in blobs))
        return VerifyReport(checked, checked_bytes, tuple(corrupt), removed=remove, bad_local=tuple(bad_local))

    def _expected_sizes(self) -> dict[str, int]:
        return {entry.etag: entry.size for _t, _r, entry in self.index.iter_files() if entry.etag and not entry.missing}

    async def pin_repo(self, repo: RepoRef) -> None:
        """Pin one repo from the status page or the API (``operator``); eviction keeps its blobs."""
        await asyncio.to_thread(self.index.pin_repo, repo, "operator")
        if self.metadata is not None:  # the fleet's pin: gc on any node keeps the repo's blobs
            await self.metadata.pin(repo, "operator")
        self._patch_snapshot(repo, pinned=True)

    async def unpin_repo(self, repo: RepoRef) -> str | None:
        """Unpin one repo; returns what had pinned it (a sync manifest pins it again at its next run)."""
        source = await asyncio.to_thread(self.index.unpin_repo, repo)
        if self.metadata is not None:
            source = await self.metadata.unpin(repo) or source
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
            candidates = []
            for etag in sorted(mine - kept):
                info = await self.store.stat(etag)
                if info is not None:
                    candidates.append(info)
            gone = await self.evict_blobs(candidates, None)
            removed, freed = len(gone), sum(info.size for info in gone)
            self.metrics.evictions.inc(removed)
            if self._used is not None:
                self._used = max(0, self._used - freed)
        self._patch_snapshot(repo, freed=(removed, freed))
        log.info("operator evicted %s %s: %d blobs (%d bytes)", repo.type.value, repo.repo_id, removed, freed)
        return removed, freed

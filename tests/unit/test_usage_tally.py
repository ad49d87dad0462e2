"""The usage tally between counts: a large cache's status figures move with each commit and eviction at once,
without a new count (``CacheManager.committed`` and ``evicted``), and the next count agrees with the tally."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mirror.cache import CacheManager
from mirror.hf import RepoRef, RepoType
from mirror.index import FileEntry, MetadataIndex
from mirror.layout import CacheLayout
from mirror.metrics import Metrics
from mirror.storage.local import LocalBlobStore

COMMIT = "a" * 40
MODEL = RepoRef(RepoType.MODEL, "acme/model")
DATA = RepoRef(RepoType.DATASET, "acme/data")


async def _store_file(store: LocalBlobStore, index: MetadataIndex, repo: RepoRef, path: str, size: int) -> str:
    data = path.encode() * (size // len(path)) + b"x" * (size % len(path))
    etag = hashlib.sha256(data).hexdigest()
    partial = store.partial_path(etag)
    partial.write_bytes(data)
    await store.commit(etag, partial)
    index.put_file(repo, FileEntry(COMMIT, path, etag, size, lfs=True))
    return etag


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[tuple[CacheManager, LocalBlobStore, MetadataIndex]]:
    store = LocalBlobStore(CacheLayout(tmp_path / "cache"))
    index = MetadataIndex(tmp_path / "cache" / "index")
    manager = CacheManager(store, index, Metrics(), max_size=None, is_busy=lambda _e: False, layout=store.layout)
    try:
        yield manager, store, index
    finally:
        index.close()


def _row(snapshot: object, repo: RepoRef) -> tuple[int, int] | None:
    for u in snapshot.repos:  # type: ignore[attr-defined]
        if (u.type, u.repo_id) == (repo.type.value, repo.repo_id):
            return u.files, u.bytes
    return None


async def test_commits_and_evictions_move_a_large_caches_figures_without_a_count(
        cache: tuple[CacheManager, LocalBlobStore, MetadataIndex]) -> None:
    manager, store, index = cache
    etag_a = await _store_file(store, index, MODEL, "a.bin", 1000)
    os.utime(store.blob_path(etag_a), (1000, 1000))  # the least recently used blob
    first = await manager.current_snapshot()
    assert (first.total_blobs, first.total_bytes, _row(first, MODEL)) == (1, 1000, (1, 1000))
    manager._scan_seconds = 60.0  # noqa: SLF001 - as if a count took a minute: the next one is minutes away

    etag_b = await _store_file(store, index, MODEL, "b.bin", 300)
    manager.committed(MODEL, COMMIT, etag_b, 300)
    etag_c = await _store_file(store, index, DATA, "c.bin", 50)
    manager.committed(DATA, COMMIT, etag_c, 50)
    tallied = await manager.current_snapshot()
    assert tallied.taken_at == first.taken_at  # no count ran
    assert (tallied.total_blobs, tallied.total_bytes) == (3, 1350)
    assert _row(tallied, MODEL) == (2, 1300) and _row(tallied, DATA) == (1, 50)
    assert [(u.type, u.repo_id) for u in tallied.repos] == sorted((u.type, u.repo_id) for u in tallied.repos)
    assert manager.metrics.cache_bytes._value.get() == 1350  # noqa: SLF001

    report = await manager.collect(max_size=400)  # the LRU pass: the 1000-byte blob goes, and only it
    assert (report.evicted, report.freed_bytes) == (1, 1000)
    after = await manager.current_snapshot()
    assert after.taken_at == first.taken_at
    assert after.total_bytes == report.total_bytes and after.total_blobs == 3 - report.evicted
    assert _row(after, MODEL) == (1, 300) and _row(after, DATA) == (1, 50)

    manager._scan_seconds = None  # noqa: SLF001 - count again: the tally and the count agree
    manager._snapshot = None  # noqa: SLF001
    manager.index.put_usage(None)
    counted = await manager.current_snapshot()
    assert (counted.total_blobs, counted.total_bytes) == (after.total_blobs, after.total_bytes)
    assert [(_row(counted, r)) for r in (MODEL, DATA)] == [(_row(after, r)) for r in (MODEL, DATA)]

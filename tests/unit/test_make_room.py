"""Eviction for room on disk: ``CacheManager.make_room`` in-process, on a local store with a faked free space
(moved from tests/e2e/test_fill_faults.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


async def test_make_room_evicts_least_recently_used_blobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short of disk for a new fill, the oldest unpinned blobs go first, and only as many as needed."""
    import os
    import shutil

    from mirror.cache import CacheManager
    from mirror.index import MetadataIndex
    from mirror.layout import CacheLayout
    from mirror.metrics import Metrics
    from mirror.storage.local import LocalBlobStore

    store = LocalBlobStore(CacheLayout(tmp_path / "cache"))
    etags = []
    for i in range(3):
        data = bytes([i]) * 1000
        etag = hashlib.sha256(data).hexdigest()
        partial = store.partial_path(etag)
        partial.write_bytes(data)
        path = await store.commit(etag, partial)
        os.utime(path, (1000 + i, 1000 + i))  # blob 0 is the least recently used
        etags.append(etag)
    stored = {"free": 10_000}

    def disk_usage(_path: object) -> object:
        on_disk = sum(1000 for e in etags if store.blob_path(e).exists())
        return shutil._ntuple_diskusage(100_000, 0, stored["free"] - on_disk)  # noqa: SLF001

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    index = MetadataIndex(tmp_path / "cache" / "index")
    try:
        cache = CacheManager(store, index, Metrics(), max_size=None, is_busy=lambda _e: False,
                             layout=store.layout, min_free_space=5_000)
        assert await cache.make_room(1_000, 0)  # 7,000 free: enough, nothing evicted
        assert all(store.blob_path(e).exists() for e in etags)
        assert await cache.make_room(2_500, 0)  # short by 500: the oldest blob goes, no more
        assert [store.blob_path(e).exists() for e in etags] == [False, True, True]
        assert not await cache.make_room(20_000, 0)  # more than eviction can free
    finally:
        index.close()


async def test_sparse_partials_count_in_the_quota_and_go_by_lru(tmp_path: Path) -> None:
    """Issue 28 item 1: the windows a sparse fill left (a partial file with a windows map) count in the quota and are
    evicted least recently used first, like blobs, and only when nobody fills them (their lease); the gauges show
    them apart."""
    import os

    from mirror.cache import CacheManager
    from mirror.fill.copy import sparse_partials, write_prefix, write_windows
    from mirror.index import MetadataIndex
    from mirror.layout import CacheLayout
    from mirror.metrics import Metrics
    from mirror.storage.local import LocalBlobStore

    store = LocalBlobStore(CacheLayout(tmp_path / "cache"))
    data = b"b" * 1000
    blob_etag = hashlib.sha256(data).hexdigest()
    partial = store.partial_path(blob_etag)
    partial.write_bytes(data)
    os.utime(await store.commit(blob_etag, partial), (3000, 3000))  # the blob: used after both sparse files
    sparse = []
    for i, used in enumerate((1000, 5000)):
        etag = f"{i:064x}"
        partial = store.partial_path(etag)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"w" * 400, 4096)  # one window of 400 bytes at 4096, a hole before it
            write_prefix(partial, 0)
            write_windows(partial, fd, 4096, [(4096, 4496)])
        finally:
            os.close(fd)
        os.utime(CacheLayout.windows_map(partial), (used, used))
        sparse.append(partial)
    assert [(s.etag, s.held) for s in sorted(sparse_partials(store.partials_dir), key=lambda s: s.etag)] == [
        (f"{0:064x}", 400), (f"{1:064x}", 400)]
    metrics = Metrics()
    index = MetadataIndex(tmp_path / "cache" / "index")
    busy = {f"{1:064x}"}
    try:
        cache = CacheManager(store, index, metrics, max_size=10_000, is_busy=lambda e: e in busy,
                             layout=CacheLayout(tmp_path / "cache"))
        report = await cache.collect(max_size=1_500)  # 1,800 bytes: the least recently used sparse file goes
        assert report.freed_bytes == 400 and report.total_bytes == 1_400
        assert not any(path.exists() for path in (sparse[0], *CacheLayout.notes(sparse[0])))
        assert sparse[1].exists() and store.blob_path(blob_etag).exists()
        assert metrics.sparse_files._value.get() == 1 and metrics.sparse_bytes._value.get() == 400  # noqa: SLF001
        report = await cache.collect(max_size=100)  # the blob goes next; the sparse file being filled stays
        assert not store.blob_path(blob_etag).exists() and sparse[1].exists()
        busy.clear()
        other = LocalBlobStore(CacheLayout(tmp_path / "cache"))  # another process of the node
        assert await other.acquire_lease(f"{1:064x}", "another fill", 60)  # it fills it: it stays too
        await cache.collect(max_size=100)
        assert sparse[1].exists()
        await other.release_lease(f"{1:064x}", "another fill")
        await cache.collect(max_size=100)
        assert not sparse[1].exists() and metrics.sparse_files._value.get() == 0  # noqa: SLF001
    finally:
        index.close()

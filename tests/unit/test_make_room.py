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

"""Negative index entries (issue 23, item 7): remembered 404s and refusals are bounded in number and bytes, the
oldest dropped first; positive entries are never touched."""

from __future__ import annotations

from mirror.hf import RepoRef, RepoType
from mirror.index import ApiEntry, FileEntry, MetadataIndex

REPO = RepoRef(RepoType.MODEL, "acme/tiny-model")
COMMIT = "a" * 40


def test_negative_entries_keep_within_their_count_the_oldest_dropped_first(tmp_path):
    index = MetadataIndex(tmp_path / "index", negative_max_entries=300, negative_max_bytes=1 << 30)
    index.put_file(REPO, FileEntry(COMMIT, "config.json", "b" * 40, 10))
    for n in range(2000):
        index.put_file(REPO, FileEntry(COMMIT, f"missing-{n}.bin", missing=True))
        assert index.negative_usage(exact=False)[0] <= 300
        if n % 400 == 0:
            assert index.negative_usage()[0] <= 300
    entries, size = index.negative_usage()
    assert 0.85 * 300 <= entries <= 300 and size > 0
    kept = {e.path for e in index.repo_files(REPO)}
    assert "config.json" in kept and "missing-1999.bin" in kept
    assert "missing-0.bin" not in kept and "missing-1500.bin" not in kept
    index.close()
    reopened = MetadataIndex(tmp_path / "index", negative_max_entries=300, negative_max_bytes=1 << 30)
    assert reopened.negative_usage() == (entries, size)  # counted from the index itself
    assert reopened.get_file(REPO, COMMIT, "config.json") is not None
    reopened.close()


def test_negative_entries_keep_within_their_bytes(tmp_path):
    bound = 64 * 1024
    index = MetadataIndex(tmp_path / "index", negative_max_entries=1_000_000, negative_max_bytes=bound)
    body = b'{"error": "' + b"x" * 400 + b'"}'
    for n in range(1500):
        index.put_api(REPO, COMMIT, f"tree:missing-{n}", "", ApiEntry(404, (), body, 0.0, immutable=True))
        if n % 2:
            index.put_access(f"token{n}", "content", REPO, (False, 0.0), expire=3600)
        assert index.negative_usage(exact=False)[1] <= bound
    entries, size = index.negative_usage()
    assert 0.8 * bound <= size <= bound and entries < 1500
    assert index.get_api(REPO, COMMIT, "tree:missing-1499", "") is not None
    assert index.get_api(REPO, COMMIT, "tree:missing-0", "") is None
    index.put_access("good", "content", REPO, (True, 0.0), expire=3600)
    assert index.negative_usage()[0] == entries  # an allowed access is not negative
    index.close()


async def test_negative_bytes_count_in_the_quota(tmp_path):
    """The quota holds blobs and remembered 404s together."""
    import hashlib

    from mirror.cache import CacheManager
    from mirror.layout import CacheLayout
    from mirror.metrics import Metrics
    from mirror.storage.local import LocalBlobStore

    store = LocalBlobStore(CacheLayout(tmp_path / "cache"))
    data = b"x" * 50_000
    etag = hashlib.sha256(data).hexdigest()
    partial = store.partial_path(etag)
    partial.write_bytes(data)
    await store.commit(etag, partial)
    index = MetadataIndex(tmp_path / "cache" / "index")
    try:
        cache = CacheManager(store, index, Metrics(), max_size=60_000, is_busy=lambda _e: False,
                             layout=store.layout)
        assert (await cache.collect()).evicted == 0 and store.blob_path(etag).exists()  # 50,000: under it
        for n in range(40):
            index.put_file(REPO, FileEntry(COMMIT, f"missing-{n}-{'y' * 100}.bin", missing=True))
        assert index.negative_usage()[1] > 10_000
        report = await cache.collect()
        assert report.evicted == 1 and not store.blob_path(etag).exists()  # 50,000 + the 404s: over
    finally:
        index.close()

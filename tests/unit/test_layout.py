"""The cache's layout (:mod:`mirror.layout`) against what the parts actually put on disk: the store's partial files,
leases and blobs, the fill's notes written by its own copy helpers, the sweep that tells them apart, and every
directory the wiring creates. The literal names here are the on-disk contract with existing caches (and nginx's
``alias`` to ``blobs/``): a rename in the layout must fail these tests."""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mirror.cache import CacheManager
from mirror.config import Settings
from mirror.fill.copy import Span, copy, on_disk_prefix, read_windows, write_prefix, write_windows
from mirror.index import MetadataIndex
from mirror.layout import BucketLayout, CacheLayout, blob_name
from mirror.metrics import Metrics
from mirror.parts import build_parts
from mirror.storage.local import LocalBlobStore
from mirror.sync.record import read_runs, record_run
from mirror.sync.state import default_state_path
from mirror.xet.tokens import load_secret

WINDOW = 64 * 1024


class Body:
    """What the fill's copy reads: an upstream body, here bytes in memory handed out a piece at a time."""

    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def read_some(self, size: int) -> bytes:
        piece = self.data[self.position:self.position + min(size, 16 * 1024)]
        self.position += len(piece)
        return piece

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


async def copy_window(fd: int, content: bytes, start: int, end: int, pool: ThreadPoolExecutor) -> None:
    """Bytes ``start..end`` of ``content`` into the partial file at their offset, as a parallel fill's window."""
    span = Span(start, end, start)
    body = Body(content[start:end])
    await copy(body, fd, span, pool, counter=Metrics().bytes_fetched, block_size=WINDOW,  # type: ignore[arg-type]
               on_progress=lambda _offset: None)
    assert span.complete


async def test_the_files_a_fill_leaves_are_the_ones_the_layout_names(tmp_path: Path) -> None:
    """A fill under its lease writes a window past its prefix: the partial file, its prefix note, its windows map
    and its lease are the four names the layout gives, each recognised for what it is; the commit puts the blob at
    the layout's path (where nginx's alias finds it); the sweep then drops the notes the commit left behind."""
    layout = CacheLayout(tmp_path)
    store = LocalBlobStore(layout)
    content = bytes(range(256)) * (3 * WINDOW // 256)
    etag = hashlib.sha256(content).hexdigest()
    assert await store.acquire_lease(etag, "test", 30)
    partial = store.partial_path(etag)
    with ThreadPoolExecutor(2) as pool:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            write_prefix(partial, 0)  # before any window lands past the prefix, as mirror.fill.windows does
            await copy_window(fd, content, WINDOW, 2 * WINDOW, pool)
            write_windows(partial, fd, WINDOW, [(WINDOW, 2 * WINDOW)])

            names = {entry.name for entry in os.scandir(layout.partials_dir)}
            assert names == {f"{etag}.part", f"{etag}.part.prefix", f"{etag}.part.windows", f"{etag}.lease"}
            assert {partial, CacheLayout.prefix_note(partial), CacheLayout.windows_map(partial),
                    layout.lease(etag)} == {layout.partials_dir / name for name in names}
            assert partial == layout.partial(etag)
            assert [CacheLayout.etag_of_partial(name) for name in sorted(names)] == [None, etag, None, None]
            assert {CacheLayout.partial_of_note(name) for name in names} == {None, partial.name}
            assert CacheLayout.partial_of_note(f"{etag}.lease") is None  # a lease is no fill's note
            assert on_disk_prefix(partial) == 0 and read_windows(partial, fd) == (WINDOW, [(WINDOW, 2 * WINDOW)])

            await copy_window(fd, content, 0, WINDOW, pool)
            await copy_window(fd, content, 2 * WINDOW, 3 * WINDOW, pool)
        finally:
            os.close(fd)
    blob = await store.commit(etag, partial)
    await store.release_lease(etag, "test")
    assert blob == layout.blob(etag) == tmp_path / "blobs" / etag[:2] / etag == layout.blobs_dir / blob_name(etag)
    assert store.relative_blob_path(etag) == blob_name(etag) == f"{etag[:2]}/{etag}"
    assert [info.etag async for info in store.list_blobs()] == [etag]
    assert {entry.name for entry in os.scandir(layout.partials_dir)} == {f"{etag}.part.prefix", f"{etag}.part.windows"}

    index = MetadataIndex(layout.index_dir)
    try:
        cache = CacheManager(store, index, Metrics(), max_size=None, is_busy=lambda _e: False, layout=layout)
        assert await cache.sweep_partials() == 0  # no partial file left: only its orphaned notes go
    finally:
        index.close()
    assert os.listdir(layout.partials_dir) == []


async def test_the_sweep_tells_every_name_in_partials_apart(tmp_path: Path) -> None:
    """A live fill's partial and notes stay; a committed blob's stale partial goes with its notes; a note a crash
    left half written, or without its partial, goes; an import copy and a stranger's file are not the sweep's."""
    layout = CacheLayout(tmp_path)
    store = LocalBlobStore(layout)
    live, done, gone = (hashlib.sha256(name).hexdigest() for name in (b"live", b"done", b"gone"))
    assert await store.acquire_lease(live, "test", 30)
    for etag in (live, done):
        layout.partial(etag).write_bytes(b"some bytes")
        for note in CacheLayout.notes(layout.partial(etag)):
            note.write_text("0")
    data = b"the whole blob"
    committed = hashlib.sha256(data).hexdigest()
    layout.partial(committed).write_bytes(data)
    await store.commit(committed, layout.partial(committed))
    layout.partial(committed).write_bytes(b"a fill that lost the race")  # the blob exists: this partial is stale
    CacheLayout.prefix_note(layout.partial(committed)).write_text("3")
    CacheLayout.replacing(CacheLayout.windows_map(layout.partial(gone))).write_text("{")  # a crash mid-write
    layout.import_copy(done).write_bytes(b"an import on its way")
    (layout.partials_dir / "README").write_text("not ours")
    old = time.time() - 8 * 24 * 3600
    for path in (layout.partial(done), *CacheLayout.notes(layout.partial(done))):
        os.utime(path, (old, old))  # nobody resumed it (nor read its windows) for a week, nobody holds its lease
    index = MetadataIndex(layout.index_dir)
    try:
        cache = CacheManager(store, index, Metrics(), max_size=None, is_busy=lambda _e: False, layout=layout)
        assert await cache.sweep_partials() == 2
    finally:
        index.close()
        await store.release_lease(live, "test")
    assert sorted(os.listdir(layout.partials_dir)) == sorted(
        ["README", f"{done}.import-{os.getpid()}", f"{live}.part", f"{live}.part.prefix", f"{live}.part.windows"])


def test_the_wiring_puts_each_part_where_the_layout_says(tmp_path: Path, settings_env: pytest.MonkeyPatch) -> None:
    """Every directory and file the parts create under the cache directory is one the layout names, by the
    names existing caches have."""
    cache_dir = tmp_path / "cache"
    settings = Settings(cache_dir=cache_dir, policy_block_files=("*.exe",))  # a policy: its ledger too
    parts = build_parts(settings)
    layout = parts.layout
    assert parts.admission is not None
    try:
        assert layout == CacheLayout(cache_dir) and parts.cache.layout is layout
        assert parts.admission.ledger.releases_log == cache_dir / "admission" / "releases.jsonl"
    finally:
        parts.index.close()
        parts.admission.ledger.close()
    record_run(layout, "/etc/nightly.toml", ok=True, files=1, size=1, failed=0)
    assert [run.manifest for run in read_runs(layout)] == ["nightly.toml"]
    assert default_state_path("/etc/nightly.toml", layout, None).parent == cache_dir / "sync-state"
    assert len(load_secret(layout.xet_secret)) >= 32
    assert settings.audit_directory == layout.audit_dir == cache_dir / "audit"
    assert layout.fill_leases_dir == cache_dir / "fill-leases" and layout.hot_tmp_dir == cache_dir / "hot-tmp"

    on_disk = {p.relative_to(cache_dir).as_posix() for p in cache_dir.iterdir()}
    assert on_disk == {"blobs", "partials", "index", "admission", "sync-runs", "xet-secret"}
    named = {layout.blobs_dir, layout.partials_dir, layout.index_dir, layout.admission_dir, layout.sync_runs_dir,
             layout.xet_secret}
    assert {cache_dir / name for name in on_disk} == named
    assert layout.admission_db.is_dir() and layout.admission_db == cache_dir / "admission" / "db"


def test_a_fleet_bucket_shards_its_blobs_as_the_disk_does() -> None:
    keys = BucketLayout("fleet/")
    etag = hashlib.sha256(b"x").hexdigest()
    assert keys.blob_key(etag) == f"fleet/blobs/{etag[:2]}/{etag}" == "fleet/" + "blobs/" + blob_name(etag)
    assert keys.lease_key(etag) == f"fleet/leases/{etag}"
    assert keys.etag_of_blob_key(keys.blob_key(etag)) == etag
    assert keys.etag_of_blob_key(f"fleet/blobs/{etag[:2]}/.{etag}.upload") is None  # hidden: not a blob
    assert keys.etag_of_blob_key(f"other/blobs/{etag[:2]}/{etag}") is None
    assert BucketLayout().blob_key(etag) == f"blobs/{blob_name(etag)}"

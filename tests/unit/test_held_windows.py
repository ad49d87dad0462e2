"""The fleet's record of the windows a paused sparse fill left (:mod:`mirror.metadata.held`), through its lifecycle:
recorded when the fill pauses, named to another node for a Range it covers (and to nobody for one it does not), read
on the holding node from its partial file with the record's token only, dropped by a refusal under its token, by the
quota's eviction of the windows and by the blob's commit. Two fill managers stand for two nodes (each its own cache
directory and address) over one metadata store (the embedded one here; the contract suite holds the fleet's database
to the same calls); the fill runs against the fake upstream of ``test_fill``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mirror.cache import CacheManager
from mirror.fill import FillManager
from mirror.index import MetadataIndex
from mirror.layout import CacheLayout
from mirror.metadata import EmbeddedMetadata
from mirror.metadata.held import HeldWindows
from mirror.metrics import Metrics
from mirror.storage.base import PeerAddress
from mirror.storage.local import LocalBlobStore
from tests.unit.test_fill import KIB, FakeUpstream, content_of, read_range, spec_of

WINDOW = 64 * KIB
A, B = "http://node-a:8090", "http://node-b:8090"


@pytest.fixture(autouse=True)
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeUpstream, "linger", 0.1)


@asynccontextmanager
async def node(root: Path, upstream: FakeUpstream, metadata: EmbeddedMetadata, url: str) -> AsyncIterator[FillManager]:
    manager = FillManager(LocalBlobStore(CacheLayout(root)), upstream, Metrics(),  # type: ignore[arg-type]
                          chunk_size=16 * KIB, lease_ttl=30, cancel_on_disconnect=False, node_url=url,
                          held=HeldWindows(metadata, url))
    try:
        yield manager
    finally:
        await manager.aclose(grace=0)


async def gone(metadata: EmbeddedMetadata, etag: str) -> None:
    while await metadata.get_windows(etag):
        await asyncio.sleep(0.01)


async def test_the_windows_of_a_paused_sparse_fill_are_recorded_read_by_token_and_dropped(tmp_path: Path) -> None:
    content = content_of(8 * WINDOW)
    spec = spec_of(content)
    upstream = FakeUpstream(content, windows=WINDOW, connections=2, sparse=1, read_ahead=0)
    index = MetadataIndex(tmp_path / "index")
    metadata = EmbeddedMetadata(index, tmp_path / "fill-leases")
    try:
        async with node(tmp_path / "a", upstream, metadata, A) as node_a, \
                node(tmp_path / "b", upstream, metadata, B) as node_b:
            start, end = 2 * WINDOW + 10, 3 * WINDOW + 20  # two windows
            fill = await node_a.start(spec, reading=(start, end))
            assert fill is not None and fill.sparse and fill.task is not None
            assert await read_range(node_a, fill, start, end) == content[start:end + 1]
            await asyncio.wait_for(fill.task, 10)  # paused: its lease given back, its windows recorded
            [record] = await metadata.get_windows(spec.etag)
            assert record.peer.url == A and record.held == ((2 * WINDOW, 3 * WINDOW), (3 * WINDOW, 4 * WINDOW))
            token = record.peer.token

            # Node B: a Range the windows hold is asked of node A; one they do not, of nobody (B fills it).
            assert await node_b.peer_for_range(spec, start + 5, end) == PeerAddress(A, token)
            assert await node_b.peer_for_range(spec, WINDOW, 2 * WINDOW + 5) is None
            assert await node_a.peer_for_range(spec, start, end) is None  # its own windows: a hit there

            # Node A answers from its partial file, to the record's token only, and only what it holds wholly.
            async with node_a.reading_held(spec.etag, token, start, end) as fd:
                assert fd is not None and os.pread(fd, end - start + 1, start) == content[start:end + 1]
            for wrong_token, span in (("guess", (start, end)), (token, (start, 4 * WINDOW)), (token, (0, 10))):
                async with node_a.reading_held(spec.etag, wrong_token, *span) as fd:
                    assert fd is None
            asked = len(upstream.requests)
            assert asked == 2  # nothing fetched for a peer's read of held windows

            # A refusal under another token (a lease's) leaves the record; under the record's token it goes.
            await node_b.peer_refused(spec.etag, PeerAddress(A, "a lease's token"))
            assert len(await metadata.get_windows(spec.etag)) == 1
            await node_b.peer_refused(spec.etag, PeerAddress(A, token))
            assert await metadata.get_windows(spec.etag) == []

            # Paused again: recorded again (a new token); the blob's commit drops every node's record.
            fill = await node_a.start(spec, reading=(start, end))
            assert fill is not None and fill.task is not None
            await read_range(node_a, fill, start, end)
            await asyncio.wait_for(fill.task, 10)
            [record] = await metadata.get_windows(spec.etag)
            assert record.peer.token != token
            await metadata.put_windows(spec.etag, PeerAddress(B, "b's"), [(0, WINDOW)])  # B's own, say
            path = await node_a.fetch(spec)
            assert path.read_bytes() == content
            await asyncio.wait_for(gone(metadata, spec.etag), 10)  # in the background, after the fill's readers

            # Another file's windows, evicted by the quota: the record goes first, then the windows.
            other = content_of(8 * WINDOW + 1)
            other_spec = spec_of(other)
            upstream.content = other
            fill = await node_a.start(other_spec, reading=(start, end))
            assert fill is not None and fill.task is not None
            await read_range(node_a, fill, start, end)
            await asyncio.wait_for(fill.task, 10)
            assert len(await metadata.get_windows(other_spec.etag)) == 1
            cache = CacheManager(node_a.store, MetadataIndex(tmp_path / "a-index"), Metrics(), max_size=None,
                                 is_busy=lambda _etag: False, layout=CacheLayout(tmp_path / "a"),
                                 held=node_a.held)
            try:
                await cache.collect(max_size=1)
            finally:
                cache.index.close()
            assert not node_a.store.partial_path(other_spec.etag).exists()
            assert await metadata.get_windows(other_spec.etag) == []
    finally:
        await metadata.aclose()
        index.close()

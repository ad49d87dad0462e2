"""This process's busy marks (mirror.metadata.busy) against the embedded store: what the data path counts is what a
fleet's eviction sees, and a copy from the shared store learns when an eviction of its blob is under way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mirror.index import MetadataIndex
from mirror.metadata import EmbeddedMetadata
from mirror.metadata.busy import BusyMarks
from mirror.storage.base import BlobInfo


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedMetadata]:
    index = MetadataIndex(tmp_path / "index")
    metadata = EmbeddedMetadata(index, tmp_path / "fill-leases")
    await metadata.open()
    yield metadata
    await metadata.aclose()
    index.close()


def blobs(*etags: str) -> list[BlobInfo]:
    return [BlobInfo(etag, 10, 1000.0 + i) for i, etag in enumerate(etags)]


async def test_a_read_keeps_its_blob_until_it_ends(store: EmbeddedMetadata) -> None:
    marks = BusyMarks(store, ttl=30, node="reader")
    try:
        with marks.reading("x" * 64):
            await asyncio.to_thread(marks.publish)
            assert await store.decide_eviction("evictor", blobs("x" * 64, "y" * 64), None) == ["y" * 64]
        await asyncio.to_thread(marks.publish)  # the read ended: its mark goes at the next publication
        assert await store.decide_eviction("evictor", blobs("x" * 64), None) == ["x" * 64]
    finally:
        await marks.aclose()


async def test_a_claim_waits_for_its_mark_and_learns_of_an_eviction_under_way(store: EmbeddedMetadata) -> None:
    marks = BusyMarks(store, ttl=30, node="copier")
    x, y = "a" * 64, "b" * 64
    try:
        marks.begin(x)
        assert await marks.claim(x)  # the thread published it: no evictor may choose it now
        assert await store.decide_eviction("evictor", blobs(x), None) == []
        assert await store.decide_eviction("evictor", blobs(y), None) == [y]
        marks.begin(y)
        assert not await marks.claim(y)  # decided before our mark: do not copy it
        await store.finish_eviction("evictor", [], [y])  # given up: readable again
        assert await marks.claim(y)
    finally:
        marks.end(x)
        marks.end(y)
        await marks.aclose()


async def test_reads_order_the_fleets_quota(store: EmbeddedMetadata) -> None:
    marks = BusyMarks(store, ttl=30, node="reader")
    old, new = "c" * 64, "d" * 64
    marks.read(old)  # an nginx-served hit: no duration, a read time
    await asyncio.to_thread(marks.publish)
    assert await store.decide_eviction("evictor", blobs(old, new), 5) == [new]

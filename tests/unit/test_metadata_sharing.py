"""What a node shares with its fleet (``mirror.metadata.sharing``): successes up to SHARED_ANSWER_MAX bytes, never
an error answer; a database that fails is left alone a moment (no request waits on it), then asked again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from mirror.errors import MetadataUnavailable
from mirror.hf import RepoRef, RepoType
from mirror.index import ApiEntry, MetadataIndex
from mirror.metadata import EmbeddedMetadata, sharing
from mirror.metadata.sharing import SHARED_ANSWER_MAX, SharedMetadata

REPO = RepoRef(RepoType.MODEL, "acme/tiny")


class FlakyStore(EmbeddedMetadata):
    """The embedded store, failing every call while ``down``; counts the reads it was asked."""

    def __init__(self, index: MetadataIndex, leases: Path) -> None:
        super().__init__(index, leases)
        self.is_down = False
        self.reads = 0

    async def get_api(self, *args: Any) -> Any:
        self.reads += 1
        if self.is_down:
            raise MetadataUnavailable("the database is gone")
        return await super().get_api(*args)


@pytest.fixture
def shared(tmp_path: Path) -> Any:
    index = MetadataIndex(tmp_path / "index")
    store = FlakyStore(MetadataIndex(tmp_path / "fleet"), tmp_path / "leases")
    yield SharedMetadata(store, index), store
    index.close()
    store.index.close()


async def test_only_successes_of_a_bounded_size_are_shared(shared: Any) -> None:
    fleet, store = shared
    now = time.time()
    fleet.share_api(REPO, "main", "info:", "", ApiEntry(200, (), b"{}", now))
    fleet.share_api(REPO, "main", "tree:", "", ApiEntry(200, (), b"x" * (SHARED_ANSWER_MAX + 1), now))
    fleet.share_api(REPO, "main", "tree:gone", "", ApiEntry(404, (), b"{}", now, immutable=True))
    fleet.share_read("/api/models", "anon", "", ApiEntry(200, (), b"[]", now))
    await fleet.drain()
    assert await store.get_api(REPO, "main", "info:", "") is not None
    assert await store.get_api(REPO, "main", "tree:", "") is None
    assert await store.get_api(REPO, "main", "tree:gone", "") is None
    assert await store.get_read("/api/models", "anon", "") is not None


async def test_an_answer_comes_back_with_its_age_on_this_nodes_clock(shared: Any) -> None:
    fleet, store = shared
    await store.put_api(REPO, "main", "info:", "", ApiEntry(200, (("a", "b"),), b"{}", time.time() - 100))
    entry = await fleet.api(REPO, "main", "info:", "")
    assert entry is not None and entry.headers == (("a", "b"),) and 99 < time.time() - entry.fetched_at < 110


async def test_a_failed_database_is_left_alone_a_moment_then_asked_again(shared: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, store = shared
    monkeypatch.setattr(sharing, "_DOWN_PAUSE", 0.3)
    store.is_down = True
    assert await fleet.api(REPO, "main", "info:", "") is None and fleet.down
    for _ in range(5):  # not asked while it is known down
        assert await fleet.api(REPO, "main", "info:", "") is None
    assert store.reads == 1
    fleet.share_api(REPO, "main", "info:", "", ApiEntry(200, (), b"{}", time.time()))  # dropped meanwhile
    await fleet.drain()
    store.is_down = False
    while fleet.down:
        await asyncio.sleep(0.05)
    assert await fleet.api(REPO, "main", "info:", "") is None and store.reads == 2  # asked again: nothing there
    fleet.share_api(REPO, "main", "info:", "", ApiEntry(200, (), b"{}", time.time()))
    await fleet.drain()
    assert await fleet.api(REPO, "main", "info:", "") is not None

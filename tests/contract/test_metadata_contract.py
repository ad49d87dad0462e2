"""The metadata contract (:mod:`mirror.metadata.base`), one suite run against both implementations.

``embedded`` is the default (this node's index and a lease table on its disk); ``postgres`` is
:class:`mirror.metadata.postgres.PostgresMetadata` against a real PostgreSQL server on 127.0.0.1 started by the tests
(``tests/support/postgres_server.py``), a fresh database per test. ``stores.node()`` opens the store as another node
sees it: another connection to the same database for ``postgres``; for ``embedded`` (one node) the same store.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mirror.errors import LeaseLost
from mirror.hf import RepoRef, RepoType
from mirror.index import ApiEntry, FileEntry, MetadataIndex, api_query_key, api_route_key
from mirror.metadata import EmbeddedMetadata, HeldLease, MetadataStore
from mirror.metadata.base import XetRecord
from mirror.storage.base import BlobInfo, PeerAddress

BACKENDS = ["embedded", "postgres"]
REPO = RepoRef(RepoType.MODEL, "acme/tiny")
DATASET = RepoRef(RepoType.DATASET, "acme/data")


class Stores:
    def __init__(self, backend: str, tmp: Path, url: str | None) -> None:
        self.backend = backend
        self.tmp = tmp
        self.url = url
        self.opened: list[Any] = []
        self.index: MetadataIndex | None = None

    async def node(self) -> MetadataStore:
        if self.backend == "embedded":
            if self.opened:
                return self.opened[0]  # type: ignore[no-any-return]
            self.index = MetadataIndex(self.tmp / "index")
            store: MetadataStore = EmbeddedMetadata(self.index, self.tmp / "fill-leases")
        else:
            from mirror.metadata.postgres import PostgresMetadata

            assert self.url is not None
            store = PostgresMetadata(self.url)
        await store.open()
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await store.aclose()
        if self.index is not None:
            self.index.close()


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    url = request.getfixturevalue("postgres").create_database() if request.param == "postgres" else None
    opened = Stores(request.param, tmp_path, url)
    try:
        yield opened
    finally:
        await opened.close()


def etag() -> str:
    return uuid.uuid4().hex + "00000000"


async def eventually(check: Any, deadline: float = 30.0) -> None:
    """Wait (by events where the store offers them, by short naps otherwise) until ``check()`` is true."""
    end = time.monotonic() + deadline
    while not await check():
        assert time.monotonic() < end, "the condition never came true"
        await asyncio.sleep(0.05)


# --- schema -----------------------------------------------------------------------------------------------------------

async def test_opening_twice_applies_the_schema_once(stores: Stores) -> None:
    first = await stores.node()
    await first.put_ref(REPO, "main", "a" * 40)
    nodes = await asyncio.gather(*(stores.node() for _ in range(3)))  # nodes starting together
    for node in nodes:
        record = await node.get_ref(REPO, "main")
        assert record is not None and record.commit == "a" * 40


# --- refs -------------------------------------------------------------------------------------------------------------

async def test_a_ref_put_on_one_node_is_read_on_another(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    assert await b.get_ref(REPO, "main") is None
    await a.put_ref(REPO, "main", "a" * 40)
    record = await b.get_ref(REPO, "main")
    assert record is not None and record.commit == "a" * 40 and 0 <= record.age < 60
    await b.put_ref(REPO, "main", "b" * 40)
    assert (await a.get_ref(REPO, "main")).commit == "b" * 40  # type: ignore[union-attr]
    assert await a.get_ref(REPO, "v1.0") is None
    assert await a.get_ref(DATASET, "main") is None


# --- pins -------------------------------------------------------------------------------------------------------------

async def test_pins_are_shared_and_keep_their_source(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    await a.pin(REPO, "operator")
    await a.pin(DATASET, "manifest:nightly")
    await b.pin(REPO, "manifest:other")  # a pin that exists keeps its source
    assert await b.pins() == {REPO.key: "operator", DATASET.key: "manifest:nightly"}
    assert await b.unpin(REPO) == "operator"
    assert await a.unpin(REPO) is None
    assert await a.pins() == {DATASET.key: "manifest:nightly"}


# --- fill leases ------------------------------------------------------------------------------------------------------

async def test_one_holder_at_a_time_and_epochs_grow(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    tag = etag()
    peer = PeerAddress("http://node-a:8090", "tok")
    first = await a.acquire_lease(tag, "node-a", 30, peer)
    assert first is not None
    assert await b.acquire_lease(tag, "node-b", 30) is None
    assert await a.acquire_lease(tag, "node-a", 30, peer) == first  # already ours: same epoch
    lease = await b.read_lease(tag)
    assert lease is not None and lease.owner == "node-a" and lease.epoch == first and lease.peer == peer
    assert 0 < lease.remaining <= 30
    await b.release_lease(tag, "node-b", first)  # not b's: nothing happens
    assert (await a.read_lease(tag)) is not None
    await a.release_lease(tag, "node-a", first)
    assert await b.read_lease(tag) is None
    second = await b.acquire_lease(tag, "node-b", 30)
    assert second is not None and second > first


async def test_exactly_one_of_many_contenders_wins(stores: Stores) -> None:
    nodes = [await stores.node() for _ in range(4)]
    tag = etag()
    grants = await asyncio.gather(*(nodes[i % 4].acquire_lease(tag, f"owner-{i}", 30) for i in range(24)))
    assert sum(grant is not None for grant in grants) == 1


async def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    tag = etag()
    old = await a.acquire_lease(tag, "node-a", 0.3)
    assert old is not None

    async def expired() -> bool:
        return await b.read_lease(tag) is None

    await eventually(expired)
    new = await b.acquire_lease(tag, "node-b", 30)
    assert new is not None and new > old
    # The frozen holder wakes up: it cannot renew, and its commit is refused.
    assert await asyncio.to_thread(a.renew_leases, [HeldLease(tag, "node-a", old)], 30) == set()
    with pytest.raises(LeaseLost):
        async with a.fence(tag, "node-a", old):
            raise AssertionError("a stale holder's commit ran")
    async with b.fence(tag, "node-b", new):
        pass
    await a.release_lease(tag, "node-a", old)  # a stale release frees nothing
    lease = await a.read_lease(tag)
    assert lease is not None and lease.owner == "node-b"


async def test_renewal_keeps_a_lease_past_its_ttl(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    tag, other = etag(), etag()
    epoch = await a.acquire_lease(tag, "node-a", 0.6)
    assert epoch is not None
    held = [HeldLease(tag, "node-a", epoch), HeldLease(other, "node-a", 7)]  # the second was never granted
    for _ in range(6):
        assert await asyncio.to_thread(a.renew_leases, held, 5) == {tag}
        await asyncio.sleep(0.2)
    assert await b.acquire_lease(tag, "node-b", 5) is None
    lease = await b.read_lease(tag)
    assert lease is not None and lease.epoch == epoch and lease.remaining > 1


async def test_waiters_hear_of_a_grant_and_a_release(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    tag = etag()
    async with a.changed(tag) as change:
        epoch = await b.acquire_lease(tag, "node-b", 30)
        assert epoch is not None
        assert await change.wait(30)
        await b.release_lease(tag, "node-b", epoch)
        assert await change.wait(30)
        assert await a.read_lease(tag) is None
    async with a.changed(etag()) as quiet:
        assert not await quiet.wait(0.1)  # nothing happened to that one


# --- files, access confirmations, pinned blobs -----------------------------------------------------------------------

async def test_file_entries_are_shared(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    commit = "c" * 40
    entry = FileEntry(commit, "sub/model.bin", "e" * 64, 1234, lfs=True)
    assert await b.get_file(REPO, commit, entry.path) is None
    await a.put_file(REPO, entry)
    await a.put_file(REPO, FileEntry(commit, "gone.txt", missing=True))
    assert await b.get_file(REPO, commit, entry.path) == entry
    assert await b.get_file(REPO, commit, "gone.txt") == FileEntry(commit, "gone.txt", missing=True)
    assert await b.get_file(DATASET, commit, entry.path) is None


async def test_access_confirmations_are_shared_by_digest(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    assert await b.get_access("digest-1", "content", REPO) is None
    await a.put_access("digest-1", "content", REPO, True)
    await a.put_access("public", "content", REPO, False)
    allowed = await b.get_access("digest-1", "content", REPO)
    assert allowed is not None and allowed[0] is True and 0 <= allowed[1] < 60
    assert (await b.get_access("public", "content", REPO))[0] is False  # type: ignore[index]
    assert await b.get_access("digest-1", "meta", REPO) is None


async def test_pinned_blobs_are_the_files_of_pinned_repos(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    commit = "c" * 40
    await a.put_file(REPO, FileEntry(commit, "a.bin", "1" * 64, 10))
    await a.put_file(REPO, FileEntry(commit, "missing.bin", missing=True))
    await a.put_file(DATASET, FileEntry(commit, "b.bin", "2" * 64, 10))
    assert await b.pinned_blobs() == set()
    await b.pin(REPO, "operator")
    assert await a.pinned_blobs() == {"1" * 64}


# --- busy marks, read times, evictions --------------------------------------------------------------------------------

def blob(tag: str, size: int = 10, last_access: float = 1000.0) -> BlobInfo:
    return BlobInfo(tag, size, last_access)


async def publish(store: MetadataStore, node: str, busy: set[str], read: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    return await asyncio.to_thread(store.publish_busy, node, busy, read, 30)


async def test_a_blob_busy_on_one_node_is_not_evicted_by_another(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    x, y = etag(), etag()
    assert await publish(a, "node-a", {x}) == set()
    assert await b.decide_eviction("node-b", [blob(x), blob(y)], None) == [y]
    await b.finish_eviction("node-b", [y], [])
    await publish(a, "node-a", set())  # a's read ended: its mark goes
    assert await b.decide_eviction("node-b", [blob(x)], None) == [x]


async def test_a_mark_expires_with_its_ttl(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    x = etag()
    await asyncio.to_thread(a.publish_busy, "node-a", {x}, (), 0.3)  # a dies: never renewed

    async def evictable() -> bool:
        chosen = await b.decide_eviction("node-b", [blob(x)], None)
        if chosen:
            await b.finish_eviction("node-b", [], chosen)
        return chosen == [x]

    await eventually(evictable)


async def test_pinned_and_leased_blobs_are_never_chosen(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    pinned, leased, free = etag(), etag(), etag()
    await a.put_file(REPO, FileEntry("c" * 40, "model.bin", pinned, 10))
    await a.pin(REPO, "operator")
    assert await a.acquire_lease(leased, "node-a", 30) is not None
    assert await b.decide_eviction("node-b", [blob(pinned), blob(leased), blob(free)], None) == [free]


async def test_the_quota_order_is_the_fleets_read_times(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    old, new = etag(), etag()
    candidates = [blob(old, last_access=100.0), blob(new, last_access=200.0)]
    await publish(a, "node-a", set(), {old})  # read on node a just now: the other is the least recently used
    assert await b.decide_eviction("node-b", candidates, 5) == [new]
    await b.finish_eviction("node-b", [], [new])
    assert await b.decide_eviction("node-b", candidates, 15) == [new, old]  # until the bytes needed are reached


async def test_a_mark_after_a_decision_learns_the_eviction_is_under_way(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    x, y = etag(), etag()
    assert set(await b.decide_eviction("node-b", [blob(x), blob(y)], None)) == {x, y}
    # Node a is about to copy both from the shared store: too late, it must not read them.
    assert await publish(a, "node-a", {x, y}) == {x, y}
    assert await a.decide_eviction("node-a", [blob(x), blob(y)], None) == []  # busy, and under way
    await b.finish_eviction("node-b", [x], [y])  # y could not be deleted: it is readable again
    assert await publish(a, "node-a", {x, y}) == set()


async def test_every_node_is_told_of_an_eviction(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    told: list[str] = []
    a.on_evicted(told.append)
    x, y = etag(), etag()
    assert set(await b.decide_eviction("node-b", [blob(x), blob(y)], None)) == {x, y}
    await b.finish_eviction("node-b", [x], [y])

    async def heard() -> bool:
        return told == [x]

    await eventually(heard)


async def test_concurrent_evictors_never_choose_the_same_blob(stores: Stores) -> None:
    nodes = [await stores.node() for _ in range(3)]
    tags = [etag() for _ in range(30)]
    chosen = await asyncio.gather(*(node.decide_eviction(f"node-{i}", [blob(t) for t in tags], None)
                                    for i, node in enumerate(nodes)))
    everything = [tag for one in chosen for tag in one]
    assert sorted(everything) == sorted(tags)  # each blob once, by one evictor


# --- upstream's answers, Xet records, secrets ------------------------------------------------------------------------

async def test_api_answers_are_shared_with_their_age(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    route, query = api_route_key("tree", ""), api_query_key([("recursive", "true")], None)
    assert await b.get_api(REPO, "main", route, query) is None
    headers = (("content-type", "application/json"), ("link", '<https://x/api?cursor=abc>; rel="next"'))
    body = b'[{"type":"file","path":"a.bin"}]' + bytes(range(256))  # any bytes, kept as they are
    await a.put_api(REPO, "main", route, query, ApiEntry(200, headers, body, time.time()))
    await a.put_api(REPO, "c" * 40, route, query, ApiEntry(200, headers, b"[]", time.time(), immutable=True))
    record = await b.get_api(REPO, "main", route, query)
    assert record is not None and 0 <= record.age < 60
    assert (record.entry.status, record.entry.headers, record.entry.body) == (200, headers, body)
    assert not record.entry.immutable
    pinned = await b.get_api(REPO, "c" * 40, route, query)
    assert pinned is not None and pinned.entry.immutable and pinned.entry.body == b"[]"
    assert await b.get_api(REPO, "main", route, api_query_key([], None)) is None  # another query
    assert await b.get_api(DATASET, "main", route, query) is None
    assert await b.get_api(REPO, None, route, query) is None
    await b.put_api(REPO, "main", route, query, ApiEntry(200, (), b"[1]", time.time()))  # a refresh replaces it
    assert (await a.get_api(REPO, "main", route, query)).entry.body == b"[1]"  # type: ignore[union-attr]


async def test_route_table_answers_are_shared_per_token_digest(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    await a.put_read("/api/whoami-v2", "digest-1", "", ApiEntry(200, (), b'{"name":"one"}', time.time()))
    record = await b.get_read("/api/whoami-v2", "digest-1", "")
    assert record is not None and record.entry.body == b'{"name":"one"}'
    assert await b.get_read("/api/whoami-v2", "digest-2", "") is None
    assert await b.get_read("/api/whoami-v2", "anon", "") is None


async def test_xet_records_are_shared_per_repo(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    commit = "c" * 40
    one = XetRecord(commit, "a.bin", "1" * 64, "e" * 64, 10)
    two = XetRecord(commit, "sub/b.bin", "2" * 64, "f" * 64, 20)
    assert await b.get_xet_files(REPO, commit, ["a.bin"]) == []
    await a.put_xet_files(REPO, [one, two])
    assert sorted(await b.get_xet_files(REPO, commit, ["a.bin", "sub/b.bin", "c.bin"]), key=str) == \
        sorted([one, two], key=str)
    assert await b.get_xet_files(REPO, "d" * 40, ["a.bin"]) == []
    assert await b.get_xet_by_hash(REPO, "2" * 64) == two
    assert await b.get_xet_by_hash(DATASET, "2" * 64) is None  # never another repo's file by its hash
    assert await b.get_xet_files(DATASET, commit, ["a.bin"]) == []


async def test_a_secret_is_generated_once(stores: Stores) -> None:
    nodes = [await stores.node() for _ in range(3)]
    secrets = await asyncio.gather(*(node.secret("xet", bytes([i]) * 32) for i, node in enumerate(nodes)))
    assert len(set(secrets)) == 1 and secrets[0] in {bytes([i]) * 32 for i in range(3)}
    assert await nodes[0].secret("xet", b"x" * 32) == secrets[0]
    assert await nodes[0].secret("other", b"y" * 32) == b"y" * 32


async def test_one_live_job_per_warm_across_the_fleet(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    warm = '["model:acme/tiny","main",null,null,null]'
    assert await a.claim_job(warm, "job-a", {"id": "job-a", "state": "queued"}, 30) is None
    assert await b.claim_job(warm, "job-b", {"id": "job-b", "state": "queued"}, 30) == {"id": "job-a",
                                                                                       "state": "queued"}
    await a.update_job("job-a", {"id": "job-a", "state": "running", "files_done": 1}, 30)
    assert await b.get_job("job-a") == {"id": "job-a", "state": "running", "files_done": 1}
    assert (await b.claim_job(warm, "job-c", {"id": "job-c"}, 30))["state"] == "running"  # type: ignore[index]
    assert await b.get_job("job-b") is None and await b.get_job("job-c") is None
    await a.update_job("job-a", {"id": "job-a", "state": "done"}, 30, finished=True)
    assert await b.get_job("job-a") == {"id": "job-a", "state": "done"}  # kept for status reads
    assert await b.claim_job(warm, "job-d", {"id": "job-d"}, 30) is None  # a later warm runs anew
    other = '["model:acme/tiny","v1",null,null,null]'
    assert await a.claim_job(other, "job-e", {"id": "job-e"}, 0.2) is None

    async def lapsed() -> bool:  # its node stopped publishing: the claim lapses
        return await b.claim_job(other, "job-f", {"id": "job-f"}, 30) is None

    await eventually(lapsed)


# --- held windows ----------------------------------------------------------------------------------------------------

async def test_held_windows_are_recorded_per_node_and_dropped(stores: Stores) -> None:
    a, b = await stores.node(), await stores.node()
    blob = etag()
    assert await b.get_windows(blob) == []
    await a.put_windows(blob, PeerAddress("http://node-a", "t1"), [(0, 10), (20, 30)])
    await b.put_windows(blob, PeerAddress("http://node-c", "t3"), [(0, 5)])
    records = {r.peer.url: r for r in await b.get_windows(blob)}
    assert records["http://node-a"].peer.token == "t1" and records["http://node-a"].held == ((0, 10), (20, 30))
    assert records["http://node-c"].held == ((0, 5),) and records["http://node-c"].etag == blob
    await a.put_windows(blob, PeerAddress("http://node-a", "t2"), [(0, 40)])  # paused again: replaced
    await b.drop_windows(blob, "http://node-a", "t1")  # a refusal under an old token: the new record stays
    assert {(r.peer.url, r.peer.token, r.held) for r in await b.get_windows(blob)} == {
        ("http://node-a", "t2", ((0, 40),)), ("http://node-c", "t3", ((0, 5),))}
    await b.drop_windows(blob, "http://node-a")  # evicted there
    assert [r.peer.url for r in await a.get_windows(blob)] == ["http://node-c"]
    await a.put_windows(blob, PeerAddress("http://node-a", "t4"), [(0, 40)])
    other = etag()
    await a.put_windows(other, PeerAddress("http://node-a", "t5"), [(0, 1)])
    await b.drop_windows(blob)  # committed: every node's record of it goes, no other blob's
    assert await a.get_windows(blob) == [] and len(await a.get_windows(other)) == 1

"""The storage contract (:mod:`mirror.storage.base`), one suite run against every backend.

``local`` is the cache directory on this host; ``s3`` is :class:`mirror.storage.s3.S3BlobStore` against a real
S3-compatible server on 127.0.0.1 (SeaweedFS, see ``tests/support/s3_server.py``). ``stores.new()`` opens another
store on the same backing storage: another process on the host for ``local``, another *node* (its own cache dir and
hot tier) for ``s3``. A dead lease holder is a real process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mirror.errors import IntegrityError
from mirror.layout import CacheLayout
from mirror.storage.base import BlobStore, PeerAddress
from mirror.storage.local import LocalBlobStore
from tests.support import s3_server
from tests.support.mirror_proc import REPO_ROOT

BACKENDS = ["local", "s3"]


class Stores:
    """Opens stores of one backend over the same backing storage; closes them at the end of the test."""

    def __init__(self, backend: str, tmp: Path, s3: s3_server.S3Server | None) -> None:
        self.backend = backend
        self.tmp = tmp
        self.s3 = s3
        self.prefix = f"contract-{uuid.uuid4().hex[:8]}/"
        self.opened: list[Any] = []

    def spec(self, node: int, **extra: Any) -> dict[str, Any]:
        """What a store is built from (also handed to the lease-holding subprocess)."""
        if self.backend == "local":
            return {"backend": "local", "root": str(self.tmp / "cache")}
        assert self.s3 is not None
        return {"backend": "s3", "root": str(self.tmp / f"node{node}"), "bucket": self.s3.bucket,
                "prefix": self.prefix, "endpoint": self.s3.endpoint, **extra}

    async def new(self, leases: Any = None, **extra: Any) -> Any:
        store = build(self.spec(len(self.opened), **extra), leases)
        if hasattr(store, "open"):
            await store.open()
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await store.aclose()


def build(spec: dict[str, Any], leases: Any = None) -> Any:
    if spec["backend"] == "local":
        return LocalBlobStore(CacheLayout(Path(spec["root"])))
    from mirror.storage.s3 import S3BlobStore

    return S3BlobStore(CacheLayout(Path(spec["root"])), bucket=spec["bucket"], prefix=spec["prefix"],
                       endpoint=spec["endpoint"], hot_tier_max_size=spec.get("hot_tier_max_size"),
                       leases=leases)


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[Stores]:
    server = None
    if request.param == "s3":
        server = request.getfixturevalue("s3")
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
    out = Stores(request.param, tmp_path, server)
    try:
        yield out
    finally:
        await out.close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_partial(store: BlobStore, data: bytes) -> tuple[str, Path]:
    etag = sha256(data)
    partial = store.partial_path(etag)
    partial.write_bytes(data)
    return etag, partial


def protocol_members(protocol: type) -> set[str]:
    """Every method and attribute ``protocol`` declares (its own body: what each backend must have)."""
    own = {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


async def test_every_backend_is_a_whole_blob_store(stores: Stores) -> None:
    """Conformance, as ``var _ BlobStore = &proxyBlobStore{}`` asserts it in Go: no member of the Protocol is
    missing, so nothing above the store probes for one (``getattr(store, ...)``)."""
    store = await stores.new()
    assert isinstance(store, BlobStore)
    missing = {name for name in protocol_members(BlobStore) if not hasattr(store, name)}
    assert not missing, missing
    assert {"open", "aclose", "lease_held", "lease_lost", "partials_dir", "watch_lease"} <= protocol_members(BlobStore)
    assert store.partials_dir.is_dir() and store.lease_lost("0" * 64) is None and store.lease_held("0" * 64) is False


async def test_stat_commit_local_path(stores: Stores) -> None:
    store = await stores.new()
    data = os.urandom(100_000)
    etag, partial = write_partial(store, data)
    # A partial file, even a complete one, is not a blob until it is committed.
    assert await store.stat(etag) is None
    assert await store.local_path(etag) is None
    path = await store.commit(etag, partial)
    assert path.read_bytes() == data
    assert not partial.exists()
    info = await store.stat(etag)
    assert info is not None and info.etag == etag and info.size == len(data)
    assert abs(info.last_access - time.time()) < 120
    local = await store.local_path(etag)
    assert local is not None and local.read_bytes() == data


async def test_committed_blob_is_seen_by_every_store_on_the_backing(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    data = b"shared " * 5000
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    info = await second.stat(etag)
    assert info is not None and info.size == len(data)
    local = await second.local_path(etag)  # for s3: fetched into the second node's hot tier
    assert local is not None and local.read_bytes() == data


async def test_adopt_keeps_a_verified_copy_of_a_committed_blob(stores: Stores) -> None:
    """A follower node that streamed a blob from its peer keeps that copy instead of fetching it again."""
    first, second = await stores.new(), await stores.new()
    data = os.urandom(50_000)
    etag = sha256(data)
    copy = second.partial_path(etag).with_name(f"{etag}.peer-copy")
    copy.write_bytes(data)
    assert await second.adopt(etag, copy) is None, "nothing to adopt before the commit"
    assert copy.exists()
    _, partial = write_partial(first, data)
    await first.commit(etag, partial)
    local = await second.adopt(etag, copy)
    assert local is not None and local.read_bytes() == data
    assert not copy.exists()
    assert await second.local_path(etag) == local


async def test_lease_publishes_the_holders_peer_address(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    etag = sha256(b"peer")
    assert await first.acquire_lease(etag, "owner-a", 30, PeerAddress("http://node-a:8090", "t0ken")) is True
    lease = await second.read_lease(etag)
    assert lease is not None and lease.owner == "owner-a"
    if stores.backend == "s3":  # on one host, followers read the partial file and need no address
        assert lease.peer == PeerAddress("http://node-a:8090", "t0ken")
        assert await first.refresh_lease(etag, "owner-a", 30) is True
        refreshed = await second.read_lease(etag)
        assert refreshed is not None and refreshed.peer == lease.peer, "a refresh keeps the address"
    await first.release_lease(etag, "owner-a")


async def test_commit_is_atomic_for_concurrent_readers(stores: Stores) -> None:
    """While a multi-megabyte commit runs, a reader on another store sees no blob or the whole blob, never part."""
    writer, reader = await stores.new(), await stores.new()
    data = os.urandom(6 * 1024 * 1024 + 17)
    etag, partial = write_partial(writer, data)
    seen: list[int] = []

    async def watch() -> None:
        while True:
            info = await reader.stat(etag)
            if info is not None:
                seen.append(info.size)
                return
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    await writer.commit(etag, partial)
    await asyncio.wait_for(watcher, 10)
    assert seen == [len(data)]
    local = await reader.local_path(etag)
    assert local is not None and sha256(local.read_bytes()) == etag


async def test_commit_of_an_existing_blob_is_harmless(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    data = b"twice"
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    _, again = write_partial(second, data)
    path = await second.commit(etag, again)
    assert path.read_bytes() == data


async def test_delete(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    data = b"to be deleted"
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    assert await first.delete(etag) is True
    assert await first.stat(etag) is None
    assert await second.stat(etag) is None
    assert await first.local_path(etag) is None
    assert await first.delete(etag) is False


def flip_a_byte(path: Path) -> None:
    """A same-size fault on disk: one byte of the file inverted in place."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


async def test_verify_shared_hashes_the_copy_every_node_reads(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    data = os.urandom(300_000)
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    paced: list[int] = []
    assert await second.verify_shared(etag, paced.append) is True
    assert sum(paced) == len(data)
    assert await second.verify_shared(sha256(b"never stored")) is None
    if stores.backend == "s3":
        assert second.cached_path(etag) is None  # hashed as it streamed by: nothing entered the hot tier
        client = stores.s3.client()  # type: ignore[union-attr]
        client.put_object(Bucket=stores.s3.bucket, Key=f"{stores.prefix}blobs/{etag[:2]}/{etag}",  # type: ignore[union-attr]
                          Body=data[:-1] + bytes([data[-1] ^ 1]))
    else:
        flip_a_byte(first.blob_path(etag))
    assert await second.verify_shared(etag) is False


async def test_a_bad_local_copy_is_dropped_and_the_shared_copy_kept(stores: Stores) -> None:
    """A local fault never destroys the shared copy: with a hot tier (S3) only this node's copy goes, and the next read
    copies the blob from the bucket again; where this node's file is the blob (local), the blob goes."""
    from mirror.storage.base import Discarded, discard_bad_copy

    store, other = await stores.new(), await stores.new()
    data = os.urandom(200_000)
    etag, partial = write_partial(store, data)
    path = await store.commit(etag, partial)
    assert store.has_hot_tier is (stores.backend == "s3")
    flip_a_byte(path)
    discarded = await discard_bad_copy(store, etag)
    if stores.backend == "local":
        assert store.drop_local(etag) is False
        assert discarded == Discarded(local=False, shared=True)
        assert await store.stat(etag) is None and await other.stat(etag) is None
        return
    assert discarded == Discarded(local=True, shared=False)
    assert store.cached_path(etag) is None and store.drop_local(etag) is False  # nothing left to drop
    assert await other.verify_shared(etag) is True  # the bucket object survived
    again = await store.local_path(etag)
    assert again is not None and again.read_bytes() == data
    # The bucket object itself bad: then it goes, for every node.
    client = stores.s3.client()  # type: ignore[union-attr]
    client.put_object(Bucket=stores.s3.bucket, Key=f"{stores.prefix}blobs/{etag[:2]}/{etag}",  # type: ignore[union-attr]
                      Body=b"rotten" + data[6:])
    assert await discard_bad_copy(store, etag) == Discarded(local=True, shared=True)
    assert await other.stat(etag) is None and store.cached_path(etag) is None


async def test_list_blobs(stores: Stores) -> None:
    store = await stores.new()
    expected = {}
    for i in range(5):
        data = f"blob number {i}".encode() * (i + 1)
        etag, partial = write_partial(store, data)
        await store.commit(etag, partial)
        expected[etag] = len(data)
    store.partial_path("f" * 64).write_bytes(b"a fill in progress is not listed")
    listed = {info.etag: info.size async for info in store.list_blobs()}
    assert listed == expected


async def test_touch_updates_last_access(stores: Stores) -> None:
    store = await stores.new()
    data = b"touch me"
    etag, partial = write_partial(store, data)
    path = await store.commit(etag, partial)
    old = time.time() - 3600
    os.utime(path, (old, old))
    before = await store.stat(etag)
    assert before is not None and before.last_access < time.time() - 3000
    await store.touch(etag)
    after = await store.stat(etag)
    assert after is not None and after.last_access > time.time() - 60


async def test_lease_is_exclusive_and_released(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    etag = sha256(b"lease")
    assert await first.read_lease(etag) is None
    assert await first.acquire_lease(etag, "owner-a", 30) is True
    assert await first.acquire_lease(etag, "owner-a", 30) is True  # already ours
    assert await second.acquire_lease(etag, "owner-b", 30) is False
    lease = await second.read_lease(etag)
    assert lease is not None and lease.owner == "owner-a" and lease.expires > time.time()
    assert await first.refresh_lease(etag, "owner-a", 30) is True
    await first.release_lease(etag, "owner-a")
    assert await second.read_lease(etag) is None
    assert await second.acquire_lease(etag, "owner-b", 30) is True
    await second.release_lease(etag, "owner-b")


async def test_concurrent_acquire_has_exactly_one_winner(stores: Stores) -> None:
    """The conditional put (s3) / flock (local) arbitrates: of many contenders at once, one wins."""
    contenders = [await stores.new() for _ in range(4)]
    etag = sha256(b"race")
    results = await asyncio.gather(*(s.acquire_lease(etag, f"owner-{i}", 30) for i, s in enumerate(contenders)))
    assert sum(results) == 1
    winner = results.index(True)
    await contenders[winner].release_lease(etag, f"owner-{winner}")


async def test_lease_is_kept_alive_past_its_ttl_while_held(stores: Stores) -> None:
    holder, other = await stores.new(), await stores.new()
    etag = sha256(b"long fill")
    assert await holder.acquire_lease(etag, "holder", 1.5)
    await asyncio.sleep(3.5)  # more than twice the ttl: the holder's refreshes must have kept it
    assert await other.acquire_lease(etag, "other", 1.5) is False
    await holder.release_lease(etag, "holder")


_HOLDER = """
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
from tests.contract.test_storage_contract import build
async def main():
    store = build(json.loads({spec!r}))
    if hasattr(store, "open"):
        await store.open()
    ok = await store.acquire_lease({etag!r}, "doomed", {ttl})
    print("held" if ok else "refused", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_dead_holders_lease_is_taken_over_by_exactly_one(stores: Stores) -> None:
    """A holder killed with SIGKILL never releases: its lease frees (local: at once, the kernel drops the flock;
    s3: once its ttl lapses on the store's clock) and exactly one of several contenders takes it over."""
    etag = sha256(b"dead holder " + uuid.uuid4().bytes)
    ttl = 2.0
    code = _HOLDER.format(root=str(REPO_ROOT), spec=json.dumps(stores.spec(99)), etag=etag, ttl=ttl)
    env = {**os.environ, **(stores.s3.env if stores.s3 else {})}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, cwd=REPO_ROOT)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == b"held"
        contenders = [await stores.new() for _ in range(3)]
        assert await contenders[0].acquire_lease(etag, "early", ttl) is False
        lease = await contenders[0].read_lease(etag)
        assert lease is not None and lease.owner == "doomed"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + ttl + 5
    while await contenders[0].read_lease(etag) is not None:
        assert time.monotonic() < deadline, "a dead holder's lease never expired"
        await asyncio.sleep(0.1)
    results = await asyncio.gather(*(s.acquire_lease(etag, f"heir-{i}", 30) for i, s in enumerate(contenders)))
    assert sum(results) == 1
    winner = results.index(True)
    lease = await contenders[0].read_lease(etag)
    assert lease is not None and lease.owner == f"heir-{winner}"
    await contenders[winner].release_lease(etag, f"heir-{winner}")


# --- s3 only: what the bucket backend adds ---------------------------------------------------------------------------


@pytest.fixture
async def s3_stores(tmp_path: Path, s3: s3_server.S3Server, monkeypatch: pytest.MonkeyPatch
                    ) -> AsyncIterator[Stores]:
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    out = Stores("s3", tmp_path, s3)
    try:
        yield out
    finally:
        await out.close()


async def test_s3_copy_into_the_hot_tier_reports_its_progress(s3_stores: Stores) -> None:
    """Readers follow a hot-tier copy as it grows (FillManager), so a copy of a big blob gives bytes at once."""
    first, second = await s3_stores.new(), await s3_stores.new()
    data = os.urandom(10 * 2**20)  # more than one read of the bucket object
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    assert second.cached_path(etag) is None
    reports: list[tuple[Path, int, bytes]] = []

    def progress(file: Path, written: int) -> None:
        with open(file, "rb") as f:  # what is reported is in the file already
            reports.append((file, written, f.read(written)))

    local = await second.local_path(etag, progress=progress)
    assert local is not None and local.read_bytes() == data and second.cached_path(etag) == local
    assert len(reports) >= 2 and reports[-1][1] == len(data)
    assert [written for _, written, _ in reports] == sorted(written for _, written, _ in reports)
    assert all(prefix == data[:written] for _, written, prefix in reports)


async def test_s3_hot_tier_is_bounded_lru(s3_stores: Stores) -> None:
    store = await s3_stores.new(hot_tier_max_size=25_000)
    etags = []
    for i in range(4):
        data = bytes([i]) * 10_000
        etag, partial = write_partial(store, data)
        await store.commit(etag, partial)
        etags.append(etag)
        old = time.time() - 1000 + i  # commit order = access order
        os.utime(store.blob_path(etag), (old, old))
    hot = {p.name for p, _, _ in store.hot_tier.scan()}
    assert store.hot_tier_usage()[0] <= 25_000
    assert etags[-1] in hot and etags[0] not in hot
    # Evicted from the hot tier is not gone: the bucket has it, and it comes back (verified) on the next read.
    assert await store.stat(etags[0]) is not None
    local = await store.local_path(etags[0])
    assert local is not None and local.read_bytes() == bytes([0]) * 10_000
    assert store.hot_tier_usage()[0] <= 25_000


async def test_drop_local_drops_only_a_nodes_own_copy(stores: Stores) -> None:
    first, second = await stores.new(), await stores.new()
    etag, partial = write_partial(first, b"kept in the store")
    await first.commit(etag, partial)
    assert await second.local_path(etag) is not None
    dropped = second.drop_local(etag)
    assert dropped is (stores.backend == "s3")  # a hot tier's copy; the local store's blobs are the store
    assert await first.stat(etag) is not None and await second.stat(etag) is not None
    if dropped:
        assert second.cached_path(etag) is None
        assert (await second.local_path(etag)).read_bytes() == b"kept in the store"  # type: ignore[union-attr]
    assert not second.drop_local(uuid.uuid4().hex * 2)


async def test_s3_corrupt_bucket_object_never_enters_the_hot_tier(s3_stores: Stores) -> None:
    store = await s3_stores.new()
    data = b"the real bytes"
    etag = git_sha1(data)
    client = s3_stores.s3.client()  # type: ignore[union-attr]
    client.put_object(Bucket=s3_stores.s3.bucket, Key=f"{s3_stores.prefix}blobs/{etag[:2]}/{etag}",  # type: ignore[union-attr]
                      Body=b"rotten bytes!!")
    with pytest.raises(IntegrityError):
        await store.local_path(etag)
    assert not store.blob_path(etag).exists()


async def test_s3_lease_won_for_an_already_committed_blob_is_given_back(s3_stores: Stores) -> None:
    """A node that stat()ed before another node committed must not fill again: acquiring says no."""
    committer, late = await s3_stores.new(), await s3_stores.new()
    data = b"committed elsewhere"
    etag, partial = write_partial(committer, data)
    await committer.commit(etag, partial)
    assert await late.acquire_lease(etag, "late", 30) is False
    assert await late.read_lease(etag) is None


async def test_s3_bad_bucket_fails_at_open(s3: s3_server.S3Server, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from mirror.storage.s3 import S3BlobStore

    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    store = S3BlobStore(CacheLayout(tmp_path), bucket="no-such-bucket", endpoint=s3.endpoint)
    try:
        with pytest.raises(RuntimeError, match="no-such-bucket"):
            await store.open()
    finally:
        await store.aclose()


def test_s3_settings_are_validated_and_parsed(settings_env: pytest.MonkeyPatch) -> None:
    from mirror.config import ConfigError, Settings
    from mirror.storage import open_store

    with pytest.raises(ConfigError, match="s3_bucket"):
        Settings(storage="s3")
    with pytest.raises(ConfigError, match="storage"):
        Settings(storage="nfs")
    settings_env.setenv("HF_MIRROR_HOT_TIER_MAX_SIZE", "10GiB")
    settings_env.setenv("HF_MIRROR_S3_PREFIX", "p/")
    settings = Settings(storage="s3", s3_bucket="b", s3_endpoint="http://127.0.0.1:9")
    assert settings.hot_tier_max_size == 10 * 2**30 and settings.s3_prefix == "p/"
    assert not any("aws" in key or "access_key" in key for key in settings.redacted())  # credentials: AWS chain only
    store = open_store(settings, CacheLayout(settings.cache_dir))
    assert type(store).__name__ == "S3BlobStore" and store.prefix == "p/"
    settings_env.delenv("HF_MIRROR_S3_PREFIX")
    assert isinstance(open_store(Settings(), CacheLayout(Settings().cache_dir)), LocalBlobStore)


async def test_s3_outage_hot_hits_still_served_misses_are_503(s3_stores: Stores, tmp_path: Path) -> None:
    from mirror.storage.s3 import S3BlobStore, StorageUnavailable
    from tests.support.mirror_proc import free_port

    store = await s3_stores.new()
    data = b"hot before the outage"
    etag, partial = write_partial(store, data)
    await store.commit(etag, partial)
    # The same node's cache dir, but the bucket's endpoint is gone.
    down = S3BlobStore(store.layout, bucket="b", endpoint=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    try:
        info = await down.stat(etag)
        assert info is not None and info.size == len(data)
        assert await down.local_path(etag) == store.blob_path(etag)
        started = time.monotonic()
        with pytest.raises(StorageUnavailable) as caught:
            await down.stat(sha256(b"cold"))
        assert caught.value.status == 503
        assert time.monotonic() - started < 5
    finally:
        await down.aclose()


# --- s3: a committed blob is uploaded once (issue 25 item 6) ----------------------------------------------------------


def uploads_in_flight(stores: Stores) -> list[Any]:
    listing = stores.s3.client().list_multipart_uploads(Bucket=stores.s3.bucket,  # type: ignore[union-attr]
                                                        Prefix=stores.prefix)
    return list(listing.get("Uploads", []))


def object_etag(stores: Stores, etag: str) -> str:
    head = stores.s3.client().head_object(Bucket=stores.s3.bucket,  # type: ignore[union-attr]
                                          Key=f"{stores.prefix}blobs/{etag[:2]}/{etag}")
    return str(head["ETag"])


def spy_on_completions(store: Any) -> list[str]:
    """Every multipart completion ``store`` sends to the bucket (the etag of its key)."""
    completed: list[str] = []

    async def counting(client: Any) -> Any:
        send = client.complete_multipart_upload

        async def complete(**kwargs: Any) -> Any:
            completed.append(kwargs["Key"].rsplit("/", 1)[-1])
            return await send(**kwargs)

        client.complete_multipart_upload = complete
        return client

    real_client = store.objects.client

    async def client() -> Any:
        c = await real_client()
        if not getattr(c, "_spied", False):
            await counting(c)
            c._spied = True
        return c

    store.objects.client = client
    return completed


async def test_s3_a_second_commit_of_a_committed_blob_uploads_nothing(s3_stores: Stores,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = await s3_stores.new(), await s3_stores.new()
    data = os.urandom(100_000)
    etag, partial = write_partial(first, data)
    await first.commit(etag, partial)
    committed = object_etag(s3_stores, etag)
    monkeypatch.setattr("mirror.storage.s3.bucket._SINGLE_PUT_MAX", 1024)  # the second would go up in parts
    completed = spy_on_completions(second)
    _, again = write_partial(second, data)
    path = await second.commit(etag, again)
    assert path.read_bytes() == data and not again.exists()
    assert completed == [] and not uploads_in_flight(s3_stores)
    assert object_etag(s3_stores, etag) == committed  # the object was not written again


async def test_s3_an_upload_overtaken_by_a_commit_is_never_completed(s3_stores: Stores,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fills of one blob race (no database: nothing fences them): the second's parts are up when the first
    commits. Its look right before the completion finds the object: the upload is aborted, not completed."""
    winner, loser = await s3_stores.new(), await s3_stores.new()
    data = os.urandom(100_000)
    etag, partial = write_partial(winner, data)
    monkeypatch.setattr("mirror.storage.s3.bucket._SINGLE_PUT_MAX", 1024)
    completed = spy_on_completions(loser)
    real_head = loser.objects.head_blob
    looks = 0

    async def head_blob(tag: str) -> Any:
        nonlocal looks
        looks += 1
        if looks == 2:  # the loser's parts are up, it is about to complete: the winner commits first
            assert uploads_in_flight(s3_stores)
            await winner.commit(etag, partial)
        return await real_head(tag)

    loser.objects.head_blob = head_blob
    _, mine = write_partial(loser, data)
    path = await loser.commit(etag, mine)
    assert looks == 2 and path.read_bytes() == data
    assert completed == []  # the loser sent no completion: its upload was aborted
    assert not uploads_in_flight(s3_stores)
    assert (await loser.verify_shared(etag)) is True


async def test_s3_with_a_database_only_the_current_epoch_commits(s3_stores: Stores, postgres: Any) -> None:
    """The fleet's leases (PostgreSQL): a holder whose lease was granted again to another node (a new epoch) uploads
    its parts but never completes them; the holder of the current epoch commits."""
    from mirror.errors import LeaseLost
    from mirror.metadata.fleet_leases import FleetLeases
    from mirror.metadata.postgres import PostgresMetadata

    database = postgres.create_database()
    metadata = [PostgresMetadata(database), PostgresMetadata(database)]
    leases = [FleetLeases(m, ttl=30) for m in metadata]
    try:
        for m in metadata:
            await m.open()
        old, new = [await s3_stores.new(leases=lease) for lease in leases]
    except BaseException:
        for m in metadata:
            await m.aclose()
        raise
    try:
        data = os.urandom(100_000)
        etag, partial = write_partial(old, data)
        assert await old.acquire_lease(etag, "old", 30)
        import psycopg

        with psycopg.connect(database, autocommit=True) as conn:  # the old holder's lease lapses unnoticed
            conn.execute("UPDATE hf_mirror_fill_leases SET expires = now() WHERE etag = %s", (etag,))
        assert await new.acquire_lease(etag, "new", 30)
        with pytest.raises(LeaseLost):
            await old.commit(etag, partial)
        assert await new.stat(etag) is None and not uploads_in_flight(s3_stores)
        _, mine = write_partial(new, data)
        await new.commit(etag, mine)
        assert await old.verify_shared(etag) is True
        await new.release_lease(etag, "new")
    finally:
        for store in (old, new):
            await store.aclose()
        s3_stores.opened.clear()
        for m in metadata:
            await m.aclose()

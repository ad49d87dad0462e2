"""The service in-process, over its real parts on a temporary directory (index, local store, fill engine, access
policy, cache manager: built by :func:`mirror.parts.build_parts`) and a fake upstream Hub at the upstream client's
own interface (tests/support/fake_upstream.py; no HTTP transport, no mocks of httpx).

What a resolve remembers and for how long (a ref for ``revision_ttl``, a path at a commit for good), the stale
answers when upstream fails, the access confirmations remembered per token, the offline refusals, and where a file's
bytes come from (one fill shared by concurrent readers, a wrong hash never published). Only the service's public
methods are called; waits are on the fill's own events."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mirror import hf
from mirror.access import Caller
from mirror.config import Settings
from mirror.errors import AccessDenied, EntryNotFound, HubError, IntegrityError, OfflineMiss, UpstreamUnavailable
from mirror.fill import Fill, FillManager
from mirror.fill import resume as resume_module
from mirror.metrics import Outcome
from mirror.parts import Parts, build_parts
from mirror.service.answers import BlobSource, Cached, Filling, Relay, ResolvedFile
from mirror.storage.base import PeerAddress
from tests.support.fake_upstream import FakeBody, FakeUpstream, Opened

PUBLIC = hf.RepoRef(hf.RepoType.MODEL, "acme/tiny")
GATED = hf.RepoRef(hf.RepoType.MODEL, "acme/gated")
READER, STRANGER = "hf_reader_token", "hf_stranger_token"
ANON = Caller(None)
TTL = 60.0
CONFIG = b'{"model_type": "tiny"}'
WEIGHTS = bytes(range(256)) * 1024  # 256 KiB, an LFS file


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fill's tries follow each other at once: the backoff's length is policy, not what these tests check."""
    monkeypatch.setattr(resume_module, "backoff", lambda failures: 0.0)


def settings_for(cache: Path, **overrides: object) -> Settings:
    # Fills report progress every 16 KiB (the fake body's read): readers see a fill held half-way.
    return Settings(cache_dir=cache, upstream="https://hub.example", revision_ttl=TTL, access_ttl=TTL,
                    fill_chunk_size=16 * 1024, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def mirror_service(settings: Settings, upstream: FakeUpstream) -> AsyncIterator[Parts]:
    """The one place the unit tests build a service: every part as ``serve`` builds it, over the fake upstream."""
    parts = build_parts(settings, upstream=upstream)  # type: ignore[arg-type]  # a FakeUpstream is the client's shape
    await parts.open()
    try:
        yield parts
    finally:
        await parts.aclose(grace=0)


@pytest.fixture
def hub(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> FakeUpstream:
    upstream = FakeUpstream(settings_for(tmp_path / "cache"))
    upstream.push(PUBLIC, {"config.json": CONFIG, "model.safetensors": WEIGHTS}, lfs=("model.safetensors",))
    upstream.push(GATED, {"config.json": CONFIG, "model.safetensors": WEIGHTS}, lfs=("model.safetensors",),
                  gated=True, readers=(READER,))
    return upstream


@pytest.fixture
async def parts(hub: FakeUpstream) -> AsyncIterator[Parts]:
    async with mirror_service(hub.settings, hub) as built:
        yield built


def target(repo: hf.RepoRef, path: str, revision: str = "main") -> hf.ResolveTarget:
    return hf.ResolveTarget(repo, revision, path)


def age_ref(parts: Parts, repo: hf.RepoRef, revision: str = "main") -> None:
    """The ref was last confirmed upstream longer than ``revision_ttl`` ago."""
    entry = parts.index.get_ref(repo, revision)
    assert entry is not None
    parts.index.put_ref_at(repo, revision, entry.commit, fetched_at=time.time() - TTL - 1)


async def read_all(parts: Parts, source: BlobSource) -> bytes:
    """The bytes a route would send from ``source``: the stored file, or the fill's as they are written."""
    if isinstance(source, Cached):
        return Path(source.path).read_bytes()
    assert isinstance(source, Filling)
    fill, out = source.fill, bytearray()
    async with parts.fills.reading(fill) as fd:
        while len(out) < fill.spec.size:
            readable = await FillManager.readable(fill, len(out))
            out += await asyncio.to_thread(os.pread, fd, readable - len(out), len(out))
    await ended(fill)  # the last byte is read once verified; the commit (an fsync, a rename) may still run
    return bytes(out)


async def ended(fill: Fill) -> None:
    while not fill.finished:
        await fill.changed()
    if fill.error is not None:
        raise fill.error


async def written(fill: Fill, offset: int) -> None:
    while fill.written < offset and not fill.finished:
        await fill.changed()


async def fetched(parts: Parts, resolved: ResolvedFile, caller: Caller = ANON) -> bytes:
    return await read_all(parts, await parts.service.open_blob(resolved, caller, 0, resolved.entry.size - 1))


# --- resolve: what a path is, remembered ------------------------------------------------------------------------------


async def test_a_miss_asks_upstream_once_then_the_index_answers(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    first = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert first.outcome is Outcome.MISS
    assert first.entry.etag == hub.file(PUBLIC, "config.json").etag and first.entry.size == len(CONFIG)
    assert not first.entry.lfs
    again = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert again.outcome is Outcome.HIT and again.entry == first.entry
    assert hub.count("head_file") == 1
    assert service.commit_of(PUBLIC, "main") == first.entry.commit
    weights = await service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
    assert weights.entry.lfs and weights.entry.etag == hub.file(PUBLIC, "model.safetensors").etag


async def test_a_ref_is_trusted_for_its_ttl_then_asked_again(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    old = (await service.resolve_file(target(PUBLIC, "config.json"), ANON)).entry.commit
    new = hub.push(PUBLIC, {"config.json": b'{"model_type": "tinier"}'})
    within = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert within.outcome is Outcome.HIT and within.entry.commit == old  # within the TTL: upstream not asked
    assert hub.count("head_file") == 1
    age_ref(parts, PUBLIC)
    assert service.commit_of(PUBLIC, "main") is None and service.commit_of(PUBLIC, "main", fresh=False) == old
    after = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert after.outcome is Outcome.MISS and after.entry.commit == new
    assert service.commit_of(PUBLIC, "main") == new
    # What a path is at a commit never changes: pinned to the old commit, the old entry answers without upstream.
    pinned = await service.resolve_file(target(PUBLIC, "config.json", old), ANON)
    assert pinned.outcome is Outcome.HIT and pinned.entry == within.entry
    assert hub.count("head_file") == 2


async def test_a_missing_path_at_a_commit_is_remembered(parts: Parts, hub: FakeUpstream) -> None:
    await parts.service.resolve_file(target(PUBLIC, "config.json"), ANON)  # the repo is public: no access probe
    for _ in range(2):
        with pytest.raises(EntryNotFound) as missing:
            await parts.service.resolve_file(target(PUBLIC, "nope.bin"), ANON)
        assert missing.value.commit == hub.repos[PUBLIC].refs["main"]
    assert hub.count("head_file") == 2  # the second 404 came from the index


async def test_a_missing_path_of_a_repo_not_known_public_is_no_answer_before_an_access_check(
        parts: Parts, hub: FakeUpstream) -> None:
    """A remembered 404 tells that a path does not exist: only a caller who may read the repo learns it."""
    reader = Caller(READER, own_token=True)
    with pytest.raises(EntryNotFound):
        await parts.service.resolve_file(target(GATED, "nope.bin"), reader)
    with pytest.raises(HubError) as refused:
        await parts.service.resolve_file(target(GATED, "nope.bin"), ANON)
    assert not isinstance(refused.value, EntryNotFound) and refused.value.code == "GatedRepo"


# --- stale answers when upstream fails --------------------------------------------------------------------------------


async def test_upstream_down_past_the_ttl_serves_what_is_known_stale(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    known = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    age_ref(parts, PUBLIC)
    hub.down = True
    stale = await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert stale.outcome is Outcome.STALE and stale.entry == known.entry
    assert parts.metrics.stale_served._value.get() == 1  # noqa: SLF001
    with pytest.raises(UpstreamUnavailable, match="not cached on the mirror"):  # never known: nothing to fall back on
        await service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)


async def test_a_stale_gated_file_goes_only_to_a_token_upstream_confirmed(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    reader = Caller(READER, own_token=True)
    await service.resolve_file(target(GATED, "config.json"), reader)
    age_ref(parts, GATED)
    hub.down = True
    assert (await service.resolve_file(target(GATED, "config.json"), reader)).outcome is Outcome.STALE
    for caller in (ANON, Caller(STRANGER, own_token=True)):
        with pytest.raises(UpstreamUnavailable, match="cannot be confirmed"):
            await service.resolve_file(target(GATED, "config.json"), caller)


async def test_cached_api_json_is_fresh_for_the_ttl_then_stale_when_upstream_fails(parts: Parts,
                                                                                   hub: FakeUpstream) -> None:
    service = parts.service
    info = hf.ApiTarget(PUBLIC, "", None, "")
    raw = PUBLIC.api_path()
    first = await service.api(info, "GET", raw, [], None, ANON)
    assert first.outcome is Outcome.MISS and first.status == 200
    assert (await service.api(info, "GET", raw, [], None, ANON)).outcome is Outcome.HIT
    assert hub.count("api") == 1
    cached = parts.index.get_api(PUBLIC, None, "info:", "")
    assert cached is not None
    parts.index.put_api(PUBLIC, None, "info:", "", type(cached)(cached.status, cached.headers, cached.body,
                                                                time.time() - TTL - 1))
    hub.down = True
    stale = await service.api(info, "GET", raw, [], None, ANON)
    assert stale.outcome is Outcome.STALE and stale.body == first.body


# --- access confirmations ---------------------------------------------------------------------------------------------


async def test_a_confirmed_token_is_remembered_and_a_stranger_is_asked_about(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    reader = Caller(READER, own_token=True)
    assert (await service.resolve_file(target(GATED, "config.json"), reader)).outcome is Outcome.MISS
    assert (await service.resolve_file(target(GATED, "config.json"), reader)).outcome is Outcome.HIT
    assert hub.count("head_file") == 1  # the reader's access was remembered: no probe
    stranger = Caller(STRANGER, own_token=True)
    with pytest.raises(HubError) as refused:
        await service.resolve_file(target(GATED, "config.json"), stranger)
    assert refused.value.status == 403 and refused.value.code == "GatedRepo"
    assert hub.count("head_file") == 2  # the cached entry was not served before upstream answered for this token
    with pytest.raises(HubError):
        await service.resolve_file(target(GATED, "config.json"), stranger)
    assert hub.count("head_file") == 2  # the refusal is remembered too


async def test_a_public_repo_is_served_from_the_index_to_anyone(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    await service.resolve_file(target(PUBLIC, "config.json"), ANON)
    for caller in (Caller(STRANGER, own_token=True), Caller(READER, own_token=True), ANON):
        assert (await service.resolve_file(target(PUBLIC, "config.json"), caller)).outcome is Outcome.HIT
    assert hub.count("head_file") == 1


# --- offline ----------------------------------------------------------------------------------------------------------


async def test_offline_serves_what_is_cached_and_refuses_the_rest(hub: FakeUpstream) -> None:
    reader = Caller(READER, own_token=True)
    async with mirror_service(hub.settings, hub) as online:
        public = await online.service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
        assert await fetched(online, public) == WEIGHTS
        gated = await online.service.resolve_file(target(GATED, "config.json"), reader)
        assert await fetched(online, gated, reader) == CONFIG
    asked = sum(hub.calls.values())
    offline = settings_for(hub.settings.cache_dir, offline=True)
    async with mirror_service(offline, hub) as parts:
        service = parts.service
        hit = await service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
        assert hit.outcome is Outcome.HIT  # the ref as last known, offline
        source = await service.open_blob(hit, ANON, 0, len(WEIGHTS) - 1)
        assert isinstance(source, Cached) and Path(source.path).read_bytes() == WEIGHTS
        with pytest.raises(OfflineMiss):
            await service.resolve_file(target(PUBLIC, "config.json"), ANON)  # never resolved
        resolved = await service.resolve_file(target(GATED, "config.json"), reader)  # confirmed within the grace
        assert await fetched(parts, resolved, reader) == CONFIG
        with pytest.raises(AccessDenied) as anonymous:
            await service.resolve_file(target(GATED, "config.json"), ANON)
        assert anonymous.value.status == 401
        with pytest.raises(AccessDenied) as stranger:
            await service.resolve_file(target(GATED, "config.json"), Caller(STRANGER, own_token=True))
        assert stranger.value.status == 403
        with pytest.raises(OfflineMiss):
            await service.api(hf.ApiTarget(GATED, "tree", "main", ""), "GET", GATED.api_path("/tree/main"), [],
                              None, reader)
    assert sum(hub.calls.values()) == asked  # offline: upstream never asked


# --- where the bytes come from ----------------------------------------------------------------------------------------


async def test_concurrent_readers_share_one_fill(parts: Parts, hub: FakeUpstream) -> None:
    """Three readers of a file not yet stored, while its only download is held half-way: they read the one fill's
    bytes; upstream is asked once; the next reader gets the stored blob."""
    half = len(WEIGHTS) // 2
    hub.body = lambda opened, data: FakeBody(data, hold_at=half)
    service = parts.service
    resolved = await service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
    sources = [await service.open_blob(resolved, ANON, 0, len(WEIGHTS) - 1) for _ in range(3)]
    assert all(isinstance(s, Filling) for s in sources)
    assert len({id(s.fill) for s in sources}) == 1  # type: ignore[union-attr]
    assert sources[0].outcome is Outcome.MISS
    readers = [asyncio.ensure_future(read_all(parts, s)) for s in sources]
    await asyncio.wait_for(written(sources[0].fill, half), 10)  # type: ignore[union-attr]  # half-way ...
    assert await asyncio.to_thread(hub.bodies[0].held.wait, 10)  # ... and held there: the next read waits
    hub.bodies[0].release()
    assert await asyncio.gather(*readers) == [WEIGHTS] * 3
    assert len(hub.opened) == 1
    after = await service.open_blob(resolved, ANON, 0, len(WEIGHTS) - 1)
    assert isinstance(after, Cached) and after.outcome is Outcome.HIT


async def test_a_drop_mid_way_resumes_from_the_byte_reached(parts: Parts, hub: FakeUpstream) -> None:
    drops = iter([100 * 1024])
    hub.body = lambda opened, data: FakeBody(data, drop_after=next(drops, None))
    resolved = await parts.service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
    assert await fetched(parts, resolved) == WEIGHTS
    assert [(o.start, o.end) for o in hub.opened] == [(0, None), (100 * 1024, None)]
    assert parts.store.cached_path(resolved.entry.etag) is not None


async def test_bytes_that_do_not_match_the_etag_are_never_published(parts: Parts, hub: FakeUpstream) -> None:
    service = parts.service
    resolved = await service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
    hub.corrupt = True
    with pytest.raises(IntegrityError):
        await fetched(parts, resolved)
    assert parts.store.cached_path(resolved.entry.etag) is None
    assert not parts.store.partial_path(resolved.entry.etag).exists()
    hub.corrupt = False  # upstream heals: the next reader fills it again, from the start
    assert await fetched(parts, resolved) == WEIGHTS
    assert hub.opened[-1] == Opened("model.safetensors", resolved.entry.commit, 0, None, None)
    assert parts.store.cached_path(resolved.entry.etag) is not None


async def test_a_stored_blob_is_served_without_asking_upstream(parts: Parts, hub: FakeUpstream) -> None:
    resolved = await parts.service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert await fetched(parts, resolved) == CONFIG
    calls = sum(hub.calls.values())
    hub.down = True
    again = await parts.service.resolve_file(target(PUBLIC, "config.json"), ANON)
    source = await parts.service.open_blob(again, ANON, 0, len(CONFIG) - 1)
    assert isinstance(source, Cached) and source.outcome is Outcome.HIT
    assert Path(source.path).read_bytes() == CONFIG
    assert sum(hub.calls.values()) == calls



async def test_a_file_with_no_disk_room_is_relayed_without_being_stored(hub: FakeUpstream) -> None:
    tight = settings_for(hub.settings.cache_dir, min_free_space=2**60)  # no disk leaves an exabyte free
    async with mirror_service(tight, hub) as parts:
        resolved = await parts.service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
        source = await parts.service.open_blob(resolved, ANON, 1000, 1999)
        assert isinstance(source, Relay) and source.outcome is Outcome.PASSTHROUGH
        async with parts.service.relay_file(source, chunk_size=256) as chunks:
            relayed = b"".join([chunk async for chunk in chunks])
        assert relayed == WEIGHTS[1000:2000]
        assert hub.count("open_file") == 0 and parts.store.cached_path(resolved.entry.etag) is None


async def test_a_range_relayed_from_a_peer_falls_back_to_upstream_when_the_peer_does_not_open_it(
        parts: Parts, hub: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Relay naming a peer (another node fills the file) reads the Range from that node's fill; a peer that no longer
    answers it (its fill ended meanwhile) leaves the Range to upstream, never to a failed read."""
    resolved = await parts.service.resolve_file(target(PUBLIC, "model.safetensors"), ANON)
    etag = resolved.entry.etag
    asked: list[tuple[str, str, int, int | None]] = []
    peer_up = True

    @asynccontextmanager
    async def stream_peer(url: str, token: str, start: int, end: int | None = None) -> AsyncIterator[FakeBody]:
        asked.append((url, token, start, end))
        if not peer_up:
            raise UpstreamUnavailable("peer answered 404")
        yield FakeBody(WEIGHTS[start:(end + 1 if end is not None else None)])

    monkeypatch.setattr(hub, "stream_peer", stream_peer, raising=False)
    relay = Relay(resolved, None, 1000, 50_999, Outcome.MISS, peer=PeerAddress("http://node-a:8090", "tok"))
    async with parts.service.relay_file(relay, chunk_size=4096) as chunks:
        assert b"".join([chunk async for chunk in chunks]) == WEIGHTS[1000:51_000]
    assert hub.count("stream_file") == 0 and len(asked) == 1
    url, token, start, end = asked[0]
    assert url.startswith(f"http://node-a:8090/_mirror/fills/{etag}?") and (token, start, end) == ("tok", 1000, 50_999)
    assert parts.metrics.registry.get_sample_value("hf_mirror_peer_bytes_total") == 50_000

    peer_up = False
    async with parts.service.relay_file(relay, chunk_size=4096) as chunks:
        assert b"".join([chunk async for chunk in chunks]) == WEIGHTS[1000:51_000]
    assert hub.count("stream_file") == 1 and len(asked) == 2


async def test_a_revision_asked_over_the_api_names_the_commit_of_the_branch(parts: Parts, hub: FakeUpstream) -> None:
    revision = hf.ApiTarget(PUBLIC, "revision", "main", "")
    answer = await parts.service.api(revision, "GET", PUBLIC.api_path("/revision/main"), [], None, ANON)
    assert answer.outcome is Outcome.MISS and answer.status == 200
    assert parts.service.commit_of(PUBLIC, "main") == hub.repos[PUBLIC].refs["main"]
    resolved = await parts.service.resolve_file(target(PUBLIC, "config.json"), ANON)
    assert resolved.entry.commit == hub.repos[PUBLIC].refs["main"] and hub.count("head_file") == 1

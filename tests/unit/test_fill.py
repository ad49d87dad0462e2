"""The fill engine in-process, against a fake upstream at the client's own interface (``open_file`` → a body a thread
reads with ``read_some``/``abort``) and the local store on a temporary directory: resume after a drop (one stream and
windows), an expired signed URL resolved again, an integrity failure, cancellation. No sockets, no timing asserts:
waits are on the fill's own events."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from mirror import hf
from mirror.errors import IntegrityError, NoDiskRoom, UpstreamUnavailable
from mirror.fill import Fill, FillManager, FillSpec
from mirror.fill import resume as resume_module
from mirror.fill.copy import held_windows
from mirror.layout import CacheLayout
from mirror.metrics import Metrics
from mirror.storage.local import LocalBlobStore
from mirror.upstream import FileBody, RangeIgnored, UrlExpired

KIB = 1024
PIECE = 16 * KIB  # the most a fake body gives per read


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tries follow each other at once: the backoff's length is policy, not what these tests check."""
    monkeypatch.setattr(resume_module, "backoff", lambda failures: 0.0)


def content_of(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


# --- the fake upstream ------------------------------------------------------------------------------------------------


class FakeBody:
    """A body of ``data`` read by the fill's thread; it may drop after ``drop_after`` bytes or stall there until the
    fill aborts it."""

    def __init__(self, data: bytes, *, drop_after: int | None = None, stall_after: int | None = None,
                 crawl: float = 0.0) -> None:
        self.data = data
        self.crawl = crawl  # seconds each read waits (a connection that crawls), cut short by abort
        self.position = 0
        self.drop_after = drop_after
        self.stall_after = stall_after
        self.stalled = threading.Event()
        self.aborted = threading.Event()

    def read_some(self, size: int) -> bytes:
        if self.drop_after is not None and self.position >= self.drop_after:
            raise UpstreamUnavailable("upstream read failed: connection reset (fake)")
        if self.stall_after is not None and self.position >= self.stall_after:
            self.stalled.set()
            self.aborted.wait(30)  # a blocked socket read, until abort shuts the socket
            raise UpstreamUnavailable("upstream read failed: aborted (fake)")
        if self.crawl and self.aborted.wait(self.crawl):
            raise UpstreamUnavailable("upstream read failed: aborted (fake)")
        limit = min(size, PIECE if not self.crawl else KIB)
        for mark in (self.drop_after, self.stall_after):
            if mark is not None:
                limit = min(limit, mark - self.position)
        data = self.data[self.position:self.position + limit]
        self.position += len(data)
        return data

    def abort(self) -> None:
        self.aborted.set()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Request:
    start: int
    end: int | None
    cdn_url: str | None


# What a fake upstream answers a request with: a body, the signed URL it came from, or an exception to raise.
Answer = Callable[[Request, bytes], "tuple[FakeBody, str | None] | BaseException"]


def whole(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
    return FakeBody(data), None


class FakeUpstream:
    """What the fill calls of :class:`~mirror.upstream.UpstreamClient`: ``settings`` and ``open_file``."""

    linger = 2.0  # sparse_linger (the short_linger fixture shortens it)

    def __init__(self, content: bytes, answer: Answer = whole, *, windows: int = 0, connections: int = 3,
                 hedges: int = 0, hedge_after: float = 0.2, sparse: int = 0, read_ahead: int = 0,
                 complete_share: float = 1.0) -> None:
        self.content = content
        self.answer = answer
        self.settings = SimpleNamespace(parallel_fill_threshold=1 if windows else 0, fill_connections=connections,
                                        fill_window=windows or 1, fill_hedges=hedges, fill_hedge_after=hedge_after,
                                        sparse_fill_threshold=sparse, sparse_read_ahead=read_ahead,
                                        sparse_complete_share=complete_share, sparse_linger=self.linger)
        self.requests: list[Request] = []
        self.bodies: list[FakeBody] = []

    @asynccontextmanager
    async def open_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int = 0,
                        cdn_url: str | None = None, end: int | None = None) -> AsyncIterator[FileBody]:
        request = Request(start, end, cdn_url)
        self.requests.append(request)
        answer = self.answer(request, self.content[start:end])
        if isinstance(answer, BaseException):
            raise answer
        body, served_from = answer
        self.bodies.append(body)
        yield FileBody(body, served_from, None)  # type: ignore[arg-type]


# --- helpers ----------------------------------------------------------------------------------------------------------


def spec_of(content: bytes, *, etag: str | None = None, cdn_url: str | None = None) -> FillSpec:
    return FillSpec(repo=hf.RepoRef(hf.RepoType.MODEL, "acme/tiny"), commit="c" * 40, path="model.bin",
                    etag=etag or hashlib.sha256(content).hexdigest(), size=len(content), cdn_url=cdn_url)


@asynccontextmanager
async def fill_manager(tmp_path: Path, upstream: FakeUpstream, metrics: Metrics | None = None,
                       chunk_size: int = PIECE) -> AsyncIterator[FillManager]:
    manager = FillManager(LocalBlobStore(CacheLayout(tmp_path)), upstream, metrics or Metrics(),  # type: ignore[arg-type]
                          chunk_size=chunk_size, lease_ttl=30, cancel_on_disconnect=False)
    try:
        yield manager
    finally:
        await manager.aclose(grace=0)


async def written_at_least(fill: Fill, offset: int) -> None:
    async def wait() -> None:
        while fill.written < offset and not fill.finished:
            await fill.changed()

    await asyncio.wait_for(wait(), 10)


# --- one stream -------------------------------------------------------------------------------------------------------


async def test_one_stream_resumes_after_a_drop_from_the_byte_it_reached(tmp_path: Path) -> None:
    content = content_of(300 * KIB)
    drops = iter([100 * KIB])

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
        return FakeBody(data, drop_after=next(drops, None)), None

    upstream = FakeUpstream(content, answer)
    metrics = Metrics()
    async with fill_manager(tmp_path, upstream, metrics) as manager:
        path = await manager.fetch(spec_of(content))
    assert path.read_bytes() == content
    assert upstream.requests == [Request(0, None, None), Request(100 * KIB, None, None)]
    assert metrics.registry.get_sample_value("hf_mirror_upstream_bytes_total") == len(content)  # no byte twice


async def test_an_expired_signed_url_is_resolved_again_and_the_fresh_one_reused(tmp_path: Path) -> None:
    content = content_of(200 * KIB)
    old, new = "https://cdn.example/old?sig=1", "https://cdn.example/new?sig=2"
    drops = iter([50 * KIB])

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None] | BaseException:
        if request.cdn_url == old:
            return UrlExpired("signed URL refused with 403")
        return FakeBody(data, drop_after=next(drops, None)), new  # the Hub redirects to a fresh URL

    upstream = FakeUpstream(content, answer)
    async with fill_manager(tmp_path, upstream) as manager:
        path = await manager.fetch(spec_of(content, cdn_url=old))
    assert path.read_bytes() == content
    assert upstream.requests == [Request(0, None, old), Request(0, None, None), Request(50 * KIB, None, new)]


async def test_a_stream_that_never_progresses_is_given_up(tmp_path: Path) -> None:
    content = content_of(10 * KIB)
    upstream = FakeUpstream(content, lambda request, data: UpstreamUnavailable("Upstream answered 503: busy"))
    async with fill_manager(tmp_path, upstream) as manager:
        with pytest.raises(UpstreamUnavailable, match="giving up on model.bin after 6 failed tries"):
            await manager.fetch(spec_of(content))
    assert len(upstream.requests) == resume_module.MAX_ATTEMPTS_WITHOUT_PROGRESS


async def test_bytes_that_do_not_match_the_etag_drop_the_partial_file(tmp_path: Path) -> None:
    content = content_of(64 * KIB)
    spec = spec_of(content, etag=hashlib.sha256(b"something else").hexdigest())
    metrics = Metrics()
    async with fill_manager(tmp_path, FakeUpstream(content), metrics) as manager:
        with pytest.raises(IntegrityError, match="does not match"):
            await manager.fetch(spec)
        partial = manager.store.partial_path(spec.etag)
    assert not partial.exists() and not CacheLayout.prefix_note(partial).exists()
    assert manager.store.cached_path(spec.etag) is None
    assert metrics.registry.get_sample_value("hf_mirror_integrity_failures_total") == 1


async def test_an_upstream_sending_more_than_the_file_fails_the_fill(tmp_path: Path) -> None:
    content = content_of(40 * KIB)  # the last read (8 KiB + 1 asked, to notice more) is not a whole piece
    upstream = FakeUpstream(content, lambda request, data: (FakeBody(data + b"extra"), None))
    async with fill_manager(tmp_path, upstream) as manager:
        with pytest.raises(IntegrityError, match="upstream sent more than 40960 bytes"):
            await manager.fetch(spec_of(content))


async def test_a_cancelled_fill_leaves_a_partial_file_the_next_fill_resumes(tmp_path: Path) -> None:
    content = content_of(256 * KIB)
    stall = 96 * KIB
    upstream = FakeUpstream(content, lambda request, data: (FakeBody(data, stall_after=stall), None))
    spec = spec_of(content)
    async with fill_manager(tmp_path, upstream) as manager:
        fill = await manager.start(spec)
        assert fill is not None and fill.task is not None
        await written_at_least(fill, stall)
        fill.task.cancel()
        await asyncio.wait([fill.task])
        body = upstream.bodies[0]
        assert body.aborted.is_set()  # the copy thread was woken, not abandoned
        assert isinstance(fill.error, UpstreamUnavailable)
        assert manager.store.partial_path(spec.etag).stat().st_size == stall

        upstream.answer = whole
        path = await manager.fetch(spec)
    assert path.read_bytes() == content
    assert upstream.requests[-1] == Request(stall, None, None)


async def test_the_manager_closes_its_threads(tmp_path: Path) -> None:
    async with fill_manager(tmp_path, FakeUpstream(b"")) as manager:
        pass
    with pytest.raises(RuntimeError):
        manager.threads.streams.submit(print)


# --- windows ----------------------------------------------------------------------------------------------------------


async def test_windows_each_resume_after_a_drop_and_fetch_each_byte_once(tmp_path: Path) -> None:
    window = 64 * KIB
    content = content_of(5 * window + 3 * KIB)
    dropped: list[int] = []

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
        assert request.end is not None  # every window asks its own bytes
        if request.start == window and not dropped:  # the second window drops once, 10 KiB in
            dropped.append(request.start)
            return FakeBody(data, drop_after=10 * KIB), None
        return FakeBody(data), None

    upstream = FakeUpstream(content, answer, windows=window)
    metrics = Metrics()
    async with fill_manager(tmp_path, upstream, metrics) as manager:
        path = await manager.fetch(spec_of(content))
    assert path.read_bytes() == content
    assert Request(window + 10 * KIB, 2 * window, None) in upstream.requests
    assert len(upstream.requests) == 6 + 1  # six windows, one resumed
    assert metrics.registry.get_sample_value("hf_mirror_upstream_bytes_total") == len(content)
    assert not CacheLayout.prefix_note(manager.store.partial_path(spec_of(content).etag)).exists()


async def test_windows_share_a_signed_url_resolved_again(tmp_path: Path) -> None:
    window = 64 * KIB
    content = content_of(3 * window)
    old, new = "https://cdn.example/old", "https://cdn.example/new"

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None] | BaseException:
        if request.cdn_url == old:
            return UrlExpired("signed URL refused with 410")
        return FakeBody(data), new

    upstream = FakeUpstream(content, answer, windows=window, connections=2)
    async with fill_manager(tmp_path, upstream) as manager:
        path = await manager.fetch(spec_of(content, cdn_url=old))
    assert path.read_bytes() == content
    asked = [r.cdn_url for r in upstream.requests]
    assert asked[0] == old and asked.count(old) <= 2  # each of the two workers meets the expired URL once at most
    assert 1 <= asked.count(None) <= 2  # resolved again (by the second worker too, if it had asked the old URL)
    assert asked[-1] == new  # the third window, taken after one of the first two ended, uses the fresh URL


async def test_an_upstream_ignoring_ranges_gets_one_stream_instead(tmp_path: Path) -> None:
    window = 64 * KIB
    content = content_of(4 * window)

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None] | BaseException:
        if request.end is not None:
            return RangeIgnored("Upstream ignored Range for 'model.bin' (status 200)")
        return FakeBody(data), None

    upstream = FakeUpstream(content, answer, windows=window)
    async with fill_manager(tmp_path, upstream) as manager:
        path = await manager.fetch(spec_of(content))
    assert path.read_bytes() == content
    assert upstream.requests[-1] == Request(0, None, None)


# --- hedged windows ---------------------------------------------------------------------------------------------------


def hedged(metrics: Metrics) -> tuple[float | None, float | None]:
    return (metrics.registry.get_sample_value("hf_mirror_fill_hedges_total"),
            metrics.registry.get_sample_value("hf_mirror_fill_hedge_bytes_total"))


async def test_a_window_that_stops_is_hedged_from_where_it_stands(tmp_path: Path) -> None:
    """The second window's first connection stops after 10 KiB (a read that blocks until aborted): the watchdog
    asks its rest again on a fresh connection, the hedge's first bytes win, the stopped one is cancelled (its read
    aborted), and the file is whole."""
    window = 64 * KIB
    content = content_of(4 * window)
    stalled: list[FakeBody] = []

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
        if request.start == window and not stalled:
            stalled.append(FakeBody(data, stall_after=10 * KIB))
            return stalled[0], None
        return FakeBody(data), None

    upstream = FakeUpstream(content, answer, windows=window, connections=4, hedges=2)
    metrics = Metrics()
    async with fill_manager(tmp_path, upstream, metrics) as manager:
        path = await manager.fetch(spec_of(content))
    assert path.read_bytes() == content
    assert stalled[0].aborted.is_set()  # the laggard was cancelled, its socket read cut
    hedge = [r for r in upstream.requests if window < r.start <= window + 10 * KIB or r.start == window][1:]
    assert len(hedge) == 1 and hedge[0].end == 2 * window  # one hedge, from where the window stood to its end
    count, hedge_bytes = hedged(metrics)
    assert count == 1 and hedge_bytes == 2 * window - hedge[0].start
    total = metrics.registry.get_sample_value("hf_mirror_upstream_bytes_total")
    assert total is not None and total <= len(content) + hedge_bytes


async def test_a_window_that_crawls_is_hedged_and_a_reader_there_gets_its_bytes(tmp_path: Path) -> None:
    """The first window crawls (1 KiB per 50 ms) while the others run at full speed: it is hedged on its rate
    against theirs, and a reader waiting in it is answered by the hedge."""
    window = 256 * KIB
    content = content_of(4 * window)
    crawling: list[FakeBody] = []

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
        if request.start == 0 and not crawling:
            crawling.append(FakeBody(data, crawl=0.05))
            return crawling[0], None
        return FakeBody(data), None

    upstream = FakeUpstream(content, answer, windows=window, connections=4, hedges=1)
    metrics = Metrics()
    async with fill_manager(tmp_path, upstream, metrics) as manager:
        spec = spec_of(content)
        fill = await manager.start(spec)
        assert fill is not None
        await asyncio.wait_for(written_at_least_end(fill, window), 20)  # event-based: the hedge's bytes arrive
        path = await manager.fetch(spec)
    assert path.read_bytes() == content
    assert crawling[0].aborted.is_set()
    assert hedged(metrics)[0] == 1
    assert [r.start for r in upstream.requests].count(0) == 1  # the hedge asked from where the window stood
    assert any(0 < r.start < window and r.end == window for r in upstream.requests)


async def written_at_least_end(fill: Fill, offset: int) -> None:
    while fill.written < offset and not fill.finished:
        await fill.changed()


async def test_no_hedge_without_a_budget(tmp_path: Path) -> None:
    """``fill_hedges`` 0: a crawling window is left to finish on its own connection."""
    window = 64 * KIB
    content = content_of(2 * window)

    def answer(request: Request, data: bytes) -> tuple[FakeBody, str | None]:
        return FakeBody(data, crawl=0.002 if request.start == 0 else 0.0), None

    upstream = FakeUpstream(content, answer, windows=window, connections=2, hedges=0)
    metrics = Metrics()
    async with fill_manager(tmp_path, upstream, metrics) as manager:
        path = await manager.fetch(spec_of(content))
    assert path.read_bytes() == content
    assert len(upstream.requests) == 2 and hedged(metrics) == (0.0, 0.0)


# --- sparse fills: ranged reads fetch their windows -------------------------------------------------------------------


async def read_range(manager: FillManager, fill: Fill, start: int, end: int) -> bytes:
    """A reader of bytes ``start..end`` (inclusive) of a fill in progress, as the routes read them."""
    out = bytearray()
    async with manager.reading(fill) as fd:
        position = start
        while position <= end:
            readable = await FillManager.readable(fill, position)
            size = min(readable, end + 1) - position
            out += os.pread(fd, size, position)
            position += size
    return bytes(out)


@pytest.fixture
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeUpstream, "linger", 0.1)


async def test_ranged_reads_fetch_their_windows_and_a_full_download_the_rest(tmp_path: Path,
                                                                               short_linger: None) -> None:
    """A Range of a large file fetches its window and the read-ahead (one window), nothing else; the fill pauses
    once its reader left, its windows kept (the map); a second read of them asks upstream nothing, from a fresh
    manager too (another process); a full download then fetches only the rest, and the blob is verified whole."""
    window = 64 * KIB
    content = content_of(8 * window)
    spec = spec_of(content)
    upstream = FakeUpstream(content, windows=window, connections=3, sparse=1, read_ahead=window)
    start, end = 3 * window + 100, 3 * window + 5000
    async with fill_manager(tmp_path, upstream) as manager:
        fill = await manager.start(spec, reading=(start, end))
        assert fill is not None and fill.sparse
        assert await read_range(manager, fill, start, end) == content[start:end + 1]
        assert fill.task is not None
        await asyncio.wait_for(fill.task, 10)  # paused: no reader, nothing asked
        assert fill.committed is None
    assert sorted((r.start, r.end) for r in upstream.requests) == [(3 * window, 4 * window), (4 * window, 5 * window)]
    partial = LocalBlobStore(CacheLayout(tmp_path)).partial_path(spec.etag)
    assert CacheLayout.windows_map(partial).exists()

    upstream.requests.clear()
    async with fill_manager(tmp_path, upstream) as manager:  # another process, the same cache
        fill = await manager.start(spec, reading=(start, end))
        assert fill is not None
        assert await read_range(manager, fill, start, 5 * window - 1) == content[start:5 * window]
        assert fill.holds(start, end)
        assert upstream.requests == []  # a hit: nothing from upstream
        path = await manager.fetch(spec)  # a full download: the rest
    assert path.read_bytes() == content
    asked = sorted((r.start, r.end) for r in upstream.requests)
    assert asked == [(i * window, (i + 1) * window) for i in (0, 1, 2, 5, 6, 7)]
    assert not CacheLayout.windows_map(partial).exists() and not CacheLayout.prefix_note(partial).exists()


async def test_a_sparse_fill_completes_once_its_share_is_held(tmp_path: Path, short_linger: None) -> None:
    """The completion policy: once ``sparse_complete_share`` of the file is held, the rest is fetched too."""
    window = 64 * KIB
    content = content_of(4 * window)
    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=0, complete_share=0.5)
    async with fill_manager(tmp_path, upstream) as manager:
        spec = spec_of(content)
        fill = await manager.start(spec, reading=(window, 3 * window - 1))
        assert fill is not None
        assert await read_range(manager, fill, window, 3 * window - 1) == content[window:3 * window]
        assert fill.task is not None
        await asyncio.wait_for(fill.task, 10)
        assert fill.committed is not None and fill.committed.read_bytes() == content
    assert sorted(r.start for r in upstream.requests) == [0, window, 2 * window, 3 * window]


async def test_the_share_policy_reserves_room_for_the_rest_or_keeps_the_file_sparse(
        tmp_path: Path, short_linger: None, caplog: pytest.LogCaptureFixture) -> None:
    """Completing a sparse file by its share policy first asks the quota for room for the rest of the file (as a new
    fill does); refused, the file stays sparse (nothing more fetched, a clear log line), its windows kept."""
    window = 64 * KIB
    content = content_of(4 * window)
    asked: list[tuple[int, int]] = []

    async def no_room(size: int, reserved: int) -> bool:
        asked.append((size, reserved))
        return False

    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=0, complete_share=0.5)
    async with fill_manager(tmp_path / "refused", upstream) as manager:
        manager.make_room = no_room
        spec = spec_of(content)
        fill = await manager.start(spec, reading=(window, 3 * window - 1))
        assert fill is not None
        assert await read_range(manager, fill, window, 3 * window - 1) == content[window:3 * window]
        assert fill.task is not None
        await asyncio.wait_for(fill.task, 10)  # paused: never completed
        assert fill.committed is None
    assert asked == [(2 * window, 0)]  # the rest of the file: two windows of four
    assert sorted(r.start for r in upstream.requests) == [window, 2 * window]
    assert "no disk room to complete sparse file model.bin" in caplog.text

    granted: list[int] = []

    async def room(size: int, reserved: int) -> bool:
        granted.append(size)
        return True

    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=0, complete_share=0.5)
    async with fill_manager(tmp_path / "granted", upstream) as manager:
        manager.make_room = room
        fill = await manager.start(spec_of(content), reading=(window, 3 * window - 1))
        assert fill is not None
        assert await read_range(manager, fill, window, 3 * window - 1) == content[window:3 * window]
        assert fill.task is not None
        await asyncio.wait_for(fill.task, 10)
        assert fill.committed is not None and fill.committed.read_bytes() == content
    assert granted == [2 * window]


async def test_the_sync_completing_a_sparse_file_reserves_the_rest_or_refuses(tmp_path: Path,
                                                                             short_linger: None) -> None:
    """The sync (or a warm) completing the windows a sparse fill left asks room for the rest of the file first; with
    none, it is refused (NoDiskRoom), the windows kept; with room it fetches only the rest."""
    window = 64 * KIB
    content = content_of(4 * window)
    spec = spec_of(content)
    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=0)
    asked: list[int] = []
    answer = False

    async def room(size: int, reserved: int) -> bool:
        asked.append(size)
        return answer

    async with fill_manager(tmp_path, upstream) as manager:
        manager.make_room = room
        fill = await manager.start(spec, reading=(window, window + 10))
        assert fill is not None and fill.task is not None
        assert await read_range(manager, fill, window, window + 10) == content[window:window + 11]
        await asyncio.wait_for(fill.task, 10)  # paused, one window held
        with pytest.raises(NoDiskRoom):
            await manager.fetch(spec)
        assert asked == [3 * window]
        partial = LocalBlobStore(CacheLayout(tmp_path)).partial_path(spec.etag)
        assert held_windows(partial) == [(window, 2 * window)]
        answer = True
        path = await manager.fetch(spec)
        assert path.read_bytes() == content
    assert asked == [3 * window, 3 * window]
    assert sorted(r.start for r in upstream.requests) == [0, window, 2 * window, 3 * window]


async def test_a_small_file_or_a_whole_read_is_not_sparse(tmp_path: Path) -> None:
    window = 64 * KIB
    content = content_of(2 * window)
    upstream = FakeUpstream(content, windows=window, sparse=4 * window)
    async with fill_manager(tmp_path, upstream) as manager:
        fill = await manager.start(spec_of(content), reading=(10, 20))
        assert fill is not None and not fill.sparse
        await manager.fetch(spec_of(content))


async def test_a_sparse_range_at_the_end_gets_its_last_byte_and_a_full_download_waits(tmp_path: Path,
                                                                                      short_linger: None) -> None:
    """A Range reaching the file's end (a parquet footer, the last xorb) is served as its window lands, last byte
    included, while the file is sparse (nothing else asked upstream); once the whole file is wanted the last byte
    waits for the verified blob again. The Range's windows and the read-ahead past it are asked at once."""
    window = 64 * KIB
    content = content_of(8 * window)
    spec = spec_of(content)
    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=window)
    async with fill_manager(tmp_path, upstream) as manager:
        tail = len(content) - 1000
        fill = await manager.start(spec, reading=(tail, len(content) - 1))
        assert fill is not None and fill.sparse
        assert await read_range(manager, fill, tail, len(content) - 1) == content[tail:]
        assert fill.holds(tail, len(content) - 1) and not fill.verified
        assert [(r.start, r.end) for r in upstream.requests] == [(7 * window, 8 * window)]
        middle = await manager.start(spec, reading=(2 * window, 3 * window + 10))  # joins: two windows and one ahead
        assert middle is fill
        await read_range(manager, fill, 2 * window, 3 * window + 10)
        while len(upstream.requests) < 4:  # the read-ahead's window follows (two connections)
            await asyncio.wait_for(fill.changed(), 10)
        assert sorted(r.start for r in upstream.requests) == [2 * window, 3 * window, 4 * window, 7 * window]
        fill.wants_whole()  # a full download joins: the last byte is held until the blob is verified
        if not fill.verified:
            assert fill.readable_at(len(content) - 1) <= len(content) - 1
        path = await manager.fetch(spec)
    assert path.read_bytes() == content


async def test_another_process_reads_the_windows_a_sparse_fill_holds(tmp_path: Path, short_linger: None) -> None:
    """Two processes of one node (two managers, one cache): while one leads a sparse fill, a Range on the windows it
    holds is a hit in the other (read from the shared partial file by its windows map), nothing asked upstream."""
    window = 64 * KIB
    content = content_of(8 * window)
    spec = spec_of(content)
    upstream = FakeUpstream(content, windows=window, connections=2, sparse=1, read_ahead=0)
    start, end = 5 * window + 10, 6 * window + 20
    async with fill_manager(tmp_path, upstream) as leader, fill_manager(tmp_path, upstream) as other:
        fill = await leader.start(spec, reading=(start, end))
        assert fill is not None
        assert await read_range(leader, fill, start, end) == content[start:end + 1]
        async with leader.reading(fill):  # a reader stays: the leader keeps its lease, its fill does not pause
            partial = LocalBlobStore(CacheLayout(tmp_path)).partial_path(spec.etag)
            while sum(b - a for a, b in held_windows(partial)) < 2 * window:  # the map lists both (within 0.2 s)
                await asyncio.sleep(0.02)
            asked = len(upstream.requests)
            followed = await other.start(spec, reading=(start, end))
            assert followed is not None and followed is not fill and followed.holds(start, end)
            assert await read_range(other, followed, start, end) == content[start:end + 1]
            assert len(upstream.requests) == asked == 2
            assert not followed.holds(0, 10)  # a window the map does not list: not readable here

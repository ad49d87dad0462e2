"""A parallel fill: a large file fetched upstream as several concurrent ``Range`` windows.

One TCP connection over a long, lossy path carries a fraction of the link; ``fill_connections`` of them carry
about that many times more. The file is cut into windows of ``fill_window`` bytes, taken in order by
``fill_connections`` workers; each window is written at its offset in the partial file (pwrite) and resumed on
its own after a drop (from the byte it reached) or an expired signed URL (the file is resolved again for a fresh
CDN URL, shared by every window). Each upstream byte is fetched once.

Readers are told how far the bytes are contiguous on disk (``fill.advance``) as soon as a window's bytes join the
prefix, and may read a window ahead of the prefix as its bytes land (``fill.run_end``); a reader waiting for a window
not yet begun has it fetched next (``fill.want``), so a Range far ahead (a Xet client's parallel ranges) waits
seconds, not for the whole prefix, and no byte is fetched twice. A hasher task hashes the prefix in order from the
page cache. The rules of the single stream hold: the last byte is readable only once the whole file is verified, and
nothing is committed unverified (:mod:`download`). Each window is fetched by the one resume loop
(:mod:`mirror.fill.resume`) and copied by the one body copy (:mod:`mirror.fill.copy`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mirror.config import Settings
from mirror.errors import FillPaused, UpstreamUnavailable
from mirror.fill.copy import Span, copy, read_windows, write_prefix, write_windows
from mirror.fill.resume import SignedUrl, fetch
from mirror.fill.state import Fill
from mirror.fill.threads import FillThreads, in_thread, settle
from mirror.integrity import BlobHasher
from mirror.metrics import Metrics
from mirror.upstream import FileBody, RangeIgnored, UpstreamClient

_REPORT_BYTES = 4 * 1024 * 1024  # a window's bytes reach readers at least every this many bytes (or copy's 10 ms)
_PREFIX_FILE_SECONDS = 0.05  # the prefix file (cross-process followers, resume) is rewritten at most this often
_WATCH_SECONDS = 0.2  # how often the windows in flight are sampled for a laggard
_HEDGE_SLOWER = 8  # a window this many times slower than the median of the others is asked again
_FINISHED_RATES = 8  # the rates of the last windows finished, compared with too (a tail window has no peers left)
_WINDOWS_FILE_SECONDS = 0.2  # the windows map (sparse partial files) is rewritten at most this often
_SPARSE_LINGER = 2.0  # a sparse fill with no reader and nothing asked pauses after this many seconds


log = logging.getLogger("hf_mirror.fill")


def in_windows(settings: Settings, size: int) -> bool:
    """Whether a file of ``size`` bytes is fetched in windows (``parallel_fill_threshold``, ``fill_connections``)."""
    threshold = settings.parallel_fill_threshold
    return bool(threshold and size >= threshold and settings.fill_connections > 1)


@dataclass
class Window(Span):
    started: bool = False  # a worker has taken it
    began: float = 0.0  # when a worker took it (monotonic)
    lagging: asyncio.Event = field(default_factory=asyncio.Event)  # the watchdog asks for a hedge
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (when, done) of the last seconds


class _Both:
    """Counts into two counters: the upstream bytes, and the share of them a hedge fetched."""

    def __init__(self, *counters: object) -> None:
        self.counters = counters

    def inc(self, amount: float = 1) -> None:
        for counter in self.counters:
            counter.inc(amount)  # type: ignore[attr-defined]


class WindowedFill:
    """The parallel download of ``fill`` from byte ``offset`` (the bytes before are on disk and hashed)."""

    def __init__(self, fill: Fill, fd: int, hasher: BlobHasher, offset: int, upstream: UpstreamClient,
                 metrics: Metrics, threads: FillThreads, *, connections: int, window: int, chunk_size: int,
                 url: SignedUrl, hedges: int = 0, hedge_after: float = 2.0, read_ahead: int = 0,
                 complete_share: float = 1.0, linger: float = _SPARSE_LINGER,
                 room: Callable[[int], Awaitable[bool]] | None = None) -> None:
        self.fill, self.fd, self.hasher, self.upstream, self.metrics = fill, fd, hasher, upstream, metrics
        self.threads = threads
        self.size = fill.spec.size
        self.connections = connections
        self.chunk_size = chunk_size
        self.url = url  # the newest signed URL any window got, shared with the single stream after a fallback
        # Windows are aligned on multiples of ``window`` (a sparse file's held windows keep their places); the first
        # one begins where the prefix stands.
        self.base, self.window_size = offset - offset % window, window
        self.windows = [Window(s, min(s + window, self.size), max(s, offset))
                        for s in range(self.base, self.size, window)]
        self.read_ahead = read_ahead  # sparse: bytes past a wanted position fetched with it
        self.complete_share = complete_share  # sparse: the share of the file held that has the rest fetched too
        self.linger = linger  # sparse: seconds with no reader and nothing asked before the fill pauses
        # Sparse: reserves disk for the rest of the file before the share policy completes it (the quota's
        # make_room, as a new fill's); False: no room, the file keeps its windows. None: no quota to ask.
        self.room = room
        self._completing: asyncio.Task[None] | None = None  # the share policy's reservation, once begun
        self._windows_written_at = 0.0
        self._map_due: asyncio.TimerHandle | None = None  # a map write put off by the rate limit, still to come
        self._held_from_map(offset)
        self._wanted: set[int] = set()  # windows a reader waits for, taken before the next in order
        self.contiguous = offset  # bytes on disk without a hole
        self.hashed = offset  # bytes hashed, in order
        self._next = 0
        self._more = asyncio.Event()  # the contiguous prefix grew
        self._prefix_written_at = 0.0
        self.hedges_left = hedges  # hedged requests this fill may still make (fill_hedges)
        self.hedge_after = hedge_after  # seconds of a window's rate judged at once (fill_hedge_after)
        self._finished_rates: deque[float] = deque(maxlen=_FINISHED_RATES)
        self._asked = asyncio.Event()  # a window was wanted, or the whole file asked for (idle sparse workers wake)

    def _held_from_map(self, offset: int) -> None:
        """Take the windows a previous (sparse) fill left on disk, as its windows map lists them."""
        held = read_windows(self.fill.partial, self.fd)
        if held is None or held[0] != self.window_size:
            return
        for start, done in held[1]:
            if start % self.window_size == 0 and start >= self.base:
                window = self.windows[(start - self.base) // self.window_size]
                window.done = max(window.done, min(done, window.end))
                window.started = window.complete
        contiguous = self._contiguous_from(offset)
        self.contiguous = contiguous
        self.fill.advance(contiguous)

    def _contiguous_from(self, contiguous: int) -> int:
        for candidate in self.windows:
            if candidate.end <= contiguous:
                continue
            if candidate.start > contiguous:
                break
            contiguous = max(contiguous, candidate.done)
            if not candidate.complete:
                break
        return contiguous

    def held(self) -> int:
        return sum(w.done - w.start for w in self.windows)

    def _write_map(self, force: bool = False) -> None:
        """List the windows held in the map; at most every ``_WINDOWS_FILE_SECONDS``, a write put off coming at the
        end of that time (a window completed is listed within it: a kill -9 then loses no more)."""
        now = time.monotonic()
        if force or now - self._windows_written_at >= _WINDOWS_FILE_SECONDS:
            if self._map_due is not None:
                self._map_due.cancel()
                self._map_due = None
            self._windows_written_at = now
            write_windows(self.fill.partial, self.fd, self.window_size,
                          [(w.start, w.done) for w in self.windows if w.done > w.start])
        elif self._map_due is None:
            self._map_due = asyncio.get_running_loop().call_later(
                _WINDOWS_FILE_SECONDS - (now - self._windows_written_at), self._write_map, True)

    def complete_all(self) -> None:
        """The whole file is wanted now (a full download, the sync, or the share policy): fetch every window."""
        self.fill.sparse = False
        self._asked.set()

    async def run(self) -> None:
        """Fetch every window and hash the file; raises the first failure (every worker stopped by then)."""
        write_prefix(self.fill.partial, self.contiguous)
        fill = self.fill
        fill.run_end, fill.want, fill.windowed = self.run_end, self.want, True
        fill.complete_all = self.complete_all
        for first, last in fill.wanted:  # asked before the windows began
            self.want(first, last)
        fill.wanted.clear()
        loop = asyncio.get_running_loop()
        workers = [loop.create_task(self._worker()) for _ in range(min(self.connections, len(self.windows)))]
        hashing = loop.create_task(self._hash())
        linger = loop.create_task(self._linger())
        tasks = [*workers, hashing, linger]
        if self.hedges_left > 0:
            tasks.append(loop.create_task(self._watch()))
        try:
            waiting: set[asyncio.Task[None]] = {*workers, linger}
            while waiting & set(workers):
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            await hashing
        except RangeIgnored:
            fill.run_end, fill.want, fill.windowed = None, None, False  # one stream from the hashed prefix now
            raise
        finally:
            fill.complete_all = None
            if self._completing is not None:
                tasks.append(self._completing)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            if any(w.done > w.start for w in self.windows if w.start >= self.contiguous):
                self._write_map(force=True)  # windows beyond the prefix stay for the next fill
            if self._map_due is not None:  # never after the partial file became the blob
                self._map_due.cancel()
                self._map_due = None

    # --- windows -------------------------------------------------------------------------------------------------

    def run_end(self, position: int) -> int:
        """How far the bytes from ``position`` are on disk without a hole (``position`` itself: not yet)."""
        if position < self.base:
            return self.contiguous
        index = (position - self.base) // self.window_size
        end = position
        for window in self.windows[index:]:
            if window.done <= end:
                break
            end = window.done
            if not window.complete:
                break
        return max(end, position)

    def want(self, position: int, last: int) -> None:
        """A reader waits for ``position`` (and reads on to ``last``): the windows of those bytes, and of a sparse
        fill's read-ahead past them, go next if no worker has taken them."""
        if last >= self.base:
            last += self.read_ahead if self.fill.sparse else 0
            first = (max(position, self.base) - self.base) // self.window_size
            for index in range(first, min((last - self.base) // self.window_size + 1, len(self.windows))):
                if not self.windows[index].started:
                    self._wanted.add(index)
                    self._asked.set()

    def _take(self) -> Window | None:
        while self._wanted:
            index = min(self._wanted)
            self._wanted.discard(index)
            if not self.windows[index].started:
                return self._began(self.windows[index])
        while self._next < len(self.windows) and not self.fill.sparse:
            window = self.windows[self._next]
            self._next += 1
            if not window.started:
                return self._began(window)
        return None

    @staticmethod
    def _began(window: Window) -> Window:
        window.started, window.began = True, time.monotonic()
        return window

    async def _worker(self) -> None:
        while True:
            window = self._take()
            if window is None:
                if not self.fill.sparse:
                    return
                self._asked.clear()  # sparse: wait for a reader's window (or the whole file)
                await self._asked.wait()
                continue
            await self._fetch(window)
            self._finished_rates.append((window.end - window.start) / max(time.monotonic() - window.began, 1e-3))

    async def _linger(self) -> None:
        """A sparse fill with no reader, no window in flight and none asked for pauses (:class:`FillPaused`) after
        ``linger`` seconds (``sparse_linger``): its windows stay on disk, listed in the windows map. Until then it
        holds its lease, so the other nodes of a fleet relay their Ranges of the file from it."""
        idle_since: float | None = None
        while True:
            await asyncio.sleep(self.linger / 4)
            busy = any(w.started and not w.complete for w in self.windows) or self._wanted
            if not self.fill.sparse or self.fill.readers > 0 or busy:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self.linger:
                raise FillPaused(f"{self.fill.spec.path}: {self.held()} of {self.size} bytes held (sparse)")

    async def _fetch(self, window: Window) -> None:
        """Fetch ``window`` on one connection; when the watchdog finds it lagging, race a hedge against it."""
        loop = asyncio.get_running_loop()
        current = loop.create_task(self._stream(window, window))
        try:
            while True:
                asked = loop.create_task(window.lagging.wait())
                try:
                    await asyncio.wait({current, asked}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    asked.cancel()
                if current.done():
                    current.result()
                    return
                window.lagging.clear()
                current = await self._hedge(window, current)
        finally:
            if not current.done():
                current.cancel()
            await settle(current)

    async def _hedge(self, window: Window, laggard: asyncio.Task[None]) -> asyncio.Task[None]:
        """Ask the rest of ``window`` again on a fresh connection, from where it stands; the first to deliver wins.

        The hedge wins with its first bytes (the laggard is cancelled; the bytes it wrote meanwhile are the same
        ones, at the same offsets), the laggard if it completes the window before. Returns the winner's task."""
        loop = asyncio.get_running_loop()
        start = window.done  # never past what the laggard wrote: the window stays without a hole
        log.info("window %d-%d of %s lags at %d: hedged on a fresh connection", window.start, window.end,
                 self.fill.spec.path, start)
        delivered = asyncio.Event()
        hedge = loop.create_task(self._stream(window, Span(start, window.end, start), delivered))
        first = loop.create_task(delivered.wait())
        try:
            await asyncio.wait({laggard, hedge, first}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if laggard.done() and not laggard.cancelled() and laggard.exception() is None:
            loser, winner = hedge, laggard  # the laggard completed the window first
        elif hedge.done() and not delivered.is_set() and (hedge.cancelled() or hedge.exception() is not None):
            log.info("the hedge of window %d-%d failed: %s", window.start, window.end,
                     "cancelled" if hedge.cancelled() else hedge.exception())
            return laggard
        else:
            loser, winner = laggard, hedge
        loser.cancel()
        await settle(loser)
        return winner

    async def _stream(self, window: Window, span: Span, delivered: asyncio.Event | None = None) -> None:
        """Fetch ``span`` (the window itself, or a hedge's rest of it), its progress the window's."""
        counter = self.metrics.bytes_fetched
        if delivered is not None:
            counter = _Both(counter, self.metrics.fill_hedge_bytes)  # type: ignore[assignment]

        def progress(offset: int) -> None:
            if delivered is not None:
                delivered.set()
            self._advanced(window, offset)

        async def copy_span(file: FileBody) -> None:
            await copy(file.body, self.fd, span, self.threads.windows, counter=counter, block_size=_REPORT_BYTES,
                       on_progress=progress, rate=file.rate)

        await fetch(self.upstream, self.fill.spec, span, self.url, copy_span)

    async def _complete_with_room(self) -> None:
        """The share policy completes the file: first room for the rest of it, as a new fill makes room for its file
        (the quota evicts least recently used blobs for it); no room: the file stays sparse, its windows kept."""
        rest = self.size - self.held()
        try:
            room = self.room is None or await self.room(rest)
        except Exception as exc:  # noqa: BLE001 - the quota's failure keeps the file sparse, never fails the fill
            log.warning("no room reserved to complete sparse file %s: %s", self.fill.spec.path, exc)
            room = False
        if not room:
            log.warning("no disk room to complete sparse file %s (%d more bytes): it keeps its %d bytes of windows "
                        "and fetches only the Ranges read", self.fill.spec.path, rest, self.held())
            return
        if self.fill.sparse:
            self.complete_all()

    # --- the watchdog --------------------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Find a window in flight whose rate over the last ``hedge_after`` seconds fell below 1/``_HEDGE_SLOWER``
        of the median of the others (those in flight and the last ones finished), or that brought nothing in that
        time, and ask for its hedge; at most ``hedges_left`` times in the fill."""
        while self.hedges_left > 0:
            await asyncio.sleep(_WATCH_SECONDS)
            now = time.monotonic()
            rates: dict[int, float] = {}
            for index, window in enumerate(self.windows):
                if not window.started or window.complete:
                    continue
                samples = window.samples
                samples.append((now, window.done))
                while len(samples) > 1 and now - samples[1][0] >= self.hedge_after:
                    samples.popleft()
                when, done = samples[0]
                if now - when >= self.hedge_after * 0.99 and not window.lagging.is_set():
                    rates[index] = (window.done - done) / (now - when)
            for index, rate in rates.items():
                others = [r for i, r in rates.items() if i != index] + list(self._finished_rates)
                slow = bool(others) and rate * _HEDGE_SLOWER < statistics.median(others)
                if (rate == 0 or slow) and self.hedges_left > 0:
                    window = self.windows[index]
                    self.hedges_left -= 1
                    self.metrics.fill_hedges.inc()
                    window.samples.clear()  # the hedge is judged afresh
                    window.lagging.set()

    def _advanced(self, window: Window, offset: int) -> None:
        window.done = max(window.done, offset)
        if window.complete and window.start >= self.contiguous:
            self._write_map()  # a window held beyond the prefix: listed for the next fill (sparse, resume)
            if self.fill.sparse and self._completing is None and self.held() >= self.complete_share * self.size:
                # The completion policy: most of the file is here, fetch the rest once there is room for it.
                self._completing = asyncio.get_running_loop().create_task(self._complete_with_room())
        contiguous = self._contiguous_from(self.contiguous)
        if contiguous > self.contiguous:
            self.contiguous = contiguous
            now = time.monotonic()
            if now - self._prefix_written_at >= _PREFIX_FILE_SECONDS or contiguous >= self.size:
                self._prefix_written_at = now
                write_prefix(self.fill.partial, contiguous)
            self.fill.advance(contiguous)
            self._more.set()
        else:
            self.fill.progress()  # bytes of a window ahead of the prefix: a reader there may take them

    # --- hashing -------------------------------------------------------------------------------------------------

    async def _hash(self) -> None:
        """Hash the contiguous prefix in order, reading it back from the page cache."""
        while self.hashed < self.size:
            while self.contiguous <= self.hashed:
                self._more.clear()
                await self._more.wait()
            await in_thread(self.threads.windows, functools.partial(self._hash_to, self.contiguous))

    def _hash_to(self, end: int, stop: threading.Event) -> None:
        while self.hashed < end and not stop.is_set():
            data = os.pread(self.fd, min(self.chunk_size, end - self.hashed), self.hashed)
            if not data:
                raise UpstreamUnavailable("the partial file is shorter than the bytes written to it")
            self.hasher.update(data)
            self.hashed += len(data)

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
import os
import threading
import time
from dataclasses import dataclass

from mirror.config import Settings
from mirror.errors import UpstreamUnavailable
from mirror.fill.copy import Span, copy, write_prefix
from mirror.fill.resume import SignedUrl, fetch
from mirror.fill.state import Fill
from mirror.fill.threads import FillThreads, in_thread
from mirror.integrity import BlobHasher
from mirror.metrics import Metrics
from mirror.upstream import FileBody, RangeIgnored, UpstreamClient

_REPORT_BYTES = 4 * 1024 * 1024  # a window's bytes reach readers at least every this many bytes (or copy's 10 ms)
_PREFIX_FILE_SECONDS = 0.05  # the prefix file (cross-process followers, resume) is rewritten at most this often


def in_windows(settings: Settings, size: int) -> bool:
    """Whether a file of ``size`` bytes is fetched in windows (``parallel_fill_threshold``, ``fill_connections``)."""
    threshold = settings.parallel_fill_threshold
    return bool(threshold and size >= threshold and settings.fill_connections > 1)


@dataclass
class Window(Span):
    started: bool = False  # a worker has taken it


class WindowedFill:
    """The parallel download of ``fill`` from byte ``offset`` (the bytes before are on disk and hashed)."""

    def __init__(self, fill: Fill, fd: int, hasher: BlobHasher, offset: int, upstream: UpstreamClient,
                 metrics: Metrics, threads: FillThreads, *, connections: int, window: int, chunk_size: int,
                 url: SignedUrl) -> None:
        self.fill, self.fd, self.hasher, self.upstream, self.metrics = fill, fd, hasher, upstream, metrics
        self.threads = threads
        self.size = fill.spec.size
        self.connections = connections
        self.chunk_size = chunk_size
        self.url = url  # the newest signed URL any window got, shared with the single stream after a fallback
        self.windows = [Window(s, min(s + window, self.size), s) for s in range(offset, self.size, window)]
        self.base, self.window_size = offset, window
        self._wanted: set[int] = set()  # windows a reader waits for, taken before the next in order
        self.contiguous = offset  # bytes on disk without a hole
        self.hashed = offset  # bytes hashed, in order
        self._next = 0
        self._more = asyncio.Event()  # the contiguous prefix grew
        self._prefix_written_at = 0.0

    async def run(self) -> None:
        """Fetch every window and hash the file; raises the first failure (every worker stopped by then)."""
        write_prefix(self.fill.partial, self.contiguous)
        fill = self.fill
        fill.run_end, fill.want, fill.windowed = self.run_end, self.want, True
        for offset in fill.wanted:  # asked before the windows began
            self.want(offset)
        fill.wanted.clear()
        loop = asyncio.get_running_loop()
        workers = [loop.create_task(self._worker()) for _ in range(min(self.connections, len(self.windows)))]
        hashing = loop.create_task(self._hash())
        tasks = [*workers, hashing]
        try:
            done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await hashing
        except RangeIgnored:
            fill.run_end, fill.want, fill.windowed = None, None, False  # one stream from the hashed prefix now
            raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

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

    def want(self, position: int) -> None:
        """A reader waits for ``position``: its window goes next if no worker has taken it."""
        if position >= self.base:
            index = (position - self.base) // self.window_size
            if index < len(self.windows) and not self.windows[index].started:
                self._wanted.add(index)

    def _take(self) -> Window | None:
        while self._wanted:
            index = min(self._wanted)
            self._wanted.discard(index)
            if not self.windows[index].started:
                self.windows[index].started = True
                return self.windows[index]
        while self._next < len(self.windows):
            window = self.windows[self._next]
            self._next += 1
            if not window.started:
                window.started = True
                return window
        return None

    async def _worker(self) -> None:
        while (window := self._take()) is not None:
            await self._fetch(window)

    async def _fetch(self, window: Window) -> None:
        async def copy_window(file: FileBody) -> None:
            await copy(file.body, self.fd, window, self.threads.windows, counter=self.metrics.bytes_fetched,
                       block_size=_REPORT_BYTES, on_progress=functools.partial(self._advanced, window),
                       rate=file.rate)

        await fetch(self.upstream, self.fill.spec, window, self.url, copy_window)

    def _advanced(self, window: Window, offset: int) -> None:
        window.done = max(window.done, offset)
        contiguous = self.contiguous
        for candidate in self.windows:
            if candidate.end <= contiguous:
                continue
            if candidate.start > contiguous:
                break
            contiguous = candidate.done
            if not candidate.complete:
                break
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

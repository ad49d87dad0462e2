"""The one body copy of every fill: socket → partial file at an offset, in a worker thread, telling the readers.

The single stream, each window of a parallel fill (:mod:`mirror.fill.windows`) and a copy from a peer node all copy
with :func:`copy`. A stream that hashes in line (the single stream, a peer copy) is a pipeline: its thread reads
the socket, a writer thread writes what was read into the page cache (``pwritev``), and a third hashes what was
written (hashlib drops the GIL on large blocks), the same bytes objects in every stage. Such a fill costs
max(read, write, hash) of wall time instead of their sum, on up to three cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from mirror.errors import IntegrityError, UpstreamUnavailable
from mirror.fill.threads import in_thread
from mirror.integrity import BlobHasher
from mirror.upstream import BulkBody, RateLimit

_BLOCK_SECONDS = 0.01  # a slow upstream's bytes reach readers at least this often
_HANDOFF_BYTES = 4 * 1024 * 1024  # reads handed to a copy's next stage at once (or 10 ms of them), and the most
# queued there (the hand waits beyond): each handoff wakes a thread, and a few MiB in flight bound the memory
_LINGER = 0.002  # a stage's job waits this long for more before it ends (a new job per read costs a handoff)
_READ_SIZE = 1024 * 1024  # per socket read: larger reads allocate more than they fill (measured ~3 GB/s at 1 MiB)


@dataclass
class Span:
    """Bytes ``start..end`` (exclusive) of a file that one stream fetches; ``start..done`` are on disk."""

    start: int
    end: int
    done: int
    bounded: bool = True  # asked with its end (a window); False: the rest of the file from ``done`` (one stream)

    @property
    def complete(self) -> bool:
        return self.done >= self.end

    def __str__(self) -> str:
        return f"window {self.start}-{self.end}" if self.bounded else "fill"

    def too_long(self) -> str:
        """Why an upstream sending past ``end`` fails the fill."""
        if self.bounded:
            return f"upstream sent more than the {self.end - self.start} bytes asked"
        return f"upstream sent more than {self.end} bytes"

    def cut_short(self) -> str:
        """Why a stream that ended before ``end`` is tried again."""
        if self.bounded:
            return f"upstream closed window {self.start} at {self.done}/{self.end}"
        return f"upstream closed after {self.done} of {self.end} bytes"


@dataclass(frozen=True)
class Hashing:
    """In-line hashing of a copy: ``hasher`` takes every byte in order, blocks hashed in ``pool``."""

    hasher: BlobHasher
    pool: ThreadPoolExecutor


async def copy(body: BulkBody, fd: int, span: Span, pool: ThreadPoolExecutor, *, counter: Counter, block_size: int,
               on_progress: Callable[[int], None], rate: RateLimit | None = None,
               hashing: Hashing | None = None, writes: ThreadPoolExecutor | None = None) -> None:
    """Copy ``body`` into ``fd`` from ``span.done`` up to ``span.end`` (or its EOF) in a thread of ``pool``.

    With ``writes``, what was read is written by a thread of that pool while the next bytes are read (and hashed
    by ``hashing.pool`` once written): one copy keeps up to three cores busy (:class:`_Lane`). The windows of a
    parallel fill go without: eight of them already read and write side by side, and a handoff per read would
    only add CPU.

    ``on_progress(offset)`` runs on the event loop at least every ``block_size`` bytes or ``_BLOCK_SECONDS``, and
    once at the end; ``span.done`` is where the copy got, however it ended (cancelled too: see :func:`in_thread`).
    """
    loop = asyncio.get_running_loop()
    cursor = _Cursor(span.done)

    def report(offset: int) -> None:
        if offset == cursor.reported:
            return
        cursor.reported = offset
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is left to tell
            loop.call_soon_threadsafe(on_progress, offset)

    def run(stop: threading.Event) -> None:
        _copy_body(body, fd, span, cursor, stop, report, counter, block_size, rate, hashing, writes)

    try:
        await in_thread(pool, run, body.abort)
    finally:
        span.done = max(span.done, cursor.offset)


class _Cursor:
    """How far a copy thread got, readable after it ends however it ended."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.reported = offset


def _copy_body(body: BulkBody, fd: int, span: Span, cursor: _Cursor, stop: threading.Event,
               report: Callable[[int], None], counter: Counter, block_size: int, rate: RateLimit | None,
               hashing: Hashing | None, writes: ThreadPoolExecutor | None) -> None:
    """Blocking: socket → partial file until ``span.end`` or EOF, as a pipeline of three threads.

    This thread reads, and hands its reads over by groups (``block_size`` bytes up to ``_HANDOFF_BYTES``, or what
    ``_BLOCK_SECONDS`` brought) to the writer lane (:class:`_Lane`): a thread of ``writes`` writes what has queued
    (one ``pwritev``) while this one reads on; a hash lane then hashes what was written, the same bytes objects in
    every stage (no copy). Each read takes what has arrived, and readers are told of written bytes every
    ``block_size`` bytes or ``_BLOCK_SECONDS``, as a slow upstream's bytes come. On any exit the hash covers
    exactly the bytes up to ``cursor.offset`` (those written: a group is hashed only once written), so a resume
    can continue from there.
    """
    end = span.end
    position = cursor.offset  # bytes read; ``cursor.offset``: bytes written
    hash_lane = None if hashing is None else _Lane(hashing.pool, functools.partial(_hash_all, hashing.hasher))
    told = _Told(report, block_size)

    def write(pieces: list[bytes], offset: int, length: int) -> None:
        _write_all(fd, pieces, offset)
        cursor.offset = offset + length
        told.wrote(length, cursor.offset)
        if hash_lane is not None:
            hash_lane.put(pieces, length)

    write_lane = _Lane(writes, write)
    group: list[bytes] = []  # reads not yet handed over: a handoff wakes a thread, so it is made per group
    group_bytes, group_began, group_limit = 0, time.monotonic(), min(block_size, _HANDOFF_BYTES)
    try:
        while position < end and not stop.is_set():
            data = body.read_some(min(_READ_SIZE, end - position + 1))  # +1: notice an upstream sending more
            if not data:
                break
            if position + len(data) > end:
                raise IntegrityError(span.too_long())
            counter.inc(len(data))
            if rate is not None:
                rate.take(len(data))
            group.append(data)
            group_bytes += len(data)
            position += len(data)
            if group_bytes >= group_limit or time.monotonic() - group_began >= _BLOCK_SECONDS:
                write_lane.put(group, group_bytes, position - group_bytes)
                group, group_bytes, group_began = [], 0, time.monotonic()
    finally:
        try:
            try:
                if group and write_lane.error is None:  # what was read before a drop is kept: a resume goes on
                    write_lane.put(group, group_bytes, position - group_bytes)
            finally:
                write_lane.close()
        finally:
            if hash_lane is not None:
                hash_lane.close()
            report(cursor.offset)


class _Told:
    """When the writer lane tells readers: every ``block_size`` bytes written, or ``_BLOCK_SECONDS``."""

    def __init__(self, report: Callable[[int], None], block_size: int) -> None:
        self.report, self.block_size = report, block_size
        self.untold, self.at = 0, time.monotonic()

    def wrote(self, length: int, offset: int) -> None:
        self.untold += length
        if self.untold >= self.block_size or time.monotonic() - self.at >= _BLOCK_SECONDS:
            self.report(offset)
            self.untold, self.at = 0, time.monotonic()


class _Lane:
    """One stage of a copy: ``work(pieces, offset, length)`` on what queued up, in order, one job at a time.

    Items queue while a job of ``pool`` runs (at most ``_HANDOFF_BYTES``: ``put`` waits beyond), and the job takes
    all that queued at once, so a fast stage costs one handoff per batch, not per read; an idle job lingers
    ``_LINGER`` for the next item before it ends (a new job per read would cost more). Without a pool, ``put``
    runs the work itself. After a failure nothing more runs; ``put`` and ``close`` raise it."""

    def __init__(self, pool: ThreadPoolExecutor | None, work: Callable[[list[bytes], int, int], None]) -> None:
        self.pool, self.work = pool, work
        self.lock = threading.Condition()
        self.queued: list[bytes] = []
        self.queued_bytes = 0
        self.offset = -1  # where the queued bytes belong (-1: not placed, a hash)
        self.running = False
        self.error: BaseException | None = None

    def put(self, pieces: list[bytes], length: int, offset: int = -1) -> None:
        with self.lock:
            while self.queued_bytes >= _HANDOFF_BYTES and self.running and self.error is None:
                self.lock.wait()
            if self.error is not None:
                raise self.error
            if not self.queued:
                self.offset = offset
            self.queued += pieces
            self.queued_bytes += length
            if self.running:
                self.lock.notify_all()  # a job lingering for more
                return
            self.running = True
        if self.pool is None:
            self._run()
            return
        try:
            self.pool.submit(self._run)
        except BaseException:  # the pool is shut down: nothing will take the queue
            with self.lock:
                self.running = False
                self.lock.notify_all()
            raise

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queued and self.pool is not None:
                    self.lock.wait(_LINGER)  # the next read is likely close: taking it here spares a handoff
                pieces, length, offset = self.queued, self.queued_bytes, self.offset
                self.queued, self.queued_bytes = [], 0
                if not pieces:
                    self.running = False
                    self.lock.notify_all()
                    return
                self.lock.notify_all()
            try:
                self.work(pieces, offset, length)
            except BaseException as exc:
                with self.lock:
                    self.error, self.running = exc, False
                    self.queued, self.queued_bytes = [], 0
                    self.lock.notify_all()
                return

    def close(self) -> None:
        """Wait for what queued; raise the failure if one stopped the lane."""
        with self.lock:
            while self.running:
                self.lock.wait()
        if self.error is not None:
            raise self.error


def _hash_all(hasher: BlobHasher, pieces: list[bytes], offset: int, length: int) -> None:
    for piece in pieces:
        hasher.update(piece)


_IOV_MAX = 512  # pieces per pwritev (Linux takes 1024)


def _write_all(fd: int, pieces: list[bytes], offset: int) -> None:
    """``pieces`` at ``offset``, in as few ``pwritev`` calls as the kernel takes."""
    views = [memoryview(piece) for piece in pieces]
    while views:
        batch = views[:_IOV_MAX]
        written = os.pwritev(fd, batch, offset)
        offset += written
        while written and views:  # drop what was written, keep the rest of a piece cut short
            if written >= len(views[0]):
                written -= len(views.pop(0))
            else:
                views[0] = views[0][written:]
                written = 0


def hash_range(fd: int, hasher: BlobHasher, start: int, end: int, stop: threading.Event,
               buffer: bytearray) -> int:
    """Hash bytes ``start..end`` of ``fd`` in order, read back into ``buffer`` (reused: no allocation, no fresh
    pages per read); returns where it got (``end``, or less when ``stop`` was set). Raises at a short file."""
    view = memoryview(buffer)
    position = start
    while position < end and not stop.is_set():
        count = os.preadv(fd, [view[:min(len(view), end - position)]], position)
        if not count:
            raise UpstreamUnavailable("the partial file is shorter than the bytes written to it")
        hasher.update(view[:count])
        position += count
    return position


def resume_offset(fd: int, size: int, hasher: BlobHasher, chunk_size: int, partial: Path | None = None) -> int:
    """Hash what a previous fill left in the partial file, and continue after it.

    A parallel fill's partial file holds windows beyond its contiguous prefix: its prefix file says how far the
    bytes are contiguous, and the rest is cut (those windows are fetched again)."""
    existing = os.fstat(fd).st_size
    prefix = read_prefix(partial) if partial is not None else None
    if prefix is not None:
        existing = min(existing, prefix)
        if read_windows(partial, fd) is None:  # type: ignore[arg-type]
            os.ftruncate(fd, existing)  # windows beyond the prefix are fetched again; a map keeps them (sparse)
        prefix_path(partial).unlink(missing_ok=True)  # type: ignore[arg-type]
    if existing > size:
        os.ftruncate(fd, 0)
        return 0
    offset = 0
    while offset < existing:
        data = os.pread(fd, min(chunk_size, existing - offset), offset)
        if not data:
            break
        hasher.update(data)
        offset += len(data)
    return offset


# --- the prefix file of a parallel fill ------------------------------------------------------------------------------
# A parallel fill writes windows at their offsets, so the partial file's size is not how far its bytes are
# contiguous. ``<partial>.prefix`` says that (written before any window lands beyond the prefix, replaced atomically,
# removed once the partial file is committed or dropped): what a follower in another process and a resume read.


def prefix_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".prefix")


def write_prefix(partial: Path, offset: int) -> None:
    path = prefix_path(partial)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, path)


def read_prefix(partial: Path) -> int | None:
    try:
        text = prefix_path(partial).read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else 0


def on_disk_prefix(partial: Path) -> int:
    """How many bytes of a partial file (another process fills it) are contiguous on disk."""
    size = os.stat(partial).st_size
    prefix = read_prefix(partial)
    return size if prefix is None else min(size, prefix)


# --- the windows map of a sparse partial file ------------------------------------------------------------------------
# A ranged read of a large file fetches only its windows (mirror.fill.windows): the partial file is sparse, and
# ``<partial>.windows`` says which bytes it holds beyond the contiguous prefix: the window size, the partial file's
# inode (a map outliving its file, or a file made again, is ignored) and ``[start, done]`` of every window begun.
# Written after the bytes it lists, replaced atomically, removed with the partial file (commit, integrity failure).


def windows_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".windows")


def write_windows(partial: Path, fd: int, window: int, held: list[tuple[int, int]]) -> None:
    path = windows_path(partial)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"window": window, "inode": os.fstat(fd).st_ino, "held": held}))
    os.replace(tmp, path)


def read_windows(partial: Path, fd: int) -> tuple[int, list[tuple[int, int]]] | None:
    """``(window size, held spans)`` of the partial file open at ``fd``; ``None``: no map, or not this file's."""
    try:
        data = json.loads(windows_path(partial).read_text())
        window, inode, held = int(data["window"]), int(data["inode"]), [(int(a), int(b)) for a, b in data["held"]]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    stat = os.fstat(fd)
    if inode != stat.st_ino or any(b > stat.st_size for _, b in held):
        return None
    return window, held

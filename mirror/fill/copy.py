"""The one body copy of every fill: socket → partial file at an offset, in a worker thread, telling the readers.

The single stream, each window of a parallel fill (:mod:`mirror.fill.windows`) and a copy from a peer node all copy
with :func:`copy`. A stream that hashes in line (the single stream, a peer copy) hashes beside the socket reads and
disk writes (hashlib drops the GIL on large blocks), so it costs max(read + write, hash) instead of their sum.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from mirror.errors import IntegrityError
from mirror.fill.threads import in_thread
from mirror.integrity import BlobHasher
from mirror.layout import CacheLayout
from mirror.upstream import BulkBody, RateLimit

_BLOCK_SECONDS = 0.01  # a slow upstream's bytes reach readers at least this often
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
               hashing: Hashing | None = None) -> None:
    """Copy ``body`` into ``fd`` from ``span.done`` up to ``span.end`` (or its EOF) in a thread of ``pool``.

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
        _copy_body(body, fd, span, cursor, stop, report, counter, block_size, rate, hashing)

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
               hashing: Hashing | None) -> None:
    """Blocking: socket → partial file until ``span.end`` or EOF.

    Each read takes what has arrived, so a slow upstream's first bytes reach readers at once. Hashing and progress
    go by blocks (``block_size`` bytes or ``_BLOCK_SECONDS``), the hash of one block beside the reads of the next.
    On any exit the hash covers exactly the bytes up to ``cursor.offset``, so a resume can continue from there.
    """
    end = span.end
    pending: Future[None] | None = None
    block: list[bytes] = []
    block_bytes, block_began = 0, time.monotonic()
    try:
        while cursor.offset < end and not stop.is_set():
            data = body.read_some(min(_READ_SIZE, end - cursor.offset + 1))  # +1: notice an upstream sending more
            if not data:
                break
            if cursor.offset + len(data) > end:
                raise IntegrityError(span.too_long())
            _write_all(fd, data, cursor.offset)
            cursor.offset += len(data)
            counter.inc(len(data))
            if rate is not None:
                rate.take(len(data))
            if hashing is not None:
                block.append(data)
            block_bytes += len(data)
            if block_bytes >= block_size or time.monotonic() - block_began >= _BLOCK_SECONDS:
                if hashing is not None:
                    if pending is not None:
                        pending.result()
                    pending = hashing.pool.submit(_hash_all, hashing.hasher, block)
                block, block_bytes, block_began = [], 0, time.monotonic()
                report(cursor.offset)
    finally:
        if pending is not None:
            pending.result()
        if hashing is not None:
            _hash_all(hashing.hasher, block)
        report(cursor.offset)


def _hash_all(hasher: BlobHasher, pieces: list[bytes]) -> None:
    for piece in pieces:
        hasher.update(piece)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def resume_offset(fd: int, size: int, hasher: BlobHasher, chunk_size: int, partial: Path | None = None) -> int:
    """Hash what a previous fill left in the partial file, and continue after it.

    A parallel fill's partial file holds windows beyond its contiguous prefix: its prefix file says how far the
    bytes are contiguous, and the rest is cut (those windows are fetched again). A sparse one keeps them, listed in
    its windows map, and keeps its prefix file too (a kill -9 while the prefix is hashed must not leave a map
    without it: its holes would pass for bytes); a map without a prefix file trusts no prefix at all."""
    existing = os.fstat(fd).st_size
    prefix = read_prefix(partial) if partial is not None else None
    sparse = partial is not None and read_windows(partial, fd) is not None
    if sparse and prefix is None:
        prefix = 0
    if prefix is not None:
        existing = min(existing, prefix)
        if not sparse:
            os.ftruncate(fd, existing)  # windows beyond the prefix are fetched again
            CacheLayout.prefix_note(partial).unlink(missing_ok=True)  # type: ignore[arg-type]
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
# contiguous. Its prefix note (``CacheLayout.prefix_note``) says that (written before any window lands beyond the
# prefix, replaced atomically, removed once the partial file is committed or dropped): what a follower in another
# process and a resume read.


def write_prefix(partial: Path, offset: int) -> None:
    path = CacheLayout.prefix_note(partial)
    tmp = CacheLayout.replacing(path)
    tmp.write_text(str(offset))
    os.replace(tmp, path)


def read_prefix(partial: Path) -> int | None:
    try:
        text = CacheLayout.prefix_note(partial).read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else 0


def on_disk_prefix(partial: Path) -> int:
    """How many bytes of a partial file (another process fills it) are contiguous on disk."""
    size = os.stat(partial).st_size
    prefix = read_prefix(partial)
    return size if prefix is None else min(size, prefix)


# --- the windows map of a sparse partial file ------------------------------------------------------------------------
# A ranged read of a large file fetches only its windows (mirror.fill.windows): the partial file is sparse, and its
# windows map (``CacheLayout.windows_map``) says which bytes it holds beyond the contiguous prefix: the window size,
# the partial file's inode (a map outliving its file, or a file made again, is ignored) and ``[start, done]`` of every
# window begun.
# Written after the bytes it lists, replaced atomically, removed with the partial file (commit, integrity failure).


def write_windows(partial: Path, fd: int, window: int, held: list[tuple[int, int]]) -> None:
    path = CacheLayout.windows_map(partial)
    tmp = CacheLayout.replacing(path)
    tmp.write_text(json.dumps({"window": window, "inode": os.fstat(fd).st_ino, "held": held}))
    os.replace(tmp, path)


def read_windows(partial: Path, fd: int) -> tuple[int, list[tuple[int, int]]] | None:
    """``(window size, held spans)`` of the partial file open at ``fd``; ``None``: no map, or not this file's."""
    try:
        data = json.loads(CacheLayout.windows_map(partial).read_text())
        window, inode, held = int(data["window"]), int(data["inode"]), [(int(a), int(b)) for a, b in data["held"]]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    stat = os.fstat(fd)
    if inode != stat.st_ino or any(b > stat.st_size for _, b in held):
        return None
    return window, held


def held_at(partial: Path, fd: int) -> list[tuple[int, int]]:
    """The spans ``[start, done)`` the map of the partial file open at ``fd`` lists as on disk (none: no valid map)."""
    held = read_windows(partial, fd)
    return [(a, b) for a, b in held[1] if b > a] if held is not None else []


def held_windows(partial: Path) -> list[tuple[int, int]]:
    """The spans ``[start, done)`` a sparse partial file's map lists as on disk (none: no valid map). Blocking."""
    try:
        fd = os.open(partial, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        return held_at(partial, fd)
    finally:
        os.close(fd)


def covers(held: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether the spans ``held`` (``[start, done)``) hold every byte of ``start..end`` (inclusive)."""
    position = start
    for first, done in sorted(held):
        if first > position:
            break
        position = max(position, done)
    return position > end


def touch_windows(partial: Path) -> None:
    """A sparse partial file was read (a ranged read of its windows): its map's mtime is its last use, what the quota's
    LRU orders it by beside the blobs."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(CacheLayout.windows_map(partial))


@dataclass(frozen=True)
class SparsePartial:
    """A partial file that holds windows (a sparse fill never completed), as the quota and the status see it."""

    etag: str
    partial: Path
    held: int  # bytes its windows hold (its disk usage, the holes aside)
    last_access: float  # the map's mtime: its last window fetched, or its last ranged read (touch_windows)


def sparse_partials(partials_dir: Path) -> list[SparsePartial]:
    """Every partial file under ``partials_dir`` with a valid windows map (blocking: call it in a thread)."""
    found: list[SparsePartial] = []
    try:
        entries = list(os.scandir(partials_dir))
    except FileNotFoundError:
        return found
    suffix = ".part.windows"
    for entry in entries:
        if not entry.name.endswith(suffix):
            continue
        partial = Path(entry.path[: -len(".windows")])
        try:
            fd = os.open(partial, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            held = read_windows(partial, fd)
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        finally:
            os.close(fd)
        if held is not None:
            found.append(SparsePartial(entry.name[: -len(suffix)], partial, sum(b - a for a, b in held[1]), mtime))
    return found


def drop_partial(partial: Path) -> None:
    """Remove a partial file and its notes (prefix, windows map): the map first, so nothing lists bytes gone."""
    for path in (CacheLayout.windows_map(partial), CacheLayout.prefix_note(partial), partial):
        path.unlink(missing_ok=True)

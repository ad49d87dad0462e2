"""Copying a body into a partial file in a worker thread, hashing it beside the reads and telling the readers.

Hashing runs beside the socket reads and disk writes (hashlib drops the GIL on large blocks), so a fill costs
max(read + write, hash) instead of their sum.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from prometheus_client import Counter

from mirror.errors import IntegrityError
from mirror.fill.state import Fill
from mirror.integrity import BlobHasher
from mirror.upstream import BulkBody, RateLimit

_HASH_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fill-hash")
_COPY_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fill-copy")  # one thread per running fill
_BLOCK_SECONDS = 0.01  # a slow upstream's bytes reach readers at least this often
_READ_SIZE = 1024 * 1024  # per socket read: larger reads allocate more than they fill (measured ~3 GB/s at 1 MiB)


class Cursor:
    """How far a copy thread got, readable after it ends however it ended."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.reported = offset


async def pump(fill: Fill, body: BulkBody, fd: int, cursor: Cursor, hasher: BlobHasher, counter: Counter,
               block_size: int, rate: RateLimit | None = None) -> None:
    """Copy the body into the partial file in a worker thread, announcing progress to the readers.

    The thread owns ``fd`` until it returns: on cancellation it is told to stop and awaited, never abandoned.
    """
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def progress(offset: int) -> None:
        if offset == cursor.reported:
            return
        counter.inc(offset - cursor.reported)
        cursor.reported = offset
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is left to tell
            loop.call_soon_threadsafe(fill.advance, offset)

    def run() -> None:
        copy_body(body, fd, cursor, fill.spec.size, hasher, block_size, stop, progress, rate)

    done = asyncio.wrap_future(_COPY_POOL.submit(run))
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        body.abort()
        await settle(done)
        raise


async def settle(done: asyncio.Future[None]) -> None:
    """Wait for a thread told to stop, and take its outcome: a read cut by ``abort`` fails by design, and an
    exception left unretrieved would be printed as a traceback when the loop closes (Ctrl-C of the sync)."""
    await asyncio.wait([done])
    if not done.cancelled():
        done.exception()


def copy_body(body: BulkBody, fd: int, cursor: Cursor, size: int, hasher: BlobHasher, block_size: int,
              stop: threading.Event, progress: Callable[[int], None], rate: RateLimit | None = None) -> None:
    """Blocking: socket → partial file until ``size`` bytes or EOF.

    Each read takes what has arrived, so a slow upstream's first bytes reach readers at once. Hashing and progress
    go by blocks (``block_size`` bytes or ``_BLOCK_SECONDS``), the hash of one block beside the reads of the next.
    On any exit the hash covers exactly the bytes up to ``cursor.offset``, so a resume can continue from there.
    """
    pending: Future[None] | None = None
    block: list[bytes] = []
    block_bytes, block_began = 0, time.monotonic()
    try:
        while cursor.offset < size and not stop.is_set():
            data = body.read_some(min(_READ_SIZE, size - cursor.offset + 1))  # +1: notice an upstream sending more
            if not data:
                break
            if cursor.offset + len(data) > size:
                raise IntegrityError(f"upstream sent more than {size} bytes")
            _write_all(fd, data, cursor.offset)
            cursor.offset += len(data)
            if rate is not None:
                rate.take(len(data))
            block.append(data)
            block_bytes += len(data)
            if block_bytes >= block_size or time.monotonic() - block_began >= _BLOCK_SECONDS:
                if pending is not None:
                    pending.result()
                pending = _HASH_POOL.submit(_hash_all, hasher, block)
                block, block_bytes, block_began = [], 0, time.monotonic()
                progress(cursor.offset)
    finally:
        if pending is not None:
            pending.result()
        _hash_all(hasher, block)
        progress(cursor.offset)


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
    bytes are contiguous, and the rest is cut (those windows are fetched again)."""
    existing = os.fstat(fd).st_size
    prefix = read_prefix(partial) if partial is not None else None
    if prefix is not None:
        existing = min(existing, prefix)
        os.ftruncate(fd, existing)
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

"""The body copy (socket → partial file in one thread, hashed beside in another): readers are told only of bytes on
disk, and however a copy ends the hash covers exactly the bytes written (what a resume continues from)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mirror.errors import UpstreamUnavailable
from mirror.fill.copy import Hashing, Span, copy
from mirror.integrity import BlobHasher

DATA = os.urandom(3 * 1024 * 1024 + 12345)


class _Body:
    """Serves ``data`` in reads of at most ``piece`` bytes; fails after ``fail_after`` bytes when given."""

    def __init__(self, data: bytes, piece: int, fail_after: int | None = None) -> None:
        self.data, self.piece, self.fail_after, self.at = data, piece, fail_after, 0

    def read_some(self, size: int) -> bytes:
        if self.fail_after is not None and self.at >= self.fail_after:
            raise UpstreamUnavailable("dropped")
        out = self.data[self.at:self.at + min(size, self.piece)]
        self.at += len(out)
        return out

    def abort(self) -> None:
        pass


class _Counter:
    def __init__(self) -> None:
        self.total = 0.0

    def inc(self, amount: float = 1) -> None:
        self.total += amount


class _Recorder:
    """A hasher that keeps what it was given, to compare with the file."""

    def __init__(self) -> None:
        self.data = bytearray()

    def update(self, data: bytes | memoryview) -> None:
        self.data += data


def _run(body: _Body, path: Path, span: Span, hasher: object, *, read_only: bool = False) -> list[int]:
    fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o644)
    seen: list[int] = []

    def progress(offset: int) -> None:
        on_disk = os.pread(fd, offset, 0)
        assert on_disk == DATA[:offset]  # never told of a byte not yet written
        seen.append(offset)

    async def main() -> None:
        with ThreadPoolExecutor(2) as reads, ThreadPoolExecutor(2) as hashes:
            await copy(body, fd, span, reads, counter=_Counter(), block_size=256 * 1024,  # type: ignore[arg-type]
                       on_progress=progress, hashing=Hashing(hasher, hashes))  # type: ignore[arg-type]

    try:
        asyncio.run(main())
    finally:
        os.close(fd)
    return seen


def test_a_whole_copy_writes_and_hashes_every_byte_in_order(tmp_path: Path) -> None:
    hasher = BlobHasher(hashlib.sha256(DATA).hexdigest(), len(DATA))
    span = Span(0, len(DATA), 0, bounded=False)
    seen = _run(_Body(DATA, 100_000), tmp_path / "part", span, hasher)
    assert span.done == len(DATA) and hasher.matches()
    assert (tmp_path / "part").read_bytes() == DATA
    assert seen == sorted(seen) and seen[-1] == len(DATA)


def test_a_dropped_stream_keeps_what_it_read_and_the_hash_covers_exactly_that(tmp_path: Path) -> None:
    hasher = _Recorder()
    span = Span(0, len(DATA), 0, bounded=False)
    with pytest.raises(UpstreamUnavailable):
        _run(_Body(DATA, 70_000, fail_after=1_500_000), tmp_path / "part", span, hasher)
    assert span.done >= 1_500_000
    assert bytes(hasher.data) == DATA[:span.done] == (tmp_path / "part").read_bytes()[:span.done]


def test_a_failed_write_hashes_nothing_it_lost(tmp_path: Path) -> None:
    (tmp_path / "part").write_bytes(b"")
    hasher = _Recorder()
    span = Span(0, len(DATA), 0, bounded=False)
    with pytest.raises(OSError):
        _run(_Body(DATA, 70_000), tmp_path / "part", span, hasher, read_only=True)  # every write fails
    assert span.done == 0 and not hasher.data

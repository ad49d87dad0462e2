"""A fill's state: what it downloads (:class:`FillSpec`) and how far it got (:class:`Fill`), shared by its readers."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mirror import hf


@dataclass(frozen=True)
class FillSpec:
    """What to download: a file at a commit, which becomes blob ``etag`` of ``size`` bytes."""

    repo: hf.RepoRef
    commit: str
    path: str
    etag: str
    size: int
    token: str | None = None
    cdn_url: str | None = None
    detached: bool = True  # False: the fill may be cancelled when its last reader leaves (fill_on_disconnect=cancel)


class Fill:
    """The shared state of one blob fill: how many bytes are on disk, and how it ended."""

    def __init__(self, spec: FillSpec, partial: Path) -> None:
        self.spec = spec
        self.partial = partial  # where this process's download (or copy from a peer) of the blob is written
        # The file readers follow while the fill runs: ``partial`` once the fill knows it downloads or follows;
        # for a blob already committed in a remote store, the file the store copies it into (see follow_copy).
        self.source: Path | None = None
        self.written = 0
        self.committed: Path | None = None
        self.verified = False  # every byte written and hashed against the etag: readers may take the last byte
        self.error: BaseException | None = None
        self.readers = 0
        self.task: asyncio.Task[None] | None = None
        self.peer_token = secrets.token_urlsafe(24)  # published in our lease: opens this fill to the other nodes
        self.leading = False  # this process holds the lease and downloads
        # Whether the bytes come in windows this process fetches (mirror.fill.windows): None until the fill knows,
        # False for one stream or a copy another process or node makes. While True, ``run_end`` tells how far the
        # bytes from an offset are on disk, and ``want(first, last)`` asks for the windows of those bytes next;
        # ``wanted`` keeps the spans readers asked for before the windows began.
        self._windowed: bool | None = False
        self._decided = asyncio.Event()
        self._decided.set()
        self.run_end: Callable[[int], int] | None = None
        self.want: Callable[[int, int], None] | None = None
        self.wanted: set[tuple[int, int]] = set()
        # Sparse (mirror.fill.windows): only the windows readers ask for (and a read-ahead) are fetched, the rest once
        # the whole file is wanted (``complete_all``, set while the windows run) or by the completion policy.
        self.sparse = False
        self.complete_all: Callable[[], None] | None = None
        self.windows_seen = 0  # a follower of another process's sparse fill: the mtime of its map last read
        self._progress = asyncio.Event()

    @property
    def windowed(self) -> bool | None:
        return self._windowed

    @windowed.setter
    def windowed(self, value: bool | None) -> None:
        self._windowed = value
        if value is None:
            self._decided.clear()
        else:
            self._decided.set()

    async def decided(self, timeout: float) -> bool | None:
        """Whether the fill comes in windows, once it knows (at most ``timeout`` seconds: then still ``None``)."""
        try:
            await asyncio.wait_for(self._decided.wait(), timeout)
        except TimeoutError:
            pass
        return self._windowed

    @property
    def finished(self) -> bool:
        return self.committed is not None or self.error is not None

    def advance(self, written: int) -> None:
        self.written = written
        self._wake()

    def finish(self, committed: Path | None, error: BaseException | None = None) -> None:
        self.committed, self.error = committed, error
        self._decided.set()  # nothing more to decide: a far Range waiting on it goes on
        if committed is not None:
            self.written = self.spec.size
        self._wake()

    def follow_copy(self, file: Path, written: int) -> None:
        """The store's progress report while it copies a committed blob onto this node's disk."""
        self.source = file
        self.advance(written)

    def wants_whole(self) -> None:
        """Someone wants the whole file (a full download, the sync): a sparse fill fetches every window now."""
        if self.sparse:
            self.sparse = False
            if self.complete_all is not None:
                self.complete_all()

    def follow_windows(self, held: list[tuple[int, int]]) -> None:
        """Another process of this node leads this sparse fill (or none does yet): the windows its map lists as on
        disk (``held``: ``[start, done)`` spans) are readable here too, so a Range on them is a hit in any process.
        The process that leads the fill in windows replaces this with its own ``run_end``."""
        runs: list[list[int]] = []
        for start, done in sorted(held):
            if runs and start <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], done)
            else:
                runs.append([start, done])

        def run_end(position: int) -> int:
            for start, done in runs:
                if start <= position < done:
                    return done
            return position

        self.run_end = run_end
        self.progress()

    def holds(self, start: int, end: int) -> bool:
        """Whether bytes ``start..end`` (inclusive) are on disk already."""
        return self.readable_at(start) > end

    def progress(self) -> None:
        """Bytes were written somewhere past the contiguous prefix (a window ahead of it)."""
        self._wake()

    def verify(self) -> None:
        self.verified = True
        self._wake()

    def _wake(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def changed(self) -> None:
        """Return at the next progress report, verification or end."""
        await self._progress.wait()

    async def wait_beyond(self, offset: int) -> None:
        """Return once byte ``offset`` is readable (see :meth:`readable_at`), or the fill has finished; a byte in a
        window not yet begun asks for that window next."""
        asked = False
        while self.readable_at(offset) <= offset and not self.finished:
            if not asked:
                asked = True
                self.ask(offset)
            await self._progress.wait()

    def ask(self, offset: int, last: int | None = None) -> None:
        """A reader needs byte ``offset`` (and on to ``last``, inclusive: a Range read): a fill in windows takes their
        windows next (asked before the windows begin too); a sparse one adds its read-ahead past ``last``."""
        if offset < self.spec.size:
            last = offset if last is None else min(max(last, offset), self.spec.size - 1)
            if self.want is not None:
                self.want(offset, last)
            else:
                self.wanted.add((offset, last))

    def readable_at(self, position: int) -> int:
        """The end (exclusive) of the bytes from ``position`` a reader may take now; ``<= position``: none yet. The
        contiguous prefix, or, past it, the bytes a window has on disk from there (never the last byte before the
        whole file is verified, unless the fill is sparse).

        A sparse fill serves Ranges, and a Range cannot be checked whole by its client whatever byte it ends on: the
        window holding the file's last byte is readable as it lands (a parquet footer, a zip directory, the last
        xorb of a ranged Xet read), like every other window. Once the whole file is wanted the rule is back: a
        full download never gets its last byte before the blob is verified."""
        end = self.readable_end()
        if position < end or self.run_end is None:
            return end
        return min(self.run_end(position), self.spec.size if self.sparse else self.spec.size - 1)

    def readable_end(self) -> int:
        """Bytes a reader may take: all once verified; before, all but the last, which waits for verification.

        The last byte does not wait for the commit's fsync: the bytes in the page cache are the ones just hashed.
        """
        if self.verified or self.committed is not None:
            return self.spec.size
        return min(self.written, max(self.spec.size - 1, 0))

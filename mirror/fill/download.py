"""Downloading a blob from upstream into its partial file: resume, retry, verify, commit.

Size and hash (sha256 for LFS, git blob sha1 for regular files) are checked before the blob is committed; a
partial file a previous fill left is hashed and continued, and a signed CDN URL that expired is resolved again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from mirror.errors import IntegrityError
from mirror.fill.copy import Hashing, Span, copy, resume_offset
from mirror.fill.resume import SignedUrl, fetch
from mirror.fill.state import Fill
from mirror.fill.threads import FillThreads
from mirror.fill.windows import WindowedFill, in_windows
from mirror.integrity import BlobHasher
from mirror.layout import CacheLayout
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore
from mirror.upstream import FileBody, RangeIgnored, UpstreamClient

log = logging.getLogger("hf_mirror.fill")


async def download(fill: Fill, store: BlobStore, upstream: UpstreamClient, metrics: Metrics, threads: FillThreads,
                   chunk_size: int, room: Callable[[int], Awaitable[bool]] | None = None) -> None:
    """Fill ``fill`` from upstream (this process holds its lease), then commit the blob. ``room``: reserves disk for
    the rest of a sparse file before its completion policy fetches it (:class:`WindowedFill`).

    A file of at least ``parallel_fill_threshold`` bytes is fetched in concurrent windows (:mod:`windows`); an
    upstream that ignores bounded Ranges gets the single stream from the contiguous prefix instead. Both fetch by
    the one resume loop (:mod:`mirror.fill.resume`)."""
    spec = fill.spec
    partial = fill.partial
    settings = upstream.settings
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        hasher = BlobHasher(spec.etag, spec.size)
        offset = await asyncio.to_thread(resume_offset, fd, spec.size, hasher, chunk_size, partial)
        fill.advance(offset)
        if offset:
            log.info("resuming fill of %s at byte %d of %d", spec.path, offset, spec.size)
        url = SignedUrl(spec.cdn_url)
        if not (in_windows(settings, spec.size) and offset < spec.size):
            fill.windowed = False  # one stream (or nothing left to fetch)
        else:
            windows = WindowedFill(fill, fd, hasher, offset, upstream, metrics, threads,
                                   connections=settings.fill_connections, window=settings.fill_window,
                                   chunk_size=chunk_size, url=url, hedges=settings.fill_hedges,
                                   hedge_after=settings.fill_hedge_after, read_ahead=settings.sparse_read_ahead,
                                   complete_share=settings.sparse_complete_share,
                                   linger=settings.sparse_linger, room=room)
            try:
                await windows.run()
                offset = spec.size
            except RangeIgnored:
                offset = windows.hashed  # every worker has stopped: the file is cut back to the hashed prefix
                await asyncio.to_thread(os.ftruncate, fd, offset)
                for note in CacheLayout.notes(partial):  # contiguous again (a failure keeps them: see resume)
                    note.unlink(missing_ok=True)
                fill.advance(offset)
                log.info("upstream ignores Range for %s: one stream from byte %d", spec.path, offset)
        stream = Span(offset, spec.size, offset, bounded=False)
        hashing = Hashing(hasher, threads.hashes)

        async def copy_stream(file: FileBody) -> None:
            await copy(file.body, fd, stream, threads.streams, counter=metrics.bytes_fetched, block_size=chunk_size,
                       on_progress=fill.advance, rate=file.rate, hashing=hashing)

        await fetch(upstream, spec, stream, url, copy_stream)
        if not hasher.matches():
            metrics.integrity_failures.inc()
            os.ftruncate(fd, 0)
            partial.unlink(missing_ok=True)
            for note in CacheLayout.notes(partial):
                note.unlink(missing_ok=True)
            raise IntegrityError(f"{spec.repo.key} {spec.path}: content does not match etag {spec.etag}")
        fill.verify()
    finally:
        os.close(fd)
    committed = await store.commit(spec.etag, partial)
    for note in CacheLayout.notes(partial):  # after the partial file became the blob: see copy.write_prefix
        note.unlink(missing_ok=True)
    fill.finish(committed)
    log.info("committed %s %s (%d bytes) as %s", spec.repo.key, spec.path, spec.size, spec.etag)

"""The worker threads of the fills, and the one rule for running blocking work in them from the event loop.

The pools belong to the :class:`~mirror.fill.manager.FillManager`: created with it, shut down in its ``aclose``, so
a process (or a test) that builds and closes several managers leaves no thread pool behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class FillThreads:
    """The thread pools of one fill engine. Their sizes bound how much runs at once, as the fills were tuned for."""

    def __init__(self) -> None:
        # One thread per running single-stream fill (or copy from a peer node) ...
        self.streams = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fill-copy")
        # ... one per window in flight, and each parallel fill's hashing of its contiguous prefix ...
        self.windows = ThreadPoolExecutor(max_workers=256, thread_name_prefix="fill-window")
        # ... and the hashing of a single stream's blocks, beside the reads of the next block.
        self.hashes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fill-hash")

    def shutdown(self) -> None:
        """Let idle threads go. Not waited for: a thread still busy belongs to a fill that is being cancelled, and
        blocking the event loop on it would stall the shutdown it is part of."""
        for pool in (self.streams, self.windows, self.hashes):
            pool.shutdown(wait=False)


async def in_thread(pool: ThreadPoolExecutor, work: Callable[[threading.Event], None],
                    abort: Callable[[], None] | None = None) -> None:
    """Run ``work(stop)`` in ``pool`` and wait for it.

    The thread owns what it works on (a partial file's fd, a socket) until it returns, so it is never abandoned: on
    cancellation it is told to stop (``stop`` is set, ``abort`` wakes a blocking read), awaited, and its outcome taken
    (:func:`settle`); then the cancellation goes on.
    """
    stop = threading.Event()
    done = asyncio.wrap_future(pool.submit(work, stop))
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        if abort is not None:
            abort()
        await settle(done)
        raise


async def settle(done: asyncio.Future[None]) -> None:
    """Wait for a thread told to stop, and take its outcome: a read cut by ``abort`` fails by design, and an
    exception left unretrieved would be printed as a traceback when the loop closes (Ctrl-C of the sync)."""
    await asyncio.wait([done])
    if not done.cancelled():
        done.exception()

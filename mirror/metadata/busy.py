"""This process's blobs in use, as the fleet's evictions see them (``--metadata-url``).

A blob is *busy* while this process fills it (from upstream, a peer, or the shared store into its hot tier) or sends
it to a client. The data path only counts, in memory; a thread of its own publishes the set to the metadata store
(:meth:`mirror.metadata.base.MetadataStore.publish_busy`), with the read times of the blobs read since, so that
neither a request nor a slow event loop waits on the database:

- *A newly busy blob wakes the thread* (publications at most every ``_MIN_GAP`` seconds, batched); the set is
  renewed every third of the ttl, and a blob no longer busy leaves it at the next publication.
- *A copy from the shared store claims the blob first* (:meth:`claim`): it waits for a publication that carries its
  mark, which also says whether an eviction of the blob is under way; then the copy must not begin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator

from mirror.metadata.base import MetadataStore

log = logging.getLogger("hf_mirror.metadata")

_MIN_GAP = 0.05  # seconds between two publications: new marks within it go out together
_CLAIM_WAIT = 5.0  # a claim waits this long for its publication, then reads anyway (the database is down or slow)


class BusyMarks:
    def __init__(self, metadata: MetadataStore, ttl: float, node: str | None = None) -> None:
        self.metadata = metadata
        self.ttl = ttl
        self.interval = ttl / 3
        self.node = node or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._read: set[str] = set()
        self._published_any = False  # the database holds marks of ours (an empty set must then be published once)
        self._asked = 0  # bumped by every claim and newly busy blob: a publication covers what was asked before it
        self._claims: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[set[str] | None]]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the data path: counts only ---------------------------------------------------------------------------------

    def begin(self, etag: str) -> None:
        """``etag`` is read or filled here from now on (until :meth:`end`)."""
        with self._lock:
            count = self._counts.get(etag, 0)
            self._counts[etag] = count + 1
            self._read.add(etag)
            if count == 0:
                self._asked += 1
        if count == 0:
            self._start()
            self._wake.set()

    def end(self, etag: str) -> None:
        with self._lock:
            count = self._counts.get(etag, 0) - 1
            if count > 0:
                self._counts[etag] = count
            else:
                self._counts.pop(etag, None)  # unmarked at the next publication

    @contextlib.contextmanager
    def reading(self, etag: str) -> Iterator[None]:
        """A response sends the blob's bytes meanwhile."""
        self.begin(etag)
        try:
            yield
        finally:
            self.end(etag)

    def read(self, etag: str) -> None:
        """A read with no duration of its own (nginx sends the bytes): its time orders the fleet's quota."""
        with self._lock:
            self._read.add(etag)

    async def claim(self, etag: str) -> bool:
        """Before copying ``etag`` from the shared store (inside :meth:`begin`): wait until the fleet sees our mark.
        False when an eviction of it is under way (do not read the shared copy: it is going); True when it is
        ours to read, or when the database could not be asked within ``_CLAIM_WAIT`` (as a node on its own)."""
        loop = asyncio.get_running_loop()
        claim: asyncio.Future[set[str] | None] = loop.create_future()
        with self._lock:
            self._asked += 1
            self._claims.append((self._asked, loop, claim))
        self._start()
        self._wake.set()
        try:
            evicting = await asyncio.wait_for(asyncio.shield(claim), _CLAIM_WAIT)
        except TimeoutError:
            log.warning("the busy mark of %s was not published within %.0f s: reading it anyway", etag, _CLAIM_WAIT)
            return True
        return evicting is None or etag not in evicting

    # --- the thread -------------------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._publish_forever, name="busy-marks", daemon=True)
            self._thread.start()

    def _publish_forever(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            if self._stop.is_set():
                break
            gap = last + _MIN_GAP - time.monotonic()
            if gap > 0:
                time.sleep(gap)  # new marks arriving together go out together
            self._wake.clear()
            last = time.monotonic()
            self.publish()

    def publish(self) -> None:
        """One publication of this process's marks and reads (the thread's; a test may call it)."""
        with self._lock:
            busy = set(self._counts)
            read, self._read = self._read, set()
            asked = self._asked
            claims = [c for c in self._claims if c[0] <= asked]
            self._claims = [c for c in self._claims if c[0] > asked]
        evicting: set[str] | None = None
        if busy or read or self._published_any or claims:
            try:
                evicting = self.metadata.publish_busy(self.node, busy, read, self.ttl)
                self._published_any = bool(busy)
            except Exception as exc:  # noqa: BLE001 - the database is down or slow: marks lapse, evictions wait too
                log.warning("could not publish %d busy mark(s): %s", len(busy), exc)
                with self._lock:
                    self._read |= read
        for _, loop, claim in claims:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_settle, claim, evicting)

    async def aclose(self) -> None:
        """Stop the thread and take this process's marks back (else they lapse after the ttl)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)
            self._thread = None
        if self._published_any:
            try:
                await asyncio.to_thread(self.metadata.publish_busy, self.node, (), (), self.ttl)
            except Exception as exc:  # noqa: BLE001 - they lapse by themselves
                log.info("busy marks not taken back at shutdown: %s", exc)
            self._published_any = False


def _settle(claim: asyncio.Future[set[str] | None], evicting: set[str] | None) -> None:
    if not claim.done():
        claim.set_result(evicting)

"""Fill leases granted by the metadata store, for the nodes of a fleet (``--metadata-url`` with ``--storage s3``).

It takes the place of the bucket's lease objects (:mod:`mirror.storage.s3.leases`) in the S3 store:

- *Grants, expiry and takeovers are the database's*: its clock decides, and each new holder gets a larger epoch.
- *Renewal runs in a thread of its own* on its own connection, every third of the ttl, so a busy event loop (or a
  slow data path) cannot make a lease lapse.
- *A holder that cannot renew stops*: when a renewal finds the lease gone, or renewals fail until less than one
  renewal interval is left before the lease could lapse, :meth:`lost` fires and the fill engine cancels the
  download, before another node can be granted the lease.
- *The commit is fenced*: the bucket upload completes only inside :meth:`fence`, which the store accepts only under
  the current epoch; a holder frozen past its lease (SIGSTOP) and resumed commits nothing.
- *Followers are told*: :meth:`watch` wakes them at a grant, release or commit anywhere in the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from mirror.errors import LeaseLost
from mirror.metadata.announce import Subscription
from mirror.metadata.base import HeldLease, MetadataStore
from mirror.storage.base import Lease, PeerAddress

log = logging.getLogger("hf_mirror.fill")


@dataclass
class _Held:
    owner: str
    epoch: int
    deadline: float  # monotonic: the lease cannot have lapsed before this (measured from before the last grant)
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class FleetLeases:
    rechecks_blob = False  # the store checks the bucket after a grant (the bucket's leases do it themselves)

    def __init__(self, metadata: MetadataStore, ttl: float) -> None:
        self.metadata = metadata
        self.ttl = ttl
        self.interval = ttl / 3
        self.held: dict[str, _Held] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    async def acquire(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        held = self.held.get(etag)
        if held is not None and not held.lost.is_set():
            return held.owner == owner
        self.held.pop(etag, None)
        sent = time.monotonic()
        epoch = await self.metadata.acquire_lease(etag, owner, self.ttl, peer)
        if epoch is None:
            return False
        self.held[etag] = _Held(owner, epoch, sent + self.ttl)
        self._start_renewing()
        return True

    async def refresh(self, etag: str, owner: str, ttl: float) -> bool:
        held = self.held.get(etag)
        if held is None or held.owner != owner or held.lost.is_set():
            return False
        sent = time.monotonic()
        kept = await asyncio.to_thread(self.metadata.renew_leases, [HeldLease(etag, owner, held.epoch)], self.ttl)
        if etag in kept:
            held.deadline = sent + self.ttl
            return True
        held.lost.set()
        return False

    async def release(self, etag: str, owner: str) -> None:
        held = self.held.get(etag)
        if held is None or held.owner != owner:
            return
        del self.held[etag]
        await self.metadata.release_lease(etag, owner, held.epoch)

    async def read(self, etag: str) -> Lease | None:
        record = await self.metadata.read_lease(etag)
        if record is None:
            return None
        return Lease(etag, record.owner, time.time() + record.remaining, record.peer)

    def lost(self, etag: str) -> asyncio.Event | None:
        """Set when this process no longer holds ``etag``'s lease; None when it does not hold it."""
        held = self.held.get(etag)
        return held.lost if held is not None else None

    def fence(self, etag: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The commit of ``etag`` runs inside this: only under the epoch this process holds, if it is current."""
        held = self.held.get(etag)
        if held is None:
            # Not a fill under a lease (``cache import`` commits what it verified itself): nothing to fence.
            return contextlib.nullcontext()
        if held.lost.is_set():
            raise LeaseLost(f"the fill lease of {etag} was lost (epoch {held.epoch})")
        return self.metadata.fence(etag, held.owner, held.epoch)

    def watch(self, etag: str) -> contextlib.AbstractAsyncContextManager[Subscription]:
        return self.metadata.changed(etag)

    async def aclose(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.interval + 5)
            self._thread = None

    # --- the renewal thread -----------------------------------------------------------------------------------------

    def _start_renewing(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_forever, name="fill-lease-renewal", daemon=True)
        self._thread.start()

    def _renew_forever(self) -> None:
        while not self._stop.wait(self.interval):
            snapshot = [(etag, held) for etag, held in list(self.held.items()) if not held.lost.is_set()]
            if snapshot:
                self._renew(snapshot)

    def _renew(self, snapshot: list[tuple[str, _Held]]) -> None:
        sent = time.monotonic()
        try:
            kept: set[str] | None = self.metadata.renew_leases(
                [HeldLease(etag, held.owner, held.epoch) for etag, held in snapshot], self.ttl)
        except Exception as exc:  # noqa: BLE001 - the database is down or slow: the deadline decides below
            log.warning("could not renew %d fill lease(s): %s", len(snapshot), exc)
            kept = None
        for etag, held in snapshot:
            if kept is not None and etag in kept:
                held.deadline = sent + self.ttl
            elif kept is not None:
                self._lose(etag, held, "another node holds it now")
            elif time.monotonic() + self.interval >= held.deadline:
                # The next try could come too late: stop now, before the database may grant it to another node.
                self._lose(etag, held, "it could not be renewed")

    def _lose(self, etag: str, held: _Held, why: str) -> None:
        log.warning("lost the fill lease of %s (epoch %d): %s; this node stops fetching it", etag, held.epoch, why)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(held.lost.set)

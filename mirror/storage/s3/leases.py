"""Fill leases in the bucket: one node fills a blob, the others follow (``<prefix>leases/<etag>``, JSON
``{owner, ttl, host, pid, refreshed, peer}``).

- *Leases are objects written with conditional puts.* ``If-None-Match: *`` creates a lease only when none exists;
  ``If-Match: <etag>`` replaces exactly the version that was read (a refresh by the owner, or a takeover of an
  expired lease). The store arbitrates, so exactly one node wins without any coordinator of our own, as far as the
  store keeps its word: one that lets two win (SeaweedFS has been seen to) costs a second upstream download, never
  wrong bytes; the commit does not rely on these writes (see :meth:`Bucket.put_blob`). A fleet database
  (``--metadata-url``) takes their place.
- *Lease expiry is measured on the store's clock*: a lease is expired when the server's ``Date`` is more than
  ``ttl`` past the object's ``Last-Modified``. Node clocks may disagree; only the server's is compared with itself.
- *The holder refreshes its lease in the background* (every ``ttl/3``) for as long as it holds it, so a long fill
  keeps its lease and a dead node's (``kill -9``, lost host) lapses after ``ttl``.
- *Acquiring re-checks the blob*: between a caller's ``stat`` and its lease, another node may have committed and
  released. A lease won for a blob that already exists is given back at once and ``False`` is returned, so the
  caller follows (and finds the blob) instead of downloading it from upstream a second time.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from botocore.exceptions import ClientError

from mirror.storage.base import Lease, PeerAddress
from mirror.storage.s3.bucket import Bucket
from mirror.storage.s3.errors import http_status

log = logging.getLogger("hf_mirror.storage.s3")


class FillLeases(Protocol):
    """What the S3 store needs of its fill leases: the bucket's own (:class:`Leases`), or a fleet database's
    (:class:`mirror.metadata.fleet_leases.FleetLeases`, with fencing, notifications and a renewal thread)."""

    held: dict[str, Any]  # etag -> a lease this process holds (with its ``owner``)
    rechecks_blob: bool  # whether ``acquire`` itself gives back a lease won for a blob already committed

    async def acquire(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool: ...

    async def refresh(self, etag: str, owner: str, ttl: float) -> bool: ...

    async def release(self, etag: str, owner: str) -> None: ...

    async def read(self, etag: str) -> Lease | None: ...

    # Subscribes to changes of a lease anywhere in the fleet; None: followers poll the lease.
    watch: Callable[[str], AbstractAsyncContextManager[Any]] | None

    def lost(self, etag: str) -> asyncio.Event | None:
        """Set when this process loses a lease it holds; None where a held lease cannot be lost mid-fill."""
        ...

    # What the commit's last step runs inside (``fence(etag)``: only under the current holder); None: no fence.
    fence: Callable[[str], AbstractAsyncContextManager[None]] | None

    async def aclose(self) -> None: ...


class HeldLease:
    """A lease this process holds: its owner, ttl, the S3 ETag of our lease object, and its refresher task."""

    def __init__(self, owner: str, ttl: float, lease_etag: str, peer: PeerAddress | None) -> None:
        self.owner = owner
        self.ttl = ttl
        self.lease_etag = lease_etag
        self.peer = peer
        self.task: asyncio.Task[None] | None = None


class Leases:
    rechecks_blob = True
    watch = None  # the bucket has no notifications: followers poll the lease object

    def lost(self, etag: str) -> asyncio.Event | None:
        return None  # a lapsed lease object is noticed at its next refresh, which stops the fill

    fence = None  # the bucket's conditional writes decide; the commit is not fenced

    async def aclose(self) -> None:
        """The refresher tasks end with the fills that hold their leases: nothing of its own to close."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self.held: dict[str, HeldLease] = {}  # etag -> the lease this process holds

    async def acquire(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        held = self.held.get(etag)
        if held is not None and held.owner == owner:
            return True
        if held is not None:
            return False  # another owner of this very process holds it
        client = await self.bucket.client()
        key = self.bucket.lease_key(etag)
        for _ in range(3):  # a lease deleted between our failed create and our read: try again
            try:
                put = await client.put_object(Bucket=self.bucket.name, Key=key, Body=_lease_body(owner, ttl, peer),
                                              IfNoneMatch="*", ContentType="application/json")
            except ClientError as exc:
                if http_status(exc) not in (409, 412):
                    raise
            else:
                return await self._won(etag, owner, ttl, put["ETag"], peer)
            current = await self._read_object(etag)
            if current is None:
                continue
            record, lease_etag, remaining = current
            if record.get("owner") == owner:  # ours from before (e.g. an earlier call of this owner): keep it
                replaced = await self._conditional_replace(etag, owner, ttl, lease_etag, peer)
                return replaced is not None and await self._won(etag, owner, ttl, replaced, peer)
            if remaining > 0:
                return False
            # Expired: take it over. If-Match on the version we read makes exactly one contender win.
            replaced = await self._conditional_replace(etag, owner, ttl, lease_etag, peer)
            if replaced is None:
                return False
            log.info("took over the expired fill lease of %s from %s", etag, record.get("owner", "?"))
            return await self._won(etag, owner, ttl, replaced, peer)
        return False

    async def _won(self, etag: str, owner: str, ttl: float, lease_etag: str, peer: PeerAddress | None) -> bool:
        held = HeldLease(owner, ttl, lease_etag, peer)
        self.held[etag] = held
        client = await self.bucket.client()
        try:
            await client.head_object(Bucket=self.bucket.name, Key=self.bucket.blob_key(etag))
        except ClientError as exc:
            if http_status(exc) != 404:
                await self.release(etag, owner)
                raise
        else:
            # Committed by another node between the caller's stat and our lease: no fill is needed.
            await self.release(etag, owner)
            return False
        held.task = asyncio.create_task(self._keep_alive(etag, held), name=f"lease:{etag[:12]}")
        return True

    async def _conditional_replace(self, etag: str, owner: str, ttl: float, lease_etag: str,
                                   peer: PeerAddress | None) -> str | None:
        """Write our lease over exactly version ``lease_etag``; the new version's ETag, or None if it changed."""
        client = await self.bucket.client()
        try:
            put = await client.put_object(Bucket=self.bucket.name, Key=self.bucket.lease_key(etag),
                                          Body=_lease_body(owner, ttl, peer), IfMatch=lease_etag,
                                          ContentType="application/json")
        except ClientError as exc:
            if http_status(exc) in (404, 409, 412):
                return None
            raise
        return str(put["ETag"])

    async def _keep_alive(self, etag: str, held: HeldLease) -> None:
        interval = max(held.ttl / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self._refresh(etag, held):
                    log.warning("lost the fill lease of %s (another node took it over)", etag)
                    if self.held.get(etag) is held:
                        del self.held[etag]
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store hiccup: try again next tick, the ttl has slack
                log.warning("could not refresh the fill lease of %s: %s", etag, exc)

    async def _refresh(self, etag: str, held: HeldLease) -> bool:
        replaced = await self._conditional_replace(etag, held.owner, held.ttl, held.lease_etag, held.peer)
        if replaced is None:
            return False
        held.lease_etag = replaced
        return True

    async def refresh(self, etag: str, owner: str, ttl: float) -> bool:
        held = self.held.get(etag)
        if held is None or held.owner != owner:
            return False
        held.ttl = ttl
        if await self._refresh(etag, held):
            return True
        self.held.pop(etag, None)
        if held.task is not None:
            held.task.cancel()
        return False

    async def release(self, etag: str, owner: str) -> None:
        held = self.held.get(etag)
        if held is None or held.owner != owner:
            return
        del self.held[etag]
        if held.task is not None and held.task is not asyncio.current_task():
            held.task.cancel()
        client = await self.bucket.client()
        key = self.bucket.lease_key(etag)
        try:
            # Delete only our version: if another node took the lease over meanwhile, it keeps it.
            await client.delete_object(Bucket=self.bucket.name, Key=key, IfMatch=held.lease_etag)
        except ClientError as exc:
            status = http_status(exc)
            if status in (404, 412):
                return
            if status not in (400, 501):
                raise
            # The store does not do conditional deletes: check the owner, then delete (a narrow race, and a lease
            # lost this way only costs a duplicate upstream download, never wrong bytes).
            current = await self._read_object(etag)
            if current is not None and current[0].get("owner") == owner:
                await client.delete_object(Bucket=self.bucket.name, Key=key)

    async def read(self, etag: str) -> Lease | None:
        """The live lease of ``etag``, or None when there is none or it has expired (it is free to take)."""
        current = await self._read_object(etag)
        if current is None:
            return None
        record, _, remaining = current
        if remaining <= 0:
            return None
        peer = record.get("peer")
        address = (PeerAddress(str(peer.get("url", "")), str(peer.get("token", "")))
                   if isinstance(peer, dict) and peer.get("url") else None)
        return Lease(etag, str(record.get("owner", "?")), time.time() + remaining, address)

    async def _read_object(self, etag: str) -> tuple[dict[str, Any], str, float] | None:
        """(record, object ETag, seconds left on the store's clock), or None when there is no lease object."""
        client = await self.bucket.client()
        try:
            response = await client.get_object(Bucket=self.bucket.name, Key=self.bucket.lease_key(etag))
        except ClientError as exc:
            if http_status(exc) == 404:
                return None
            raise
        body = response["Body"]
        try:
            raw = await body.read()
        finally:
            body.close()
        try:
            record = json.loads(raw or b"{}")
        except ValueError:
            record = {}
        ttl = float(record.get("ttl", 0) or 0)
        server_now = _server_date(response) or time.time()
        remaining = response["LastModified"].timestamp() + ttl - server_now
        return record, str(response["ETag"]), remaining


def _lease_body(owner: str, ttl: float, peer: PeerAddress | None) -> bytes:
    now = time.time()
    # "refreshed" makes every write distinct, so each version has its own ETag for If-Match.
    record: dict[str, Any] = {"owner": owner, "ttl": ttl, "host": socket.gethostname(), "pid": os.getpid(),
                              "refreshed": now, "nonce": uuid.uuid4().hex[:8]}
    if peer is not None:
        # Whoever can read the bucket's leases can read its blobs too: the token opens nothing more than that.
        record["peer"] = {"url": peer.url, "token": peer.token}
    return json.dumps(record).encode()


def _server_date(response: dict[str, Any]) -> float | None:
    raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not raw:
        return None
    try:
        return email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None

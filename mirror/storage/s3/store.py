"""The S3 blob store: a :class:`mirror.storage.base.BlobStore` over a shared bucket, with this node's hot tier in
front and fill leases in the bucket.

- *Committing is an upload of a blob not in the bucket yet*: looked for before the upload and again right before a
  multipart completion (inside the fleet database's fence, under the current epoch, when there is one); a blob is
  written once, and enters the hot tier.
- *Bytes fetched from the bucket are hashed against the etag* before they enter the hot tier.
- *A local fault never destroys the shared copy*: :meth:`drop_local` removes only this node's hot-tier copy, and
  :meth:`verify_shared` hashes the bucket object itself (streamed, never entering the hot tier) before anything
  deletes it.
- *Fills in progress stay local* (``<cache_dir>/partials/<etag>.part``); other nodes stream them from this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from mirror.errors import IntegrityError, LeaseLost, MirrorError
from mirror.integrity import BlobHasher
from mirror.layout import CacheLayout, blob_name
from mirror.storage.base import BlobInfo, CopyProgress, Lease, PeerAddress
from mirror.storage.s3.bucket import Bucket
from mirror.storage.s3.errors import storage_errors
from mirror.storage.s3.hot_tier import HotTier
from mirror.storage.s3.leases import FillLeases, Leases

log = logging.getLogger("hf_mirror.storage.s3")

_READ_CHUNK = 4 * 1024 * 1024


class S3BlobStore:
    has_hot_tier = True  # this node's copies of bucket objects: a fault in one is this node's alone

    def __init__(self, layout: CacheLayout, *, bucket: str, prefix: str = "", endpoint: str | None = None,
                 region: str = "us-east-1", hot_tier_max_size: int | None = None, max_attempts: int = 3,
                 leases: FillLeases | None = None) -> None:
        self.layout = layout
        self.root = layout.root
        self.bucket = bucket
        self.prefix = (prefix.strip("/") + "/") if prefix.strip("/") else ""
        self.endpoint = endpoint
        self.region = region
        self.hot_tier_max_size = hot_tier_max_size or None
        # Few attempts: a request waits on the store, so an outage should surface as a 503 in seconds, not minutes.
        self.max_attempts = max_attempts
        self.objects = Bucket(bucket, prefix=self.prefix, endpoint=endpoint, region=region, max_attempts=max_attempts)
        self.hot_tier = HotTier(layout, max_size=self.hot_tier_max_size)
        # The bucket's lease objects, unless a fleet database grants the leases (--metadata-url): then the commit is
        # fenced by it, and followers are told of changes instead of polling.
        self.leases: FillLeases = leases if leases is not None else Leases(self.objects)
        self.watch_lease = self.leases.watch
        self.blobs_dir = self.hot_tier.blobs_dir
        self.partials_dir = layout.partials_dir  # always local: other nodes stream a fill from here
        self.tmp_dir = self.hot_tier.tmp_dir
        for folder in (self.blobs_dir, self.partials_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._hot_fetches: dict[str, asyncio.Task[Path | None]] = {}

    async def open(self) -> None:
        """Connect and check the bucket, so a wrong endpoint, bucket or credential fails at startup, not mid-request."""
        await self.objects.check()
        self.hot_tier.sweep_tmp()

    async def aclose(self) -> None:
        for etag in list(self.leases.held):
            held = self.leases.held.get(etag)
            if held is not None:
                try:
                    await self.release_lease(etag, held.owner)
                except MirrorError as exc:  # the lease then lapses after its ttl
                    log.warning("could not release the fill lease of %s: %s", etag, exc)
        await self.leases.aclose()  # a fleet database's: its renewal thread
        await self.objects.aclose()

    # --- blobs ------------------------------------------------------------------------------------------------------

    def blob_path(self, etag: str) -> Path:
        """The hot-tier path of a blob (it may not be there: see :meth:`local_path`)."""
        return self.hot_tier.path(etag)

    def relative_blob_path(self, etag: str) -> str:
        return blob_name(etag)

    @storage_errors
    async def stat(self, etag: str) -> BlobInfo | None:
        # Only committed blobs ever enter the hot tier, so a hot copy answers without a round trip.
        info = self.hot_tier.info(etag)
        if info is not None:
            return info
        return await self.objects.head_blob(etag)

    def cached_path(self, etag: str) -> Path | None:
        info = self.hot_tier.info(etag)
        if info is None:
            return None
        path = self.blob_path(etag)
        self.hot_tier.touch(path, info.last_access)
        return path

    @storage_errors
    async def local_path(self, etag: str, progress: CopyProgress | None = None) -> Path | None:
        path = self.cached_path(etag)
        if path is not None:
            return path
        # One download per blob in this process; shielded, so a client that hangs up does not cancel it for others.
        task = self._hot_fetches.get(etag)
        if task is None:
            task = asyncio.create_task(self._fetch_to_hot(etag, progress), name=f"hot:{etag[:12]}")
            self._hot_fetches[etag] = task
            task.add_done_callback(lambda _t: self._hot_fetches.pop(etag, None))
        return await asyncio.shield(task)

    async def _fetch_to_hot(self, etag: str, progress: CopyProgress | None) -> Path | None:
        """Copy a bucket blob into the hot tier, hashed against its etag on the way."""
        if self.blob_path(etag).exists():  # another worker process on this host fetched it meanwhile
            return self.blob_path(etag)
        response = await self.objects.get_blob(etag)
        if response is None:
            return None
        size = int(response["ContentLength"])
        hasher = BlobHasher(etag, size)
        tmp = self.hot_tier.tmp_path(etag)
        with self.hot_tier.entering(etag):
            try:
                received = 0
                with open(tmp, "wb", buffering=0) as f:  # unbuffered: what progress reports is in the file
                    body = response["Body"]
                    try:
                        while chunk := await body.read(_READ_CHUNK):
                            await asyncio.to_thread(_write_fully, f, chunk)
                            hasher.update(chunk)
                            received += len(chunk)
                            if progress is not None:
                                progress(tmp, received)
                    finally:
                        body.close()
                if received != size or not hasher.matches():
                    raise IntegrityError(f"bucket object for blob {etag} does not match its etag "
                                         f"({received} of {size} bytes read)")
                return await self.hot_tier.enter(etag, tmp, size)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()

    def partial_path(self, etag: str) -> Path:
        return self.layout.partial(etag)

    @storage_errors
    async def commit(self, etag: str, partial: Path) -> Path:
        size = os.stat(partial).st_size
        lost = self.leases.lost(etag)
        if lost is not None and lost.is_set():  # do not even upload the parts
            raise LeaseLost(f"the fill lease of {etag} was lost before its commit")
        fencing = self.leases.fence
        fence = (lambda: fencing(etag)) if fencing is not None else None
        with self.hot_tier.entering(etag):
            if not await self.objects.put_blob(etag, partial, size, fence=fence):
                log.info("blob %s was in the bucket already: this node's upload of it was discarded", etag)
            return await self.hot_tier.enter(etag, partial, size)

    async def adopt(self, etag: str, copy: Path) -> Path | None:
        info = await self.stat(etag)
        if info is None:
            return None
        if self.blob_path(etag).exists() or os.stat(copy).st_size != info.size:
            copy.unlink(missing_ok=True)
            return await self.local_path(etag)
        with self.hot_tier.entering(etag):
            return await self.hot_tier.enter(etag, copy, info.size)

    @storage_errors
    async def delete(self, etag: str) -> bool:
        """Remove the blob from the bucket (every node) and from this node's hot tier."""
        existed = self.hot_tier.remove(etag)
        return await self.objects.delete_blob(etag) or existed

    def drop_local(self, etag: str) -> bool:
        """Drop this node's hot-tier copy only: the bucket object is the fleet's, and is checked on its own."""
        return self.hot_tier.remove(etag)

    @storage_errors
    async def verify_shared(self, etag: str, pace: Callable[[int], None] | None = None) -> bool | None:
        """Hash the bucket object against its etag as it streams by (nothing is written to this disk)."""
        response = await self.objects.get_blob(etag)
        if response is None:
            return None
        size = int(response["ContentLength"])
        hasher = BlobHasher(etag, size)
        received = 0
        body = response["Body"]
        try:
            while chunk := await body.read(_READ_CHUNK):
                await asyncio.to_thread(_hash_block, hasher, chunk, pace)  # the pace sleeps: not on the loop
                received += len(chunk)
        finally:
            body.close()
        return received == size and hasher.matches()

    def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob in the bucket (last access is the commit time: S3 keeps no read times)."""
        return self.objects.list_blobs()

    async def touch(self, etag: str) -> None:
        info = self.hot_tier.info(etag)
        if info is not None:
            self.hot_tier.touch(self.blob_path(etag), info.last_access)

    def hot_tier_usage(self) -> tuple[int, int]:
        """(bytes, blobs) in this node's hot tier."""
        return self.hot_tier.usage()

    # --- leases -----------------------------------------------------------------------------------------------------

    @storage_errors
    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        if not await self.leases.acquire(etag, owner, ttl, peer):
            return False
        if not self.leases.rechecks_blob and await self.objects.head_blob(etag) is not None:
            # Committed by another node between the caller's stat and our grant: no fill is needed.
            await self.leases.release(etag, owner)
            return False
        return True

    @storage_errors
    async def refresh_lease(self, etag: str, owner: str, ttl: float) -> bool:
        return await self.leases.refresh(etag, owner, ttl)

    @storage_errors
    async def release_lease(self, etag: str, owner: str) -> None:
        await self.leases.release(etag, owner)

    def lease_lost(self, etag: str) -> asyncio.Event | None:
        return self.leases.lost(etag)

    def lease_held(self, etag: str) -> bool:
        return False  # the bucket's leases are the fleet's: gc's own rules decide (no per-host lock)

    @storage_errors
    async def read_lease(self, etag: str) -> Lease | None:
        return await self.leases.read(etag)


def _hash_block(hasher: BlobHasher, block: bytes, pace: Callable[[int], None] | None) -> None:
    hasher.update(block)
    if pace is not None:
        pace(len(block))


def _write_fully(f: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[f.write(view):]

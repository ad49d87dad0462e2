"""The storage interface: a content-addressed blob store with partial files and fill leases.

Blobs are named by the Hub's etag (sha256 hex for LFS files, git blob sha1 hex for regular files) and are immutable
once committed. A fill writes into ``partial_path(etag)`` (always a local file: it is also what followers read while
the fill runs) and publishes with ``commit``, which must be atomic: a reader sees either no blob or the whole blob.

Where the blobs are shared (S3), a node also keeps its own copies (a hot tier). *A local fault never destroys the
shared copy*: a local copy that fails its check is dropped (``drop_local``), and the shared copy is deleted only when
it fails a check of its own (``verify_shared``); :func:`discard_bad_copy` is that rule, for every caller.

A lease makes one fill per blob across processes (and, for shared backends, across nodes). A lease has an owner id
and an expiry; the owner refreshes it while it works, and anyone may take over an expired lease.

Every backend passes the contract suite in ``tests/contract/test_storage_contract.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class BlobInfo:
    etag: str
    size: int
    last_access: float  # unix time of the last read (or of the commit)


@dataclass(frozen=True)
class PeerAddress:
    """Where the holder of a lease streams its fill in progress to other nodes, and the token that opens it."""

    url: str
    token: str


@dataclass(frozen=True)
class Lease:
    etag: str
    owner: str
    expires: float
    peer: PeerAddress | None = None


CopyProgress = Callable[[Path, int], None]


@runtime_checkable
class BlobStore(Protocol):
    partials_dir: Path  # this node's partial files (fills in progress), whichever store holds the blobs
    # This node keeps copies of its own beside the shared blobs (S3's hot tier): a bad one is a local fault, and the
    # shared copy is checked on its own. False where this node's file is the stored blob itself (local).
    has_hot_tier: bool
    # Subscribes to changes of ``etag``'s lease anywhere (``async with watch_lease(etag) as change``), so followers
    # are told instead of polling; None where the store has no notifications (followers poll the lease).
    watch_lease: Callable[[str], AbstractAsyncContextManager[Any]] | None

    async def open(self) -> None:
        """Connect and check: a remote store fails here, at startup, on a wrong endpoint, bucket or credential."""
        ...

    async def aclose(self) -> None:
        """Give back the fill leases this process holds, then close connections."""
        ...

    def lease_held(self, etag: str) -> bool:
        """Another process of this host holds ``etag``'s fill lease (gc and ``cache rm`` leave the blob alone);
        False where leases are not kept per host."""
        ...

    def lease_lost(self, etag: str) -> asyncio.Event | None:
        """Set when this process loses the fill lease it holds on ``etag`` (then it stops fetching and commits
        nothing); None where a held lease cannot be lost mid-fill."""
        ...

    async def stat(self, etag: str) -> BlobInfo | None:
        """The committed blob's info, or ``None`` when it is not (yet) in the store."""
        ...

    def cached_path(self, etag: str) -> Path | None:
        """The committed blob's file on this node's disk now, or ``None``; never fetches. Counts as a read."""
        ...

    async def local_path(self, etag: str, progress: CopyProgress | None = None) -> Path | None:
        """A local file holding the whole committed blob (fetched into a hot tier if the backend is remote).

        While a remote blob is being copied in, ``progress(file, bytes)`` reports the file it is copied into and
        how much of it is written, so that readers can follow the copy instead of waiting for all of it.
        """
        ...

    def partial_path(self, etag: str) -> Path:
        """Where a fill of ``etag`` writes; the directory exists."""
        ...

    async def commit(self, etag: str, partial: Path) -> Path:
        """Publish a verified partial file as the blob, atomically; returns the blob's local path."""
        ...

    async def adopt(self, etag: str, copy: Path) -> Path | None:
        """Keep ``copy``, a local file verified against ``etag``, as this node's file of the committed blob (instead
        of fetching the blob from the store again); ``None``, and ``copy`` left alone, when it is not committed."""
        ...

    async def delete(self, etag: str) -> bool:
        """Remove a committed blob, the shared copy included (every node); True when it existed."""
        ...

    def drop_local(self, etag: str) -> bool:
        """Remove this node's own copy of the blob, leaving the shared copy alone (a copy that failed its check, or
        one of a blob another node evicted); True when one was removed. False, and nothing removed, where this
        node's file *is* the stored blob (``has_hot_tier`` is False). Readers holding the file keep it."""
        ...

    async def verify_shared(self, etag: str, pace: Callable[[int], None] | None = None) -> bool | None:
        """Hash the shared copy of the blob (the one every node reads: the bucket object, or the file on the local
        backend) against its etag: True when it matches, False when it does not, None when there is no such blob.
        Nothing enters a hot tier. ``pace(n)`` is called in a worker thread after each block read (the scrub's
        rate limit)."""
        ...

    def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every committed blob."""
        ...

    async def touch(self, etag: str) -> None:
        """Record a read, for LRU eviction."""
        ...

    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        """Take the fill lease of ``etag`` for ``ttl`` seconds: True if free, expired, or already ours.

        ``peer`` is published in the lease (shared backends) so that other nodes can stream the fill from us.
        """
        ...

    async def refresh_lease(self, etag: str, owner: str, ttl: float) -> bool:
        """Extend our lease; False if we lost it."""
        ...

    async def release_lease(self, etag: str, owner: str) -> None:
        ...

    async def read_lease(self, etag: str) -> Lease | None:
        ...


@dataclass(frozen=True)
class Discarded:
    """What :func:`discard_bad_copy` removed."""

    local: bool  # this node's own copy (the shared copy passed its own check, or was not checked)
    shared: bool  # the shared copy, which failed its own check (every node fetches the blob again)


async def discard_bad_copy(store: BlobStore, etag: str, *, check_shared: bool = True,
                           pace: Callable[[int], None] | None = None) -> Discarded:
    """This node's file of ``etag`` failed its check: drop it. The shared copy is deleted only when it fails a check
    of its own (``check_shared=False`` leaves it to the next copy from it, which is hashed on its way in), or when
    this node's file was the shared copy (the local backend)."""
    if not store.has_hot_tier:  # this node's file is the stored blob: it is the one that failed
        return Discarded(local=False, shared=await store.delete(etag))
    dropped = store.drop_local(etag)
    if check_shared and await store.verify_shared(etag, pace) is False:
        return Discarded(local=dropped, shared=await store.delete(etag))
    return Discarded(local=dropped, shared=False)

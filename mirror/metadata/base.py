"""The metadata store: what the nodes of a fleet must agree on, behind one interface.

Two implementations pass the one contract suite (``tests/contract/test_metadata_contract.py``):

- :class:`mirror.metadata.embedded.EmbeddedMetadata`, the default: this node's index (refs, pins) and a lease table
  beside it on local disk. One node, no server to run.
- :class:`mirror.metadata.postgres.PostgresMetadata` (``--metadata-url postgresql://...``): one database for the
  fleet. Leases are decided by the database's clock and carry a fencing epoch; changes are announced by
  ``LISTEN``/``NOTIFY``.

Beside refs, files, access confirmations and pins, the fleet shares what upstream answered on the API routes (API JSON,
tree listings, the route table's reads: :class:`AnswerRecord`), the Xet hashes upstream named (:class:`XetRecord`) and
named secrets generated once for the fleet (the Xet signing key), and the warm jobs running (one per warm, whichever
node is asked).

A *fill lease* names the one process that downloads a blob. It has an ``epoch`` that grows at every grant to a new
holder; only the holder of the current epoch may commit (:meth:`MetadataStore.fence`), so a holder that was frozen
past its lease and resumes commits nothing.

*Busy marks* name the blobs each process of the fleet reads or fills now (published in batches by a thread,
:mod:`mirror.metadata.busy`, with the store's clock and an expiry), and the fleet's read times order its quota. An
*eviction* is decided for the fleet in one transaction (:meth:`MetadataStore.decide_eviction`): it skips every blob
pinned anywhere, busy on any node, leased for a fill or being evicted by another node, and records the eviction
as under way; a node about to copy a blob from the shared store publishes its mark first and learns from that same
publication whether an eviction of it is under way. Once the blobs are deleted, :meth:`finish_eviction` tells every
node (:meth:`on_evicted`) to drop its own copies (a hot tier).

*Held windows* name the nodes whose sparse partial file holds windows of a blob that no fill leases now (a sparse
fill that paused, :mod:`mirror.metadata.held`): another node asks that node for a Range they cover, with the token
the record carries, instead of asking upstream again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mirror.hf import RepoRef
from mirror.index import ApiEntry, FileEntry
from mirror.metadata.announce import Subscription
from mirror.storage.base import BlobInfo, PeerAddress

# An eviction decided this many seconds ago and not finished is void: its evictor died or froze, and the blobs it
# chose are read and evicted again as any others (an evictor stops deleting well before: EVICTION_DELETE_WINDOW).
EVICTION_GRACE = 120.0
EVICTION_DELETE_WINDOW = EVICTION_GRACE / 2


@dataclass(frozen=True)
class RefRecord:
    """Where a branch or tag pointed, and how many seconds ago (by the store's clock) that was learnt."""

    commit: str
    age: float


@dataclass(frozen=True)
class AnswerRecord:
    """A stored upstream answer (its ``fetched_at`` is the storing node's) and its age by the store's clock."""

    entry: ApiEntry
    age: float


@dataclass(frozen=True)
class XetRecord:
    """Upstream said ``path`` at ``commit`` is Xet file ``xet_hash``, whose LFS blob is ``etag`` (``size`` bytes)."""

    commit: str
    path: str
    xet_hash: str
    etag: str
    size: int


@dataclass(frozen=True)
class LeaseRecord:
    """A live fill lease: who holds it, under which epoch, for how many more seconds (the store's clock)."""

    etag: str
    owner: str
    epoch: int
    remaining: float
    peer: PeerAddress | None = None


@dataclass(frozen=True)
class HeldLease:
    """A lease this process holds, as the renewal thread renews it."""

    etag: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class WindowsRecord:
    """The node at ``peer.url`` holds the spans ``held`` (``[start, done)``) of blob ``etag`` in its sparse partial
    file; its peer route serves a Range of them to whoever sends ``peer.token``."""

    etag: str
    peer: PeerAddress
    held: tuple[tuple[int, int], ...]


@runtime_checkable
class MetadataStore(Protocol):
    async def open(self) -> None:
        """Connect and apply the schema's migrations (a wrong URL or credential fails here, at startup)."""
        ...

    async def aclose(self) -> None:
        ...

    # --- refs: branch or tag -> commit ------------------------------------------------------------------------------

    async def get_ref(self, repo: RepoRef, revision: str) -> RefRecord | None:
        ...

    async def put_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        ...

    # --- files: (repo, commit, path) -> blob etag and size (or a remembered 404) ----------------------------------

    async def get_file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        ...

    async def put_file(self, repo: RepoRef, entry: FileEntry) -> None:
        ...

    # --- access confirmations: (token digest or "public", kind, repo) -> allowed, how long ago ---------------------

    async def get_access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        """(allowed, seconds since it was confirmed, by the store's clock). ``subject`` is a token's digest, never
        a token."""
        ...

    async def put_access(self, subject: str, kind: str, repo: RepoRef, allowed: bool) -> None:
        ...

    # --- upstream's answers: API JSON and listings per repo, the route table's reads per token digest ---------------

    async def get_api(self, repo: RepoRef, revision: str | None, route: str, query: str) -> AnswerRecord | None:
        """The answer stored under the index's API key (``mirror.index.api_route_key``, ``api_query_key``)."""
        ...

    async def put_api(self, repo: RepoRef, revision: str | None, route: str, query: str, entry: ApiEntry) -> None:
        ...

    async def get_read(self, path: str, subject: str, query: str) -> AnswerRecord | None:
        """A route-table answer of no one repo, per ``subject``: the digest of the token sent upstream (never a
        token), or ``anon``."""
        ...

    async def put_read(self, path: str, subject: str, query: str, entry: ApiEntry) -> None:
        ...

    # --- Xet hashes upstream named (mirror.xet.catalog) ---------------------------------------------------------------

    async def get_xet_files(self, repo: RepoRef, commit: str, paths: list[str]) -> list[XetRecord]:
        """The records of those of ``paths`` at ``commit`` upstream named a Xet hash for."""
        ...

    async def get_xet_by_hash(self, repo: RepoRef, xet_hash: str) -> XetRecord | None:
        """A file of ``repo`` (never of another repo) upstream named ``xet_hash``."""
        ...

    async def put_xet_files(self, repo: RepoRef, records: list[XetRecord]) -> None:
        ...

    # --- secrets generated once -------------------------------------------------------------------------------------

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The secret ``name``: the one stored, else ``candidate``, stored now (the first of nodes racing wins; every
        node gets the winner's)."""
        ...

    # --- warm jobs: one per warm across the fleet --------------------------------------------------------------------

    async def claim_job(self, identity: str, job_id: str, state: dict[str, Any], ttl: float) -> dict[str, Any] | None:
        """Claim the warm ``identity`` (what it warms, for whom: never a token) for job ``job_id`` for ``ttl``
        seconds: None when it is ours now, else the state of the live job that holds it (another node's)."""
        ...

    async def update_job(self, job_id: str, state: dict[str, Any], ttl: float, *, finished: bool = False) -> None:
        """The job's state, its claim extended by ``ttl`` seconds; ``finished``: the claim is given up (a later warm
        runs anew), the state kept for status reads."""
        ...

    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The last state a job published (kept a day after it ended)."""
        ...

    # --- pins: repos gc never evicts --------------------------------------------------------------------------------

    async def pin(self, repo: RepoRef, source: str) -> None:
        """Pin a repo; a pin that exists keeps its source (a manifest owns its pins)."""
        ...

    async def unpin(self, repo: RepoRef) -> str | None:
        """Remove a pin; the source it had, or None when the repo was not pinned."""
        ...

    async def pins(self) -> dict[str, str]:
        """Every pinned repo (its ``RepoRef.key``) -> who pinned it."""
        ...

    async def pinned_blobs(self) -> set[str]:
        """The etags of every known file of a pinned repo (gc keeps them, whichever node pinned the repo)."""
        ...

    # --- fill leases ------------------------------------------------------------------------------------------------

    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> int | None:
        """Grant the lease of ``etag`` for ``ttl`` seconds if it is free, expired or already ``owner``'s: its
        epoch (a new, larger one for a new holder), else None."""
        ...

    def renew_leases(self, held: Iterable[HeldLease], ttl: float) -> set[str]:
        """Extend each of ``held`` to ``ttl`` seconds from now; the etags still held under their epoch.

        Blocking and thread-safe: the renewal thread calls it (off the event loop, on its own connection), so a busy
        loop cannot lose a lease. Raises when the store cannot be reached."""
        ...

    async def release_lease(self, etag: str, owner: str, epoch: int) -> None:
        """Free the lease if ``owner`` still holds it under ``epoch`` (a lease taken over stays with its new holder)."""
        ...

    async def read_lease(self, etag: str) -> LeaseRecord | None:
        """The live lease of ``etag``; None when it is free or expired (free to take)."""
        ...

    def fence(self, etag: str, owner: str, epoch: int) -> AbstractAsyncContextManager[None]:
        """``async with store.fence(...)``: the body (the blob's commit) runs only while ``owner`` holds ``epoch``,
        and no new holder can be granted the lease until it ends; raises LeaseLost otherwise."""
        ...

    def changed(self, etag: str) -> AbstractAsyncContextManager[Subscription]:
        """``async with store.changed(etag) as change:`` then read the state, then ``await change.wait(timeout)``:
        returns at the next grant, release or commit of ``etag``'s lease (anywhere, for a shared store), or after
        ``timeout`` seconds. Subscribing before reading means no change between the read and the wait is missed."""
        ...

    # --- held windows: the sparse partial files of paused fills, by node (mirror.metadata.held) ---------------------

    async def put_windows(self, etag: str, peer: PeerAddress, held: Sequence[tuple[int, int]]) -> None:
        """The node at ``peer.url`` holds ``held`` of ``etag`` now, read with ``peer.token`` (its record replaced)."""
        ...

    async def get_windows(self, etag: str) -> list[WindowsRecord]:
        """Every node's record of ``etag``'s windows."""
        ...

    async def drop_windows(self, etag: str, url: str | None = None, token: str | None = None) -> None:
        """Forget the node at ``url``'s record of ``etag`` (only if it still carries ``token``, when given); every
        node's when ``url`` is None (the blob is committed: nobody needs windows of it)."""
        ...

    # --- busy marks, read times and evictions (the fleet's quota) ---------------------------------------------------

    def publish_busy(self, node: str, busy: Collection[str], read: Collection[str], ttl: float) -> set[str]:
        """``node``'s busy blobs are exactly ``busy`` now, each for ``ttl`` seconds (its other marks go), and the
        blobs of ``read`` were read now (the fleet's LRU order). Returns those of ``busy`` whose eviction is under
        way: a mark published after a decision does not stop it, so the caller must not read the shared copy.

        Blocking and thread-safe (the marks' thread calls it, on its own connection); raises when the store cannot be
        reached. A mark published before a decision is seen by it: they serialize."""
        ...

    async def decide_eviction(self, node: str, candidates: Sequence[BlobInfo], need: int | None) -> list[str]:
        """In one transaction: of ``candidates``, least recently read first (the fleet's read times, else each
        candidate's ``last_access``), those not pinned anywhere, not busy on any node, not leased for a fill and
        not being evicted by another node, until their sizes reach ``need`` bytes (None: every one allowed).
        Records their eviction as under way by ``node``; returns their etags, to delete then
        :meth:`finish_eviction` within ``EVICTION_DELETE_WINDOW`` seconds."""
        ...

    async def finish_eviction(self, node: str, deleted: Collection[str], kept: Collection[str]) -> None:
        """The blobs ``node`` decided to evict are ``deleted`` (every node is told: :meth:`on_evicted`) or ``kept``
        (not deleted after all: readable again at once)."""
        ...

    def on_evicted(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(etag)`` in this process for every blob evicted by any node (the shared store's copy is
        gone: drop this node's own). A shared store that lost its notification channel calls it, once back, for the
        evictions finished meanwhile."""
        ...

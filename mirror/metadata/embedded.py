"""The embedded metadata store, the default: this node's index (refs, pins) and a lease table on local disk.

One node shares nothing: the service, the access policy and the Xet catalog read the index themselves, and only a
fleet's database (``metadata_url``) is asked behind it. The answers, Xet records and secrets here keep the contract
(``tests/contract/test_metadata_contract.py``) on the index all the same.

It wraps what a single node always had, so a node without ``--metadata-url`` behaves as before. Its leases are
rows of a diskcache table under the cache directory (SQLite transactions make a grant atomic across the worker
processes of one host, whose clock they share); its announcements reach this process's waiters only, which is all
one node needs (a waiter's timeout covers the other worker processes). Busy marks, read times and evictions are
rows of that table too, decided in its transactions; a node without ``--metadata-url`` does not use them (its
quota decides alone, as before), but they keep the one contract.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import diskcache

from mirror.errors import LeaseLost
from mirror.hf import RepoRef
from mirror.index import ApiEntry, FileEntry, MetadataIndex
from mirror.metadata.announce import Announcements, Subscription
from mirror.metadata.base import (
    EVICTION_GRACE,
    AnswerRecord,
    HeldLease,
    LeaseRecord,
    RefRecord,
    WindowsRecord,
    XetRecord,
)
from mirror.storage.base import BlobInfo, PeerAddress

log = logging.getLogger("hf_mirror.metadata")

_BUSY = ("busy",)  # the one row of every process's marks: node -> (etags, expires)

JOB_KEEP = 86400.0  # seconds a finished warm job's state is kept for status reads
_CLAIM, _JOB = "warm-claim\x1f", "warm-job\x1f"  # lease-table keys of warm jobs (an etag is hex)


class EmbeddedMetadata:
    def __init__(self, index: MetadataIndex, leases_dir: Path) -> None:
        self.index = index
        self.leases_dir = leases_dir
        self._leases: diskcache.Cache | None = None
        self._announcements = Announcements()
        self._evicted: list[Callable[[str], None]] = []

    async def open(self) -> None:
        """Nothing to connect: the lease table opens at its first use (a node that never fills never creates it)."""

    async def aclose(self) -> None:
        if self._leases is not None:
            self._leases.close()
            self._leases = None

    def _table(self) -> diskcache.Cache:
        if self._leases is None:
            self._leases = diskcache.Cache(str(self.leases_dir), eviction_policy="none")
        return self._leases

    # --- refs -------------------------------------------------------------------------------------------------------

    async def get_ref(self, repo: RepoRef, revision: str) -> RefRecord | None:
        entry = self.index.get_ref(repo, revision)
        return None if entry is None else RefRecord(entry.commit, max(time.time() - entry.fetched_at, 0.0))

    async def put_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        self.index.put_ref(repo, revision, commit)

    # --- files and access confirmations: the index's own ---------------------------------------------------------

    async def get_file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        return self.index.get_file(repo, commit, path)

    async def put_file(self, repo: RepoRef, entry: FileEntry) -> None:
        self.index.put_file(repo, entry)

    async def get_access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        value = self.index.get_access(subject, kind, repo)
        return None if value is None else (bool(value[0]), max(time.time() - value[1], 0.0))

    async def put_access(self, subject: str, kind: str, repo: RepoRef, allowed: bool) -> None:
        self.index.put_access(subject, kind, repo, (allowed, time.time()))

    # --- upstream's answers: the index's own ------------------------------------------------------------------------

    async def get_api(self, repo: RepoRef, revision: str | None, route: str, query: str) -> AnswerRecord | None:
        return _aged(self.index.get_api(repo, revision, route, query))

    async def put_api(self, repo: RepoRef, revision: str | None, route: str, query: str, entry: ApiEntry) -> None:
        self.index.put_api(repo, revision, route, query, entry)

    async def get_read(self, path: str, subject: str, query: str) -> AnswerRecord | None:
        return _aged(self.index.get_read(path, subject, query))

    async def put_read(self, path: str, subject: str, query: str, entry: ApiEntry) -> None:
        self.index.put_read(path, subject, query, entry)

    # --- Xet records: keys of their own under the repo's ("xet", ...) (the catalog's are mirror.xet.catalog's) ------

    async def get_xet_files(self, repo: RepoRef, commit: str, paths: list[str]) -> list[XetRecord]:
        found = (self.index.get_xet(repo, ("record", commit, path)) for path in paths)
        return [record for record in found if isinstance(record, XetRecord)]

    async def get_xet_by_hash(self, repo: RepoRef, xet_hash: str) -> XetRecord | None:
        record = self.index.get_xet(repo, ("record-hash", xet_hash))
        return record if isinstance(record, XetRecord) else None

    async def put_xet_files(self, repo: RepoRef, records: list[XetRecord]) -> None:
        for record in records:
            self.index.put_xet(repo, ("record", record.commit, record.path), record)
            self.index.put_xet(repo, ("record-hash", record.xet_hash), record)

    async def secret(self, name: str, candidate: bytes) -> bytes:
        return self.index.setdefault_secret(name, candidate)

    # --- warm jobs: rows of the lease table, under keys no etag has (the host's worker processes share them) -------

    async def claim_job(self, identity: str, job_id: str, state: dict[str, Any], ttl: float) -> dict[str, Any] | None:
        table = self._table()
        with table.transact():
            now = time.time()
            claim = table.get(_CLAIM + identity)
            if claim is not None and claim[0] != job_id and claim[1] > now:
                held = table.get(_JOB + claim[0])
                if held is not None:
                    return dict(held)
            table.set(_CLAIM + identity, (job_id, now + ttl))
            table.set(_JOB + job_id, dict(state), expire=JOB_KEEP, tag=identity)
        return None

    async def update_job(self, job_id: str, state: dict[str, Any], ttl: float, *, finished: bool = False) -> None:
        table = self._table()
        with table.transact():
            identity = table.get(_JOB + job_id, tag=True)[1]
            table.set(_JOB + job_id, dict(state), expire=JOB_KEEP, tag=identity)
            if identity is not None:
                claim = table.get(_CLAIM + identity)
                if claim is not None and claim[0] == job_id:
                    if finished:
                        table.delete(_CLAIM + identity)
                    else:
                        table.set(_CLAIM + identity, (job_id, time.time() + ttl))

    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        found = self._table().get(_JOB + job_id)
        return None if found is None else dict(found)

    # --- pins -------------------------------------------------------------------------------------------------------

    async def pin(self, repo: RepoRef, source: str) -> None:
        self.index.pin_repo(repo, source)

    async def unpin(self, repo: RepoRef) -> str | None:
        return self.index.unpin_repo(repo)

    async def pins(self) -> dict[str, str]:
        return {f"{kind}:{repo_id}": source for (kind, repo_id), source in self.index.pin_sources().items()}

    async def pinned_blobs(self) -> set[str]:
        pinned = self.index.pinned_repos()
        return {entry.etag for kind, repo_id, entry in self.index.iter_files()
                if (kind, repo_id) in pinned and entry.etag and not entry.missing}

    # --- fill leases: etag -> (owner, epoch, expires, peer url, peer token); owner None when free ------------------

    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> int | None:
        table = self._table()
        with table.transact():
            now = time.time()
            row = table.get(etag)
            epoch = 0
            if row is not None:
                held_by, epoch, expires = row[0], row[1], row[2]
                if held_by == owner and expires > now:
                    table.set(etag, (owner, epoch, now + ttl, *_peer(peer)))
                    return int(epoch)
                if held_by is not None and expires > now:
                    return None
            epoch += 1
            table.set(etag, (owner, epoch, now + ttl, *_peer(peer)))
        self._announcements.announce(etag)
        return int(epoch)

    def renew_leases(self, held: Iterable[HeldLease], ttl: float) -> set[str]:
        table = self._table()
        kept: set[str] = set()
        with table.transact():
            now = time.time()
            for lease in held:
                row = table.get(lease.etag)
                if row is not None and row[0] == lease.owner and row[1] == lease.epoch:
                    table.set(lease.etag, (row[0], row[1], now + ttl, row[3], row[4]))
                    kept.add(lease.etag)
        return kept

    async def release_lease(self, etag: str, owner: str, epoch: int) -> None:
        table = self._table()
        with table.transact():
            row = table.get(etag)
            if row is None or row[0] != owner or row[1] != epoch:
                return
            table.set(etag, (None, epoch, 0.0, None, None))
        self._announcements.announce(etag)

    async def read_lease(self, etag: str) -> LeaseRecord | None:
        row = self._table().get(etag)
        if row is None or row[0] is None:
            return None
        remaining = row[2] - time.time()
        if remaining <= 0:
            return None
        peer = PeerAddress(row[3], row[4]) if row[3] else None
        return LeaseRecord(etag, row[0], int(row[1]), remaining, peer)

    @contextlib.asynccontextmanager
    async def fence(self, etag: str, owner: str, epoch: int) -> AsyncIterator[None]:
        # One node: a check suffices (a grant to another holder needs this lease to lapse first, which its renewal
        # thread prevents while the commit runs).
        row = self._table().get(etag)
        if row is None or row[0] != owner or row[1] != epoch:
            raise LeaseLost(f"the fill lease of {etag} is no longer held under epoch {epoch}")
        yield
        self._announcements.announce(etag)

    def changed(self, etag: str) -> contextlib.AbstractAsyncContextManager[Subscription]:
        return self._announcements.changed(etag)

    # --- held windows: rows ("windows", etag) -> {node url: (token, held)} (one node: only its own record) ----------

    async def put_windows(self, etag: str, peer: PeerAddress, held: Sequence[tuple[int, int]]) -> None:
        table = self._table()
        with table.transact():
            records = dict(table.get(("windows", etag)) or {})
            records[peer.url] = (peer.token, tuple((int(a), int(b)) for a, b in held))
            table.set(("windows", etag), records)

    async def get_windows(self, etag: str) -> list[WindowsRecord]:
        records = self._table().get(("windows", etag)) or {}
        return [WindowsRecord(etag, PeerAddress(url, token), held) for url, (token, held) in records.items()]

    async def drop_windows(self, etag: str, url: str | None = None, token: str | None = None) -> None:
        table = self._table()
        with table.transact():
            records = dict(table.get(("windows", etag)) or {})
            for node in [url] if url is not None else list(records):
                if node in records and (token is None or records[node][0] == token):
                    del records[node]
            if records:
                table.set(("windows", etag), records)
            else:
                table.delete(("windows", etag))

    # --- busy marks, read times, evictions: rows ("busy",), ("read", etag), ("eviction", etag) ----------------------

    def publish_busy(self, node: str, busy: Collection[str], read: Collection[str], ttl: float) -> set[str]:
        table = self._table()
        with table.transact():
            now = time.time()
            marks = {n: v for n, v in (table.get(_BUSY) or {}).items() if v[1] > now and n != node}
            if busy:
                marks[node] = (frozenset(busy), now + ttl)
            table.set(_BUSY, marks)
            for etag in read:
                table.set(("read", etag), now)
            return {etag for etag in busy if _evicting(table.get(("eviction", etag)), now)}

    async def decide_eviction(self, node: str, candidates: Sequence[BlobInfo], need: int | None) -> list[str]:
        if not candidates or (need is not None and need <= 0):
            return []
        pinned = await self.pinned_blobs()
        table = self._table()
        with table.transact():
            now = time.time()
            busy = {etag for etags, expires in (table.get(_BUSY) or {}).values() if expires > now for etag in etags}

            def allowed(blob: BlobInfo) -> bool:
                lease = table.get(blob.etag)
                eviction = table.get(("eviction", blob.etag))
                return (blob.etag not in busy and blob.etag not in pinned
                        and not (lease is not None and lease[0] is not None and lease[2] > now)
                        and not (_evicting(eviction, now) and eviction[0] != node))

            order = sorted((b for b in candidates if allowed(b)),
                           key=lambda b: (max(table.get(("read", b.etag)) or 0.0, b.last_access), b.etag))
            chosen: list[str] = []
            freed = 0
            for blob in order:
                if need is not None and freed >= need:
                    break
                chosen.append(blob.etag)
                freed += blob.size
                table.set(("eviction", blob.etag), (node, "evicting", now))
        return chosen

    async def finish_eviction(self, node: str, deleted: Collection[str], kept: Collection[str]) -> None:
        table = self._table()
        with table.transact():
            now = time.time()
            for etag in deleted:
                record = table.get(("eviction", etag))
                if record is not None and record[0] == node:
                    table.set(("eviction", etag), (node, "done", now))
                table.delete(("read", etag))
            for etag in kept:
                record = table.get(("eviction", etag))
                if record is not None and record[0] == node and record[1] == "evicting":
                    table.delete(("eviction", etag))
        for etag in deleted:  # this process's listeners (one node: the others share its disk)
            for callback in self._evicted:
                try:
                    callback(etag)
                except Exception:  # noqa: BLE001 - one listener's failure must not stop the others
                    log.exception("eviction listener failed on %s", etag)

    def on_evicted(self, callback: Callable[[str], None]) -> None:
        self._evicted.append(callback)


def _evicting(record: tuple[str, str, float] | None, now: float) -> bool:
    """An eviction decided and still under way (not finished, not void)."""
    return record is not None and record[1] == "evicting" and now - record[2] < EVICTION_GRACE


def _aged(entry: ApiEntry | None) -> AnswerRecord | None:
    return None if entry is None else AnswerRecord(entry, max(time.time() - entry.fetched_at, 0.0))


def _peer(peer: PeerAddress | None) -> tuple[str | None, str | None]:
    return (peer.url, peer.token) if peer is not None else (None, None)

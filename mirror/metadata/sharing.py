"""The fleet's copy of what a node learns from upstream, behind the node's own index (``metadata_url``).

A node still answers from its index first (no database round trip on a warm hit). What its index does not know, or
knows only staler than the ttl allows, it asks the fleet's database before upstream; what it learns from upstream it
hands to the database in the background. So a branch resolved on one node is answered by the others within
``revision_ttl`` without asking upstream, and 50 nodes ask upstream once per ttl, not 50 times.

Shared this way: refs, file entries, access confirmations (by token digest), upstream's answers on the API routes
(API JSON, tree listings, the route table's reads; :data:`SHARED_ANSWER_MAX` bytes at most each, only successes) and
the Xet hashes upstream named.

The database being down never fails a request: the node then behaves as a node on its own (it asks upstream), and
its index keeps serving what it holds. A failed read makes the node leave the database alone for
:data:`_DOWN_PAUSE` seconds (no request waits on a database it just found gone), then ask it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from mirror import hf
from mirror.errors import MirrorError
from mirror.hf import RepoRef
from mirror.index import ApiEntry, FileEntry, MetadataIndex
from mirror.metadata.base import AnswerRecord, MetadataStore, XetRecord

log = logging.getLogger("hf_mirror.metadata")
_T = TypeVar("_T")

_PENDING_WRITES = 1000  # background writes in flight at most: past it, a write is dropped (the next node re-learns it)
# The largest answer shared (bytes of body): a recursive tree page of the Hub's 1,000 entries with LFS and Xet fields
# is about 300 KB, and the info JSON of a repo of ~10,000 files about 1 MB. Larger answers (the info of a huge
# dataset) stay with each node, which asks upstream for them itself as before: a row that size would cost every node
# that reads it more than the one upstream call it saves, and a node's index keeps them under the same bound
# (read_cache_entry, 1 MiB by default).
SHARED_ANSWER_MAX = 1024**2
_DOWN_PAUSE = 3.0  # seconds the database is left alone after a failed read


class SharedMetadata:
    def __init__(self, store: MetadataStore, index: MetadataIndex) -> None:
        self.store = store
        self.index = index
        self._pending: set[asyncio.Task[None]] = set()
        self._down_until = 0.0  # time.monotonic() until which the database is not asked (it just failed)

    @property
    def down(self) -> bool:
        """Whether the database failed a moment ago (it is left alone until :data:`_DOWN_PAUSE` has passed)."""
        return time.monotonic() < self._down_until

    async def _ask(self, what: str, read: Coroutine[Any, Any, _T]) -> _T | None:
        """``read``'s answer, or None when the database fails (or failed a moment ago)."""
        if self.down:
            read.close()
            return None
        try:
            return await read
        except MirrorError as exc:
            self._down_until = time.monotonic() + _DOWN_PAUSE
            log.debug("fleet %s not read: %s", what, exc)
            return None

    async def commit_of(self, repo: RepoRef, revision: str, ttl: float) -> str | None:
        """The commit the fleet resolved ``revision`` to within ``ttl`` seconds; kept in the index too."""
        if hf.is_commit(revision):
            return revision
        record = await self._ask(f"ref of {repo.key}@{revision}", self.store.get_ref(repo, revision))
        if record is None or record.age >= ttl:
            return None
        self.index.put_ref_at(repo, revision, record.commit, time.time() - record.age)
        return record.commit

    async def file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        entry = await self._ask(f"file entry of {repo.key} {path}", self.store.get_file(repo, commit, path))
        if entry is not None:
            self.index.put_file(repo, entry)
        return entry

    async def access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        """(allowed, unix time of the confirmation on this node's clock), as another node confirmed it."""
        value = await self._ask(f"access of {repo.key}", self.store.get_access(subject, kind, repo))
        return None if value is None else (value[0], time.time() - value[1])

    async def api(self, repo: RepoRef, revision: str | None, route: str, query: str) -> ApiEntry | None:
        """The API answer another node stored under this key (its ``fetched_at`` on this node's clock), whatever its
        age: the caller decides whether it is fresh. Not put in the index: the caller does, as it stores its own."""
        record = await self._ask(f"answer of {repo.key} {route}", self.store.get_api(repo, revision, route, query))
        return _localised(record)

    async def read(self, path: str, subject: str, query: str) -> ApiEntry | None:
        """A route-table answer another node stored for this token digest (or ``anon``), as :meth:`api`."""
        return _localised(await self._ask(f"answer of {path[:200]}", self.store.get_read(path, subject, query)))

    async def xet_files(self, repo: RepoRef, commit: str, paths: list[str]) -> list[XetRecord]:
        found = await self._ask(f"Xet hashes of {repo.key}", self.store.get_xet_files(repo, commit, paths))
        return found or []

    async def xet_file(self, repo: RepoRef, xet_hash: str) -> XetRecord | None:
        return await self._ask(f"Xet hash of {repo.key}", self.store.get_xet_by_hash(repo, xet_hash))

    def share_api(self, repo: RepoRef, revision: str | None, route: str, query: str, entry: ApiEntry) -> None:
        if _shareable(entry):
            self._write(self.store.put_api(repo, revision, route, query, entry))

    def share_read(self, path: str, subject: str, query: str, entry: ApiEntry) -> None:
        if _shareable(entry):
            self._write(self.store.put_read(path, subject, query, entry))

    def share_xet(self, repo: RepoRef, records: list[XetRecord]) -> None:
        if records:
            self._write(self.store.put_xet_files(repo, records))

    def share_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        self._write(self.store.put_ref(repo, revision, commit))

    def share_file(self, repo: RepoRef, entry: FileEntry) -> None:
        self._write(self.store.put_file(repo, entry))

    def share_access(self, subject: str, kind: str, repo: RepoRef, allowed: bool) -> None:
        self._write(self.store.put_access(subject, kind, repo, allowed))

    def _write(self, write: Coroutine[Any, Any, None]) -> None:
        """In the background: a request never waits for the database to learn what it learnt."""
        if len(self._pending) >= _PENDING_WRITES or self.down:
            write.close()
            return
        task = asyncio.ensure_future(self._quietly(write))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _quietly(self, write: Coroutine[Any, Any, None]) -> None:
        try:
            await write
        except MirrorError as exc:
            self._down_until = time.monotonic() + _DOWN_PAUSE
            log.debug("fleet metadata not written: %s", exc)

    async def drain(self, timeout: float = 5.0) -> None:
        """Let the background writes finish (at shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)


def _shareable(entry: ApiEntry) -> bool:
    """Successes of at most SHARED_ANSWER_MAX bytes: a refusal or a 404 is anyone's input (any name can be asked),
    and is the asking node's to remember."""
    return 200 <= entry.status < 300 and len(entry.body) <= SHARED_ANSWER_MAX


def _localised(record: AnswerRecord | None) -> ApiEntry | None:
    if record is None:
        return None
    return dataclasses.replace(record.entry, fetched_at=time.time() - record.age)

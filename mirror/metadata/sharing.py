"""The fleet's copy of what a node learns from upstream, behind the node's own index (``metadata_url``).

A node still answers from its index first (no database round trip on a warm hit). What its index does not know, or
knows only staler than the ttl allows, it asks the fleet's database before upstream; what it learns from upstream it
hands to the database in the background. So a branch resolved on one node is answered by the others within
``revision_ttl`` without asking upstream, and 50 nodes ask upstream once per ttl, not 50 times.

The database being down never fails a request: the node then behaves as a node on its own (it asks upstream), and
its index keeps serving what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from mirror import hf
from mirror.errors import MirrorError
from mirror.hf import RepoRef
from mirror.index import FileEntry, MetadataIndex
from mirror.metadata.base import MetadataStore

log = logging.getLogger("hf_mirror.metadata")

_PENDING_WRITES = 1000  # background writes in flight at most: past it, a write is dropped (the next node re-learns it)


class SharedMetadata:
    def __init__(self, store: MetadataStore, index: MetadataIndex) -> None:
        self.store = store
        self.index = index
        self._pending: set[asyncio.Task[None]] = set()

    async def commit_of(self, repo: RepoRef, revision: str, ttl: float) -> str | None:
        """The commit the fleet resolved ``revision`` to within ``ttl`` seconds; kept in the index too."""
        if hf.is_commit(revision):
            return revision
        try:
            record = await self.store.get_ref(repo, revision)
        except MirrorError as exc:
            log.debug("fleet ref of %s@%s not read: %s", repo.key, revision, exc)
            return None
        if record is None or record.age >= ttl:
            return None
        self.index.put_ref_at(repo, revision, record.commit, time.time() - record.age)
        return record.commit

    async def file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        try:
            entry = await self.store.get_file(repo, commit, path)
        except MirrorError as exc:
            log.debug("fleet file entry of %s %s not read: %s", repo.key, path, exc)
            return None
        if entry is not None:
            self.index.put_file(repo, entry)
        return entry

    async def access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        """(allowed, unix time of the confirmation on this node's clock), as another node confirmed it."""
        try:
            value = await self.store.get_access(subject, kind, repo)
        except MirrorError as exc:
            log.debug("fleet access of %s not read: %s", repo.key, exc)
            return None
        return None if value is None else (value[0], time.time() - value[1])

    def share_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        self._write(self.store.put_ref(repo, revision, commit))

    def share_file(self, repo: RepoRef, entry: FileEntry) -> None:
        self._write(self.store.put_file(repo, entry))

    def share_access(self, subject: str, kind: str, repo: RepoRef, allowed: bool) -> None:
        self._write(self.store.put_access(subject, kind, repo, allowed))

    def _write(self, write: Coroutine[Any, Any, None]) -> None:
        """In the background: a request never waits for the database to learn what it learnt."""
        if len(self._pending) >= _PENDING_WRITES:
            write.close()
            return
        task = asyncio.ensure_future(self._quietly(write))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _quietly(write: Coroutine[Any, Any, None]) -> None:
        try:
            await write
        except MirrorError as exc:
            log.debug("fleet metadata not written: %s", exc)

    async def drain(self, timeout: float = 5.0) -> None:
        """Let the background writes finish (at shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)

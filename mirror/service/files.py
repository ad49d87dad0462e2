"""The file side of the service: what a path is at a revision, and where its bytes come from.

Refs are mutable, content is immutable: what a path is at a commit, and the blob behind an etag, never change once
known. Content is local-first: a cached blob is served without asking upstream (after an access check for repos
that are not public). One fill per blob (:mod:`mirror.fill`). The service decides where a file's bytes come from
(:class:`Cached`, :class:`Filling` or :class:`Relay`: the route only sends them) and the request's outcome, once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.errors import (
    EntryNotFound,
    ErrorCode,
    HubError,
    MetadataUnavailable,
    MirrorError,
    OfflineMiss,
    UpstreamUnavailable,
)
from mirror.fill import FillSpec, fill_url
from mirror.index import FileEntry, blob_key
from mirror.metrics import Outcome
from mirror.service.answers import BlobSource, Cached, Filling, Relay, ResolvedFile
from mirror.service.core import ServiceCore
from mirror.service.listing import entry_from_listing
from mirror.storage.base import discard_bad_copy
from mirror.upstream import BulkBody

log = logging.getLogger("hf_mirror.service")


# A Range starting this far past the bytes a fill has written is relayed from upstream instead of waiting for them.
RANGE_RELAY_GAP = 16 * 1024 * 1024
# How long a far Range waits for a new fill to know whether it fetches windows itself (it holds the lease) or
# follows another process (then the Range is relayed: that process's prefix does not jump to it).
_DECISION_WAIT = 2.0
# How long an access probe's answer stays shared after it ends (see _check_content_access).
_PROBE_LINGER = 1.0
# What confirm_content asks for when no file of a repo is known: any path does (the Hub checks access first), one that
# no repo has keeps a file a gated repo might serve to anyone (a model card) from answering for its content.
_PROBE_PATH = ".hf-mirror-access-check"

_HIT, _MISS, _STALE, _PASSTHROUGH = Outcome.HIT, Outcome.MISS, Outcome.STALE, Outcome.PASSTHROUGH


class FileService:
    """The file side: resolve a path at a revision, check content access, decide where a file's bytes come from."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core  # the shared state (refs, probes in flight) and the rules both sides apply
        # The parts the methods ask, as the core holds them (references, never replaced).
        self.settings, self.index, self.store, self.upstream = core.settings, core.index, core.store, core.upstream
        self.fills, self.access, self.metrics, self.xet = core.fills, core.access, core.metrics, core.xet
        self.make_room, self.on_hit, self.admission = core.make_room, core.on_hit, core.admission
        self.shared = core.shared

    async def resolve_file(self, target: hf.ResolveTarget, caller: Caller) -> ResolvedFile:
        """What ``target`` is: commit, etag, size. Raises the Hub's errors (EntryNotFound carries the commit)."""
        repo, revision, path = target.repo, target.revision, target.path
        commit = self.core.known_commit(repo, revision, fresh=True) or await self.core.fleet_commit(repo, revision)
        if commit is not None:
            entry = self.index.get_file(repo, commit, path) or entry_from_listing(self.index, repo, commit, path)
            if entry is None and (entry := await self.core.fleet_file(repo, commit, path)) is not None:
                if self.xet is not None and entry.lfs:  # its Xet hash, if the node that asked upstream learnt one
                    await self.xet.recall(repo, commit, [path])
            if entry is not None:
                if not self.access.is_public(repo, "content"):  # a public repo's hit makes no coroutine for it
                    await self._check_content_access(repo, revision, path, caller)
                return self._found(repo, entry, _HIT)
        if self.settings.offline:
            return self._stale_file(target, caller, OfflineMiss(f"{path} is not cached and the mirror is offline"))
        try:
            meta = await self.upstream.head_file(repo, revision, path, caller.token, caller.check)
        except EntryNotFound as exc:
            if exc.commit:
                self.core.remember_ref(repo, revision, exc.commit)
                self.core.remember_file(repo, FileEntry(exc.commit, path, missing=True))
            raise
        except UpstreamUnavailable as exc:
            return self._stale_file(target, caller, exc)
        except HubError as exc:
            if exc.status in (401, 403, 404):
                self.access.record_public(repo, "content", caller.token, public=False)
            raise
        self.core.remember_ref(repo, revision, meta.commit)
        entry = FileEntry(meta.commit, path, blob_key(meta.etag), meta.size, lfs=bool(hf.SHA256_RE.match(meta.etag)))
        self.core.remember_file(repo, entry)
        if self.xet is not None and entry.lfs:
            self.xet.record(repo, meta.commit, path, meta.xet_hash, entry.etag, meta.size)
        self.access.record_public(repo, "content", caller.token)
        self.access.record_allowed(repo, "content", caller.token)
        return ResolvedFile(repo, entry, _MISS, meta.cdn_url)

    def _found(self, repo: hf.RepoRef, entry: FileEntry, outcome: Outcome) -> ResolvedFile:
        if entry.missing:
            raise EntryNotFound(entry.commit)  # the Hub's own words: the client appends them to its message
        return ResolvedFile(repo, entry, outcome)

    def _stale_file(self, target: hf.ResolveTarget, caller: Caller, cause: MirrorError) -> ResolvedFile:
        commit = self.core.known_commit(target.repo, target.revision, fresh=False)
        entry = self.index.get_file(target.repo, commit, target.path) if commit else None
        if entry is None:
            if isinstance(cause, UpstreamUnavailable):
                raise type(cause)(f"{cause.message}; {target.path} is not cached on the mirror")
            raise cause
        if not self.access.may_serve_stale(target.repo, "content", caller):
            raise self.core.unconfirmed(caller, target.repo, "content")
        self.metrics.stale_served.inc()
        log.warning("serving %s %s stale: %s", target.repo.key, target.path, cause.message)
        return self._found(target.repo, entry, _STALE)

    async def _check_content_access(self, repo: hf.RepoRef, revision: str, path: str, caller: Caller) -> None:
        if self.access.is_public(repo, "content"):  # access.check's first test, before a probe is made for nothing
            return

        async def probe(token: str | None) -> None:
            if self.settings.offline:
                raise UpstreamUnavailable("offline")
            # One probe at a time per repo and token: the HEADs a client sends at once for many files of a repo
            # (snapshot_download, 8 threads) share the first one's answer instead of asking upstream each.
            key = (repo.key, token_digest(token), _guard_key(caller.check))
            probes = self.core.probes  # the core's one table, shared by every request of the service
            task = probes.get(key)
            if task is None:
                probes[key] = task = asyncio.ensure_future(
                    self.upstream.head_file(repo, revision, path, token, caller.check))
                # Kept a moment after it ends: a HEAD that arrives between the answer and the access memo's update
                # still shares it instead of asking upstream again.
                task.add_done_callback(lambda done: asyncio.get_running_loop().call_later(
                    _PROBE_LINGER, lambda: probes.pop(key, None) if probes.get(key) is done else None))
            await asyncio.shield(task)

        await self.access.check(repo, "content", caller, probe)

    async def confirm_content(self, repo: hf.RepoRef, revision: str, caller: Caller) -> None:
        """Raise unless ``caller`` may read ``repo``'s content, by the rule a resolve applies (public content, or
        access upstream confirmed for the caller's token): for actions that add to the cache (pin, warm) and that show
        a job of a repo. Gated repos are not public here, whatever their metadata. The probe is the HEAD of a file
        the mirror knows of the repo, else of a path no repo has: the Hub checks a repo's visibility and gate before
        the path, so an ``EntryNotFound`` (or ``RevisionNotFound``) answer still says the caller may read it."""
        if self.access.is_public(repo, "content"):
            return

        async def probe(token: str | None) -> None:  # only when no answer for this token is remembered
            if self.settings.offline:
                raise UpstreamUnavailable("offline")
            # An LFS file first: weights are what a gate protects.
            known = min((e for e in await asyncio.to_thread(self.index.repo_files, repo) if not e.missing),
                        key=lambda e: not e.lfs, default=None)
            at, path = (known.commit, known.path) if known is not None else (revision, _PROBE_PATH)
            try:
                await self.upstream.head_file(repo, at, path, token, caller.check)
            except HubError as exc:
                if exc.code not in (ErrorCode.ENTRY_NOT_FOUND, ErrorCode.REVISION_NOT_FOUND):
                    raise

        await self.access.check(repo, "content", caller, probe)

    def fill_token(self, resolved: ResolvedFile, caller: Caller) -> str | None:
        """The token a fill downloads with: the caller's; for public content, the service token (the rate limits of
        an account, not of an anonymous address). The bytes of a file whose metadata upstream served anonymously."""
        if caller.token is None and self.access.is_public(resolved.repo, "content"):
            return self.settings.upstream_token
        return caller.token

    async def admit_bytes(self, resolved: ResolvedFile, caller: Caller) -> None:
        """The admission policy before any byte of a file leaves the mirror, and on a HEAD (resolve GET and HEAD,
        the Xet CAS, the sync and the warm): a file to scan, or to quarantine, is stored whole first (never served
        meanwhile), then scanned and decided; a quarantined blob stays stored and listed until an operator releases
        its etag. On the HEAD too, so that a client learns the refusal before it takes the Xet path (the HEAD that
        precedes every download; its GET or reconstruction then finds the verdict known)."""
        gate = self.admission
        if gate is None:
            return
        repo, entry = resolved.repo, resolved.entry
        decision = await gate.decide(repo, entry.commit, entry.path, entry.etag, token=caller.token,
                                     guard=caller.check)
        if decision.action in ("scan", "quarantine"):
            blob = await self._stored(resolved, caller)
            if decision.action == "scan":
                await gate.scan(entry.etag, blob)
                decision = await gate.decide(repo, entry.commit, entry.path, entry.etag, token=caller.token,
                                             guard=caller.check)
            gate.hold(decision, repo, entry.commit, entry.path, entry.etag)
        gate.enforce(decision, repo, entry.path, entry.etag)

    async def _stored(self, resolved: ResolvedFile, caller: Caller) -> str:
        """The blob's path on this disk, fetched whole first when it is not there (a scan reads every byte)."""
        entry = resolved.entry
        path = self.store.cached_path(entry.etag)
        if path is not None:
            return str(path)
        await self._may_fill(resolved)
        spec = FillSpec(resolved.repo, entry.commit, entry.path, entry.etag, entry.size,
                        token=self.fill_token(resolved, caller), cdn_url=resolved.cdn_url, detached=True)
        return str(await self.fills.fetch(spec))

    async def _may_fill(self, resolved: ResolvedFile) -> None:
        """Refuse, before any byte is sent, a file not stored that cannot be fetched now: offline, or (a fleet) its
        lease would come from a database that failed a moment ago (a clear 503, not a response cut later)."""
        entry = resolved.entry
        if self.settings.offline and await self.store.stat(entry.etag) is None:
            raise OfflineMiss(f"{entry.path} is not cached and the mirror is offline")
        if (self.shared is not None and self.shared.down and self.settings.storage == "s3"
                and not self.fills.is_filling(entry.etag) and await self.store.stat(entry.etag) is None):
            log.warning("not filling %s %s: the fleet's metadata database is unreachable", resolved.repo.key,
                        entry.path)
            raise MetadataUnavailable(f"{entry.path} is not cached and the fleet's metadata database is unreachable, "
                                      "so it cannot be fetched now; try again later")

    async def head_outcome(self, resolved: ResolvedFile) -> Outcome:
        """The outcome a HEAD reports: a hit only when the blob is stored, on this disk (one stat) or else in the
        shared store; a miss when only its metadata is known, or when the shared store is down."""
        if resolved.outcome is not _HIT or self.store.cached_path(resolved.entry.etag) is not None:
            return resolved.outcome
        try:
            stored = await self.store.stat(resolved.entry.etag) is not None
        except MirrorError:  # the shared store is down: a HEAD still answers from the metadata
            stored = False
        return _HIT if stored else _MISS

    async def open_blob(self, resolved: ResolvedFile, caller: Caller, start: int, end: int,
                        detached: bool = False, whole: bool = False) -> BlobSource:
        """Where the bytes ``start..end`` of the file come from: its file on this disk, the fill producing it (from
        upstream, or from a remote store), or upstream directly (no disk room; a Range far beyond the fill).
        ``whole``: these bytes are part of a download of the whole file (a Xet client's xorb ranges of a whole-file
        reconstruction): the fill fetches every byte, never sparse."""
        if self.admission is not None:
            await self.admit_bytes(resolved, caller)
        entry = resolved.entry
        stale = resolved.outcome is _STALE
        path = self.store.cached_path(entry.etag)
        if path is not None and await self._intact(str(path), entry):
            await self.store.touch(entry.etag)  # least recently *used* goes first when the quota needs room
            if self.fills.busy is not None:
                self.fills.busy.read(entry.etag)  # the fleet's quota orders by the fleet's reads
            if self.on_hit is not None:
                self.on_hit(entry.etag)
            return Cached(str(path), _STALE if stale else _HIT)
        await self._may_fill(resolved)
        spec = FillSpec(resolved.repo, entry.commit, entry.path, entry.etag, entry.size,
                        token=self.fill_token(resolved, caller),
                        cdn_url=resolved.cdn_url, detached=detached)
        if not whole:
            # A Range another node of the fleet is filling (a sparse fill there, say), or holds as the windows of a
            # paused sparse fill: relayed from that node, never fetched from upstream a second time nor stored here.
            peer = await self.fills.peer_for_range(spec, start, end)
            if peer is not None:
                return Relay(resolved, caller.token, start, end, _STALE if stale else _MISS, peer=peer)
        # Room for what the fill will write: the file, or a sparse fill's windows for this Range (a full download
        # joining a sparse fill makes room for the file then).
        running = self.fills.get(entry.etag)
        if (self.make_room is not None and not self.settings.offline and (running is None or running.sparse)
                and not await self.make_room(entry.size if whole else self.fills.room_for(entry.size, start, end),
                                             self.fills.bytes_to_write)):
            log.warning("no disk room for %s %s (%d bytes): relaying it without storing it", resolved.repo.key,
                        entry.path, entry.size)
            return Relay(resolved, caller.token, start, end, _STALE if stale else _PASSTHROUGH)
        fill = await self.fills.start(spec, reading=None if whole else (start, end))
        if fill is None:  # on this disk meanwhile
            path = self.store.cached_path(entry.etag)
            if path is not None:
                return Cached(str(path), _STALE if stale else _HIT)
            return Relay(resolved, caller.token, start, end, _STALE if stale else _PASSTHROUGH)
        if start > fill.written + RANGE_RELAY_GAP and not self.settings.offline and not fill.holds(start, end):
            # A Range far beyond what the fill has. A fill in windows fetches that Range's window next: each byte
            # once. A single-stream fill (or another process's, whose prefix will not jump to it) has it relayed from
            # upstream while the fill goes on.
            fill.ask(start)
            if await fill.decided(_DECISION_WAIT) is not True:
                return Relay(resolved, caller.token, start, end, _STALE if stale else _MISS)
        # A fill already verified (its commit's fsync still running) needs nothing more from upstream: a hit.
        if fill.sparse and not fill.holds(start, end):
            await fill.decided(_DECISION_WAIT)  # a sparse fill knows the windows its file holds once they begin
        held = fill.verified or fill.holds(start, end)  # a sparse file's windows held already are hits too
        return Filling(fill, _STALE if stale else _HIT if held else _MISS)

    def reading(self, etag: str) -> AbstractContextManager[None]:
        """While a response sends a stored blob's bytes: busy for the fleet's evictions (nothing on a node alone)."""
        busy = self.fills.busy
        return busy.reading(etag) if busy is not None else nullcontext()

    async def admit_lfs_file(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int,
                             caller: Caller) -> None:
        """:meth:`admit_bytes` for an LFS file known by its hash (the Xet CAS: the file a token's repo names)."""
        await self.admit_bytes(self._lfs_file(repo, commit, path, etag, size), caller)

    async def lfs_outcome(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int) -> Outcome:
        """:meth:`head_outcome` of an LFS file known by its hash (the Xet CAS's audit note: cached or not)."""
        return await self.head_outcome(self._lfs_file(repo, commit, path, etag, size))

    async def open_xorb(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int, caller: Caller,
                        start: int, end: int, whole: bool = False) -> BlobSource:
        """Where the bytes ``start..end`` of an LFS file framed into a Xet xorb come from (the CAS's signed range
        names the file): as :meth:`open_blob` decides, detached from the request; but a relay that would carry the
        file's last byte reads the fill in progress instead, when there is one (only a verified fill ends a file)."""
        source = await self.open_blob(self._lfs_file(repo, commit, path, etag, size), caller, start, end,
                                      detached=True, whole=whole)
        if type(source) is Relay and end + 1 == size:
            fill = self.fills.get(etag)
            if fill is not None:
                return Filling(fill, source.outcome)
        return source

    @staticmethod
    def _lfs_file(repo: hf.RepoRef, commit: str, path: str, etag: str, size: int) -> ResolvedFile:
        return ResolvedFile(repo, FileEntry(commit, path, etag, size, lfs=True), _HIT)

    async def _intact(self, path: str, entry: FileEntry) -> bool:
        """The cheap check on every hit: a stored blob of the wrong size is never served; it is removed and
        fetched again. (A same-size corruption is the scrub's: see CacheManager.suspect.)"""
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return False
        if size == entry.size:
            return True
        self.metrics.integrity_failures.inc()
        log.error("stored blob %s is %d bytes, not %d: removed, fetching it again", entry.etag, size, entry.size)
        # This disk's file: on S3 a hot-tier copy, dropped alone (the copy from the bucket is hashed on its way in).
        await discard_bad_copy(self.store, entry.etag, check_shared=False)
        return False

    @asynccontextmanager
    async def relay_file(self, relay: Relay, chunk_size: int) -> AsyncIterator[AsyncIterator[bytes]]:
        """The relayed bytes of ``relay``, as they arrive from the peer that fills the file or from upstream (never
        stored). A peer that does not open the Range (its fill ended meanwhile) leaves it to upstream."""
        entry = relay.resolved.entry
        async with AsyncExitStack() as stack:
            if relay.peer is not None:
                spec = FillSpec(relay.resolved.repo, entry.commit, entry.path, entry.etag, entry.size)
                try:
                    peer_body = await stack.enter_async_context(
                        self.upstream.stream_peer(fill_url(relay.peer, spec), relay.peer.token, relay.start, relay.end))
                except MirrorError as exc:
                    log.info("peer %s did not open bytes %d-%d of %s: relayed from upstream (%s)", relay.peer.url,
                             relay.start, relay.end, entry.path, exc)
                    await self.fills.peer_refused(entry.etag, relay.peer)  # a record of its windows: not asked again
                else:
                    yield self._peer_chunks(peer_body, relay.end + 1 - relay.start, chunk_size)
                    return
            body = await stack.enter_async_context(self.upstream.stream_file(
                relay.resolved.repo, entry.commit, entry.path, relay.token, relay.start, relay.end, chunk_size))
            yield body.chunks

    async def _peer_chunks(self, body: BulkBody, length: int, chunk_size: int) -> AsyncIterator[bytes]:
        """``length`` bytes of a peer's answer, read in a worker thread as they arrive; a short one is a failure."""
        while length > 0:
            data = await asyncio.to_thread(body.read_some, min(chunk_size, length))
            if not data:
                raise UpstreamUnavailable(f"the peer's answer ended {length} bytes short")
            length -= len(data)
            self.metrics.bytes_from_peers.inc(len(data))
            yield data


def _guard_key(check: Callable[[hf.RepoRef], None] | None) -> str:
    """Which repo policy a caller's guard applies (the operator's filter, or one principal's): probes are shared only
    by callers under the same one."""
    if isinstance(check, functools.partial):
        return f"{id(check.func)}:{check.args!r}"
    return str(id(getattr(check, "__self__", check)))


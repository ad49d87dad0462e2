"""The pull-through policy. Returns values, never web-framework objects.

- Refs are mutable, content is immutable: a branch or tag maps to a commit for ``revision_ttl`` seconds; what a
  path is at a commit, and the blob behind an etag, never change once known.
- Content is local-first: a cached blob is served without asking upstream (after an access check for repos that
  are not public). Metadata is remote-first once its TTL is over, with a stale fallback when upstream fails.
- One fill per blob (:mod:`mirror.fill`).
- The service decides where a file's bytes come from (:class:`Cached`, :class:`Filling` or :class:`Relay`: the route
  only sends them) and the request's :class:`~mirror.metrics.Outcome`, once.

Policy: no web framework and no HTTP client type here. Upstream answers arrive as :mod:`mirror.upstream` values; index
keys are built by :mod:`mirror.index`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from mirror import hf
from mirror.access import AccessPolicy, Caller, offline_refusal, token_digest
from mirror.config import Settings
from mirror.errors import EntryNotFound, HubError, MirrorError, OfflineMiss, UpstreamUnavailable
from mirror.fill import Fill, FillManager, FillSpec
from mirror.index import ApiEntry, FileEntry, MetadataIndex, api_query_key, api_route_key, blob_key
from mirror.metrics import Metrics, Outcome
from mirror.storage.base import BlobStore
from mirror.upstream import RelayBody, UpstreamClient

log = logging.getLogger("hf_mirror.service")


# A Range starting this far past the bytes a fill has written is relayed from upstream instead of waiting for them.
RANGE_RELAY_GAP = 16 * 1024 * 1024
# How long an access probe's answer stays shared after it ends (see _check_content_access).
_PROBE_LINGER = 1.0

_HIT, _MISS, _STALE, _PASSTHROUGH = Outcome.HIT, Outcome.MISS, Outcome.STALE, Outcome.PASSTHROUGH


@dataclass(frozen=True)
class ResolvedFile:
    repo: hf.RepoRef
    entry: FileEntry
    outcome: Outcome  # HIT (metadata from the index) | MISS (asked upstream) | STALE (upstream failed)
    cdn_url: str | None = None


@dataclass(frozen=True)
class Cached:
    """The blob is a committed file on this disk."""

    path: str
    outcome: Outcome


@dataclass(frozen=True)
class Filling:
    """The blob is being filled: its bytes are read as they are written (:meth:`FillManager.reading`)."""

    fill: Fill
    outcome: Outcome


@dataclass(frozen=True)
class Relay:
    """The bytes ``start..end`` come from upstream, relayed without being stored (:meth:`MirrorService.relay_file`):
    there is no disk room for the blob (a passthrough), or the Range lies far beyond what its fill has (a miss)."""

    resolved: ResolvedFile
    token: str | None
    start: int
    end: int
    outcome: Outcome


BlobSource = Cached | Filling | Relay


@dataclass(frozen=True)
class ApiResult:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    outcome: Outcome


class MirrorService:
    def __init__(self, settings: Settings, index: MetadataIndex, store: BlobStore, upstream: UpstreamClient,
                 fills: FillManager, access: AccessPolicy, metrics: Metrics,
                 make_room: Callable[[int, int], Awaitable[bool]] | None = None,
                 on_hit: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.index = index
        self.store = store
        self.upstream = upstream
        self.fills = fills
        self.access = access
        self.metrics = metrics
        self.make_room = make_room
        self.on_hit = on_hit  # a stored blob was served: the scrub checks it (once per file, in the background)
        self._probes: dict[tuple[str, str, str], asyncio.Future[object]] = {}  # access probes in flight
        # Upstream's Xet hashes (mirror.xet.XetCatalog), set by the app when it serves Xet: learned from upstream's
        # answers, put back on tree / paths-info answers (the cached JSON stays Xet-free).
        self.xet: Any = None

    # --- files -----------------------------------------------------------------------------------------------------

    async def resolve_file(self, target: hf.ResolveTarget, caller: Caller) -> ResolvedFile:
        """What ``target`` is: commit, etag, size. Raises the Hub's errors (EntryNotFound carries the commit)."""
        repo, revision, path = target.repo, target.revision, target.path
        commit = self._known_commit(repo, revision, fresh=True)
        if commit is not None:
            entry = self.index.get_file(repo, commit, path) or self._entry_from_listing(repo, commit, path)
            if entry is not None:
                await self._check_content_access(repo, revision, path, caller)
                return self._found(repo, entry, _HIT)
        if self.settings.offline:
            return self._stale_file(target, caller, OfflineMiss(f"{path} is not cached and the mirror is offline"))
        try:
            meta = await self.upstream.head_file(repo, revision, path, caller.token, caller.check)
        except EntryNotFound as exc:
            if exc.commit:
                self._remember_ref(repo, revision, exc.commit)
                self.index.put_file(repo, FileEntry(exc.commit, path, missing=True))
            raise
        except UpstreamUnavailable as exc:
            return self._stale_file(target, caller, exc)
        except HubError as exc:
            if exc.status in (401, 403, 404):
                self.access.record_public(repo, "content", caller.token, public=False)
            raise
        self._remember_ref(repo, revision, meta.commit)
        entry = FileEntry(meta.commit, path, blob_key(meta.etag), meta.size, lfs=bool(hf.SHA256_RE.match(meta.etag)))
        self.index.put_file(repo, entry)
        if self.xet is not None and entry.lfs:
            self.xet.record(repo, meta.commit, path, meta.xet_hash, entry.etag, meta.size)
        self.access.record_public(repo, "content", caller.token)
        self.access.record_allowed(repo, "content", caller.token)
        return ResolvedFile(repo, entry, _MISS, meta.cdn_url)

    def _entry_from_listing(self, repo: hf.RepoRef, commit: str, path: str) -> FileEntry | None:
        """A file's entry from the recursive tree listing of its commit, when the index holds it (``snapshot_download``
        lists the tree, then sends a HEAD per file: those HEADs need no upstream call of their own). The listing
        gives size, oid and LFS sha256; the commit is known. Served through the same access check as any cached
        entry (:meth:`_check_content_access`): a gated or private repo's listing helps only a confirmed caller."""
        query: list[tuple[str, str]] | None = [("recursive", "true"), ("expand", "false")]
        found = None
        pages = 0
        while query is not None and pages < 1000:
            cached = self.index.get_api(repo, commit, api_route_key("tree", ""), api_query_key(query, None))
            if cached is None or cached.status != 200:
                return found
            try:
                listing = json.loads(cached.body)
            except ValueError:
                return found
            for item in listing if isinstance(listing, list) else ():
                entry = _listed_file(commit, item)
                if entry is not None:  # the whole page at once: the next HEADs find their entry directly
                    self.index.put_file(repo, entry)
                    found = entry if entry.path == path else found
            if found is not None:
                return found
            query = _next_page(cached.headers)
            pages += 1
        return found

    def _found(self, repo: hf.RepoRef, entry: FileEntry, outcome: Outcome) -> ResolvedFile:
        if entry.missing:
            raise EntryNotFound(entry.commit)  # the Hub's own words: the client appends them to its message
        return ResolvedFile(repo, entry, outcome)

    def _stale_file(self, target: hf.ResolveTarget, caller: Caller, cause: MirrorError) -> ResolvedFile:
        commit = self._known_commit(target.repo, target.revision, fresh=False)
        entry = self.index.get_file(target.repo, commit, target.path) if commit else None
        if entry is None:
            if isinstance(cause, UpstreamUnavailable):
                raise type(cause)(f"{cause.message}; {target.path} is not cached on the mirror")
            raise cause
        if not self.access.may_serve_stale(target.repo, "content", caller):
            raise self._unconfirmed(caller)
        self.metrics.stale_served.inc()
        log.warning("serving %s %s stale: %s", target.repo.key, target.path, cause.message)
        return self._found(target.repo, entry, _STALE)

    async def _check_content_access(self, repo: hf.RepoRef, revision: str, path: str, caller: Caller) -> None:
        async def probe(token: str | None) -> None:
            if self.settings.offline:
                raise UpstreamUnavailable("offline")
            # One probe at a time per repo and token: the HEADs a client sends at once for many files of a repo
            # (snapshot_download, 8 threads) share the first one's answer instead of asking upstream each.
            key = (repo.key, token_digest(token), _guard_key(caller.check))
            task = self._probes.get(key)
            if task is None:
                self._probes[key] = task = asyncio.ensure_future(
                    self.upstream.head_file(repo, revision, path, token, caller.check))
                # Kept a moment after it ends: a HEAD that arrives between the answer and the access memo's update
                # still shares it instead of asking upstream again.
                task.add_done_callback(lambda done: asyncio.get_running_loop().call_later(
                    _PROBE_LINGER, lambda: self._probes.pop(key, None) if self._probes.get(key) is done else None))
            await asyncio.shield(task)

        await self.access.check(repo, "content", caller, probe)

    def _unconfirmed(self, caller: Caller) -> MirrorError:
        if self.settings.offline:
            return offline_refusal(caller)
        return UpstreamUnavailable("Upstream is unreachable and access to this repo cannot be confirmed")

    def fill_token(self, resolved: ResolvedFile, caller: Caller) -> str | None:
        """The token a fill downloads with: the caller's; for public content, the service token (the rate limits of
        an account, not of an anonymous address). The bytes of a file whose metadata upstream served anonymously."""
        if caller.token is None and self.access.is_public(resolved.repo, "content"):
            return self.settings.upstream_token
        return caller.token

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
                        detached: bool = False) -> BlobSource:
        """Where the bytes ``start..end`` of the file come from: its file on this disk, the fill producing it (from
        upstream, or from a remote store), or upstream directly (no disk room; a Range far beyond the fill)."""
        entry = resolved.entry
        stale = resolved.outcome is _STALE
        path = self.store.cached_path(entry.etag)
        if path is not None and await self._intact(str(path), entry):
            await self.store.touch(entry.etag)  # least recently *used* goes first when the quota needs room
            if self.on_hit is not None:
                self.on_hit(entry.etag)
            return Cached(str(path), _STALE if stale else _HIT)
        if self.settings.offline and await self.store.stat(entry.etag) is None:
            raise OfflineMiss(f"{entry.path} is not cached and the mirror is offline")
        spec = FillSpec(resolved.repo, entry.commit, entry.path, entry.etag, entry.size,
                        token=self.fill_token(resolved, caller),
                        cdn_url=resolved.cdn_url, detached=detached)
        if (self.make_room is not None and not self.settings.offline and not self.fills.is_filling(entry.etag)
                and not await self.make_room(entry.size, self.fills.bytes_to_write)):
            log.warning("no disk room for %s %s (%d bytes): relaying it without storing it", resolved.repo.key,
                        entry.path, entry.size)
            return Relay(resolved, caller.token, start, end, _STALE if stale else _PASSTHROUGH)
        fill = await self.fills.start(spec)
        if fill is None:  # on this disk meanwhile
            path = self.store.cached_path(entry.etag)
            if path is not None:
                return Cached(str(path), _STALE if stale else _HIT)
            return Relay(resolved, caller.token, start, end, _STALE if stale else _PASSTHROUGH)
        if start > fill.written + RANGE_RELAY_GAP and not self.settings.offline:
            # A Range far beyond what the fill has: relay it from upstream while the fill goes on.
            return Relay(resolved, caller.token, start, end, _STALE if stale else _MISS)
        # A fill already verified (its commit's fsync still running) needs nothing more from upstream: a hit.
        return Filling(fill, _STALE if stale else _HIT if fill.verified else _MISS)

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
        await self.store.delete(entry.etag)
        return False

    @asynccontextmanager
    async def relay_file(self, relay: Relay, chunk_size: int) -> AsyncIterator[AsyncIterator[bytes]]:
        """The relayed bytes of ``relay``, as they arrive from upstream (never stored)."""
        entry = relay.resolved.entry
        async with self.upstream.stream_file(relay.resolved.repo, entry.commit, entry.path, relay.token,
                                             relay.start, relay.end, chunk_size) as body:
            yield body.chunks

    # --- revisions -------------------------------------------------------------------------------------------------

    def _known_commit(self, repo: hf.RepoRef, revision: str, *, fresh: bool) -> str | None:
        if hf.is_commit(revision):
            return revision
        if fresh:
            entry = self.index.get_ref_fresh(repo, revision, self.settings.revision_ttl)
        else:
            entry = self.index.get_ref(repo, revision)
        if entry is None and fresh and self.settings.offline:
            entry = self.index.get_ref(repo, revision)
        return entry.commit if entry else None

    def _remember_ref(self, repo: hf.RepoRef, revision: str, commit: str) -> None:
        if revision != commit and hf.is_commit(commit):
            self.index.put_ref(repo, revision, commit)

    # --- API routes ------------------------------------------------------------------------------------------------

    async def api(self, target: hf.ApiTarget, method: str, raw_path: str, query: list[tuple[str, str]],
                  form: list[tuple[str, str]] | None, caller: Caller) -> ApiResult:
        """Cached API JSON for the read routes clients use; immutable when pinned to a commit.

        Only the query parameters a route understands are sent upstream and make up the cache key: junk in a query
        string neither reaches upstream nor grows the index.
        """
        route = target.sub or "info"
        revision = target.revision
        if route not in hf.API_CACHED_ROUTES:
            raise HubError(404, "EntryNotFound", "Xet is not served by this mirror; clients download over HTTP")
        query = [(k, v) for k, v in query if k in hf.API_QUERY_PARAMS.get(route, ())]
        key_query = api_query_key(query, form)
        key_route = api_route_key(route, target.path)
        key_rev = revision
        commit = self._known_commit(target.repo, revision, fresh=True) if revision else None
        immutable = bool(revision and hf.is_commit(revision))
        cached = self.index.get_api(target.repo, key_rev, key_route, key_query)
        fresh = cached is not None and (
            cached.immutable or time.time() - cached.fetched_at < self.settings.revision_ttl
        )
        if cached is not None and (fresh or self.settings.offline):
            await self._check_meta_access(target, caller, cached)
            return ApiResult(cached.status, cached.headers, cached.body, _HIT)
        if self.settings.offline:
            raise OfflineMiss(f"{raw_path} is not cached and the mirror is offline")
        upstream_path = raw_path + (f"?{urlencode(query)}" if query else "")
        try:
            response = await self.upstream.api("POST" if form is not None else "GET", upstream_path, caller.token,
                                               form=form, guard=caller.check)
        except UpstreamUnavailable as exc:
            return await self._stale_api(target, caller, cached, exc)
        if response.status_code >= 500:
            return await self._stale_api(target, caller, cached, self.upstream.error(response, resolve=False))
        if response.status_code >= 400:
            error = self.upstream.error(response, resolve=False)
            if immutable and isinstance(error, EntryNotFound):
                # A path missing at a commit stays missing: remember it, so that datasets' probes of absent folders
                # keep their fast 404 while upstream is down.
                headers = tuple((k, v) for k, v in response.headers.items()
                                if k.lower() in hf.API_RELAYED_HEADERS and k.lower() != "x-error-message")
                if not any(k.lower() == "x-error-code" for k, _ in headers):
                    headers += (("x-error-code", "EntryNotFound"),)
                body = json.dumps({"error": error.message}).encode()
                entry = ApiEntry(404, headers + (("x-error-message", error.message),), body, time.time(),
                                 immutable=True)
                self.index.put_api(target.repo, key_rev, key_route, key_query, entry)
            elif response.status_code in (401, 403, 404):
                self.access.record_public(target.repo, "meta", caller.token, public=False)
            raise error
        body = _rewrite_json(response.content, route, target, revision, commit, self)
        headers = tuple(
            (k, v) for k, v in response.headers.items() if k.lower() in hf.API_RELAYED_HEADERS and k.lower() != "etag"
        )
        link = response.headers.get("link")
        if link:
            headers += (("link", link),)  # rewritten per request (the mirror's own address), see routes.api
        entry = ApiEntry(response.status_code, headers, body, time.time(), immutable=immutable)
        self.index.put_api(target.repo, key_rev, key_route, key_query, entry)
        self.access.record_public(target.repo, "meta", caller.token)
        self.access.record_allowed(target.repo, "meta", caller.token)
        return ApiResult(entry.status, entry.headers, entry.body, _MISS)

    async def _stale_api(self, target: hf.ApiTarget, caller: Caller, cached: ApiEntry | None,
                         cause: MirrorError) -> ApiResult:
        if cached is None:
            raise cause
        if not self.access.may_serve_stale(target.repo, "meta", caller):
            raise self._unconfirmed(caller)
        self.metrics.stale_served.inc()
        log.warning("serving API %s %s stale: %s", target.repo.key, target.sub or "info", cause.message)
        return ApiResult(cached.status, cached.headers, cached.body, _STALE)

    async def _check_meta_access(self, target: hf.ApiTarget, caller: Caller, cached: ApiEntry) -> None:
        async def probe(token: str | None) -> None:
            if self.settings.offline:
                raise UpstreamUnavailable("offline")
            response = await self.upstream.api("GET", target.repo.api_path(), token, guard=caller.check)
            if response.status_code >= 400:
                raise self.upstream.error(response, resolve=False)

        await self.access.check(target.repo, "meta", caller, probe)

    @asynccontextmanager
    async def relay(self, raw_path: str, query: list[tuple[str, str]], caller: Caller) -> AsyncIterator[RelayBody]:
        """A read route the mirror does not cache (listings, whoami, parquet listings), relayed as it arrives.

        Always with the caller's own Hub token or none: never with the service token, whatever the settings."""
        if self.settings.offline:
            raise OfflineMiss(f"{raw_path} is not cached and the mirror is offline")
        token = caller.token if caller.own_token else None
        async with self.upstream.relay(raw_path + (f"?{urlencode(query)}" if query else ""), token) as body:
            yield body


def _guard_key(check: Callable[[hf.RepoRef], None] | None) -> str:
    """Which repo policy a caller's guard applies (the operator's filter, or one principal's): probes are shared only
    by callers under the same one."""
    if isinstance(check, functools.partial):
        return f"{id(check.func)}:{check.args!r}"
    return str(id(getattr(check, "__self__", check)))


def _listed_file(commit: str, item: object) -> FileEntry | None:
    """A tree listing's file entry as the index keeps it: the etag is the LFS sha256, else the git blob oid."""
    if not isinstance(item, dict) or item.get("type") != "file" or not isinstance(item.get("path"), str):
        return None
    lfs = item.get("lfs")
    etag = lfs.get("oid") or lfs.get("sha256") if isinstance(lfs, dict) else item.get("oid")
    size = item.get("size")
    if not isinstance(etag, str) or not isinstance(size, int):
        return None
    lfs_file = bool(hf.SHA256_RE.match(etag))
    if not lfs_file and not hf.SHA1_RE.match(etag):
        return None
    return FileEntry(commit, item["path"], blob_key(etag), size, lfs=lfs_file)


def _next_page(headers: tuple[tuple[str, str], ...]) -> list[tuple[str, str]] | None:
    """The query of a cached listing page's next page (its ``Link: <...>; rel="next"``), if any."""
    for name, value in headers:
        if name.lower() == "link" and 'rel="next"' in value:
            url = value.split("<", 1)[-1].split(">", 1)[0]
            return parse_qsl(urlsplit(url).query, keep_blank_values=True)
    return None


def _rewrite_json(body: bytes, route: str, target: hf.ApiTarget, revision: str | None, commit: str | None,
                  service: MirrorService) -> bytes:
    """Strip Xet fields, and learn ref -> commit from info JSON (``sha``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    xet_commit = revision if revision and hf.is_commit(revision) else commit
    if service.xet is not None and route in ("tree", "paths-info") and xet_commit:
        service.xet.learn_listing(target.repo, xet_commit, data)
    hf.strip_xet_json(data)
    if revision and route == "revision" and isinstance(data, dict) and hf.is_commit(str(data.get("sha", ""))):
        service._remember_ref(target.repo, revision, data["sha"])  # noqa: SLF001
    return json.dumps(data, separators=(",", ":")).encode()

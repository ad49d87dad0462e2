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

Objects composed over one core, not mixins: :class:`MirrorService` builds each side from the one
:class:`~mirror.service.core.ServiceCore` and offers their public methods, which it delegates
(a coroutine method's delegate hands back the side's coroutine itself: no extra frame on every request).

- :mod:`mirror.service.answers`: the values a route sends (ResolvedFile; Cached | Filling | Relay; ApiResult);
- :mod:`mirror.service.core`: ``ServiceCore``, what every side shares (the parts, refs remembered, the questions in
  flight, the unconfirmed-access refusal);
- :mod:`mirror.service.files`: ``FileService``, resolve a file, check content access, decide where its bytes come
  from;
- :mod:`mirror.service.listing`: a cached tree listing read back as file entries (a function the file side calls);
- :mod:`mirror.service.api`: ``ApiService``, cached API JSON, its stale fallback, the relay of uncached read routes;
- :mod:`mirror.service.reads`: ``ReadService``, the routes of the route table (mirror.routetable), cached as it says
  (a route cached per repo under the API side's access and stale rules).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from mirror import hf
from mirror.access import Caller
from mirror.admission import AdmissionGate
from mirror.metrics import Outcome
from mirror.routetable import ReadRoute
from mirror.service.answers import ApiResult, BlobSource, Relay, ResolvedFile
from mirror.service.api import ApiService
from mirror.service.core import ServiceCore
from mirror.service.files import FileService
from mirror.service.reads import ReadService
from mirror.upstream import RelayBody


class MirrorService:
    """The one service a mirror's routes and its sync ask: the file side and the API side, built over one core.

    Each method says what it answers and hands the call to the side that decides it (go-to-definition lands here,
    then one step on). The sides are attributes, never reached through by a route (tests/unit/test_layers.py)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.file_service = FileService(core)
        self.api_service = ApiService(core)
        self.read_service = ReadService(core, self.api_service)

    # --- what the core holds ---------------------------------------------------------------------------------------

    @property
    def admission(self) -> AdmissionGate | None:
        """The admission policy (:mod:`mirror.admission`); ``None``: every file is admitted."""
        return self.core.admission

    @property
    def xet(self) -> Any:
        """Upstream's Xet hashes (a :class:`mirror.xet.XetCatalog`) when the mirror serves Xet, else ``None``."""
        return self.core.xet

    def commit_of(self, repo: hf.RepoRef, revision: str, *, fresh: bool = True) -> str | None:
        """The commit this node knows ``revision`` at (never asks upstream): :meth:`ServiceCore.commit_of`."""
        return self.core.commit_of(repo, revision, fresh=fresh)

    def learn_visibility(self, repo: hf.RepoRef, caller: Caller) -> Awaitable[None]:
        """Whether ``repo`` is public, asked anonymously once for a caller lent the service token:
        :meth:`ServiceCore.learn_visibility`."""
        return self.core.learn_visibility(repo, caller)

    # --- the file side ---------------------------------------------------------------------------------------------

    def resolve_file(self, target: hf.ResolveTarget, caller: Caller) -> Awaitable[ResolvedFile]:
        """What ``target`` is (commit, etag, size), or the Hub's error: :meth:`FileService.resolve_file`."""
        return self.file_service.resolve_file(target, caller)

    def confirm_content(self, repo: hf.RepoRef, revision: str, caller: Caller) -> Awaitable[None]:
        """Raise unless ``caller`` may read ``repo``'s content (pin, warm, a job's page):
        :meth:`FileService.confirm_content`."""
        return self.file_service.confirm_content(repo, revision, caller)

    def admit_bytes(self, resolved: ResolvedFile, caller: Caller) -> Awaitable[None]:
        """The admission policy before any byte of a file leaves the mirror: :meth:`FileService.admit_bytes`."""
        return self.file_service.admit_bytes(resolved, caller)

    def head_outcome(self, resolved: ResolvedFile) -> Awaitable[Outcome]:
        """The outcome a HEAD reports (a hit only when the blob is stored): :meth:`FileService.head_outcome`."""
        return self.file_service.head_outcome(resolved)

    def open_blob(self, resolved: ResolvedFile, caller: Caller, start: int, end: int,
                  detached: bool = False, whole: bool = False) -> Awaitable[BlobSource]:
        """Where the bytes ``start..end`` of a file come from (Cached | Filling | Relay):
        :meth:`FileService.open_blob`."""
        return self.file_service.open_blob(resolved, caller, start, end, detached, whole)

    def relay_file(self, relay: Relay, chunk_size: int) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """The relayed bytes of ``relay``, as they arrive from upstream: :meth:`FileService.relay_file`."""
        return self.file_service.relay_file(relay, chunk_size)

    def reading(self, etag: str) -> AbstractContextManager[None]:
        """While a response sends a stored blob's bytes (no node of a fleet evicts it): :meth:`FileService.reading`."""
        return self.file_service.reading(etag)

    def admit_lfs_file(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int,
                       caller: Caller) -> Awaitable[None]:
        """:meth:`admit_bytes` for an LFS file known by its hash (the Xet CAS): :meth:`FileService.admit_lfs_file`."""
        return self.file_service.admit_lfs_file(repo, commit, path, etag, size, caller)

    def lfs_outcome(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int) -> Awaitable[Outcome]:
        """:meth:`head_outcome` of an LFS file known by its hash (the Xet CAS): :meth:`FileService.lfs_outcome`."""
        return self.file_service.lfs_outcome(repo, commit, path, etag, size)

    def open_xorb(self, repo: hf.RepoRef, commit: str, path: str, etag: str, size: int, caller: Caller,
                  start: int, end: int, whole: bool = False) -> Awaitable[BlobSource]:
        """Where the bytes of an LFS file framed into a Xet xorb come from: :meth:`FileService.open_xorb`."""
        return self.file_service.open_xorb(repo, commit, path, etag, size, caller, start, end, whole)

    # --- the API side ----------------------------------------------------------------------------------------------

    def api(self, target: hf.ApiTarget, method: str, raw_path: str, query: list[tuple[str, str]],
            form: list[tuple[str, str]] | None, caller: Caller) -> Awaitable[ApiResult]:
        """Cached API JSON for the read routes clients use (info, revision, tree, paths-info):
        :meth:`ApiService.api`."""
        return self.api_service.api(target, method, raw_path, query, form, caller)

    def relay(self, raw_path: str, query: list[tuple[str, str]],
              caller: Caller) -> AbstractAsyncContextManager[RelayBody]:
        """A read route the mirror does not cache, relayed as it arrives (the caller's own token or none):
        :meth:`ApiService.relay`."""
        return self.api_service.relay(raw_path, query, caller)

    def read_query(self, route: ReadRoute, query: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The query parameters a route of the route table reads: :meth:`ReadService.read_query`."""
        return self.read_service.read_query(route, query)

    def read(self, route: ReadRoute, target: hf.ApiTarget | None, raw_path: str,
             query: list[tuple[str, str]], caller: Caller, *, revalidate: bool = False) -> Awaitable[ApiResult]:
        """A route of the route table, cached as it says (stored, stale, or upstream's): :meth:`ReadService.read`."""
        return self.read_service.read(route, target, raw_path, query, caller, revalidate=revalidate)


__all__ = ["ApiService", "FileService", "MirrorService", "ReadService", "ServiceCore"]

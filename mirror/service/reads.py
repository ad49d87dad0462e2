"""The routes of the route table (:mod:`mirror.routetable`): discussions, likers, collections, papers, whoami...

Each is asked upstream with the caller's own Hub token or none, never the service token, and cached as the table
says: per repo (behind the repo's metadata access check), shared (keyed by the token sent upstream, so a list that
shows one user's private repos is never another's), per caller, or not at all. Only the query parameters the route
reads go upstream and into a key; an answer over ``read_cache_entry`` bytes is relayed and not stored. When upstream
fails or the mirror is offline, a stored answer is served stale; without one the caller gets a Hub-shaped 504.
"""

from __future__ import annotations

import time
from urllib.parse import urlencode

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.errors import MirrorError, OfflineMiss, UpstreamTimeout, UpstreamUnavailable
from mirror.index import READ_KEEP, ApiEntry, api_query_key, api_route_key
from mirror.metrics import Outcome
from mirror.routetable import Caching, ReadRoute
from mirror.service.answers import ApiResult
from mirror.service.api import ApiService
from mirror.service.core import ServiceCore


def own_caller(caller: Caller) -> Caller:
    """The caller as upstream may see them on these routes: their own token, or none (never the service token)."""
    return Caller(caller.token if caller.own_token else None, own_token=caller.own_token, check=caller.check)


class ReadService:
    """The routes of the route table, cached as it says; a per-repo answer is guarded by the API side's rules."""

    def __init__(self, core: ServiceCore, api_service: ApiService) -> None:
        self.core = core
        # The API side: a route cached per repo is behind its metadata access check and its stale-access rule.
        self.api_service = api_service
        # The parts the methods ask, as the core holds them (references, never replaced).
        self.settings, self.index, self.upstream = core.settings, core.index, core.upstream
        self.access, self.metrics, self.shared = core.access, core.metrics, core.shared

    def read_query(self, route: ReadRoute, query: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The query parameters the route reads; the rest never leaves the mirror."""
        return [(k, v) for k, v in query if k in route.params]

    async def read(self, route: ReadRoute, target: hf.ApiTarget | None, raw_path: str,
                   query: list[tuple[str, str]], caller: Caller, *, revalidate: bool = False) -> ApiResult:
        """A stored answer (fresh, or stale when upstream cannot be asked) or upstream's, stored as the table says.
        Only for routes cached (``route.caching`` is not NONE); the others are relayed (:meth:`ApiService.relay`).
        ``revalidate``: the caller asked ``Cache-Control: no-cache`` (the nightly sync's listings): upstream first."""
        caller = own_caller(caller)
        query = self.read_query(route, query)
        path = raw_path.split("?")[0].rstrip("/")
        key_query = api_query_key(query, None)
        # The repo whose policy guards a stored answer: routes cached per repo only (a per-caller answer is keyed
        # by the caller's token, and its refusals say nothing of the repo's visibility).
        by_repo = target if route.caching is Caching.REPO else None
        if by_repo is not None:
            key_route = api_route_key(by_repo.sub, by_repo.path)
            cached = self.index.get_api(by_repo.repo, None, key_route, key_query)
            ttl = self.settings.revision_ttl
        else:
            digest = token_digest(caller.token)
            cached = self.index.get_read(path, digest, key_query)
            ttl = self.settings.read_ttl
        fresh = cached is not None and not revalidate and time.time() - cached.fetched_at < ttl
        if cached is not None and fresh:
            if by_repo is not None:
                await self.api_service.check_meta_access(by_repo, caller, cached)
            return ApiResult(cached.status, cached.headers, cached.body, Outcome.HIT)
        if self.settings.offline:
            if cached is not None:
                return await self._stale_read(by_repo, caller, cached, OfflineMiss("offline"))
            raise OfflineMiss(f"{path[:200]} is not cached and the mirror is offline")
        if self.shared is not None and not revalidate:
            # Another node's answer within the ttl is this node's too, kept in its index.
            fleet = (await self.shared.api(by_repo.repo, None, key_route, key_query) if by_repo is not None
                     else await self.shared.read(path, digest, key_query))
            if fleet is not None and (cached is None or fleet.fetched_at > cached.fetched_at):
                cached = fleet  # the stale fallback too
                if time.time() - fleet.fetched_at < ttl:
                    if by_repo is not None:
                        await self.api_service.check_meta_access(by_repo, caller, fleet)
                        self.index.put_api(by_repo.repo, None, key_route, key_query, fleet, expire=READ_KEEP)
                    else:
                        self.index.put_read(path, digest, key_query, fleet)
                    return ApiResult(fleet.status, fleet.headers, fleet.body, Outcome.HIT)
        try:
            response = await self.upstream.api("GET", path + (f"?{urlencode(query)}" if query else ""), caller.token,
                                               guard=caller.check)
        except UpstreamUnavailable as exc:
            return await self._stale_read(by_repo, caller, cached, exc)
        if response.status_code >= 500:
            return await self._stale_read(by_repo, caller, cached,
                                          self.upstream.error(response, resolve=False))
        if response.status_code >= 400:  # relayed as upstream sent it: its code, or none
            if by_repo is not None and response.status_code in (401, 403, 404):
                self.access.record_public(by_repo.repo, "meta", caller.token, public=False)
            raise self.upstream.error(response, resolve=False, infer=False)
        headers = tuple((k, v) for k, v in response.headers.items() if k.lower() in hf.API_RELAYED_HEADERS)
        if response.headers.get("link"):
            headers += (("link", response.headers["link"]),)  # rewritten per request (the mirror's own address)
        entry = ApiEntry(response.status_code, headers, response.content, time.time())
        if len(response.content) > self.settings.read_cache_entry:
            return ApiResult(entry.status, entry.headers, entry.body, Outcome.PASSTHROUGH)
        if by_repo is not None:
            self.index.put_api(by_repo.repo, None, key_route, key_query, entry, expire=READ_KEEP)
            self.access.record_public(by_repo.repo, "meta", caller.token)
            self.access.record_allowed(by_repo.repo, "meta", caller.token)
            if self.shared is not None:
                self.shared.share_api(by_repo.repo, None, key_route, key_query, entry)
        else:
            self.index.put_read(path, digest, key_query, entry)
            if self.shared is not None:
                self.shared.share_read(path, digest, key_query, entry)
        return ApiResult(entry.status, entry.headers, entry.body, Outcome.MISS)

    async def _stale_read(self, target: hf.ApiTarget | None, caller: Caller, cached: ApiEntry | None,
                          cause: MirrorError) -> ApiResult:
        """``target``: the repo of a route cached per repo (its stale-access rule applies), else ``None``."""
        if cached is None:
            if isinstance(cause, UpstreamUnavailable) and not isinstance(cause, UpstreamTimeout):
                raise UpstreamTimeout(cause.message) from None  # nothing to answer with: a gateway timeout
            raise cause
        if target is not None:
            await self.api_service.stale_api(target, caller, cached, cause)  # the repo's stale-access rule; counted
        else:
            self.metrics.stale_served.inc()
        return ApiResult(cached.status, cached.headers, cached.body, Outcome.STALE)

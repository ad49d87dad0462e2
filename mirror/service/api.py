"""The API side of the service: cached API JSON for the read routes clients use (immutable when pinned to a commit,
remote-first once its TTL is over, stale when upstream fails), and the relay of the routes it does not cache."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote, urlencode

from mirror import hf
from mirror.access import Caller
from mirror.errors import EntryNotFound, ErrorCode, HubError, MirrorError, OfflineMiss, UpstreamUnavailable
from mirror.index import ApiEntry, api_query_key, api_route_key
from mirror.metrics import Outcome
from mirror.service.answers import ApiResult
from mirror.service.core import ServiceCore
from mirror.upstream import RelayBody

log = logging.getLogger("hf_mirror.service")
_ERROR_CODE = hf.H_ERROR_CODE.lower()

_HIT, _MISS, _STALE = Outcome.HIT, Outcome.MISS, Outcome.STALE


class ApiService:
    """The API side: cached API JSON (repo info, revisions, trees, paths-info), its stale fallback, the relay."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core  # the shared state (refs remembered) and the rules both sides apply
        # The parts the methods ask, as the core holds them (references, never replaced).
        self.settings, self.index, self.upstream = core.settings, core.index, core.upstream
        self.access, self.metrics, self.xet, self.shared = core.access, core.metrics, core.xet, core.shared

    async def api(self, target: hf.ApiTarget, method: str, raw_path: str, query: list[tuple[str, str]],
                  form: list[tuple[str, str]] | None, caller: Caller) -> ApiResult:
        """Cached API JSON for the read routes clients use; immutable when pinned to a commit.

        Only the query parameters a route understands are sent upstream and make up the cache key: junk in a query
        string neither reaches upstream nor grows the index.
        """
        route = target.sub or "info"
        revision = target.revision
        if route not in hf.API_CACHED_ROUTES:
            raise HubError(404, ErrorCode.ENTRY_NOT_FOUND,
                           "Xet is not served by this mirror; clients download over HTTP")
        query = [(k, v) for k, v in query if k in hf.API_QUERY_PARAMS.get(route, ())]
        key_query = api_query_key(query, form)
        key_route = api_route_key(route, target.path)
        key_rev = revision
        commit = self.core.known_commit(target.repo, revision, fresh=True) if revision else None
        immutable = bool(revision and hf.is_commit(revision))
        cached = self.index.get_api(target.repo, key_rev, key_route, key_query)
        fresh = cached is not None and (
            cached.immutable or time.time() - cached.fetched_at < self.settings.revision_ttl
        )
        if cached is not None and (fresh or self.settings.offline):
            await self.check_meta_access(target, caller, cached)
            return ApiResult(cached.status, cached.headers, cached.body, _HIT)
        if self.settings.offline:
            raise OfflineMiss(f"{raw_path} is not cached and the mirror is offline")
        if self.shared is not None and not fresh:
            # Another node's answer within the ttl (or at a commit) is this node's too, kept in its index.
            fleet = await self.shared.api(target.repo, key_rev, key_route, key_query)
            if fleet is not None and (cached is None or fleet.fetched_at > cached.fetched_at):
                cached = fleet  # the stale fallback too
                if fleet.immutable or time.time() - fleet.fetched_at < self.settings.revision_ttl:
                    await self.check_meta_access(target, caller, fleet)
                    self.index.put_api(target.repo, key_rev, key_route, key_query, fleet)
                    if revision and route == "revision":
                        _learn_revision(self, target, revision, fleet)
                    if self.xet is not None and route in ("tree", "paths-info") and revision:
                        at = revision if immutable else commit or await self.core.fleet_commit(target.repo, revision)
                        if at is not None:
                            await _recall_xet(self, target, at, fleet)
                    return ApiResult(fleet.status, fleet.headers, fleet.body, _HIT)
        if commit is None and revision and route in ("tree", "paths-info") and self.xet is not None:
            try:
                commit = await self._listing_commit(target, caller)
            except UpstreamUnavailable as exc:  # one wait for a dead upstream, not two
                return await self.stale_api(target, caller, cached, exc)
        upstream_path = raw_path + (f"?{urlencode(query)}" if query else "")
        try:
            response = await self.upstream.api("POST" if form is not None else "GET", upstream_path, caller.token,
                                               form=form, guard=caller.check)
        except UpstreamUnavailable as exc:
            return await self.stale_api(target, caller, cached, exc)
        if response.status_code >= 500:
            return await self.stale_api(target, caller, cached, self.upstream.error(response, resolve=False))
        if response.status_code >= 400:
            error = self.upstream.error(response, resolve=False, infer=False)  # upstream's code, or none
            if immutable and isinstance(error, EntryNotFound):
                # A path missing at a commit stays missing: remember it, so that datasets' probes of absent folders
                # keep their fast 404 while upstream is down.
                headers = tuple((k, v) for k, v in response.headers.items()
                                if k.lower() in hf.API_RELAYED_HEADERS and k.lower() != "x-error-message")
                if not any(k.lower() == _ERROR_CODE for k, _ in headers):
                    headers += ((_ERROR_CODE, ErrorCode.ENTRY_NOT_FOUND.value),)
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
        if self.shared is not None:
            self.shared.share_api(target.repo, key_rev, key_route, key_query, entry)
        self.access.record_public(target.repo, "meta", caller.token)
        self.access.record_allowed(target.repo, "meta", caller.token)
        return ApiResult(entry.status, entry.headers, entry.body, _MISS)

    async def _listing_commit(self, target: hf.ApiTarget, caller: Caller) -> str | None:
        """The commit a branch's listing is of, asked first when not known: upstream's Xet hashes are learned (and
        put back on the listing) per commit, so that a cold ``HfFileSystem`` (which lists a branch before anything
        names its commit) still takes the Xet path, as files over 50 GB need. ``None`` when upstream will not say:
        the listing then goes out without Xet hashes, as before."""
        assert target.revision is not None
        revision = hf.ApiTarget(target.repo, "revision", target.revision, "")
        raw_path = f"{target.repo.api_path()}/revision/{quote(target.revision, safe='')}"
        try:
            answer = await self.api(revision, "GET", raw_path, [], None, caller)
        except UpstreamUnavailable:
            raise
        except MirrorError:
            return None  # upstream refused the revision: the listing's own answer will say why
        if answer.outcome is _STALE:
            raise UpstreamUnavailable(f"upstream did not answer for {target.repo.key}@{target.revision}")
        return self.core.known_commit(target.repo, target.revision, fresh=True)

    async def stale_api(self, target: hf.ApiTarget, caller: Caller, cached: ApiEntry | None,
                        cause: MirrorError) -> ApiResult:
        """``cached`` served stale when upstream failed (``cause``), if the repo's stale-access rule lets the caller
        have it (counted); else the refusal, or ``cause`` when nothing is stored."""
        if cached is None:
            raise cause
        if not self.access.may_serve_stale(target.repo, "meta", caller):
            raise self.core.unconfirmed(caller, target.repo, "meta")
        self.metrics.stale_served.inc()
        log.warning("serving API %s %s stale: %s", target.repo.key, target.sub or "info", cause.message)
        return ApiResult(cached.status, cached.headers, cached.body, _STALE)

    async def check_meta_access(self, target: hf.ApiTarget, caller: Caller, cached: ApiEntry) -> None:
        """Raise unless ``caller`` may read the repo's metadata (public, or confirmed upstream for its token)."""
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


def _learn_revision(service: ApiService, target: hf.ApiTarget, revision: str, entry: ApiEntry) -> None:
    """A revision's info another node fetched names its commit: the ref, as old as that answer (never fresher)."""
    try:
        sha = str(json.loads(entry.body).get("sha", ""))
    except (ValueError, AttributeError):
        return
    if revision != sha and hf.is_commit(sha):
        service.index.put_ref_at(target.repo, revision, sha, entry.fetched_at)


async def _recall_xet(service: ApiService, target: hf.ApiTarget, commit: str, entry: ApiEntry) -> None:
    """The Xet hashes of a listing another node fetched (the stored body is Xet-stripped): from the fleet."""
    try:
        data = json.loads(entry.body)
    except ValueError:
        return
    await service.xet.recall_listing(target.repo, commit, data)


def _rewrite_json(body: bytes, route: str, target: hf.ApiTarget, revision: str | None, commit: str | None,
                  service: ApiService) -> bytes:
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
        service.core.remember_ref(target.repo, revision, data["sha"])
    return json.dumps(data, separators=(",", ":")).encode()

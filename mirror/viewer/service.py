"""The dataset viewer's answers and the Hub's parquet-conversion routes, cached: the policy (no web framework here).

``datasets.load_dataset`` asks ``datasets-server.<HF_ENDPOINT host>/info?dataset=...`` (with the user's token) and
uses the answer only when its ``X-Revision`` is the commit it resolved and the JSON says ``partial: false`` with
``pending`` and ``failed`` present and empty. The mirror answers that host itself (see :mod:`mirror.routes.viewer`):

- ``/info``, ``/splits``, ``/parquet``, ``/size``, ``/is-valid`` are asked upstream (``viewer_upstream``) with the
  caller's token and cached per dataset and query: the newest answer, and the answer per ``X-Revision`` commit.
  Fresh for ``revision_ttl``; stale when upstream fails; offline, the cached answer (the one for the commit ``main``
  is known at, when there is one) or, with pyarrow installed, one built from cached parquet files
  (:mod:`mirror.viewer.parquet_info`); else a fast 404.
- Every answer passes the same per-caller access check as the dataset's files (``content``), because that is the
  viewer's own rule (it asks the Hub's auth check with the caller's token) and a gated dataset's API JSON is public
  while its viewer answers are not: a cached answer of a private or gated dataset goes only to a caller whose access
  upstream confirmed (a viewer answer, or a file of the dataset, fetched with that token; else one HEAD of a file
  of the dataset on the Hub with it; offline or upstream down: a confirmation within ``access_grace``). Anyone else
  gets what the viewer answers them: 401 ``ExternalUnauthenticatedError`` without a token, 404
  ``ExternalAuthenticatedError`` with one. The mirror's service token is never sent for a caller's request.
- Only the query parameters an endpoint understands go upstream and into the key; bodies are bounded by
  ``max_api_body``; errors are never cached (junk names cannot grow the index).
- Upstream URLs in bodies (``parquet_files[].url``) are rewritten to the mirror, per request.

The Hub's ``/api/datasets/{repo}/parquet[/{config}[/{split}]]`` listing is cached the same way; its
``.../{n}.parquet`` redirect into ``refs/convert/parquet`` is answered from the cached branch when the mirror knows the
branch's commit and the file, else asked upstream (never followed) and remembered.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from mirror import hf
from mirror.access import AccessPolicy, Caller, offline_refusal
from mirror.config import Settings
from mirror.errors import (
    AccessDenied,
    EntryNotFound,
    ErrorCode,
    HubError,
    MirrorError,
    RevisionNotFound,
    UpstreamUnavailable,
    ViewerNotFound,
)
from mirror.index import ApiEntry, MetadataIndex, api_query_key
from mirror.metrics import Metrics, Outcome
from mirror.upstream.viewer import ViewerUpstream

log = logging.getLogger("hf_mirror.viewer")

# The viewer's endpoints the mirror answers, with the query parameters each understands (``dataset`` is the repo).
VIEWER_ENDPOINTS: dict[str, tuple[str, ...]] = {
    "info": ("config",), "splits": ("config",), "parquet": ("config", "split"), "size": ("config",),
    "is-valid": (),
}
PARQUET_BRANCH = "refs/convert/parquet"
_LATEST = "viewer"  # the index's revision slot for the newest answer (per-commit answers use the commit)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")  # a config or split name
_PARQUET_FILE_RE = re.compile(r"^(\d{1,6})\.parquet$")
_KEPT_HEADERS = ("content-type", "x-revision", "x-error-code", "x-error-message")
_ACCESS = "content"  # the viewer's answers are the dataset's content, read with the dataset's files' access rule
# The viewer's answers to a caller who may not read the dataset (its libapi's auth check).
_UNAUTHENTICATED = ("The dataset does not exist, or is not accessible without authentication (private or gated). "
                    "Please check the spelling of the dataset name or retry with authentication.")
_AUTHENTICATED = ("The dataset does not exist, or is not accessible with the current credentials (private or gated). "
                  "Please check the spelling of the dataset name or retry with other authentication credentials.")
_DENIED_CODES = ("ExternalUnauthenticatedError", "ExternalAuthenticatedError", ErrorCode.REPO_NOT_FOUND,
                 ErrorCode.GATED_REPO)


@dataclass(frozen=True)
class ViewerResult:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    outcome: Outcome


def check_name(value: str | None, what: str) -> str | None:
    if value is not None and not _NAME_RE.match(value):
        raise ViewerNotFound(f"invalid {what} {value[:100]!r}")
    return value


def rewrite_urls(body: bytes, replacements: tuple[tuple[str, str], ...]) -> bytes:
    """Every JSON string that starts with an upstream base, pointed at the mirror instead."""
    if not any(old.encode() in body for old, _ in replacements):
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            for old, new in replacements:
                if node == old or node.startswith(old + "/"):
                    return new + node[len(old):]
            return node
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        return node

    return json.dumps(walk(data)).encode()


class ViewerService:
    def __init__(self, settings: Settings, index: MetadataIndex, access: AccessPolicy, upstream: ViewerUpstream,
                 metrics: Metrics,
                 offline_info: Callable[[hf.RepoRef, str | None], Awaitable[tuple[dict[str, Any], str] | None]]
                 | None = None) -> None:
        self.settings = settings
        self.index = index
        self.access = access
        self.upstream = upstream
        self.metrics = metrics
        self.enabled = settings.viewer_upstream not in ("off", "none")
        # Offline /info from cached parquet files: (repo, config) -> (the answer's JSON, its commit), or None.
        self.offline_info = offline_info

    def pointed_at(self, *, hub: str, viewer: str) -> tuple[tuple[str, str], ...]:
        """The replacements (:func:`rewrite_urls`) that point upstream's URLs in an answer at ``hub`` and ``viewer``
        (the mirror's bases as a client reached it): the viewer's base first, then the Hub's."""
        return (self.upstream.base, viewer), (self.upstream.upstream.base, hub)

    # --- the viewer host -------------------------------------------------------------------------------------------

    async def answer(self, endpoint: str, repo: hf.RepoRef, query: list[tuple[str, str]],
                     caller: Caller) -> ViewerResult:
        """The viewer's answer to ``/{endpoint}?dataset={repo}&...`` for ``caller``."""
        known = VIEWER_ENDPOINTS[endpoint]
        params = [(k, v) for k, v in query if k in known]
        for key, value in params:
            check_name(value, key)
        path_qs = f"/{endpoint}?" + urlencode([("dataset", repo.repo_id), *params])
        offline = self.settings.offline or not self.enabled
        try:
            result = await self._cached(repo, f"viewer-{endpoint}:", api_query_key(params, None), caller, offline,
                                        lambda: self.upstream.viewer(path_qs, caller.token), resolve_error=False)
        except (HubError, AccessDenied) as exc:
            raise _viewer_denial(exc, caller) from None
        if result is not None:
            return result
        if endpoint == "info" and self.offline_info is not None:
            built = await self.offline_info(repo, dict(params).get("config"))
            if built is not None:
                try:
                    await self._check_access(repo, caller)
                except (HubError, AccessDenied) as exc:
                    raise _viewer_denial(exc, caller) from None
                headers = (("content-type", "application/json"), ("x-revision", built[1]))
                return ViewerResult(200, headers, json.dumps(built[0]).encode(), Outcome.STALE)
        raise ViewerNotFound(f"The dataset viewer's answer for {repo.repo_id} is not cached on this mirror"
                             + (" and the mirror is offline" if self.settings.offline else ""))

    # --- the Hub's parquet routes ----------------------------------------------------------------------------------

    async def hub_parquet(self, repo: hf.RepoRef, config: str | None, rest: str, caller: Caller) -> ViewerResult:
        """``/api/datasets/{repo}/parquet[/{config}[/{split}[/{n}.parquet]]]``."""
        check_name(config, "config")
        split, _, name = rest.partition("/")
        check_name(split or None, "split")
        path = repo.api_path("/parquet" + "".join(f"/{quote(p, safe='')}" for p in (config, split, name) if p))
        if name:
            match = _PARQUET_FILE_RE.match(name)
            if match is None or "/" in name or not config or not split:
                raise ViewerNotFound(f"{name[:100]!r} is not a parquet file of the conversion")
            local = self._branch_redirect(repo, config, split, int(match.group(1)))
            if local is not None:
                await self._check_access(repo, caller)
                return ViewerResult(302, (("location", local), ("content-type", "application/json")), b"{}",
                                    Outcome.HIT)
        route = f"hub-parquet:{config or ''}/{split}/{name}"
        result = await self._cached(repo, route, "", caller, self.settings.offline,
                                    lambda: self.upstream.hub(path, caller.token), resolve_error=False)
        if result is None and not name:
            result = await self._derived_listing(repo, config, split, caller)
        if result is None:
            raise ViewerNotFound(f"{path} is not cached on this mirror and the mirror is offline")
        return result

    async def _derived_listing(self, repo: hf.RepoRef, config: str | None, split: str,
                               caller: Caller) -> ViewerResult | None:
        """Offline, a config's or a split's listing cut out of the cached whole listing."""
        whole = self._pick(repo, "hub-parquet://", "")
        if whole is None or whole.status != 200 or not config:
            return None
        try:
            data = json.loads(whole.body)
            part = data[config] if not split else data[config][split]
        except (ValueError, KeyError, TypeError):
            raise ViewerNotFound(f"{config}/{split} is not in the cached parquet listing of {repo.repo_id}") from None
        await self._check_access(repo, caller)
        return ViewerResult(200, (("content-type", "application/json"),), json.dumps(part).encode(), Outcome.HIT)

    def _branch_redirect(self, repo: hf.RepoRef, config: str, split: str, n: int) -> str | None:
        """The resolve path of the ``n``-th parquet file of ``config/split`` in the cached conversion branch."""
        ref = self.index.get_ref(repo, PARQUET_BRANCH)
        if ref is None:
            return None
        for folder in (split, f"partial-{split}"):
            path = f"{config}/{folder}/{n:04d}.parquet"
            entry = self.index.get_file(repo, ref.commit, path)
            if entry is not None and not entry.missing:
                return f"/{repo.type.url_prefix}{repo.repo_id}/resolve/{quote(PARQUET_BRANCH, safe='')}/{path}"
        return None

    # --- the cache -------------------------------------------------------------------------------------------------

    async def _cached(self, repo: hf.RepoRef, route: str, query_key: str, caller: Caller, offline: bool,
                      ask: Callable[[], Awaitable[Any]], *, resolve_error: bool) -> ViewerResult | None:
        """The cached answer while fresh (or offline); else upstream's, cached; stale when upstream fails.
        ``None`` when offline and nothing is cached."""
        cached = self._pick(repo, route, query_key)
        fresh = cached is not None and time.time() - cached.fetched_at < self.settings.revision_ttl
        if cached is not None and (fresh or offline):
            await self._check_access(repo, caller)
            return ViewerResult(cached.status, cached.headers, cached.body, Outcome.HIT)
        if offline:
            return None
        try:
            answer = await ask()
        except UpstreamUnavailable as exc:
            return await self._stale(repo, caller, cached, exc)
        status = answer.status_code
        if status >= 500 or status == 429:
            error = self.upstream.upstream.error(answer, resolve=resolve_error)
            return await self._stale(repo, caller, cached, error)
        if status >= 400:
            # Only an auth refusal says the dataset is not public (a 404 for a dataset without a conversion does not).
            if caller.token is None and (status == 401 or answer.headers.get(hf.H_ERROR_CODE) in _DENIED_CODES):
                self.access.record_public(repo, _ACCESS, None, public=False)
            raise self.upstream.upstream.error(answer, resolve=resolve_error)
        headers = tuple((k.lower(), v) for k, v in answer.headers.items() if k.lower() in _KEPT_HEADERS)
        if status in (301, 302, 303, 307, 308):
            location = answer.headers.get("location", "")
            if location.startswith(self.upstream.upstream.base + "/"):
                location = location[len(self.upstream.upstream.base):]
            if not location.startswith("/"):
                raise UpstreamUnavailable("upstream redirected the parquet file outside the Hub")
            headers += (("location", location),)
        entry = ApiEntry(status, headers, answer.content, time.time())
        self.index.put_api(repo, _LATEST, route, query_key, entry)
        revision = dict(headers).get("x-revision", "")
        if hf.is_commit(revision):
            self.index.put_api(repo, revision, route, query_key, entry)
        self.access.record_public(repo, _ACCESS, caller.token)
        self.access.record_allowed(repo, _ACCESS, caller.token)
        return ViewerResult(entry.status, entry.headers, entry.body, Outcome.MISS)

    def _pick(self, repo: hf.RepoRef, route: str, query_key: str) -> ApiEntry | None:
        """The answer for the commit ``main`` is known at, when cached; else the newest."""
        latest = self.index.get_api(repo, _LATEST, route, query_key)
        main = self.index.get_ref(repo, "main")
        if main is not None and (latest is None or dict(latest.headers).get("x-revision") != main.commit):
            pinned = self.index.get_api(repo, main.commit, route, query_key)
            if pinned is not None:
                return pinned
        return latest

    async def _stale(self, repo: hf.RepoRef, caller: Caller, cached: ApiEntry | None,
                     cause: MirrorError) -> ViewerResult:
        if cached is None:
            raise cause
        if not self.access.may_serve_stale(repo, _ACCESS, caller):
            raise UpstreamUnavailable("Upstream is unreachable and access to this dataset cannot be confirmed")
        self.metrics.stale_served.inc()
        log.warning("serving the viewer's answer for %s stale: %s", repo.key, cause.message)
        return ViewerResult(cached.status, cached.headers, cached.body, Outcome.STALE)

    async def _check_access(self, repo: hf.RepoRef, caller: Caller) -> None:
        """The dataset's ``content`` access, as for its files: public, or confirmed for this caller's token (else one
        HEAD of a file on the Hub with it: a missing file still says the token may read the dataset)."""
        offline = self.settings.offline

        async def probe(token: str | None) -> None:
            if offline:
                raise UpstreamUnavailable("offline")
            try:
                await self.upstream.upstream.head_file(repo, "main", ".gitattributes", token, caller.check)
            except (EntryNotFound, RevisionNotFound):
                return

        try:
            await self.access.check(repo, _ACCESS, caller, probe)
        except UpstreamUnavailable:
            if offline:
                raise offline_refusal(caller, unknown=self.access.visibility_unknown(repo, _ACCESS)) from None
            raise


def _viewer_denial(exc: HubError | AccessDenied, caller: Caller) -> MirrorError:
    """What the viewer answers a caller who may not read the dataset (the mirror's own reason kept when offline);
    any other error as it is."""
    if isinstance(exc, AccessDenied) or exc.status in (401, 403) or exc.code in _DENIED_CODES:
        # As the viewer maps the Hub's auth check: its 401 (no token, or one it does not know) -> 401; a refusal
        # of a known token (403, 404) -> 404, which says nothing of whether the dataset exists.
        offline = isinstance(exc, AccessDenied)
        if exc.status == 401 or caller.token is None:
            return HubError(401, "ExternalUnauthenticatedError", exc.message if offline else _UNAUTHENTICATED)
        return HubError(404, "ExternalAuthenticatedError", exc.message if offline else _AUTHENTICATED)
    return exc

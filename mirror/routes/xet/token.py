"""The Xet token route and the hints that lead clients to it (:mod:`mirror.routes.xet`, steps 1 and 2): ``X-Xet-Hash``
and the ``xet-auth`` link on resolve answers, ``xetHash`` on tree and paths-info entries, and
``GET /api/{type}s/{repo}/xet-read-token/{rev}``, the mirror's own signed token after resolve's access check."""

from __future__ import annotations

import json
from urllib.parse import quote

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.asgi import Scope, Send
from mirror.audit import caller_of
from mirror.config import Settings
from mirror.errors import EntryNotFound, HubError, MirrorError, OfflineMiss, RevisionNotFound, UpstreamUnavailable
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import mirror_base, send_error
from mirror.service import MirrorService
from mirror.service.answers import ApiResult, ResolvedFile
from mirror.xet import CAS_PREFIX, XetCatalog, XetSigner


class XetTokenRoute:
    def __init__(self, settings: Settings, service: MirrorService, catalog: XetCatalog, signer: XetSigner,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.service = service
        self.catalog = catalog
        self.signer = signer
        self.metrics = metrics
        self.token_ttl = settings.xet_token_ttl

    # --- hints on the mirror's own answers -------------------------------------------------------------------------

    def resolve_headers(self, scope: Scope, resolved: ResolvedFile) -> list[tuple[bytes, bytes]]:
        """``X-Xet-Hash`` and the ``xet-auth`` link (the mirror's token route) for a file upstream marks as Xet."""
        entry = resolved.entry
        if not entry.lfs:
            return []
        xet_hash = self.catalog.hint(resolved.repo, entry.commit, entry.path, entry.etag)
        if xet_hash is None:
            return []
        route = f"{mirror_base(scope)}{resolved.repo.api_path()}/xet-read-token/{entry.commit}"
        return [(b"x-xet-hash", xet_hash.encode()), (b"link", f'<{route}>; rel="xet-auth"'.encode("latin-1"))]

    def annotate(self, target: hf.ApiTarget, result: ApiResult) -> ApiResult:
        """Tree and paths-info answers: ``xetHash`` back on the entries whose blob upstream named."""
        if target.sub not in ("tree", "paths-info") or result.status != 200 or b'"lfs"' not in result.body:
            return result
        commit = self._commit(target.repo, target.revision)
        if commit is None and target.revision and (result.outcome is Outcome.STALE or self.settings.offline):
            # A listing served from the cache (upstream down, or offline) is of the commit the ref last named: the
            # token route resolves the branch the same way, so the hint stays one the mirror can serve.
            commit = self.service.commit_of(target.repo, target.revision, fresh=False)
        if commit is None:
            return result
        try:
            data = json.loads(result.body)
        except ValueError:
            return result
        if not self.catalog.annotate_listing(target.repo, commit, data):
            return result
        body = json.dumps(data, separators=(",", ":")).encode()
        return ApiResult(result.status, result.headers, body, result.outcome)

    def _commit(self, repo: hf.RepoRef, revision: str | None) -> str | None:
        if not revision:
            return None
        return self.service.commit_of(repo, revision)

    # --- the token route -------------------------------------------------------------------------------------------

    async def token(self, scope: Scope, send: Send, target: hf.ApiTarget, caller: Caller) -> Outcome:
        head = scope["method"] == "HEAD"
        try:
            repo = target.repo
            commit = await self._granted_commit(repo, target.revision or "", caller)
            claims = {"t": repo.type.value, "r": repo.repo_id, "c": commit, "u": token_digest(caller.token),
                      "w": caller_of(scope), **self._caller_claims(caller)}  # w: who, as the audit log names them
            token, exp = self.signer.sign("access", claims, self.token_ttl)
        except MirrorError as exc:
            self.metrics.requests.labels(route="xet-token", outcome=Outcome.ERROR).inc()
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        cas_url = mirror_base(scope) + CAS_PREFIX
        body = json.dumps({"accessToken": token, "exp": exp, "casUrl": cas_url}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store"), (b"x-xet-cas-url", cas_url.encode("latin-1")),
                   (b"x-xet-access-token", token.encode()), (b"x-xet-token-expiration", str(exp).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})
        self.metrics.requests.labels(route="xet-token", outcome=Outcome.HIT).inc()
        return Outcome.HIT

    async def _granted_commit(self, repo: hf.RepoRef, revision: str, caller: Caller) -> str:
        """The commit ``revision`` names, once this caller passed the checks a resolve of the repo's content makes.

        First the revision's info with the caller's token (cached as the API route caches it): a private repo and a
        missing one get upstream's one answer (401 without a token, 404 with one), whatever this node has seen of
        either. Then the resolve of one file of the repo (gated, private, offline and confirmed-access rules): a
        file this node knows, else the first the revision lists, so no HEAD through this node is needed first."""
        if not revision:
            raise RevisionNotFound("A Xet token is for a revision: /xet-read-token/{revision}")
        info: dict | None = None
        unreachable: MirrorError | None = None
        try:
            answer = await self.service.api(hf.ApiTarget(repo, "revision", revision, ""), "GET",
                                            f"{repo.api_path()}/revision/{quote(revision, safe='')}", [], None,
                                            caller)
            info = _info(answer)
        except (OfflineMiss, UpstreamUnavailable) as exc:
            # Offline or upstream down, and the revision's info not cached: the ref and a file this node knows, with
            # the rules a resolve applies then (confirmed access within the grace period).
            unreachable = exc
        commit = str(info["sha"]) if info and hf.is_commit(str(info.get("sha", ""))) else (
            self._commit(repo, revision) or self.service.commit_of(repo, revision, fresh=False))
        probe = self.catalog.probe_path(repo)
        if probe is None and commit and (path := _first_path(info)):
            probe = (commit, path)
        if not commit or probe is None:
            raise unreachable or EntryNotFound(commit or None, "No file of this revision is known to the mirror")
        # The access check a resolve of this repo's content makes for this caller (gated, private, offline).
        await self.service.resolve_file(hf.ResolveTarget(repo, probe[0], probe[1]), caller)
        return commit

    def _caller_claims(self, caller: Caller) -> dict[str, str]:
        """How the CAS reads upstream for this caller: its own token (sealed), none, or the service token (``svc``:
        never written into a claim; the CAS takes it from the settings again)."""
        if caller.token is None:
            return {"m": "anon"}
        if caller.own_token:
            return {"m": "own", "a": self.signer.seal(caller.token)}
        return {"m": "svc"}


def _info(answer: ApiResult) -> dict | None:
    """The revision's info JSON, or the error it was cached as (a missing path at a commit is remembered)."""
    if answer.status >= 400:
        headers = {k.lower(): v for k, v in answer.headers}
        raise HubError(answer.status, headers.get(hf.H_ERROR_CODE.lower()),
                       headers.get(hf.H_ERROR_MESSAGE.lower()) or "Not found")
    try:
        data = json.loads(answer.body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _first_path(info: dict | None) -> str | None:
    for sibling in (info or {}).get("siblings") or ():
        if isinstance(sibling, dict) and isinstance(sibling.get("rfilename"), str):
            return sibling["rfilename"]
    return None

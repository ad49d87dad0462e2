"""``POST /api/mirror/warm``, ``GET /api/mirror/warm/{id}``, ``GET /api/mirror/ready``: warm on request.

The JSON in and out is the mirror's own API (not the Hub's); errors keep the Hub's shape. The work is
:mod:`mirror.sync.warm`'s; the caller's identity comes from the app, checked against the repo the request names.
A warm adds to the cache: it is open for a repo whose content is public, else only to a caller whose access upstream
confirmed (the rule a resolve applies), or to an operator. A job's status follows the same read rule: a caller who
may not read the job's repo gets the answer an unknown id gets.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.asgi import Receive, Scope, Send
from mirror.errors import BadRequest, ErrorCode, HubError, MirrorError, RepoNotFound, RouteNotFound
from mirror.routes.common import bearer_token, query_pairs, read_body, refuse_cross_site, send_error
from mirror.sync.warm import WarmJobs, WarmRequest

_MAX_BODY = 64 * 1024
_MAX_PATTERNS = 200
_UNKNOWN_JOB = "no such warm job (jobs are kept in memory, the last 1000)"
Authorize = Callable[[hf.RepoRef], Caller]  # the caller, after the lists and the mirror token allow the repo
Confirm = Callable[[hf.RepoRef, str, Caller], Awaitable[None]]  # raises unless the caller may read the repo's content


class WarmHandler:
    def __init__(self, jobs: WarmJobs, *, body_timeout: float, confirm: Confirm) -> None:
        self.jobs = jobs
        self.body_timeout = body_timeout
        self.confirm = confirm

    async def __call__(self, scope: Scope, receive: Receive, send: Send, raw_path: str,
                       authorize: Authorize, operator: bool = False) -> str:
        try:
            path = raw_path.rstrip("/")
            if path == "/api/mirror/warm":
                request = _request(await self._json_body(scope, receive))
                caller = authorize(request.repo)
                try:
                    if not operator:
                        await self.confirm(request.repo, request.revision, caller)
                    job = await self.jobs.submit(request, caller, who=_who(scope), operator=operator)
                except HubError as exc:
                    if exc.code != ErrorCode.REPO_NOT_FOUND:
                        raise
                    # The Hub's 401 "Repository not found" reads as a credentials problem: name the repo instead.
                    whose = ("to your token" if caller.own_token else "to the mirror's token" if caller.token
                             else "without a token")
                    raise RepoNotFound(f"{request.repo.type.value} {request.repo.repo_id} not found upstream, "
                                       f"or not visible {whose}") from None
                await _send_json(send, 202, job.as_json())  # an identical warm queued or running: that job
                return "warm"
            if path == "/api/mirror/ready":
                query = query_pairs(scope)
                fields: dict[str, Any] = {k: v for k, v in query if k in ("repo", "type", "revision")}
                for key in ("allow_patterns", "ignore_patterns"):
                    values = [v for k, v in query if k == key]
                    if values:
                        fields[key] = values
                request = _request(fields)
                readiness = await self.jobs.ready(request, authorize(request.repo))
                await _send_json(send, 200 if readiness.ready else 503, readiness.as_json(),
                                 head=scope["method"] == "HEAD")
                return "ready" if readiness.ready else "not-ready"
            job = await self.jobs.find(path.rsplit("/", 1)[-1])  # this node's, or the fleet's
            if job is None or not (operator or await self._may_read(job.request.repo, job.commit, authorize)):
                raise RouteNotFound(_UNKNOWN_JOB)
            await _send_json(send, 200, job.as_json(), head=scope["method"] == "HEAD")
            return "warm-status"
        except MirrorError as exc:
            await send_error(send, exc, head=scope["method"] == "HEAD")
            return "error"

    async def _may_read(self, repo: hf.RepoRef, commit: str, authorize: Authorize) -> bool:
        """Whether the caller may read ``repo`` (the lists, the mirror token's patterns, then its content)."""
        try:
            await self.confirm(repo, commit, authorize(repo))
        except MirrorError:
            return False
        return True

    async def _json_body(self, scope: Scope, receive: Receive) -> Any:
        refuse_cross_site(scope)  # JSON only, and never from a page on another origin (its preflight grants nothing)
        body = await read_body(receive, limit=_MAX_BODY, timeout=self.body_timeout)
        try:
            return json.loads(body or b"{}")
        except ValueError:
            raise BadRequest("request body is not valid JSON") from None


def _who(scope: Scope) -> str:
    """The caller as the warm rate counts it: its token (a digest), else its address."""
    token = bearer_token(scope)
    if token:
        return "token:" + token_digest(token)
    client = scope.get("client")
    return "addr:" + (client[0] if client else "?")


def _request(data: Any) -> WarmRequest:
    """A warm or ready request from JSON or query fields, each checked: a clear 400 for bad input."""
    if not isinstance(data, dict):
        raise BadRequest('expected a JSON object: {"repo": "org/name", "type": "model", "revision": "main"}')
    unknown = sorted(set(data) - {"repo", "type", "revision", "allow_patterns", "ignore_patterns"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    repo_id = data.get("repo")
    if not isinstance(repo_id, str) or not repo_id:
        raise BadRequest('"repo" is required, e.g. "org/name"')
    kind = data.get("type", "model")
    if kind not in ("model", "dataset", "space"):
        raise BadRequest('"type" must be "model", "dataset" or "space"')
    revision = data.get("revision", "main")
    if not isinstance(revision, str):
        raise BadRequest('"revision" must be a string')
    return WarmRequest(hf.RepoRef(hf.RepoType(kind), hf.validate_repo_id(repo_id)), hf.validate_revision(revision),
                       _patterns(data.get("allow_patterns"), "allow_patterns"),
                       _patterns(data.get("ignore_patterns"), "ignore_patterns"))


def _patterns(value: Any, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if (not isinstance(value, list) or len(value) > _MAX_PATTERNS
            or not all(isinstance(p, str) and 0 < len(p) <= 256 for p in value)):
        raise BadRequest(f'"{name}" must be a list of at most {_MAX_PATTERNS} glob patterns')
    return tuple(value)


async def _send_json(send: Send, status: int, data: Any, *, head: bool = False) -> None:
    body = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": b"" if head else body})

"""Operations routes: ``/healthz``, ``/metrics``, the status page at ``/`` and its JSON at ``/api/mirror/status``
(both take ``?page=&q=&per_page=&sort=&order=&type=&pinned=``, and ``?repo=model:org/name`` for one repo's page: 404
when it is not cached or not the caller's to see), and the operator's actions on one repo:
``POST /api/mirror/repos/{type}/{org/name}/pin|unpin|evict`` (JSON answers; :class:`RepoActions`).

What a caller sees on these routes is narrowed by the app (``hf_mirror.visible`` in the request's scope: a mirror
token's patterns), and the repo actions follow one rule: ``unpin`` and ``evict`` take an operator credential;
``pin`` (like a warm) is open only for a repo whose content the caller may read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from mirror import hf
from mirror.access import Caller
from mirror.asgi import Receive, Scope, Send
from mirror.errors import BadRequest, MethodNotAllowed, MirrorError, RouteNotFound
from mirror.metrics import Metrics
from mirror.routes.common import bearer_token, refuse_cross_site, send_error, send_preflight
from mirror.status import render_repo_page, render_status_page
from mirror.status.page import REFRESH

if TYPE_CHECKING:
    from mirror.cache import CacheManager

Status = Callable[..., Awaitable[dict[str, Any]]]

ACTIONS_PREFIX = "/api/mirror/repos/"
ACTIONS = ("pin", "unpin", "evict")
DESTRUCTIVE = ("unpin", "evict")  # they delete or un-protect cached content: an operator's
VISIBLE_KEY = "hf_mirror.visible"  # the scope entry the app sets: (type, repo id) -> may this caller see it
OPERATOR_KEY = "hf_mirror.operator"  # ... and this one when the caller sent the admin token: every repo listed
Confirm = Callable[[hf.RepoRef, str, Caller], Awaitable[None]]  # raises unless the caller may read the repo's content
_MAX_BODY = 4096


def ops_router(metrics: Metrics, status: Status, refresh: Callable[[], Awaitable[Any]] | None = None) -> APIRouter:
    router = APIRouter()


    def params(request: Request) -> dict[str, Any]:
        q = request.query_params
        return {"page": q.get("page"), "q": q.get("q"), "per_page": q.get("per_page"), "sort": q.get("sort"),
                "order": q.get("order"), "type": q.get("type"), "pinned": q.get("pinned"), "repo": q.get("repo"),
                # The caller's token: a Hub token's confirmed gated or private repos are listed to it.
                "token": bearer_token(request.scope),
                "visible": request.scope.get(VISIBLE_KEY), "operator": request.scope.get(OPERATOR_KEY, False)}

    def refresh_every(request: Request) -> int:
        try:
            return min(max(int(request.query_params.get("refresh", REFRESH)), 0), 3600)
        except ValueError:
            return REFRESH

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 once the mirror is ready to serve."""
        return JSONResponse({"status": "ok"})

    @router.get("/metrics")
    async def metrics_endpoint() -> Response:
        """Prometheus metrics (the cache-size gauges from the last usage snapshot: no scan on this path)."""
        await (refresh() if refresh is not None else status())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @router.get("/api/mirror/status")
    async def status_json(request: Request) -> JSONResponse:
        """The status page's data as JSON: ``?q=`` searches repo names, ``?type=``, ``?pinned=yes|no``,
        ``?sort=name|type|size|files|last_use|pinned&order=asc|desc``, ``?page=`` (1-based), ``?per_page=``; or one
        repo's with ``?repo=type:org/name``."""
        data = await status(**params(request))
        missing = "repo" in request.query_params and data.get("repo") is None
        return JSONResponse(data, status_code=404 if missing else 200, headers={"cache-control": "no-store"})

    @router.get("/", response_class=HTMLResponse)
    async def status_page(request: Request) -> HTMLResponse:
        """Server-rendered status page, or one repo's (same parameters as the JSON; ``?refresh=`` seconds)."""
        data = await status(**params(request))
        base = request.scope.get("root_path", "")  # the path prefix (mirror.front): every link starts with it
        every = refresh_every(request)
        if "repo" in request.query_params:
            return HTMLResponse(render_repo_page(data, base=base, refresh=every),
                                status_code=404 if data.get("repo") is None else 200,
                                headers={"cache-control": "no-store"})
        return HTMLResponse(render_status_page(data, base=base, refresh=every), headers={"cache-control": "no-store"})

    return router


def install(app: FastAPI, metrics: Metrics, status: Status, refresh: Callable[[], Awaitable[Any]] | None = None,
            ) -> None:
    app.include_router(ops_router(metrics, status, refresh))


# --- the operator's actions on one repo --------------------------------------------------------------------------


def parse_action(raw_path: str) -> tuple[hf.RepoRef, str]:
    """``/api/mirror/repos/model/acme/x/pin`` -> (model acme/x, ``pin``); 404 for anything else."""
    rest = raw_path[len(ACTIONS_PREFIX):].rstrip("/")
    kind, _, rest = rest.partition("/")
    repo_id, _, action = rest.rpartition("/")
    if action not in ACTIONS or kind not in ("model", "dataset", "space") or not repo_id:
        raise RouteNotFound("expected POST /api/mirror/repos/{model|dataset|space}/{org/name}/{pin|unpin|evict}")
    return hf.RepoRef(hf.RepoType(kind), hf.validate_repo_id(repo_id)), action


class RepoActions:
    """``POST /api/mirror/repos/{type}/{repo}/pin|unpin|evict``, never from a page of another site
    (:func:`refuse_cross_site`). In mirror-auth mode a mirror token whose patterns allow the repo is required first.
    ``unpin`` and ``evict`` then need an operator credential (``require_operator``: 403 otherwise); ``pin`` needs an
    operator or a caller who may read the repo's content (``confirm``: public content, or access upstream confirmed
    for the caller's token), as a warm does."""

    def __init__(self, cache: CacheManager, *, confirm: Confirm, body_timeout: float,
                 on_change: Callable[[], None] | None = None) -> None:
        self.cache = cache
        self.confirm = confirm
        self.body_timeout = body_timeout
        self.on_change = on_change

    async def __call__(self, scope: Scope, receive: Receive, send: Send, raw_path: str,
                       authorize: Callable[[hf.RepoRef], Caller], require_operator: Callable[[str], None],
                       operator: bool) -> str:
        method = scope["method"]
        try:
            repo, action = parse_action(raw_path)
            if method == "OPTIONS":
                await send_preflight(send, ("POST",), grant=False)
                return "options"
            if method != "POST":
                raise MethodNotAllowed(f"{method} is not allowed here: POST", allow=("POST",))
            refuse_cross_site(scope)
            await self._drain(receive)
            caller = authorize(repo)  # 401 without a mirror token in auth mode; the lists and the token's patterns
            if action in DESTRUCTIVE:
                require_operator(action)
            elif not operator:
                await self.confirm(repo, "main", caller)
            result: dict[str, Any] = {"type": repo.type.value, "repo": repo.repo_id, "action": action}
            if action == "pin":
                await self.cache.pin_repo(repo)
                result["pinned"] = True
            elif action == "unpin":
                result["was_pinned_by"] = await self.cache.unpin_repo(repo)
                result["pinned"] = False
            else:
                blobs, freed = await self.cache.evict_repo(repo)
                result.update(blobs=blobs, freed_bytes=freed)
            if self.on_change is not None:
                self.on_change()
            body = json.dumps(result).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": body})
            return action
        except MirrorError as exc:
            await send_error(send, exc, head=method == "HEAD")
            return "error"

    async def _drain(self, receive: Receive) -> None:
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout):
                while True:
                    message = await receive()
                    size += len(message.get("body", b""))
                    if size > _MAX_BODY:
                        raise BadRequest(f"request body over {_MAX_BODY} bytes")
                    if not message.get("more_body"):
                        return
        except TimeoutError:
            raise BadRequest(f"request body not received within {self.body_timeout:g} s") from None

"""``create_app(settings)``: the ASGI application over the parts that :mod:`mirror.parts` wires together.

The ASGI entry point dispatches on the *raw* path (see :mod:`mirror.hf`): resolve routes and Hub API routes go to
plain ASGI handlers (the hot path carries no framework overhead); operations routes (``/healthz``, ``/metrics``,
``/``) and the OpenAPI docs are a FastAPI app. Resources are built in the lifespan, not at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from mirror import hf
from mirror.access import Caller
from mirror.asgi import HEAD_BOUNDED, Receive, Scope, Send
from mirror.audit import AUDIT_WHO, AuditLog, AuditRecorder, IndexFollower, note_file
from mirror.auth import MirrorAuth
from mirror.config import Settings
from mirror.errors import HeadersTooLarge, MethodNotAllowed, MirrorError, RouteNotFound
from mirror.fill import PEER_ROUTE
from mirror.logs import AccessLog, request_id_from
from mirror.metrics import Metrics
from mirror.parts import build_parts
from mirror.routes import ops
from mirror.routes.api import ApiHandler
from mirror.routes.common import CORS_HEADERS, bearer_token, query_pairs, send_error, send_preflight
from mirror.routes.peer import PeerFillHandler
from mirror.routes.resolve import ResolveHandler
from mirror.routes.viewer import ViewerHandler, is_viewer_host, viewer_target
from mirror.routes.warm import WarmHandler
from mirror.routes.xet.cas import XetCas
from mirror.routes.xet.token import XetTokenRoute
from mirror.status import StatusBoard, StatusHistory
from mirror.sync.record import read_runs
from mirror.sync.warm import WarmJobs
from mirror.upstream.viewer import ViewerUpstream
from mirror.viewer.parquet_info import OfflineInfo
from mirror.viewer.service import ViewerService
from mirror.xet import CAS_PREFIX

log = logging.getLogger("hf_mirror")
# Operations routes that show repo names and traffic: in mirror-auth mode, for mirror-token holders only.
_GUARDED_OPS = ("", "/metrics", "/api/mirror/status")
_LENT = "hf_mirror.lent"  # scope key: (repo, kind) of an answer for a caller lent the service token
# The route class of a request, for hf_mirror_request_duration_seconds: set by _dispatch once it knows it.
ROUTE_CLASS = "hf_mirror.route"
# The memo of classified paths (check_canonical and classify depend on the path alone): bounded in entries and length.
_ROUTE_MEMO_ENTRIES = 4096
_ROUTE_MEMO_PATH = 1024
_ROUTE_CLASSES = {kind: kind.value for kind in hf.RouteKind}  # an enum's .value is a property call


class Mirror:
    """The running mirror's parts, built in the lifespan and closed on shutdown."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.parts = build_parts(settings, metrics)  # the one wiring (mirror.parts): store by `storage`, and the rest
        self.store = self.parts.store
        self.index = self.parts.index
        self.upstream = self.parts.upstream
        self.fills = self.parts.fills
        self.access = self.parts.access
        self.cache = self.parts.cache
        self.service = self.parts.service
        # Xet through the mirror (issue 17, mirror.routes.xet): off, every Xet hint is stripped as before.
        self.xet_token: XetTokenRoute | None = None
        self.xet_cas: XetCas | None = None
        signer = self.parts.xet_signer
        if signer is not None:
            catalog = self.service.xet  # built with the service (mirror.parts)
            self.xet_token = XetTokenRoute(settings, self.service, catalog, signer, metrics)
            self.xet_cas = XetCas(settings, self.service, self.fills, catalog, signer, metrics,
                                  audited=settings.audit_log)  # a reconstruction is an Xet download's audit event
        xet_token = self.xet_token
        self.resolve = ResolveHandler(self.service, self.fills, metrics,
                                      chunk_size=settings.serve_chunk_size, accel_redirect=settings.accel_redirect,
                                      xet_headers=xet_token.resolve_headers if xet_token else None)
        self.api = ApiHandler(self.service, metrics, max_paths_info=settings.max_paths_info,
                              max_relay_bytes=settings.max_api_body, body_timeout=settings.header_timeout,
                              annotate=xet_token.annotate if xet_token else None)
        self.peer = PeerFillHandler(self.fills, metrics, chunk_size=settings.serve_chunk_size)
        # Warm on request, on the nightly sync's engine (mirror.sync.warm); one job per warm across a fleet.
        self.warm_jobs = WarmJobs(self.parts, fleet=self.parts.metadata if settings.metadata_url else None)
        self.warm = WarmHandler(self.warm_jobs, body_timeout=settings.header_timeout,
                                confirm=self.service.confirm_content)
        # The dataset viewer's host and the Hub's parquet routes (issue 20): mirror.viewer.
        self.viewer = ViewerHandler(ViewerService(settings, self.index, self.access,
                                                  ViewerUpstream(self.upstream, settings.viewer_upstream or ""),
                                                  metrics, offline_info=OfflineInfo(self.index, self.store)),
                                    metrics)

        # The status page (mirror.status) and the operator's actions on one repo (mirror.routes.ops), issue 19.
        visible = None if settings.auth_required else self._public  # open to anyone: the repos anyone may read
        self.history = StatusHistory(metrics)
        admission = self.parts.admission
        self.board = StatusBoard(self.cache, settings, self.upstream, self.fills, self.history, visible=visible,
                                 warm_jobs=self.warm_jobs,  # and the admission policy's quarantine (issue 27):
                                 quarantine=admission.quarantined if admission is not None else None)
        self.repo_actions = ops.RepoActions(self.cache, confirm=self.service.confirm_content,
                                            body_timeout=settings.header_timeout, on_change=self.board.forget_pins)
        # The audit log (issue 27, mirror.audit): an event per file served and per refusal, indexed in the background.
        self.audit: AuditRecorder | None = None
        self.audit_index: IndexFollower | None = None
        if settings.audit_log:
            directory = settings.audit_directory
            self.audit = AuditRecorder(AuditLog(directory, max_file_bytes=settings.audit_file_size,
                                                session_idle=settings.audit_session_seconds),
                                       (settings.upstream_token or "",))
            self.audit_index = IndexFollower(directory)

    async def start(self) -> None:
        await self.parts.start()
        self.history.start()
        if self.audit_index is not None:
            self.audit_index.start()

    async def close(self) -> None:
        await self.history.aclose()
        await self.warm_jobs.aclose()
        await self.parts.aclose()
        if self.audit is not None:
            self.audit.log.close()
        if self.audit_index is not None:
            await self.audit_index.aclose()

    async def status(self, **params: Any) -> dict[str, Any]:
        """One page of the status data (``page``, ``q``, ``per_page``): mirror.status.StatusBoard."""
        return await self.board.data(**params)

    def _public(self, repo_type: str, repo_id: str) -> bool:
        repo = hf.RepoRef(hf.RepoType(repo_type), repo_id)
        return self.access.is_public(repo, "meta") or self.access.is_public(repo, "content")


class MirrorApp:
    """The ASGI application."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.mirror: Mirror | None = None
        self.auth = MirrorAuth(settings)
        self._routes: dict[str, hf.Route] = {}  # raw path -> its route, for paths check_canonical passed
        # A HEAD is an audit event only as an admission refusal: without a policy, a HEAD takes no audit note.
        self._audits_heads = settings.policy_active
        self.access_log = (AccessLog(settings.log_format, (settings.upstream_token or "",))
                           if settings.access_log else None)
        self.fastapi = FastAPI(title="hf-mirror", version="0.1.0", lifespan=self._lifespan)
        ops.install(self.fastapi, self.metrics, self._status, self._refresh)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self.mirror = Mirror(self.settings, self.metrics)
        await self.mirror.start()
        log.info("hf-mirror ready: upstream %s, cache %s%s", self.settings.upstream_display, self.settings.cache_dir,
                 " (offline)" if self.settings.offline else "")
        if self.settings.lend_upstream_token and self.settings.upstream_token and not self.settings.auth_required:
            log.warning("--lend-upstream-token: every caller that sends no token reads what the service token can "
                        "read, gated and private repos included. Use it only where every client is trusted.")
        try:
            yield
        finally:
            await self.mirror.close()
            if self.access_log is not None:
                self.access_log.flush()

    async def _status(self, **params: Any) -> dict[str, Any]:
        assert self.mirror is not None
        return await self.mirror.status(**params)

    async def _refresh(self) -> None:
        """/metrics: the cache gauges from the last usage snapshot (refreshed in a thread, never waited for twice)."""
        assert self.mirror is not None
        await self.mirror.cache.current_snapshot()
        await asyncio.to_thread(self._read_disk_and_sync)

    def _read_disk_and_sync(self) -> None:
        """/metrics: free disk under the cache, and what the syncs into this cache directory recorded."""
        assert self.mirror is not None
        with contextlib.suppress(OSError):
            self.metrics.disk_free_bytes.set(shutil.disk_usage(self.mirror.cache.root).free)
        for run in read_runs(self.mirror.parts.layout):
            self.metrics.sync_run(run.manifest, run.finished, run.ok, run.last_success)

    def caller(self, scope: Scope, repo: hf.RepoRef | None, kind: str = "content") -> Caller:
        """The request's identity (401 in auth mode without a valid mirror token), checked against the lists.
        ``kind``: what the answer shows of ``repo`` (``content``, or ``meta`` for the Hub API's JSON)."""
        caller, principal = self.auth.caller(bearer_token(scope))
        if principal is not None:
            scope[AUDIT_WHO] = principal.name  # the audit log names the mirror token's holder
        if repo is not None:
            self.auth.authorize(principal, repo)
            if caller.lent:
                scope[_LENT] = (repo, kind)
        return caller

    async def lent_caller(self, scope: Scope, repo: hf.RepoRef | None, kind: str = "content") -> Caller:
        """:meth:`caller`, and for a caller lent the service token, whether ``repo`` is public learned first: the
        answer may then go to a page on any origin (see :meth:`_any_origin`)."""
        caller = self.caller(scope, repo, kind)
        if caller.lent and repo is not None:
            assert self.mirror is not None
            await self.mirror.service.learn_visibility(repo, caller)
        return caller

    def _any_origin(self, scope: Scope) -> bool:
        """Whether the answer carries ``Access-Control-Allow-Origin: *``: always, as the Hub does, but for an answer
        the lent service token unlocked (``--lend-upstream-token``): the operator lends it to the callers, not to
        every web page they open (a page on another origin would read a private file through their browser)."""
        lent = scope.get(_LENT)
        if lent is None:
            return True
        assert self.mirror is not None
        return self.mirror.access.visibility(*lent) is True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.mirror is None:
            await self.fastapi(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_from(scope["headers"])
        status_box: list[int] = [0]
        size_box: list[int | None] = [None]
        request_header = (b"x-request-id", request_id.encode())
        audit = self.mirror.audit
        head = scope["method"] == "HEAD"

        async def send_outward(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if audit is not None:  # before the first byte: a served file's event is never lost (mirror.audit)
                    audit.response_started(scope, message, request_id)
                status_box[0] = message["status"]
                headers = message.get("headers", ())
                if not head:  # a HEAD's Content-Length announces no body: no size in the log
                    for name, value in headers:
                        if name == b"content-length":
                            size_box[0] = int(value)
                if _LENT not in scope or self._any_origin(scope):
                    message["headers"] = [*headers, *CORS_HEADERS, request_header]
                else:
                    message["headers"] = [*headers, request_header]
            await send(message)

        # The zero-copy path needs uvicorn's own bound ``send`` (see mirror.routes.sendfile): it travels in the scope.
        scope["hf_mirror.raw_send"] = send
        outcome = await self._dispatch(scope, receive, send_outward)
        elapsed = time.perf_counter() - started
        self.metrics.observe_request(scope.get(ROUTE_CLASS, "other"), outcome, elapsed)
        if self.access_log is not None:
            self.access_log.write(request_id, scope["method"], scope.get("path", ""), status_box[0] or "-",
                                  elapsed * 1000, outcome, size_box[0])

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> str:
        """Route a request. Read-only and closed by default: the path has one spelling, the method is a read, the
        repo passes every policy, and anything the mirror does not know is refused here, never relayed."""
        assert self.mirror is not None
        raw_path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        method = scope["method"]
        try:
            if HEAD_BOUNDED not in scope and sum(len(k) + len(v) for k, v in scope["headers"]) > \
                    self.settings.max_header_bytes:
                raise HeadersTooLarge(f"request headers exceed {self.settings.max_header_bytes} bytes")
            route = self._routes.get(raw_path)  # a path seen before: canonical, and what classify said of it
            if route is None:
                hf.check_canonical(raw_path)
            if is_viewer_host(scope):  # datasets-server.<this host>: the viewer's routes only, never relayed
                scope[ROUTE_CLASS] = "viewer"
                if method == "OPTIONS":
                    await send_preflight(send, ("GET", "HEAD"))
                    return "options"
                if method not in ("GET", "HEAD"):
                    raise MethodNotAllowed(f"{method} is not allowed here: this mirror is read-only")
                query = query_pairs(scope)
                endpoint, dataset = viewer_target(raw_path, query)
                return await self.mirror.viewer.viewer(scope, send, endpoint, dataset, query,
                                                       await self.lent_caller(scope, dataset))
            if raw_path == CAS_PREFIX or raw_path.startswith(CAS_PREFIX + "/"):  # the mirror's Xet CAS
                scope[ROUTE_CLASS] = "xet"
                if self.mirror.xet_cas is None:
                    raise RouteNotFound("Xet is not served by this mirror; clients download over HTTP")
                if method == "OPTIONS":
                    await send_preflight(send, ("GET", "HEAD"))
                    return "options"
                return await self.mirror.xet_cas.cas(scope, receive, send, raw_path[len(CAS_PREFIX):])
            if raw_path.startswith(PEER_ROUTE):  # another node of the fleet; its lease token stands for auth
                scope[ROUTE_CLASS] = "peer"
                return await self.mirror.peer(scope, receive, send, raw_path[len(PEER_ROUTE):])
            if raw_path.startswith(ops.ACTIONS_PREFIX):  # pin/unpin/evict one repo (mirror.routes.ops.RepoActions)
                scope[ROUTE_CLASS] = "mirror"
                bearer = bearer_token(scope)
                return await self.mirror.repo_actions(scope, receive, send, raw_path,
                                                      lambda repo: self.caller(scope, repo),
                                                      lambda action: self.auth.require_operator(bearer, action),
                                                      self.auth.is_operator(bearer))
            if route is None:
                route = hf.classify(raw_path)
                if len(raw_path) <= _ROUTE_MEMO_PATH:
                    if len(self._routes) >= _ROUTE_MEMO_ENTRIES:
                        self._routes.clear()
                    self._routes[raw_path] = route
            scope[ROUTE_CLASS] = _ROUTE_CLASSES[route.kind]
            if method == "OPTIONS":
                await send_preflight(send, route.methods, grant=route.kind is not hf.RouteKind.MIRROR)
                return "options"
            if method not in route.methods:
                raise MethodNotAllowed(f"{method} is not allowed here: this mirror is read-only",
                                       allow=route.methods)
            if route.resolve is not None:
                if self.mirror.audit is not None and (method != "HEAD" or self._audits_heads):
                    target = route.resolve
                    note_file(scope, target.repo.type.value, target.repo.repo_id, target.path, target.revision)
                caller = await self.lent_caller(scope, route.resolve.repo)
                return await self.mirror.resolve(scope, receive, send, route.resolve, caller)
            if route.api is not None:
                # The Hub's JSON about a repo is its metadata; its Xet token and parquet files are its content.
                meta = route.api.sub not in ("xet-read-token", "parquet")
                caller = await self.lent_caller(scope, route.api.repo, "meta" if meta else "content")
                if route.api.sub == "xet-read-token" and self.mirror.xet_token is not None:
                    return await self.mirror.xet_token.token(scope, send, route.api, caller)
                if route.api.sub == "parquet":  # the parquet conversion's listing and files (mirror.viewer)
                    return await self.mirror.viewer.hub_parquet(scope, send, route.api, caller)
                return await self.mirror.api(scope, receive, send, raw_path, route.api, caller, route.read)
            if route.kind is hf.RouteKind.MIRROR:  # warm and ready: the repo named in the request is authorized
                return await self.mirror.warm(scope, receive, send, raw_path,
                                              lambda repo: self.caller(scope, repo),
                                              self.auth.is_operator(bearer_token(scope)))
            if route.kind in (hf.RouteKind.LISTING, hf.RouteKind.LOCAL):
                return await self.mirror.api(scope, receive, send, raw_path, None, self.caller(scope, None),
                                             route.read)
            if route.kind is hf.RouteKind.OPS and raw_path.rstrip("/") in _GUARDED_OPS and self.settings.auth_required:
                principal = self.auth.principal(bearer_token(scope))  # repo names and traffic: token holders only
                # ... and of the repos, those its patterns allow (the status page, its JSON, the warm jobs).
                scope[ops.VISIBLE_KEY] = lambda kind, repo_id: self.auth.sees(
                    principal, hf.RepoRef(hf.RepoType(kind), repo_id))
            elif route.kind is hf.RouteKind.OPS and self.auth.is_admin_token(bearer_token(scope)):
                scope[ops.OPERATOR_KEY] = True  # the operator's status lists every cached repo, not only public ones
            if route.kind is hf.RouteKind.UNKNOWN:
                raise RouteNotFound(f"{raw_path[:200]} is not a route this mirror serves")
        except MirrorError as exc:
            await send_error(send, exc, head=method == "HEAD")
            return "error"
        await self.fastapi(scope, receive, send)
        return "ops"


def create_app(settings: Settings) -> MirrorApp:
    return MirrorApp(settings)

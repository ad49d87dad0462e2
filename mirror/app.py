"""``create_app(settings)``: the ASGI application over the parts that :mod:`mirror.parts` wires together.

The ASGI entry point dispatches on the *raw* path (see :mod:`mirror.hf`): resolve routes and Hub API routes go to
plain ASGI handlers (the hot path carries no framework overhead); operations routes (``/healthz``, ``/metrics``,
``/``) and the OpenAPI docs are a FastAPI app. Resources are built in the lifespan, not at import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from mirror import hf
from mirror.access import Caller
from mirror.auth import MirrorAuth
from mirror.config import Settings
from mirror.errors import HeadersTooLarge, MethodNotAllowed, MirrorError
from mirror.fill import PEER_ROUTE
from mirror.logs import AccessLog
from mirror.metrics import Metrics
from mirror.parts import build_parts
from mirror.routes import ops
from mirror.routes.api import ApiHandler
from mirror.routes.common import Receive, Scope, Send, bearer_token, check_raw_path, send_error
from mirror.routes.peer import PeerFillHandler
from mirror.routes.resolve import ResolveHandler

log = logging.getLogger("hf_mirror")
# Real clients send about 1 KiB; a JWT a few. nginx's default front refuses lines over 8 KiB.
_MAX_HEADER_BYTES = 32 * 1024


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
        self.resolve = ResolveHandler(self.service, self.fills, self.upstream, metrics,
                                      chunk_size=settings.serve_chunk_size, accel_redirect=settings.accel_redirect)
        self.api = ApiHandler(self.service, metrics, max_paths_info=settings.max_paths_info)
        self.peer = PeerFillHandler(self.fills, metrics, chunk_size=settings.serve_chunk_size)

    async def start(self) -> None:
        await self.parts.start()

    async def close(self) -> None:
        await self.parts.aclose()

    async def status(self) -> dict[str, Any]:
        return await self.cache.status(self.settings, self.upstream, self.fills)


class MirrorApp:
    """The ASGI application."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.mirror: Mirror | None = None
        self.auth = MirrorAuth(settings)
        self.access_log = (AccessLog(settings.log_format, (settings.upstream_token or "",))
                           if settings.access_log else None)
        self.fastapi = FastAPI(title="hf-mirror", version="0.1.0", lifespan=self._lifespan)
        ops.install(self.fastapi, self.metrics, self._status)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self.mirror = Mirror(self.settings, self.metrics)
        await self.mirror.start()
        log.info("hf-mirror ready: upstream %s, cache %s%s", self.settings.upstream, self.settings.cache_dir,
                 " (offline)" if self.settings.offline else "")
        try:
            yield
        finally:
            await self.mirror.close()
            if self.access_log is not None:
                self.access_log.flush()

    async def _status(self) -> dict[str, Any]:
        assert self.mirror is not None
        return await self.mirror.status()

    def caller(self, scope: Scope, repo: hf.RepoRef | None) -> Caller:
        """The request's identity (401 in auth mode without a valid mirror token), checked against the lists."""
        caller, principal = self.auth.caller(bearer_token(scope))
        if repo is not None:
            self.auth.authorize(principal, repo)
        return caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.mirror is None:
            await self.fastapi(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = os.urandom(8).hex()
        status_box: list[int] = [0]

        async def send_logged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
                message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", request_id.encode())]
            await send(message)

        # The zero-copy path needs uvicorn's own bound ``send`` (see mirror.routes.sendfile): it travels in the scope.
        outward = send_logged if self.settings.access_log else send
        scope["hf_mirror.raw_send"] = send
        outcome = await self._dispatch(scope, receive, outward)
        if self.access_log is not None:
            self.access_log.write(request_id, scope["method"], scope.get("path", ""), status_box[0] or "-",
                                  (time.perf_counter() - started) * 1000, outcome)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> str:
        assert self.mirror is not None
        raw_path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        method = scope["method"]
        try:
            if sum(len(k) + len(v) for k, v in scope["headers"]) > _MAX_HEADER_BYTES:
                raise HeadersTooLarge(f"request headers exceed {_MAX_HEADER_BYTES} bytes")
            if "/resolve/" in raw_path or raw_path.startswith("/api/resolve-cache/"):
                check_raw_path(raw_path)
                target = hf.parse_resolve(raw_path)
                if target is not None:
                    if method not in ("GET", "HEAD"):
                        raise MethodNotAllowed(f"{method} is not allowed on resolve URLs")
                    caller = self.caller(scope, target.repo)
                    return await self.mirror.resolve(scope, receive, send, target, caller)
            if raw_path.startswith(PEER_ROUTE):  # another node of the fleet; its lease token stands for auth
                return await self.mirror.peer(scope, receive, send, raw_path[len(PEER_ROUTE):])
            if raw_path.startswith("/api/") and raw_path != "/api/mirror/status":
                check_raw_path(raw_path)
                api_target = hf.parse_api(raw_path)
                caller = self.caller(scope, api_target.repo if api_target else None)
                return await self.mirror.api(scope, receive, send, raw_path, api_target, caller)
        except MirrorError as exc:
            await send_error(send, exc, head=method == "HEAD")
            return "error"
        await self.fastapi(scope, receive, send)
        return "ops"


def create_app(settings: Settings) -> MirrorApp:
    return MirrorApp(settings)

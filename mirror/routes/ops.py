"""Operations routes: ``/healthz``, ``/metrics`` and the status page at ``/``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response

from mirror.metrics import Metrics
from mirror.status import render_status_page


def ops_router(metrics: Metrics, status: Callable[[], Any]) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 once the mirror is ready to serve."""
        return JSONResponse({"status": "ok"})

    @router.get("/metrics")
    async def metrics_endpoint() -> Response:
        """Prometheus metrics."""
        await status()  # refreshes the cache-size gauges
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @router.get("/api/mirror/status")
    async def status_json() -> JSONResponse:
        """The status page's data as JSON."""
        return JSONResponse(await status())

    @router.get("/", response_class=HTMLResponse)
    async def status_page() -> HTMLResponse:
        """Server-rendered status page."""
        return HTMLResponse(render_status_page(await status()))

    return router


def install(app: FastAPI, metrics: Metrics, status: Callable[[], Any]) -> None:
    app.include_router(ops_router(metrics, status))

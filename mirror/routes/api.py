"""``/api/...``: repo info, revision, tree, paths-info, refs, commits (cached); the routes of the route table
(mirror.routetable: discussions, listings, whoami...) cached or relayed as it says."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import parse_qsl

from mirror import hf
from mirror.access import Caller
from mirror.asgi import Receive, Scope, Send
from mirror.errors import BadRequest, MirrorError
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import header, mirror_base, outcome_headers, query_pairs, read_body, send_error
from mirror.routetable import Caching, ReadRoute
from mirror.service import MirrorService
from mirror.service.answers import ApiResult

log = logging.getLogger("hf_mirror.api")

_MAX_BODY = 1024 * 1024
_AGENT_HARNESSES = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()


class ApiHandler:
    def __init__(self, service: MirrorService, metrics: Metrics, *, max_paths_info: int,
                 max_relay_bytes: int, body_timeout: float,
                 annotate: Callable[[hf.ApiTarget, ApiResult], ApiResult] | None = None) -> None:
        self.service = service
        self.metrics = metrics
        self.max_paths_info = max_paths_info
        self.max_relay_bytes = max_relay_bytes
        self.body_timeout = body_timeout
        # Xet (mirror.routes.xet): put upstream's xetHash back on tree / paths-info answers when Xet is served.
        self.annotate = annotate

    async def __call__(self, scope: Scope, receive: Receive, send: Send, raw_path: str,
                       target: hf.ApiTarget | None, caller: Caller, read: ReadRoute | None = None) -> Outcome:
        """A read route: cached JSON for one repo's routes, the route table's routes as it says (cached, or relayed
        as they arrive)."""
        method = scope["method"]
        try:
            if raw_path.rstrip("/") == "/api/agent-harnesses":
                result = ApiResult(200, (("content-type", "application/json"),), _AGENT_HARNESSES, Outcome.HIT)
            elif read is not None and read.caching is not Caching.NONE:
                revalidate = "no-cache" in (header(scope, b"cache-control") or "").lower()
                result = await self.service.read(read, target, raw_path, query_pairs(scope), caller,
                                                 revalidate=revalidate)
            elif read is not None or target is None:
                query = self.service.read_query(read, query_pairs(scope)) if read is not None else query_pairs(scope)
                return await self._relay(scope, send, raw_path, query, caller)
            elif (target.sub or "info") not in hf.API_CACHED_ROUTES | {"xet-read-token"}:
                return await self._relay(scope, send, raw_path, query_pairs(scope), caller)
            else:
                form = await self._read_form(scope, receive) if method == "POST" else None
                result = await self.service.api(target, method, raw_path, query_pairs(scope), form, caller)
                if self.annotate is not None:
                    result = self.annotate(target, result)
        except MirrorError as exc:
            self.metrics.requests.labels(route="api", outcome=Outcome.ERROR).inc()
            await send_error(send, exc, head=method == "HEAD")
            return Outcome.ERROR
        self.metrics.requests.labels(route="api", outcome=result.outcome).inc()
        headers = [(b"content-length", str(len(result.body)).encode()), *outcome_headers(result.outcome)]
        headers += _relayed_headers(result.headers, scope)
        await send({"type": "http.response.start", "status": result.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else result.body})
        return result.outcome

    async def _relay(self, scope: Scope, send: Send, raw_path: str, query: list[tuple[str, str]],
                     caller: Caller) -> Outcome:
        """Stream an uncached read route from upstream, never more than ``max_relay_bytes``; memory stays bounded."""
        head = scope["method"] == "HEAD"
        started = False
        try:
            async with self.service.relay(raw_path, query, caller) as body:
                headers = outcome_headers(Outcome.PASSTHROUGH)
                headers += _relayed_headers(tuple(body.headers.items()), scope)
                await send({"type": "http.response.start", "status": body.status_code, "headers": headers})
                started = True
                sent = 0
                if not head:
                    async for chunk in body.chunks:
                        sent += len(chunk)
                        if sent > self.max_relay_bytes:
                            raise MirrorError(f"relayed answer over {self.max_relay_bytes} bytes")
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except MirrorError as exc:
            self.metrics.requests.labels(route="api", outcome=Outcome.ERROR).inc()
            if started:
                log.warning("relay of %s cut: %s", raw_path[:200], exc.message)
                return Outcome.ABORTED  # the headers are gone: a cut connection is the only honest signal left
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        await send({"type": "http.response.body", "body": b""})
        self.metrics.requests.labels(route="api", outcome=Outcome.PASSTHROUGH).inc()
        return Outcome.PASSTHROUGH

    async def _read_form(self, scope: Scope, receive: Receive) -> list[tuple[str, str]]:
        body = await read_body(receive, limit=_MAX_BODY, timeout=self.body_timeout)
        content_type = ""
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = value.decode("latin-1")
        if "json" in content_type:
            try:
                data = json.loads(body or b"{}")
            except ValueError as exc:
                raise BadRequest("request body is not valid JSON") from exc
            pairs = [("paths", str(p)) for p in data.get("paths", [])] if isinstance(data, dict) else []
            if isinstance(data, dict) and "expand" in data:
                pairs.append(("expand", str(data["expand"]).lower()))
        else:
            pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        paths = [v for k, v in pairs if k == "paths"]
        if len(paths) > self.max_paths_info:
            raise BadRequest(f"too many paths ({len(paths)} > {self.max_paths_info})")
        for path in paths:
            hf.validate_path(path, allow_empty=True)
        return pairs


def _relayed_headers(headers: tuple[tuple[str, str], ...], scope: Scope) -> list[tuple[bytes, bytes]]:
    """Upstream's headers that clients read (``hf.API_RELAYED_HEADERS``), pagination links pointed at the mirror."""
    out = []
    for name, value in headers:
        name = name.lower()
        if name not in hf.API_RELAYED_HEADERS and name != "link":
            continue
        if name == "link":
            value = hf.rewrite_link_header(value, mirror_base(scope)) or ""
            if not value:
                continue
        out.append((name.encode(), value.encode("latin-1", "replace")))
    return out

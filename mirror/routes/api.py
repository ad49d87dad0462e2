"""``/api/...``: repo info, revision, tree, paths-info, refs, commits (cached); anything else relayed uncached."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from mirror import hf
from mirror.access import Caller
from mirror.errors import BadRequest, MirrorError
from mirror.metrics import Metrics
from mirror.routes.common import Receive, Scope, Send, mirror_base, query_pairs, send_error
from mirror.service import ApiResult, MirrorService

_MAX_BODY = 1024 * 1024
_AGENT_HARNESSES = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()


class ApiHandler:
    def __init__(self, service: MirrorService, metrics: Metrics, *, max_paths_info: int) -> None:
        self.service = service
        self.metrics = metrics
        self.max_paths_info = max_paths_info

    async def __call__(self, scope: Scope, receive: Receive, send: Send, raw_path: str,
                       target: hf.ApiTarget | None, caller: Caller) -> str:
        method = scope["method"]
        try:
            if raw_path.rstrip("/") == "/api/agent-harnesses":
                result = ApiResult(200, (("content-type", "application/json"),), _AGENT_HARNESSES, "hit")
            else:
                form = await self._read_form(scope, receive) if method in ("POST", "PUT") else None
                query = query_pairs(scope)
                if target is None:
                    result = await self.service.passthrough(method, raw_path, query, form, caller)
                else:
                    result = await self.service.api(target, method, raw_path, query, form, caller)
        except MirrorError as exc:
            self.metrics.requests.labels(route="api", outcome="error").inc()
            await send_error(send, exc, head=method == "HEAD")
            return "error"
        self.metrics.requests.labels(route="api", outcome=result.outcome).inc()
        headers = [(b"content-length", str(len(result.body)).encode()), (b"x-mirror-cache", result.outcome.encode())]
        for name, value in result.headers:
            if name.lower() == "link":
                value = hf.rewrite_link_header(value, mirror_base(scope)) or ""
                if not value:
                    continue
            if name.lower() == "content-length":
                continue
            headers.append((name.lower().encode(), value.encode("latin-1")))
        if result.outcome == "stale":
            headers.append((b"warning", b'110 - "Response is stale"'))
        await send({"type": "http.response.start", "status": result.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else result.body})
        return result.outcome

    async def _read_form(self, scope: Scope, receive: Receive) -> list[tuple[str, str]]:
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > _MAX_BODY:
                raise BadRequest(f"request body over {_MAX_BODY} bytes")
            if not message.get("more_body"):
                break
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

"""The dataset viewer's host (``datasets-server.<the mirror's host>``) and the Hub's ``/api/datasets/{repo}/parquet``
routes: the edge. The policy is :mod:`mirror.viewer.service`.

Any request whose ``Host`` starts with ``datasets-server.`` is the viewer's: ``/info``, ``/splits``, ``/parquet``,
``/size`` and ``/is-valid`` with ``?dataset=`` are answered, anything else on that host is a 404, never relayed.
"""

from __future__ import annotations

from mirror import hf
from mirror.access import Caller
from mirror.asgi import Scope, Send
from mirror.errors import HubError, MirrorError, ViewerNotFound
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import header, outcome_headers, send_error
from mirror.viewer.service import VIEWER_ENDPOINTS, ViewerResult, ViewerService, rewrite_urls

VIEWER_HOST_PREFIX = "datasets-server."


_VIEWER_HOST_BYTES = VIEWER_HOST_PREFIX.encode()


def is_viewer_host(scope: Scope) -> bool:
    """Whether the request's Host is ``datasets-server.<this host>`` (every request asks: bytes, no decoding)."""
    for key, value in scope["headers"]:
        if key == b"host":
            return value[:len(_VIEWER_HOST_BYTES)].lower() == _VIEWER_HOST_BYTES
    return False


def viewer_target(raw_path: str, query: list[tuple[str, str]]) -> tuple[str, hf.RepoRef]:
    """The endpoint and dataset of a viewer-host request; a Hub-shaped 404/422 for anything else."""
    endpoint = raw_path.strip("/")
    if endpoint not in VIEWER_ENDPOINTS:
        raise ViewerNotFound(f"{raw_path[:200]} is not a dataset viewer route this mirror serves")
    datasets = [v for k, v in query if k == "dataset"]
    if len(datasets) != 1 or not datasets[0]:
        raise HubError(422, "MissingRequiredParameter", "Parameter 'dataset' is required")
    return endpoint, hf.RepoRef(hf.RepoType.DATASET, hf.validate_repo_id(datasets[0]))


class ViewerHandler:
    def __init__(self, service: ViewerService, metrics: Metrics) -> None:
        self.service = service
        self.metrics = metrics

    async def viewer(self, scope: Scope, send: Send, endpoint: str, repo: hf.RepoRef, query: list[tuple[str, str]],
                     caller: Caller) -> Outcome:
        return await self._answer(scope, send, lambda: self.service.answer(endpoint, repo, query, caller))

    async def hub_parquet(self, scope: Scope, send: Send, target: hf.ApiTarget, caller: Caller) -> Outcome:
        if target.repo.type is not hf.RepoType.DATASET:
            return await self._answer(scope, send, _not_found)
        return await self._answer(scope, send,
                                  lambda: self.service.hub_parquet(target.repo, target.revision, target.path, caller))

    async def _answer(self, scope: Scope, send: Send, produce) -> Outcome:  # noqa: ANN001
        head = scope["method"] == "HEAD"
        try:
            result: ViewerResult = await produce()
        except MirrorError as exc:
            self.metrics.requests.labels(route="viewer", outcome=Outcome.ERROR).inc()
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        self.metrics.requests.labels(route="viewer", outcome=result.outcome).inc()
        body = rewrite_urls(result.body, self._replacements(scope))
        headers = [(b"content-length", str(len(body)).encode()), *outcome_headers(result.outcome)]
        root = scope.get("root_path", "")  # a local Location goes under the mirror's path prefix (mirror.front)
        headers += [(k.encode(), _local(root, k, v).encode("latin-1", "replace"))
                    for k, v in result.headers]
        await send({"type": "http.response.start", "status": result.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})
        return result.outcome

    def _replacements(self, scope: Scope) -> tuple[tuple[str, str], ...]:
        """Upstream's bases -> the mirror's, as this client reached it (the Hub routes on the host without the
        ``datasets-server.`` prefix)."""
        host = header(scope, b"host") or f"{scope['server'][0]}:{scope['server'][1]}"
        if host.lower().startswith(VIEWER_HOST_PREFIX):
            host = host[len(VIEWER_HOST_PREFIX):]
        hub = f"{scope.get('scheme', 'http')}://{host}{scope.get('root_path', '')}"
        viewer = hub.replace("://", "://" + VIEWER_HOST_PREFIX, 1)
        return self.service.pointed_at(hub=hub, viewer=viewer)


async def _not_found() -> ViewerResult:
    raise ViewerNotFound("parquet conversions exist for datasets only")


def _local(root: str, name: str, value: str) -> str:
    """A header value as this client must see it: a local ``Location`` under the mirror's path prefix."""
    return root + value if name == "location" and value.startswith("/") else value

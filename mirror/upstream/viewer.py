"""The dataset viewer's host upstream (``datasets-server.<hub>``) and the Hub's parquet redirects, as values.

One GET, no redirect followed (a viewer answer is JSON; the Hub's ``/parquet/{config}/{split}/{n}.parquet`` answer is
a redirect whose ``Location`` the mirror reads, never follows), the body read up to ``max_api_body``. The caller's
token goes to the viewer host only: it is the host the operator configured (``viewer_upstream``), as the Hub's own
client sends it there. It shares the upstream client's connection pool and error scrubbing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from mirror.errors import UpstreamTimeout
from mirror.upstream.client import UpstreamClient
from mirror.upstream.connection import read_capped
from mirror.upstream.values import UpstreamAnswer


def viewer_base(upstream: str) -> str:
    """Where the Hub's client looks for the viewer: ``https://hf.co`` -> ``https://datasets-server.hf.co``."""
    return upstream.replace("://", "://datasets-server.", 1)


class ViewerUpstream:
    def __init__(self, upstream: UpstreamClient, base: str) -> None:
        self.upstream = upstream
        self.base = base.rstrip("/")
        parts = urlsplit(self.base)
        self.display = f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"

    async def get(self, base: str, path_qs: str, token: str | None) -> UpstreamAnswer:
        """``GET base + path_qs`` with ``token``; redirects are returned, not followed. Raises UpstreamTimeout when
        the host cannot be reached (DNS, refused, timeout)."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        request = self.upstream.client.build_request("GET", base + path_qs, headers=headers)
        try:
            response = await self.upstream.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamTimeout(f"{self.display if base == self.base else self.upstream.display} is unreachable: "
                                  f"{type(exc).__name__}") from exc
        try:
            return await read_capped(response, self.upstream.settings.max_api_body, path_qs.split("?")[0])
        finally:
            await response.aclose()

    async def viewer(self, path_qs: str, token: str | None) -> UpstreamAnswer:
        return await self.get(self.base, path_qs, token)

    async def hub(self, path_qs: str, token: str | None) -> UpstreamAnswer:
        return await self.get(self.upstream.base, path_qs, token)

    def scrub(self, text: str) -> str:
        return self.upstream.scrub(text)

"""The dataset viewer's host upstream (``datasets-server.<hub>``) and the Hub's parquet redirects, as values.

One GET, no redirect followed (a viewer answer is JSON; the Hub's ``/parquet/{config}/{split}/{n}.parquet`` answer is
a redirect whose ``Location`` the mirror reads, never follows), the body read up to ``max_api_body``. The caller's
token goes to the viewer host only: it is the host the operator configured (``viewer_upstream``), as the Hub's own
client sends it there. It shares the upstream client's connection pool and error scrubbing.

A viewer host named ``datasets-server.<IP address>`` (or ``.localhost``) is what the Hub's client derives from an
upstream named by address, such as a central mirror at ``http://10.1.2.3:8090``: no resolver answers that name, so
the request goes to the address itself with the name as its ``Host``, which a chained mirror answers as its viewer
host on its own listener (a TLS upstream is then checked against the address, as the upstream itself is).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import httpx

from mirror.errors import UpstreamTimeout
from mirror.upstream.client import UpstreamClient
from mirror.upstream.connection import read_capped
from mirror.upstream.values import UpstreamAnswer

_VIEWER_PREFIX = "datasets-server."


def viewer_base(upstream: str) -> str:
    """Where the Hub's client looks for the viewer: ``https://hf.co`` -> ``https://datasets-server.hf.co``."""
    return upstream.replace("://", "://" + _VIEWER_PREFIX, 1)


def _is_address(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def viewer_route(base: str) -> tuple[str, str | None]:
    """The URL to connect to for the viewer at ``base``, and the ``Host`` to send (None: the URL's own): for
    ``datasets-server.<address>``, the address itself with that name as the Host (see the module docstring)."""
    scheme, sep, rest = base.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or not netloc.lower().startswith(_VIEWER_PREFIX):
        return base, None
    address = netloc[len(_VIEWER_PREFIX):]
    try:
        host = urlsplit(f"{scheme}://{address}").hostname  # also ``[::1]:8090``
    except ValueError:
        return base, None
    if not host or not _is_address(host):
        return base, None
    return f"{scheme}://{address}{slash}{path}", netloc


class ViewerUpstream:
    def __init__(self, upstream: UpstreamClient, base: str) -> None:
        self.upstream = upstream
        self.base = base.rstrip("/")  # the viewer's URL as clients name it (the answers' URLs are rewritten from it)
        self.connect, self.host = viewer_route(self.base)
        scheme, _, rest = self.base.partition("://")
        self.display = f"{scheme}://{rest.partition('/')[0].rpartition('@')[2]}"  # never credentials

    async def get(self, base: str, path_qs: str, token: str | None) -> UpstreamAnswer:
        """``GET base + path_qs`` with ``token``; redirects are returned, not followed. Raises UpstreamTimeout when
        the host cannot be reached (DNS, refused, timeout)."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        url = base + path_qs
        if base == self.base and self.host is not None:
            url = self.connect + path_qs
            headers["host"] = self.host
        request = self.upstream.client.build_request("GET", url, headers=headers)
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

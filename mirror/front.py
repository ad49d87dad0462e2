"""The mirror behind a reverse proxy under a path (``https://proxy/hf``): where it is mounted, and what a trusted front
says about it. An ASGI layer around the app, outermost, so it sees the address of the peer itself (before uvicorn's
``X-Forwarded-For`` handling replaces it with the client's).

Two forms, one result:

* the front passes the full path (``/hf/api/models/x``) and ``--root-path /hf`` tells the mirror to strip it;
* the front strips the prefix (``/api/models/x``) and says so with ``X-Forwarded-Prefix: /hf``, believed only from
  a ``--trusted-proxies`` address: anyone else could otherwise write a prefix of their choosing into the URLs the
  mirror hands out (a ``casUrl``, a ``Link``, a ``Location``) and send other clients' tokens elsewhere.

Either way the request reaches the app with ``root_path`` the public prefix, ``path`` the full path (ASGI's rule,
what FastAPI routes on) and ``raw_path`` the mirror's own path, the prefix off (what :mod:`mirror.app` dispatches
on). Every URL the mirror writes starts from ``root_path`` (:func:`mirror.routes.common.mirror_base`, the viewer's
rewrites, the status page). Without a prefix and a trusted front this layer is not built at all: the hot path is
untouched.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware, _TrustedHosts

from mirror.asgi import Receive, Scope, Send
from mirror.config import Settings

# A believable prefix: a plain path (no dot segments, no quoting, no query), as Settings.root_path is.
_PREFIX = re.compile(r"(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+")
_MAX_PREFIX = 200
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def wanted(settings: Settings) -> bool:
    """Whether the app needs this layer: a mount path, or a front whose forwarded headers are believed."""
    return bool(settings.root_path or settings.trusted_proxies)


class Front:
    """ASGI: strip the mount path, believe a trusted front's ``X-Forwarded-Prefix``, then the app.

    With ``trusted_proxies``, uvicorn's own proxy-headers layer runs inside this one with the same list (the server
    turns uvicorn's off), so one setting names the fronts for every ``X-Forwarded-*`` header."""

    def __init__(self, app: App, root_path: str, trusted_proxies: tuple[str, ...]) -> None:
        self.root_path = root_path
        self._root = root_path.encode()
        self.trusted = _TrustedHosts(list(trusted_proxies)) if trusted_proxies else None
        self.app: App = (ProxyHeadersMiddleware(app, list(trusted_proxies)) if trusted_proxies  # type: ignore[arg-type]
                         else app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.place(scope)
        await self.app(scope, receive, send)

    def place(self, scope: Scope) -> None:
        """Set ``root_path``, ``path`` and ``raw_path`` as the module says."""
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        path: str = scope["path"]
        root = self._root
        carried = bool(root) and (raw == root or raw.startswith(root + b"/"))
        if carried:
            raw = raw[len(root):] or b"/"
            path = path[len(self.root_path):] or "/"
        forwarded = self._forwarded_prefix(scope)
        if forwarded is not None:
            base = forwarded + (self.root_path if carried else "")
        else:
            base = self.root_path
        scope["root_path"] = base
        scope["raw_path"] = raw
        scope["path"] = base + path

    def _forwarded_prefix(self, scope: Scope) -> str | None:
        """The front's ``X-Forwarded-Prefix`` when the peer is a trusted front and the value a plain path; ``""``
        for ``/``; ``None`` when there is none to believe."""
        if self.trusted is None:
            return None
        client = scope.get("client")
        if not client or client[0] not in self.trusted:
            return None
        value = None
        for name, header in scope["headers"]:
            if name == b"x-forwarded-prefix":
                value = header.decode("latin-1").split(",")[0].strip()  # several fronts: the outermost's
                break
        if value is None:
            return None
        value = "/" + value.strip("/") if value.strip("/") else ""
        if value and (len(value) > _MAX_PREFIX or not _PREFIX.fullmatch(value)):
            return None  # a front that forwards anything else is misconfigured: write no prefix rather than it
        return value

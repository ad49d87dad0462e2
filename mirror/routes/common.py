"""ASGI helpers shared by the routes: request headers, the caller, Hub-shaped error responses, Range parsing."""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit

from mirror import hf
from mirror.asgi import Receive, Scope, Send
from mirror.errors import AccessDenied, BadRequest, MirrorError, RangeNotSatisfiable, UnsupportedMediaType
from mirror.metrics import Outcome


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (``name`` lower-case)."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def bearer_token(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


async def read_body(receive: Receive, *, limit: int, timeout: float) -> bytes:
    """A request body of at most ``limit`` bytes, received within ``timeout`` seconds, else a 400: a body sent byte
    by byte must not hold a slot forever, nor a huge one the memory."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                body += message.get("body", b"")
                if len(body) > limit:
                    raise BadRequest(f"request body over {limit} bytes")
                if not message.get("more_body"):
                    return bytes(body)
    except TimeoutError:
        raise BadRequest(f"request body not received within {timeout:g} s") from None


def mirror_base(scope: Scope) -> str:
    """The mirror's own base URL as the client reached it (for pagination links)."""
    host = header(scope, b"host") or f"{scope['server'][0]}:{scope['server'][1]}"
    return f"{scope.get('scheme', 'http')}://{host}{scope.get('root_path', '')}"


_CONTROL = dict.fromkeys([*range(0x20), 0x7F], "?")


def _header_safe(text: str) -> str:
    """A header value: one line, latin-1, no control characters (the message may quote a client's path)."""
    return " ".join(text.split()).translate(_CONTROL).encode("latin-1", "replace").decode("latin-1")[:500]


def error_parts(exc: MirrorError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of a Hub-shaped error: ``X-Error-Code``, ``X-Error-Message``, ``{"error": ...}``."""
    body = json.dumps({"error": exc.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (hf.H_ERROR_MESSAGE.lower().encode(), _header_safe(exc.message).encode("latin-1")),
    ]
    if exc.code:
        headers.append((hf.H_ERROR_CODE.lower().encode(), exc.code.encode()))
    for name, value in exc.headers.items():
        headers.append((name.lower().encode(), value.encode("latin-1")))
    return exc.status, headers, body


async def send_error(send: Send, exc: MirrorError, *, head: bool = False) -> None:
    status, headers, body = error_parts(exc)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> inclusive (start, end); ``None`` = whole file.

    Several ranges are answered with the whole file (allowed by RFC 9110); a malformed or unsatisfiable range
    raises RangeNotSatisfiable, so clients never get bytes they did not ask for.
    """
    if not value:
        return None
    unit, _, spec = value.partition("=")
    if unit.strip().lower() != "bytes" or not spec:
        raise RangeNotSatisfiable(size)
    if "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        raise RangeNotSatisfiable(size)
    try:
        if first == "":
            suffix = int(last)
            if suffix <= 0 or size == 0:
                raise RangeNotSatisfiable(size)
            return max(size - suffix, 0), size - 1
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        raise RangeNotSatisfiable(size) from None
    if start < 0 or start >= size or end < start:
        raise RangeNotSatisfiable(size)
    return start, min(end, size - 1)


def query_pairs(scope: Scope) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    return parse_qsl(raw, keep_blank_values=True)


_CACHE_HEADER = hf.H_MIRROR_CACHE.lower().encode()
# A stale answer says so as HTTP caches do (RFC 7234's warn-code 110), besides ``X-Mirror-Cache: stale``.
_STALE_WARNING = (b"warning", b'110 - "Response is stale"')


def outcome_headers(outcome: Outcome) -> list[tuple[bytes, bytes]]:
    """The mirror's outcome on the wire, the one way every route writes it: ``X-Mirror-Cache``, and the stale
    ``Warning`` on a stale answer."""
    if outcome is Outcome.STALE:
        return [(_CACHE_HEADER, outcome.encode()), _STALE_WARNING]
    return [(_CACHE_HEADER, outcome.encode())]


# What browser clients (transformers.js, huggingface.js) read on the Hub's answers: sent on every answer, as the Hub
# does, so that a page on another origin can load models through the mirror.
CORS_HEADERS = (
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", b"X-Repo-Commit,X-Request-Id,X-Error-Code,X-Error-Message,X-Total-Count,"
     b"ETag,Link,Accept-Ranges,Content-Range,X-Linked-Size,X-Linked-ETag,X-Xet-Hash,X-Mirror-Cache"),
)
_PREFLIGHT_MAX_AGE = b"86400"


async def send_preflight(send: Send, methods: tuple[str, ...], *, grant: bool = True) -> None:
    """Answer ``OPTIONS`` (a CORS preflight, or a plain probe) locally: nothing goes upstream. ``grant=False`` for
    the mirror's own actions (warm, pin...): answered, but nothing granted, so no page on another origin may call
    them with JSON."""
    allow = ", ".join((*methods, "OPTIONS")).encode()
    headers = [(b"allow", allow), (b"content-length", b"0")]
    if grant:
        headers += [(b"access-control-allow-methods", allow),
                    (b"access-control-allow-headers", b"authorization, range, content-type, user-agent, x-request-id"),
                    (b"access-control-max-age", _PREFLIGHT_MAX_AGE)]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def refuse_cross_site(scope: Scope) -> None:
    """No web page on another origin may trigger an action: the body must be JSON (a cross-origin page must then
    send a preflight, which these routes never grant), and a browser's request from another origin is refused by
    its ``Origin`` / ``Sec-Fetch-Site`` headers (a plain form cannot send JSON, but belt and braces)."""
    site = (header(scope, b"sec-fetch-site") or "").lower()
    origin = header(scope, b"origin")
    if site and site not in ("same-origin", "none"):
        raise AccessDenied("cross-site requests cannot change the mirror", status=403, code="CrossSiteRequest")
    if origin is not None:  # else not a browser's cross-origin request (browsers send Origin on every one)
        _refuse_other_origin(scope, origin)
    if not is_json_media_type(header(scope, b"content-type")):
        raise UnsupportedMediaType("send the request with Content-Type: application/json")


def _refuse_other_origin(scope: Scope, origin: str) -> None:
    # The whole origin: another port of the same host is another site's page (its own server, its own scripts). The
    # request's own origin is its scheme (X-Forwarded-Proto behind a trusted front: uvicorn's proxy headers) with
    # the Host it was sent to, or the X-Forwarded-Host a front passed on (a browser cannot set either cross-origin
    # without a preflight, which these routes never grant).
    scheme = scope.get("scheme", "http")
    own = {_origin(f"{scheme}://{value.split(',')[0].strip()}")
           for value in (header(scope, b"host"), header(scope, b"x-forwarded-host")) if value}
    if _origin(origin) is None or _origin(origin) not in own:
        raise AccessDenied("cross-origin requests cannot change the mirror", status=403, code="CrossSiteRequest")


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# RFC 9110 media type: type "/" subtype *( OWS ";" OWS parameter ), a parameter's value a token or a quoted string.
_MEDIA_TYPE = re.compile(rf'\s*({_TOKEN})/({_TOKEN})(?:\s*;\s*{_TOKEN}=(?:{_TOKEN}|"(?:[^"\\]|\\.)*"))*\s*')


def is_json_media_type(value: str | None) -> bool:
    """``application/json`` exactly (case-insensitive, parameters such as ``charset`` allowed): what a browser can
    only send after a preflight. ``text/plain; application/json`` is text/plain, which it sends without one."""
    match = _MEDIA_TYPE.fullmatch(value or "")
    return match is not None and (match[1].lower(), match[2].lower()) == ("application", "json")


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(value: str) -> tuple[str, str, int] | None:
    """An origin as (scheme, host, port), the default port filled in; ``None`` for an opaque one (``null``)."""
    try:
        parts = urlsplit(value.strip())
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]

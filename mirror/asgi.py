"""ASGI's types, and plumbing for small apps that read the whole request and answer with a whole body: the demo's
sample Hub (``mirror.demo.sample_hub``) and the test suite's Hub emulator. The mirror's own routes stream, and use the
types and :func:`watch_disconnect` only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Set in a request's scope by the mirror's server protocol (mirror.server), which counts the request line and
# headers against ``max_header_bytes`` as they arrive: the app need not add them up again.
HEAD_BOUNDED = "hf_mirror.head_bounded"


async def answer_lifespan(scope: Scope, receive: Receive, send: Send) -> bool:
    """Run the lifespan protocol to its end when ``scope`` is a lifespan scope: True then (the app returns)."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


async def read_body(receive: Receive) -> bytes:
    """The request body, all of it."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def send_response(send: Send, method: str, status: int, headers: dict[str, str], body: bytes) -> None:
    """Answer with ``body`` (no body for HEAD); sets ``content-length`` in ``headers`` unless it is there."""
    headers.setdefault("content-length", str(len(body)))
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def watch_disconnect(receive: Receive, event: asyncio.Event) -> None:
    """Set ``event`` when the client hangs up (a body sender stops at the next chunk)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            event.set()
            return

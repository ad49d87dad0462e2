"""The zero-copy path writes to its own duplicate of the connection's socket (mirror.routes.sendfile): when the
transport closes meanwhile and a new connection is given the same descriptor number, a file's bytes never reach
the new client."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from mirror.routes.sendfile import _ZeroCopy


class Cycle:
    """What the probe reads of uvicorn's request cycle."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.expected_content_length = 0

    async def send(self, message: Any) -> None:  # the bound ``send`` the app is given
        pass


async def scenario() -> tuple[bytes, int, int]:
    accepted: asyncio.Queue[asyncio.Transport] = asyncio.Queue()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.put_nowait(transport)  # type: ignore[arg-type]

    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # only to pick a free port
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    listener = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", port)
    first_client = socket.create_connection(("127.0.0.1", port))
    first = await accepted.get()
    first_fd = first.get_extra_info("socket").fileno()
    zero_copy = _ZeroCopy.probe(Cycle(first).send)
    assert zero_copy is not None
    second_client = socket.socket()  # its descriptor taken now, so that the next free number is the first's
    first.close()  # the client went away: the transport closes its descriptor while a send may be under way
    await asyncio.sleep(0.05)
    second_client.connect(("127.0.0.1", port))
    second = await accepted.get()
    second_fd = second.get_extra_info("socket").fileno()
    try:
        os.write(zero_copy.sock_fd, b"bytes of the first client's file")
    except OSError:
        pass  # the first connection is gone: the write fails, and nothing reaches anyone
    zero_copy.close()
    second_client.settimeout(0.3)
    try:
        leaked = second_client.recv(100)
    except TimeoutError:
        leaked = b""
    for thing in (first_client, second_client):
        thing.close()
    second.close()
    listener.close()
    await listener.wait_closed()
    return leaked, first_fd, second_fd


def test_a_closed_connections_bytes_never_reach_the_next_one() -> None:
    leaked, first_fd, second_fd = asyncio.run(scenario())
    assert leaked == b"", leaked
    assert second_fd == first_fd  # the case the duplicate exists for: the old number given to the new connection

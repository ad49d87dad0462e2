"""The server protocol's response head (mirror.server.ResponseCycle): headers checked once are written from memory,
byte for byte as uvicorn writes them, and a header uvicorn would refuse is still refused every time."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from mirror.config import Settings
from mirror.server import ResponseCycle, protocol_factory

HEADERS = [(b"ETag", b'"abc"'), (b"content-length", b"2"), (b"Access-Control-Allow-Origin", b"*")]


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def exchange(headers: list[tuple[bytes, bytes]], requests: int) -> tuple[Transport, list[type]]:
    """``requests`` keep-alive GETs answered with ``headers`` and a 2-byte body; the cycle classes used."""
    cycles: list[type] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, log_config=None, access_log=False, server_header=False, date_header=False)
    config.load()
    protocol = protocol_factory(Settings())(config=config, server_state=ServerState(), app_state={},
                                            _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    for _ in range(requests):
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        cycle = protocol.cycle
        cycles.append(type(cycle))
        while not cycle.response_complete and not transport.closed:
            await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport, cycles


def test_repeated_headers_are_written_as_uvicorn_writes_them() -> None:
    transport, cycles = asyncio.run(exchange(HEADERS, 3))
    assert cycles == [ResponseCycle] * 3
    heads = transport.written[0::2]
    assert heads[0] == (b"HTTP/1.1 200 OK\r\netag: \"abc\"\r\ncontent-length: 2\r\n"
                        b"access-control-allow-origin: *\r\n\r\n")
    assert heads[1] == heads[0] == heads[2]  # the second and third from the checked headers' memory
    assert transport.written[1::2] == [b"ok"] * 3


def test_a_header_with_a_line_break_is_refused_every_time() -> None:
    for _ in range(2):  # the refusal is never remembered as checked
        transport, _cycles = asyncio.run(exchange([(b"x-bad", b"a\r\nset-cookie: evil=1"), *HEADERS], 1))
        assert not any(b"evil" in chunk for chunk in transport.written)
        assert transport.closed

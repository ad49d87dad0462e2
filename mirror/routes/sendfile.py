"""Sending a cached file's bytes: zero-copy ``sendfile`` when the server allows it, large reads otherwise.

uvicorn has no sendfile path of its own. Its httptools/h11 protocols hand the app a bound ``send`` of the request
cycle, which knows the connection's transport. When the headers are out and the transport's buffer is empty, the
socket is ours until the body ends: a worker thread then calls ``os.sendfile`` on it (waiting with ``select`` when
the socket is full), and the cycle is told the body is complete. Anything unusual (TLS, another server, a wrapped
``send``) takes the portable path: ``os.pread`` of large chunks, sent as ASGI body messages.

A file still being filled is sent the same way, in segments: ``available`` says how far the bytes go and waits
for more, so followers of a fill cost the process no more than readers of a committed blob.
"""

from __future__ import annotations

import asyncio
import functools
import os
import select
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from mirror.asgi import Scope, Send
from mirror.fill import Fill, FillManager

_SENDFILE_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="sendfile")
_SENDFILE_MIN = 256 * 1024  # below this, one pread + write is cheaper than the handoff
_SELECT_TIMEOUT = 30.0  # a client that reads nothing for this long is dropped

# position -> the end (exclusive) of the bytes readable now, after waiting for some beyond ``position``.
Available = Callable[[int], Awaitable[int]]


class _ZeroCopy:
    """What the zero-copy path needs from uvicorn's request cycle, or ``None`` when it is not available.

    ``sock_fd`` is a duplicate of the connection's socket descriptor, taken while the connection is alive and
    closed by :meth:`close`. The worker thread writes to it while the event loop may close the transport: with the
    transport's own descriptor, that number could by then belong to a new connection, and a file's bytes would go
    to another client. The duplicate keeps naming this connection's socket whatever the transport does."""

    def __init__(self, cycle: object, sock_fd: int, transport: object) -> None:
        self.cycle = cycle
        self.sock_fd = sock_fd
        self.transport = transport

    @classmethod
    def probe(cls, send: Send) -> _ZeroCopy | None:
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if cycle is None or transport is None or not hasattr(cycle, "expected_content_length"):
            return None
        if transport.is_closing() or transport.get_extra_info("sslcontext") is not None:
            return None
        sock = transport.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return None
        return cls(cycle, os.dup(sock.fileno()), transport)

    def close(self) -> None:
        os.close(self.sock_fd)


async def send_file_range(send: Send, path: str, start: int, length: int, chunk_size: int,
                          disconnected: asyncio.Event, raw_send: Send | None = None) -> int:
    """Send ``length`` bytes of ``path`` from ``start`` as the response body; returns the bytes sent.

    ``raw_send`` is the server's own ``send`` when ``send`` is a wrapper (the access log's).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return await send_fd_range(send, fd, start, length, chunk_size, disconnected, raw_send)
    finally:
        os.close(fd)


async def send_fd_range(send: Send, fd: int, start: int, length: int, chunk_size: int, disconnected: asyncio.Event,
                        raw_send: Send | None = None, available: Available | None = None) -> int:
    """Like :func:`send_file_range` for an open fd; with ``available``, of a file that is still growing."""
    zero_copy = _ZeroCopy.probe(raw_send or send) if length >= _SENDFILE_MIN else None
    if zero_copy is not None:
        try:
            sent = await _sendfile(zero_copy, send, fd, start, length, available)
        finally:
            zero_copy.close()
        if sent is not None:
            return sent
    return await _pread_loop(send, fd, start, length, chunk_size, disconnected, available)


async def send_fill_range(scope: Scope, send: Send, fills: FillManager, fill: Fill, start: int, length: int,
                          chunk_size: int, disconnected: asyncio.Event) -> int:
    """Send bytes of a fill in progress as they are written (its last byte once verified); returns bytes sent."""
    async with fills.reading(fill) as fd:
        return await send_fd_range(send, fd, start, length, chunk_size, disconnected,
                                   raw_send=scope.get("hf_mirror.raw_send"),
                                   available=functools.partial(fills.readable, fill))


async def _segment_end(position: int, end: int, available: Available | None) -> int:
    return end if available is None else min(await available(position), end)


async def _pread_loop(send: Send, fd: int, start: int, length: int, chunk_size: int,
                      disconnected: asyncio.Event, available: Available | None) -> int:
    position, end = start, start + length
    loop = asyncio.get_running_loop()
    while position < end and not disconnected.is_set():
        limit = await _segment_end(position, end, available)
        count = min(chunk_size, limit - position)
        data = await loop.run_in_executor(_SENDFILE_POOL, os.pread, fd, count, position)
        if not data:
            raise OSError(f"file shrank while being sent ({position - start} of {length} bytes)")
        position += len(data)
        await send({"type": "http.response.body", "body": data, "more_body": position < end})
    return position - start


async def _sendfile(zc: _ZeroCopy, send: Send, fd: int, start: int, length: int,
                    available: Available | None) -> int | None:
    transport = zc.transport
    # Wait for the headers (and anything else queued) to leave uvicorn's buffer: then the socket is ours.
    for _ in range(1000):
        if transport.get_write_buffer_size() == 0:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.001)
    else:
        return None
    if transport.is_closing():  # type: ignore[attr-defined]
        return 0
    loop = asyncio.get_running_loop()
    position, end = start, start + length
    try:
        while position < end:
            limit = await _segment_end(position, end, available)
            count = limit - position
            sent = await loop.run_in_executor(_SENDFILE_POOL, _sendfile_blocking, zc.sock_fd, fd, position, count)
            position += sent
            if sent < count:
                break  # the client went away mid-body
    except BaseException:
        transport.close()  # type: ignore[attr-defined]  # the body cannot be finished: cut it, never fake its end
        raise
    # Tell uvicorn the body is complete, so its Content-Length bookkeeping and keep-alive carry on.
    zc.cycle.expected_content_length = 0  # type: ignore[attr-defined]
    if position < end:
        transport.close()  # type: ignore[attr-defined]
        return position - start
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return length


def _sendfile_blocking(sock_fd: int, fd: int, start: int, length: int) -> int:
    sent = 0
    while sent < length:
        try:
            n = os.sendfile(sock_fd, fd, start + sent, min(length - sent, 1 << 30))
        except BlockingIOError:
            _, writable, _ = select.select([], [sock_fd], [], _SELECT_TIMEOUT)
            if not writable:
                return sent
            continue
        except (BrokenPipeError, ConnectionResetError, OSError):
            return sent
        if n == 0:
            return sent
        sent += n
    return sent

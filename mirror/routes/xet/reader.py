"""The file bytes a xorb range frames (:mod:`mirror.routes.xet.cas`), read in increasing order from where the
service said they are: a cached blob, a fill in progress (waiting for the asked bytes only), or a relay."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

from mirror.errors import MirrorError
from mirror.fill import FillManager
from mirror.service import MirrorService
from mirror.service.answers import Cached, Filling, Relay


class SourceReader:
    """``read(a, b)`` of file bytes ``[a, b)``, in increasing order, from a cached blob, a fill or a relay."""

    def __init__(self, fills: FillManager, service: MirrorService, source: Cached | Filling | Relay, start: int,
                 end: int, etag: str) -> None:
        self.fills = fills
        self.etag = etag
        self.service = service
        self.source = source
        self.start, self.end = start, end
        self._closers: list[Callable[[], None]] = []
        self._contexts: list[contextlib.AbstractAsyncContextManager] = []

    async def __aenter__(self) -> Callable[[int, int], Awaitable[bytes]]:
        busy = self.service.reading(self.etag)  # no node of a fleet evicts the blob while its bytes go out
        busy.__enter__()
        self._closers.append(lambda: busy.__exit__(None, None, None))
        try:
            return await self._open()
        except BaseException:
            for close in self._closers:  # no __aexit__ follows a failed __aenter__
                close()
            self._closers.clear()
            raise

    async def _open(self) -> Callable[[int, int], Awaitable[bytes]]:
        source = self.source
        loop = asyncio.get_running_loop()
        if type(source) is Cached:
            fd = os.open(source.path, os.O_RDONLY)
            self._closers.append(lambda: os.close(fd))

            async def read_cached(a: int, b: int) -> bytes:
                data = await loop.run_in_executor(None, os.pread, fd, b - a, a)
                if len(data) != b - a:
                    raise OSError("stored blob shorter than its size")
                return data

            return read_cached
        if type(source) is Filling:
            fill = source.fill
            context = self.fills.reading(fill)
            fd = await context.__aenter__()
            self._contexts.append(context)

            async def read_fill(a: int, b: int) -> bytes:
                position = a
                while position < b:  # waits for these bytes only (a window ahead of the prefix is enough)
                    readable = await FillManager.readable(fill, position)
                    if readable <= position:
                        raise OSError("the fill ended before these bytes")
                    position = readable
                data = await loop.run_in_executor(None, os.pread, fd, b - a, a)
                if len(data) != b - a:
                    raise OSError("fill file shorter than announced")
                return data

            return read_fill
        assert isinstance(source, Relay)
        context = self.service.relay_file(source, 1024 * 1024)
        chunks: AsyncIterator[bytes] = await context.__aenter__()
        self._contexts.append(context)
        buffer = bytearray()
        buffer_start = self.start

        async def read_relay(a: int, b: int) -> bytes:
            nonlocal buffer, buffer_start
            del buffer[:a - buffer_start]
            buffer_start = a
            while len(buffer) < b - a:
                try:
                    buffer += await chunks.__anext__()
                except StopAsyncIteration:
                    raise MirrorError("upstream range ended short") from None
            return bytes(buffer[:b - a])

        return read_relay

    async def __aexit__(self, *exc: object) -> None:
        for close in self._closers:
            close()
        for context in reversed(self._contexts):
            await context.__aexit__(*exc)

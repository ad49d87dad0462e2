"""The one retry policy for upstream requests: 429 and 5xx, with bounded backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

log = logging.getLogger("hf_mirror.upstream")

RETRY_STATUSES = (429, 500, 502, 503, 504)


class Answer(Protocol):
    """What the retry policy reads of an answer, whichever transport brought it."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aclose(self) -> None: ...


A = TypeVar("A", bound=Answer)


async def with_retries(attempt: Callable[[], Awaitable[A]], *, retries: int, backoff_max: float) -> A:
    """Retry 429/5xx with bounded backoff (``Retry-After`` honoured up to ``backoff_max`` seconds).

    A 429 is tried once more at most, then relayed with its rate-limit headers: the client knows its own budget,
    and hammering a rate-limited upstream only spends the whole mirror's.
    """
    for number in range(retries + 1):
        response = await attempt()
        if response.status_code not in RETRY_STATUSES or number == retries:
            return response
        if response.status_code == 429 and number >= 1:
            return response
        delay = min(0.25 * 2**number, backoff_max)
        retry_after = response.headers.get("retry-after")
        if retry_after and retry_after.isdigit():
            delay = min(float(retry_after), backoff_max)
        await response.aclose()
        log.info("upstream answered %s, retrying in %.2fs", response.status_code, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")

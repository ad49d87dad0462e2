"""Announcements of lease changes inside one process: who waits for which etag, and waking them.

A shared store feeds it from the database's notifications (``LISTEN``); the embedded store from its own writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Subscription:
    """One waiter's interest in one etag, registered before it reads the state it waits to see change."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """True when a change was announced since the subscription began, False after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), max(timeout, 0))
        except TimeoutError:
            return False
        self._event.clear()
        return True


class Announcements:
    def __init__(self) -> None:
        self._waiting: dict[str, set[Subscription]] = {}

    @contextlib.asynccontextmanager
    async def changed(self, etag: str) -> AsyncIterator[Subscription]:
        subscription = Subscription()
        self._waiting.setdefault(etag, set()).add(subscription)
        try:
            yield subscription
        finally:
            waiting = self._waiting.get(etag)
            if waiting is not None:
                waiting.discard(subscription)
                if not waiting:
                    del self._waiting[etag]

    def announce(self, etag: str) -> None:
        for subscription in self._waiting.get(etag, ()):
            subscription.wake()

    def announce_all(self) -> None:
        """Wake everyone (the notification channel was down: they may have missed something)."""
        for waiting in self._waiting.values():
            for subscription in waiting:
                subscription.wake()

"""Upstream bandwidth shaping: one token bucket per process, shared by every fill's reading threads.

``upstream_rate`` (bytes/s, 0 = none) bounds every fill of the server; the ``sync`` command runs under
``sync_rate`` during ``sync_hours`` instead (:func:`sync_rate_now`), so the nightly sync stays off the office link.
The bucket holds at most a quarter of a second of bytes, so a burst cannot overshoot the rate by much.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mirror.config import Settings


class RateLimit:
    """A thread-safe token bucket; ``rate()`` is read at each take (it may change with the hour)."""

    def __init__(self, rate: Callable[[], float]) -> None:
        self._rate = rate
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._stamp = time.monotonic()

    @property
    def active(self) -> bool:
        return self._rate() > 0

    def take(self, n: int) -> None:
        """Blocking: account for ``n`` bytes just read, sleeping as long as the rate requires."""
        rate = self._rate()
        if rate <= 0 or n <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._tokens + (now - self._stamp) * rate, rate / 4)
            self._stamp = now
            self._tokens -= n
            wait = -self._tokens / rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


def in_hours(hours: str, now: time.struct_time | None = None) -> bool:
    """``"08-18"``: 08:00 to 17:59 local time; ``"22-06"`` wraps past midnight; empty: always."""
    if not hours:
        return True
    start, _, end = hours.partition("-")
    hour = (now or time.localtime()).tm_hour
    first, last = int(start), int(end)
    return first <= hour < last if first <= last else hour >= first or hour < last


def sync_rate_now(settings: Settings) -> float:
    """The rate the sync runs at now: ``sync_rate`` within ``sync_hours``, else ``upstream_rate``."""
    if settings.sync_rate and in_hours(settings.sync_hours):
        return float(settings.sync_rate)
    return float(settings.upstream_rate)

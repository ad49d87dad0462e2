"""Traffic over the last hours: a ring buffer of samples of the process's counters (requests by outcome, bytes served
and fetched, error answers, upstream failures and upstream latency), taken every ``HF_MIRROR_STATUS_SAMPLE`` seconds
(60 by default) for ``HF_MIRROR_STATUS_HOURS`` hours (24). Cumulative values are kept; the charts show the
differences between neighbours. Per process: with ``--workers N`` each worker shows its own traffic (``/metrics`` is
the place for fleet-wide series)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from mirror.metrics import Metrics, Outcome


@dataclass(frozen=True)
class Sample:
    at: float
    hits: float
    misses: float  # misses and stale answers: served, but not from a fresh cache hit
    served: float  # body bytes sent to clients
    fetched: float  # body bytes fetched from upstream
    errors: float = 0.0  # error answers sent to clients (outcome ``error``)
    upstream_errors: float = 0.0  # upstream answers 5xx, and upstream requests that failed outright
    latency_sum: float = 0.0  # seconds to upstream response headers, summed ...
    latency_count: float = 0.0  # ... over this many upstream requests


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class StatusHistory:
    def __init__(self, metrics: Metrics, *, interval: float | None = None, hours: float | None = None) -> None:
        self.metrics = metrics
        self.interval = max(0.05, interval or _env_float("HF_MIRROR_STATUS_SAMPLE", 60.0))
        hours = hours or _env_float("HF_MIRROR_STATUS_HOURS", 24.0)
        self.samples: deque[Sample] = deque(maxlen=max(2, int(hours * 3600 / self.interval)))
        self._task: asyncio.Task[None] | None = None

    def read(self) -> Sample:
        """The counters now (a few dozen samples of the registry: constant time)."""
        hits = misses = errors = 0.0
        for metric in self.metrics.requests.collect():
            for s in metric.samples:
                if s.name.endswith("_total"):
                    if s.labels.get("outcome") == Outcome.HIT:
                        hits += s.value
                    elif s.labels.get("outcome") in (Outcome.MISS, Outcome.STALE):
                        misses += s.value
                    elif s.labels.get("outcome") == Outcome.ERROR:
                        errors += s.value
        upstream_errors = sum(s.value for m in self.metrics.upstream_requests.collect() for s in m.samples
                              if s.name.endswith("_total") and s.labels.get("status") in ("5xx", "error"))
        latency_sum = latency_count = 0.0
        for metric in self.metrics.upstream_latency.collect():
            for s in metric.samples:
                if s.name.endswith("_sum"):
                    latency_sum += s.value
                elif s.name.endswith("_count"):
                    latency_count += s.value
        served = sum(s.value for m in self.metrics.bytes_served.collect() for s in m.samples
                     if s.name.endswith("_total"))
        fetched = sum(s.value for m in self.metrics.bytes_fetched.collect() for s in m.samples
                      if s.name.endswith("_total"))
        return Sample(time.time(), hits, misses, served, fetched, errors, upstream_errors, latency_sum, latency_count)

    def sample(self) -> None:
        self.samples.append(self.read())

    def start(self) -> None:
        if self._task is None:
            self.sample()
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def series(self, hours: float = 6.0) -> list[dict[str, Any]]:
        """Per-interval traffic over the last ``hours``, oldest first; the last point is the interval in progress."""
        since = time.time() - hours * 3600
        points = [s for s in self.samples if s.at >= since - self.interval]
        points.append(self.read())
        out = []
        for before, after in zip(points, points[1:], strict=False):
            hits, misses = after.hits - before.hits, after.misses - before.misses
            calls = after.latency_count - before.latency_count
            out.append({"t": round(after.at, 1), "hits": int(hits), "misses": int(misses),
                        "hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
                        "bytes_served": int(after.served - before.served),
                        "bytes_fetched": int(after.fetched - before.fetched),
                        "errors": int(after.errors - before.errors),
                        "upstream_errors": int(after.upstream_errors - before.upstream_errors),
                        # The mean time to upstream response headers in the interval; None: no upstream request.
                        "upstream_latency": round((after.latency_sum - before.latency_sum) / calls, 4)
                        if calls else None})
        return out

"""Prometheus collectors, one registry per app (so tests can build many apps), and the requests' outcomes. Label
sets are bounded: routes and outcomes are small enums, never repo names or paths.

Names follow Prometheus' conventions, the unit last (``hf_mirror_served_bytes_total``). The names of the previous
release are exported beside the new ones for one release (:data:`RENAMED`), then dropped.

With ``--workers N`` every worker counts into prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``,
set by :mod:`mirror.server` before the workers start) and ``/metrics`` adds them all up, whichever worker answers.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from enum import StrEnum
from itertools import accumulate
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.utils import floatToGoString

from mirror import __version__

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# One time series per counter, not two: the ``_created`` series doubles what a scrape carries for nothing we use.
disable_created_metrics()

# New family name -> the name the previous release exported (same samples, same labels).
RENAMED = {
    "hf_mirror_served_bytes": "hf_mirror_bytes_served",
    "hf_mirror_upstream_bytes": "hf_mirror_bytes_fetched",
    "hf_mirror_peer_bytes": "hf_mirror_bytes_from_peers",
}

# Served requests: from the first byte of the request to the last of the answer (a download's transfer included).
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 300)


class Outcome(StrEnum):
    """What became of a request, decided once by the service: the ``X-Mirror-Cache`` header, the ``outcome`` label
    of ``hf_mirror_requests`` and the access log all say it in these words."""

    HIT = "hit"  # served from the cache (a stale answer says STALE)
    MISS = "miss"  # fetched from upstream (and stored, or being stored)
    STALE = "stale"  # upstream failed: the last good answer, labelled
    PASSTHROUGH = "passthrough"  # relayed from upstream, not stored
    ERROR = "error"  # a Hub-shaped error answer
    ABORTED = "aborted"  # the answer began and was cut (access log only: counted under its outcome already)
    PEER = "peer"  # a fill in progress streamed to another node (access log only)


_OUTCOMES = frozenset(Outcome)


class _Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class _WithOldNames:
    """A collector's families, each renamed one also under its previous name."""

    def __init__(self, source: _Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            yield family
            old = RENAMED.get(family.name)
            if old is not None:
                alias = Metric(old, f"{family.documentation} (deprecated name of {family.name})", family.type)
                alias.samples = [s._replace(name=old + s.name[len(family.name):]) for s in family.samples]
                yield alias


class _Durations:
    """``hf_mirror_request_duration_seconds`` in one process: the same exposition as a labelled prometheus Histogram
    with :data:`REQUEST_BUCKETS`, counted in plain lists (observed from the event loop's thread)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._le = [floatToGoString(b) for b in (*REQUEST_BUCKETS, float("inf"))]
        # (route, outcome) -> [sum, then a count per bucket (the one each observation falls in, +Inf last)]
        self._series: dict[tuple[str, str], list[float]] = {}
        registry.register(self)

    def observe(self, key: tuple[str, str], seconds: float) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = [0.0] * (len(self._le) + 1)
        series[0] += seconds
        series[1 + bisect_left(REQUEST_BUCKETS, seconds)] += 1  # the first bucket whose bound is >= seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["route", "outcome"])
        for key, series in list(self._series.items()):
            counts = list(accumulate(series[1:]))
            family.add_metric(list(key), list(zip(self._le, counts, strict=True)), series[0])
        yield family


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _Counts:
    """``hf_mirror_requests`` in one process: the same exposition as a labelled prometheus Counter, counted in plain
    numbers (incremented from the event loop's thread); ``labels(...)`` and ``collect()`` as prometheus_client's."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._labelnames = labelnames
        self._series: dict[tuple[str, ...], _Count] = {}
        registry.register(self)

    def labels(self, **labels: str) -> _Count:
        key = tuple(str(labels[name]) for name in self._labelnames)
        count = self._series.get(key)
        if count is None:
            count = self._series[key] = _Count()
        return count

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self._labelnames)
        for key, count in list(self._series.items()):
            family.add_metric(list(key), count.value)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        shared = bool(os.environ.get(MULTIPROC_ENV))
        # One process: a request is counted and timed in plain numbers here, read at each scrape (a prometheus
        # Counter takes a lock per increment and a Histogram two per observation: a measurable part of a cached
        # HEAD). Several processes count into the shared files, which only prometheus_client's own types write.
        requests = ("hf_mirror_requests", "Requests served, by route kind and outcome", ["route", "outcome"])
        self.requests: Counter | _Counts = Counter(*requests, registry=r) if shared else _Counts(*requests, registry=r)
        duration = ("hf_mirror_request_duration_seconds", "Time from a request's arrival to the end of its answer, by "
                    "route class and outcome")
        self.request_duration: Histogram | _Durations = (
            Histogram(*duration, ["route", "outcome"], registry=r, buckets=REQUEST_BUCKETS)
            if shared else _Durations(*duration, registry=r))
        self.bytes_served = Counter("hf_mirror_served_bytes", "Body bytes sent to clients", ["source"], registry=r)
        self.bytes_fetched = Counter("hf_mirror_upstream_bytes", "Body bytes fetched from upstream", registry=r)
        self.bytes_from_peers = Counter(
            "hf_mirror_peer_bytes", "Body bytes of fills in progress streamed from other nodes", registry=r
        )
        self.upstream_requests = Counter(
            "hf_mirror_upstream_requests", "Requests sent upstream, by status class", ["status"], registry=r
        )
        self.upstream_latency = Histogram(
            "hf_mirror_upstream_latency_seconds", "Time to upstream response headers", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        # Gauges under --workers: a process's own count adds up (livesum: a worker gone counts no more); what every
        # worker measures of the one shared cache is the latest value any of them wrote (mostrecent).
        self.fills_in_flight = Gauge("hf_mirror_fills_in_flight", "Blob fills running", registry=r,
                                     multiprocess_mode="livesum")
        self.fills = Counter("hf_mirror_fills", "Finished blob fills, by result", ["result"], registry=r)
        self.fill_hedges = Counter("hf_mirror_fill_hedges", "Windows of parallel fills asked again on a fresh "
                                   "connection because they lagged (hedged requests)", registry=r)
        self.fill_hedge_bytes = Counter("hf_mirror_fill_hedge_bytes", "Upstream body bytes fetched by hedged "
                                        "requests (counted in hf_mirror_upstream_bytes too)", registry=r)
        self.integrity_failures = Counter(
            "hf_mirror_integrity_failures", "Fills discarded because size or hash did not match", registry=r
        )
        self.stale_served = Counter(
            "hf_mirror_stale_served", "Responses served stale because upstream failed", registry=r
        )
        self.cache_bytes = Gauge("hf_mirror_cache_bytes", "Bytes of committed blobs", registry=r,
                                 multiprocess_mode="mostrecent")
        self.cache_blobs = Gauge("hf_mirror_cache_blobs", "Number of committed blobs", registry=r,
                                 multiprocess_mode="mostrecent")
        # Sparse files (ranged reads of large files never completed): partial files holding windows, apart from blobs.
        self.sparse_files = Gauge("hf_mirror_sparse_files", "Partial files holding windows of files never completed "
                                  "(sparse fills)", registry=r, multiprocess_mode="mostrecent")
        self.sparse_bytes = Gauge("hf_mirror_sparse_bytes", "Bytes the windows of sparse files hold (in the quota)",
                                  registry=r, multiprocess_mode="mostrecent")
        self.quota_bytes = Gauge("hf_mirror_quota_bytes", "The cache's quota (--max-size); 0 without one",
                                 registry=r, multiprocess_mode="max")
        self.disk_free_bytes = Gauge("hf_mirror_disk_free_bytes", "Free bytes on the cache directory's filesystem",
                                     registry=r, multiprocess_mode="mostrecent")
        self.evictions = Counter("hf_mirror_evictions", "Blobs evicted by the quota", registry=r)
        # The last run of each manifest synced into this cache (mirror.sync.record), read at each scrape.
        self.sync_last_run = Gauge("hf_mirror_sync_last_run_timestamp_seconds", "When the last sync run of a manifest "
                                   "ended", ["manifest"], registry=r, multiprocess_mode="mostrecent")
        self.sync_last_success = Gauge("hf_mirror_sync_last_success_timestamp_seconds", "When the last successful "
                                       "sync run of a manifest ended", ["manifest"], registry=r,
                                       multiprocess_mode="mostrecent")
        self.sync_last_ok = Gauge("hf_mirror_sync_last_run_ok", "1 when the last sync run of a manifest succeeded, "
                                  "else 0", ["manifest"], registry=r, multiprocess_mode="mostrecent")
        self.build_info = Gauge("hf_mirror_build_info", "The running mirror's version (always 1)", ["version"],
                                registry=r, multiprocess_mode="max")
        self.build_info.labels(version=__version__).set(1)
        self._durations: dict[tuple[str, str], Histogram] = {}

    def cache_grew(self, size: int) -> None:
        """A committed blob, counted by the cache gauges before the next scan. Set, not inc: under ``--workers``
        they show what the latest worker wrote (``mostrecent``), which refuses inc."""
        self.cache_bytes.set(self.cache_bytes._value.get() + size)  # noqa: SLF001 - this process's own figure
        self.cache_blobs.set(self.cache_blobs._value.get() + 1)  # noqa: SLF001

    def sync_run(self, manifest: str, finished: float, ok: bool, last_success: float | None) -> None:
        self.sync_last_run.labels(manifest=manifest).set(finished)
        self.sync_last_ok.labels(manifest=manifest).set(1 if ok else 0)
        if last_success is not None:
            self.sync_last_success.labels(manifest=manifest).set(last_success)

    def observe_request(self, route: str, outcome: str, seconds: float) -> None:
        """One served request's duration; an outcome outside :class:`Outcome` (ops routes, actions) is ``other``."""
        key = (route, outcome if outcome in _OUTCOMES else "other")
        durations = self.request_duration
        if type(durations) is _Durations:
            durations.observe(key, seconds)
            return
        child = self._durations.get(key)
        if child is None:  # labels() costs a lock and a dict build: once per pair, not per request
            child = self._durations[key] = durations.labels(route=key[0], outcome=key[1])
        child.observe(seconds)

    def render(self) -> bytes:
        """The exposition text: every worker's files under ``--workers N``, else this registry."""
        path = os.environ.get(MULTIPROC_ENV)
        source: _Collector = MultiProcessCollector(None, path) if path else self.registry
        return generate_latest(_WithOldNames(source))  # type: ignore[arg-type]

"""Prometheus collectors, one registry per app (so tests can build many apps), and the requests' outcomes. Label
sets are bounded: routes and outcomes are small enums, never repo names or paths."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


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


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hf_mirror_requests", "Requests served, by route kind and outcome", ["route", "outcome"], registry=r
        )
        self.bytes_served = Counter("hf_mirror_bytes_served", "Body bytes sent to clients", ["source"], registry=r)
        self.bytes_fetched = Counter("hf_mirror_bytes_fetched", "Body bytes fetched from upstream", registry=r)
        self.bytes_from_peers = Counter(
            "hf_mirror_bytes_from_peers", "Body bytes of fills in progress streamed from other nodes", registry=r
        )
        self.upstream_requests = Counter(
            "hf_mirror_upstream_requests", "Requests sent upstream, by status class", ["status"], registry=r
        )
        self.upstream_latency = Histogram(
            "hf_mirror_upstream_latency_seconds", "Time to upstream response headers", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.fills_in_flight = Gauge("hf_mirror_fills_in_flight", "Blob fills running in this process", registry=r)
        self.fills = Counter("hf_mirror_fills", "Finished blob fills, by result", ["result"], registry=r)
        self.integrity_failures = Counter(
            "hf_mirror_integrity_failures", "Fills discarded because size or hash did not match", registry=r
        )
        self.stale_served = Counter(
            "hf_mirror_stale_served", "Responses served stale because upstream failed", registry=r
        )
        self.cache_bytes = Gauge("hf_mirror_cache_bytes", "Bytes of committed blobs", registry=r)
        self.cache_blobs = Gauge("hf_mirror_cache_blobs", "Number of committed blobs", registry=r)
        self.evictions = Counter("hf_mirror_evictions", "Blobs evicted by the quota", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

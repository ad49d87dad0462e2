"""The one wiring: the mirror's parts, built from :class:`Settings` in one place.

``serve`` (:mod:`mirror.app`), ``sync`` (:mod:`mirror.sync`) and ``cache`` (:mod:`mirror.cli.cache`) all build
their store, index, upstream client, fill engine, access policy, cache manager and service here, so every
command honours every setting: ``storage = "s3"`` makes ``cache du`` count the bucket, not the node's hot tier.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from mirror.access import AccessPolicy
from mirror.admission import AdmissionGate, Ledger, Rules
from mirror.cache import CacheManager, Scrubber
from mirror.config import Settings
from mirror.fill import FillManager
from mirror.index import MetadataIndex
from mirror.layout import CacheLayout
from mirror.metadata import MetadataStore, open_metadata
from mirror.metadata.busy import BusyMarks
from mirror.metadata.fleet_leases import FleetLeases
from mirror.metadata.held import HeldWindows
from mirror.metadata.sharing import SharedMetadata
from mirror.metrics import Metrics
from mirror.service import MirrorService, ServiceCore
from mirror.storage import open_store
from mirror.storage.base import BlobStore
from mirror.upstream import UpstreamClient
from mirror.xet import XetCatalog, XetSigner
from mirror.xet.tokens import FLEET_SECRET, SECRET_BYTES, load_secret


@dataclass(frozen=True)
class Parts:
    """The parts of one process, built by :func:`build_parts`; ``start`` (a server) or ``open`` (a command), then
    ``aclose``."""

    settings: Settings
    layout: CacheLayout  # every path under cache_dir, named once
    metrics: Metrics
    store: BlobStore
    index: MetadataIndex
    upstream: UpstreamClient
    fills: FillManager
    access: AccessPolicy
    cache: CacheManager
    service: MirrorService
    scrubber: Scrubber
    admission: AdmissionGate | None = None  # the admission policy; None when no rule is configured
    metadata: MetadataStore | None = None  # the embedded default, or the fleet's database (metadata_url)
    busy: BusyMarks | None = None  # this process's busy marks for the fleet's evictions (metadata_url)
    xet_signer: XetSigner | None = None  # signs the mirror's Xet tokens (serve_xet); its secret read at start
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, repr=False, compare=False)

    async def open(self) -> None:
        """Check the store: a remote one fails here on a wrong endpoint, bucket or credential (and the fleet's
        database, on a wrong URL; its schema is migrated here)."""
        if self.metadata is not None:
            await self.metadata.open()
        await self.store.open()

    async def start(self) -> None:
        """What a server does at startup: open the store, drop stale partial files, run the quota's gc loop."""
        await self.open()
        if self.xet_signer is not None:
            await self.xet_signer.open()  # its secret (a fleet's: once the database is open)
        await self.cache.sweep_partials()
        self.cache.prime()  # the first usage count, in a thread, so that the status page and /metrics find it
        if self.settings.scrub_rate > 0:
            self._tasks.append(asyncio.create_task(self.scrubber.run(self.settings.scrub_rate)))
        if self.settings.gc_interval > 0:
            self._tasks.append(asyncio.create_task(self.cache.run_periodically(self.settings.gc_interval)))

    async def aclose(self, grace: float | None = None) -> None:
        """Stop the gc loop, let fills finish within ``grace`` seconds (default ``shutdown_grace``; then they are
        cancelled and stay resumable), close upstream connections, give back the store's leases, close the index."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        await self.fills.aclose(self.settings.shutdown_grace if grace is None else grace)
        await self.upstream.aclose()
        await self.store.aclose()  # gives back the fill leases this node still holds, then the connections
        if self.busy is not None:
            await self.busy.aclose()
        if self.metadata is not None:
            await self.metadata.aclose()
        self.index.close()
        if self.admission is not None:
            self.admission.ledger.close()


def build_parts(settings: Settings, metrics: Metrics | None = None, *,
                fill_manager: type[FillManager] = FillManager, upstream: UpstreamClient | None = None) -> Parts:
    """Every part from ``settings``: the store they name (local disk, or a bucket shared by several nodes with
    ``cache_dir`` as its hot tier), the index under ``cache_dir``, and the rest on top. ``fill_manager``: a
    subclass of the fill engine (``sync`` counts its downloads). ``upstream``: a client built elsewhere (the unit
    tests' fake Hub at the client's interface, tests/support/fake_upstream.py); by default, one from ``settings``."""
    metrics = metrics if metrics is not None else Metrics()
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    layout = CacheLayout(settings.cache_dir)  # the one place the cache's paths come from: passed to each part
    index = MetadataIndex(layout.index_dir, negative_max_entries=settings.negative_max_entries,
                          negative_max_bytes=settings.negative_max_bytes)
    metadata = open_metadata(settings, index, layout)
    # A fleet's database grants the fill leases of a shared bucket (fenced, renewed off the event loop, announced);
    # without one, the bucket's own lease objects do, as before.
    leases = (FleetLeases(metadata, settings.fleet_lease_seconds)
              if settings.metadata_url and settings.storage == "s3" else None)
    store = open_store(settings, layout, leases=leases)
    lease_ttl = settings.fleet_lease_seconds if leases is not None else settings.lease_stale_seconds
    # The fleet's evictions (a database): what this process reads or fills is busy for every node.
    busy = BusyMarks(metadata, settings.fleet_lease_seconds) if settings.metadata_url else None
    # The windows of paused sparse fills, recorded for the fleet's other nodes to ask for (a database, a bucket and
    # an address the others can reach).
    held = (HeldWindows(metadata, settings.node_url)
            if settings.metadata_url and settings.storage == "s3" and settings.node_url else None)
    upstream = upstream if upstream is not None else UpstreamClient(settings, metrics)
    fills = fill_manager(
        store, upstream, metrics, chunk_size=settings.fill_chunk_size, lease_ttl=lease_ttl,
        cancel_on_disconnect=settings.fill_on_disconnect == "cancel", node_url=settings.node_url, busy=busy,
        held=held,
        # Completing a sparse file reserves the rest of it, as a new fill does: the quota's make_room. The cache
        # manager is built below (it asks the fills what is busy); this is called only once the parts serve.
        make_room=lambda size, reserved: cache.make_room(size, reserved),
    )
    # The fleet's database behind this node's index (metadata_url): refs, files, access confirmations, pins, API
    # answers and listings, Xet hashes.
    shared = SharedMetadata(metadata, index) if settings.metadata_url else None
    access = AccessPolicy.from_settings(index, settings, shared)
    is_busy = _busy(store, fills)
    cache = CacheManager(store, index, metrics, max_size=settings.max_size, is_busy=is_busy,
                         layout=layout, min_free_space=settings.min_free_space or 0,
                         evicts_for_disk=settings.storage == "local", metadata=metadata if shared else None,
                         busy=busy, held=held)
    if busy is not None:
        metadata.on_evicted(cache.dropped)  # another node's eviction: this node's hot copy goes too
    scrubber = Scrubber(store, metrics, is_busy=is_busy)
    admission = (AdmissionGate(Rules.from_settings(settings), Ledger(layout), upstream,
                               offline=settings.offline) if settings.policy_active else None)
    # The service's one core (its parts and shared state), and the sides composed over it.
    core = ServiceCore(settings, index, store, upstream, fills, access, metrics, make_room=cache.make_room,
                       on_hit=scrubber.suspect if settings.scrub_rate else None, admission=admission,
                       xet=XetCatalog(index, shared) if settings.serve_xet else None, shared=shared)
    service = MirrorService(core)
    fills.on_commit.append(lambda spec: scrubber.verified(spec.etag))  # a fill verified it: no first-hit re-hash
    # The status page and /metrics count the new blob at once.
    fills.on_commit.append(lambda spec: cache.committed(spec.repo, spec.commit, spec.etag, spec.size))
    return Parts(settings, layout, metrics, store, index, upstream, fills, access, cache, service, scrubber, admission,
                 metadata, busy, _xet_signer(settings, layout, metadata) if settings.serve_xet else None)


def _xet_signer(settings: Settings, layout: CacheLayout, metadata: MetadataStore | None) -> XetSigner:
    """The secret of the mirror's Xet tokens: the setting; else a fleet's, generated once in its database (every
    node accepts every node's tokens); else this cache's own file, made on first use. Read when a server starts,
    never by a command that only builds the parts."""
    if settings.metadata_url and not settings.xet_signing_secret and metadata is not None:
        return XetSigner(load=lambda: metadata.secret(FLEET_SECRET, os.urandom(SECRET_BYTES)))

    async def own_secret() -> bytes:
        return load_secret(layout.xet_secret, settings.xet_signing_secret)

    return XetSigner(load=own_secret)


def _busy(store: BlobStore, fills: FillManager) -> Callable[[str], bool]:
    """A blob that gc and ``cache rm`` leave alone: one this process fills, or (local storage) one whose lease
    another process on this host holds (a server's fill, a sync, a ``cache import``)."""
    return lambda etag: fills.is_filling(etag) or store.lease_held(etag)

"""The metadata the nodes of a fleet share, behind one interface (:class:`mirror.metadata.base.MetadataStore`):
the embedded default on this node's disk, or one PostgreSQL database for the fleet (``metadata_url``)."""

from __future__ import annotations

from mirror.config import ConfigError, Settings
from mirror.index import MetadataIndex
from mirror.layout import CacheLayout
from mirror.metadata.base import HeldLease, LeaseRecord, MetadataStore, RefRecord
from mirror.metadata.embedded import EmbeddedMetadata

__all__ = ["HeldLease", "LeaseRecord", "MetadataStore", "RefRecord", "EmbeddedMetadata", "open_metadata"]


def open_metadata(settings: Settings, index: MetadataIndex, layout: CacheLayout) -> MetadataStore:
    """The store ``settings`` name: PostgreSQL for ``metadata_url``, else the embedded one over ``index`` (its fill
    leases in ``layout``'s ``fill-leases/``).
    Nothing connects before ``await store.open()``."""
    if settings.metadata_url:
        try:
            from mirror.metadata.postgres import PostgresMetadata  # psycopg (the fleet extra) only where it is used
        except ModuleNotFoundError as exc:
            raise ConfigError(f"metadata_url needs the fleet extra: pip install 'hf-mirror[fleet]' ({exc})") from exc
        return PostgresMetadata(settings.metadata_url, connect_timeout=settings.metadata_connect_timeout,
                                read_timeout=min(settings.metadata_read_timeout, settings.metadata_connect_timeout))
    return EmbeddedMetadata(index, layout.fill_leases_dir)

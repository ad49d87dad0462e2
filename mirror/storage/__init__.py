"""Blob storage backends behind one small interface (:class:`mirror.storage.base.BlobStore`)."""

from __future__ import annotations

from typing import Any

from mirror.config import ConfigError, Settings
from mirror.layout import CacheLayout
from mirror.storage.base import BlobStore
from mirror.storage.local import LocalBlobStore


def open_store(settings: Settings, layout: CacheLayout, *, leases: Any = None) -> BlobStore:
    """The store ``settings`` ask for: local disk in ``layout`` (the cache directory's), or a shared S3 bucket with
    the cache directory as its hot tier. S3 connections open lazily, on the running event loop (call
    ``await store.open()`` to check).
    ``leases``: the fill leases of a fleet database (``mirror.storage.s3.leases.FillLeases``) for the bucket's own."""
    if settings.storage == "s3":
        try:
            from mirror.storage.s3 import S3BlobStore  # aiobotocore (the s3 extra) is only imported where it is used
        except ModuleNotFoundError as exc:
            raise ConfigError(f"storage = 's3' needs the s3 extra: pip install 'hf-mirror[s3]' ({exc})") from exc

        assert settings.s3_bucket is not None  # Settings validates it
        return S3BlobStore(layout, bucket=settings.s3_bucket, prefix=settings.s3_prefix,
                           endpoint=settings.s3_endpoint, region=settings.s3_region,
                           hot_tier_max_size=settings.hot_tier_max_size, leases=leases)
    return LocalBlobStore(layout)

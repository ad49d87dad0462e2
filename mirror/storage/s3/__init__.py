"""S3-compatible blob store (AWS S3, MinIO, Ceph RGW, SeaweedFS) with a bounded local-disk hot tier in front.

Several mirror nodes point at one bucket; the bucket is the single truth of what exists (the names come from
:mod:`mirror.layout`: ``BucketLayout`` for the bucket, ``CacheLayout`` for this node's disk)::

    s3://<bucket>/<prefix>blobs/<etag[:2]>/<etag>   committed blobs (immutable, named by the Hub etag)
    s3://<bucket>/<prefix>leases/<etag>             fill leases: JSON {owner, ttl, host, pid, refreshed, peer}

    <cache_dir>/blobs/<etag[:2]>/<etag>             hot tier: local copies of bucket blobs, LRU by mtime, bounded
    <cache_dir>/partials/<etag>.part                fills in progress on this node (always local)
    <cache_dir>/hot-tmp/                            hot-tier downloads in progress

One noun per module: :mod:`.store` (:class:`S3BlobStore`, the ``BlobStore`` the rest of the mirror sees),
:mod:`.bucket` (the client, the keys, blob objects), :mod:`.hot_tier` (the local LRU copy), :mod:`.leases`
(conditional-put fill leases on the store's clock), :mod:`.errors` (:class:`StorageUnavailable`).

Importing this package imports aiobotocore (the ``s3`` extra): :func:`mirror.storage.open_store` imports it only
when ``storage = "s3"``.
"""

from mirror.errors import StorageUnavailable
from mirror.storage.s3.store import S3BlobStore

__all__ = ["S3BlobStore", "StorageUnavailable"]

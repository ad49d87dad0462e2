"""The bucket: one aiobotocore client, the object keys, and the blob objects (head, get, put once, delete, list).

A blob is put once: the object is looked for before an upload and again right before a multipart completion
(inside the fleet database's fence when there is one), so a second upload of a committed blob is never completed
(without a database, two committers that look at the same moment may both write: the same, verified bytes).

The client is aiobotocore (botocore's request signing, retries, credential chain, on aiohttp): every S3 call is a
coroutine on the mirror's event loop, no thread pool is needed for network I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from mirror.errors import AlreadyCommitted
from mirror.layout import BucketLayout
from mirror.storage.base import BlobInfo
from mirror.storage.s3.errors import error_code, http_status

_SINGLE_PUT_MAX = 64 * 1024 * 1024  # larger blobs go up as multipart uploads
_PART_SIZE = 64 * 1024 * 1024
_MAX_PARTS = 10_000  # S3's limit: the part size grows for blobs over 640 GB
_UPLOAD_CONCURRENCY = 4


class Bucket:
    """``s3://<name>/<prefix>blobs/<etag[:2]>/<etag>`` (committed blobs) and ``<prefix>leases/<etag>`` (leases)."""

    def __init__(self, name: str, *, prefix: str, endpoint: str | None, region: str, max_attempts: int) -> None:
        self.name = name
        self.prefix = prefix
        self.keys = BucketLayout(prefix)
        self.endpoint = endpoint
        self.region = region
        self.max_attempts = max_attempts
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._client_lock = asyncio.Lock()

    async def check(self) -> None:
        """Connect and check the bucket, so a wrong endpoint, bucket or credential fails at startup, not mid-request."""
        client = await self.client()
        try:
            await client.head_bucket(Bucket=self.name)
        except ClientError as exc:
            raise RuntimeError(f"S3 bucket {self.name!r} at {self.endpoint or 'AWS'} is not usable: "
                               f"{error_code(exc)}") from exc

    async def client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                config = Config(
                    region_name=self.region,
                    # MinIO, Ceph and SeaweedFS gateways address buckets by path; AWS picks its own style.
                    s3={"addressing_style": "path"} if self.endpoint else {},
                    retries={"max_attempts": self.max_attempts, "mode": "standard"},
                    connect_timeout=10, read_timeout=60, max_pool_connections=64,
                )
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    get_session().create_client("s3", endpoint_url=self.endpoint, config=config))
                self._stack = stack
        return self._client

    async def aclose(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
        self._stack = self._client = None

    def blob_key(self, etag: str) -> str:
        return self.keys.blob_key(etag)

    def lease_key(self, etag: str) -> str:
        return self.keys.lease_key(etag)

    async def head_blob(self, etag: str) -> BlobInfo | None:
        client = await self.client()
        try:
            head = await client.head_object(Bucket=self.name, Key=self.blob_key(etag))
        except ClientError as exc:
            if http_status(exc) == 404:
                return None
            raise
        return BlobInfo(etag, int(head["ContentLength"]), head["LastModified"].timestamp())

    async def get_blob(self, etag: str) -> Any:
        """The ``get_object`` answer (``ContentLength``, a streaming ``Body``), or None when there is no such blob."""
        client = await self.client()
        try:
            return await client.get_object(Bucket=self.name, Key=self.blob_key(etag))
        except ClientError as exc:
            if http_status(exc) == 404:
                return None
            raise

    async def put_blob(self, etag: str, partial: Path, size: int,
                       fence: Callable[[], AbstractAsyncContextManager[None]] | None = None) -> bool:
        """Upload a blob once; False when the blob was in the bucket already (this upload is then discarded: the
        bytes are the same by construction, the object is not written again).

        Nothing here depends on the store's conditional writes. The object is looked for before anything goes up,
        and a multipart upload looks again right before its completion: a blob already committed is never
        completed a second time. With ``fence`` (a fleet database's fill lease) that last look and the completion
        run inside the fence, which holds every other committer of the etag off and admits only the current
        holder: a holder that lost its lease never completes. Without it (one node, or a fleet on the bucket's
        leases) two committers that both look before either completes may both write; the second write carries
        the same, verified bytes, so a reader never sees wrong ones."""
        if await self.head_blob(etag) is not None:
            return False
        if fence is None and size <= _SINGLE_PUT_MAX:
            return await self._put_small(etag, partial)
        if fence is not None and size == 0:  # no parts to upload: the empty object is put inside the fence
            async with fence():
                if await self.head_blob(etag) is not None:
                    return False
                return await self._put_small(etag, partial)
        return await self._put_multipart(etag, partial, size, fence)

    async def _put_small(self, etag: str, partial: Path) -> bool:
        data = await asyncio.to_thread(partial.read_bytes)
        client = await self.client()
        try:
            # If-None-Match narrows the race where the store honours it; nothing depends on it (same bytes).
            await client.put_object(Bucket=self.name, Key=self.blob_key(etag), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if http_status(exc) not in (409, 412):  # 412: already there (same etag, same bytes): that is success
                raise
            return False
        return True

    async def _put_multipart(self, etag: str, partial: Path, size: int,
                             fence: Callable[[], AbstractAsyncContextManager[None]] | None = None) -> bool:
        client = await self.client()
        key = self.blob_key(etag)
        part_size = max(_PART_SIZE, -(-size // _MAX_PARTS))
        upload = await client.create_multipart_upload(Bucket=self.name, Key=key)
        upload_id = upload["UploadId"]
        semaphore = asyncio.Semaphore(_UPLOAD_CONCURRENCY)  # bounds memory to concurrency x part size

        async def put_part(number: int) -> dict[str, Any]:
            async with semaphore:
                offset = (number - 1) * part_size
                data = await asyncio.to_thread(_read_range, partial, offset, min(part_size, size - offset))
                part = await client.upload_part(Bucket=self.name, Key=key, UploadId=upload_id,
                                                PartNumber=number, Body=data)
                return {"PartNumber": number, "ETag": part["ETag"]}

        try:
            parts = await asyncio.gather(*(put_part(n) for n in range(1, -(-size // part_size) + 1)))
            async with fence() if fence is not None else contextlib.nullcontext():
                if await self.head_blob(etag) is not None:  # committed while our parts went up
                    raise AlreadyCommitted
                await client.complete_multipart_upload(Bucket=self.name, Key=key, UploadId=upload_id,
                                                       MultipartUpload={"Parts": list(parts)})
            return True
        except AlreadyCommitted:  # same etag, same bytes: success, and the upload is dropped
            with contextlib.suppress(Exception):
                await client.abort_multipart_upload(Bucket=self.name, Key=key, UploadId=upload_id)
            return False
        except BaseException:
            with contextlib.suppress(Exception):
                await client.abort_multipart_upload(Bucket=self.name, Key=key, UploadId=upload_id)
            raise

    async def delete_blob(self, etag: str) -> bool:
        """Delete the blob object; whether it was there."""
        existed = False
        client = await self.client()
        key = self.blob_key(etag)
        try:
            await client.head_object(Bucket=self.name, Key=key)
            existed = True
        except ClientError as exc:
            if http_status(exc) != 404:
                raise
        await client.delete_object(Bucket=self.name, Key=key)
        return existed

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob in the bucket (last access is the commit time: S3 keeps no read times)."""
        client = await self.client()
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.name, Prefix=self.keys.blobs_prefix):
            for item in page.get("Contents", []):
                etag = self.keys.etag_of_blob_key(item["Key"])
                if etag is not None:
                    yield BlobInfo(etag, int(item["Size"]), item["LastModified"].timestamp())


def _read_range(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)

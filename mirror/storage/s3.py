"""S3-compatible blob store (AWS S3, MinIO, Ceph RGW, SeaweedFS) with a bounded local-disk hot tier in front.

Several mirror nodes point at one bucket; the bucket is the single truth of what exists::

    s3://<bucket>/<prefix>blobs/<etag[:2]>/<etag>   committed blobs (immutable, named by the Hub etag)
    s3://<bucket>/<prefix>leases/<etag>             fill leases: JSON {owner, ttl, host, pid, refreshed, peer}

    <cache_dir>/blobs/<etag[:2]>/<etag>             hot tier: local copies of bucket blobs, LRU by mtime, bounded
    <cache_dir>/partials/<etag>.part                fills in progress on this node (always local)
    <cache_dir>/hot-tmp/                            hot-tier downloads in progress

Why the pieces are what they are:

- *Leases are objects written with conditional puts.* ``If-None-Match: *`` creates a lease only when none exists;
  ``If-Match: <etag>`` replaces exactly the version that was read (a refresh by the owner, or a takeover of an
  expired lease). The store arbitrates, so exactly one node wins without any coordinator of our own.
- *Lease expiry is measured on the store's clock*: a lease is expired when the server's ``Date`` is more than
  ``ttl`` past the object's ``Last-Modified``. Node clocks may disagree; only the server's is compared with itself.
- *The holder refreshes its lease in the background* (every ``ttl/3``) for as long as it holds it, so a long fill
  keeps its lease and a dead node's (``kill -9``, lost host) lapses after ``ttl``.
- *Acquiring re-checks the blob*: between a caller's ``stat`` and its lease, another node may have committed and
  released. A lease won for a blob that already exists is given back at once and ``False`` is returned, so the
  caller follows (and finds the blob) instead of downloading it from upstream a second time.
- *Committing is an upload with* ``If-None-Match: *``: a blob is written once; a second writer of the same etag
  (same bytes by construction) is told it exists, which is success.
- *The hot tier* holds whole committed blobs only, so a local file there is always servable (sendfile, nginx
  ``X-Accel-Redirect`` from ``<cache_dir>/blobs/``, the same layout as the local backend). Bytes fetched from the
  bucket are hashed against the etag before they enter the hot tier.

The client is aiobotocore (botocore's request signing, retries, credential chain, on aiohttp): every S3 call is a
coroutine on the mirror's event loop, no thread pool is needed for network I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import aiohttp
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from mirror.errors import IntegrityError, MirrorError
from mirror.integrity import BlobHasher
from mirror.storage.base import BlobInfo, CopyProgress, Lease, PeerAddress

log = logging.getLogger("hf_mirror.storage.s3")

_TOUCH_EVERY = 60.0  # seconds: a hot blob's mtime (its LRU age) is refreshed at most this often
_SINGLE_PUT_MAX = 64 * 1024 * 1024  # larger blobs go up as multipart uploads
_PART_SIZE = 64 * 1024 * 1024
_MAX_PARTS = 10_000  # S3's limit: the part size grows for blobs over 640 GB
_UPLOAD_CONCURRENCY = 4
_READ_CHUNK = 4 * 1024 * 1024
_HOT_TMP_MAX_AGE = 3600.0  # leftover hot-tier downloads of a killed process are removed at startup after this


_P = ParamSpec("_P")
_T = TypeVar("_T")


class StorageUnavailable(MirrorError):
    """The bucket could not be reached or refused a request. Hot-tier hits are still served without it."""

    status = 503
    code = "StorageUnavailable"


def _storage_errors(func: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """Turn client-library failures into a MirrorError, so clients get a clear 503 instead of a bare 500."""

    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await func(*args, **kwargs)
        except ClientError as exc:
            raise StorageUnavailable(f"object store refused {func.__name__}: {_code(exc)}") from exc
        except (BotoCoreError, aiohttp.ClientError) as exc:  # not OSError: a full local disk is no store outage
            raise StorageUnavailable(f"object store unreachable during {func.__name__}: {exc}") from exc

    return wrapper


class S3BlobStore:
    def __init__(self, cache_dir: Path, *, bucket: str, prefix: str = "", endpoint: str | None = None,
                 region: str = "us-east-1", hot_tier_max_size: int | None = None, max_attempts: int = 3) -> None:
        self.root = Path(cache_dir)
        self.bucket = bucket
        self.prefix = (prefix.strip("/") + "/") if prefix.strip("/") else ""
        self.endpoint = endpoint
        self.region = region
        self.hot_tier_max_size = hot_tier_max_size or None
        # Few attempts: a request waits on the store, so an outage should surface as a 503 in seconds, not minutes.
        self.max_attempts = max_attempts
        self.blobs_dir = self.root / "blobs"
        self.partials_dir = self.root / "partials"  # CacheManager.sweep_partials looks here
        self.tmp_dir = self.root / "hot-tmp"
        for folder in (self.blobs_dir, self.partials_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        self._hot_fetches: dict[str, asyncio.Task[Path | None]] = {}
        self._busy: set[str] = set()  # etags entering the hot tier right now: never evicted
        self._hot_bytes: int | None = None  # this process's estimate; rescanned before evicting
        # Leases this process holds: etag -> (owner, ttl, S3 ETag of our lease object, refresher task).
        self._held: dict[str, _HeldLease] = {}

    # --- client -----------------------------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and check the bucket, so a wrong endpoint, bucket or credential fails at startup, not mid-request."""
        client = await self._s3()
        try:
            await client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            raise RuntimeError(f"S3 bucket {self.bucket!r} at {self.endpoint or 'AWS'} is not usable: "
                               f"{_code(exc)}") from exc
        self._sweep_tmp()

    async def _s3(self) -> Any:
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
        for etag in list(self._held):
            held = self._held.get(etag)
            if held is not None:
                try:
                    await self.release_lease(etag, held.owner)
                except MirrorError as exc:  # the lease then lapses after its ttl
                    log.warning("could not release the fill lease of %s: %s", etag, exc)
        if self._stack is not None:
            await self._stack.aclose()
        self._stack = self._client = None

    def _blob_key(self, etag: str) -> str:
        return f"{self.prefix}blobs/{etag[:2]}/{etag}"

    def _lease_key(self, etag: str) -> str:
        return f"{self.prefix}leases/{etag}"

    # --- blobs ------------------------------------------------------------------------------------------------------

    def blob_path(self, etag: str) -> Path:
        """The hot-tier path of a blob (it may not be there: see :meth:`local_path`)."""
        return self.blobs_dir / etag[:2] / etag

    def relative_blob_path(self, etag: str) -> str:
        return f"{etag[:2]}/{etag}"

    def _hot_info(self, etag: str) -> BlobInfo | None:
        try:
            st = os.stat(self.blob_path(etag))
        except FileNotFoundError:
            return None
        return BlobInfo(etag, st.st_size, st.st_mtime)

    @_storage_errors
    async def stat(self, etag: str) -> BlobInfo | None:
        # Only committed blobs ever enter the hot tier, so a hot copy answers without a round trip.
        info = self._hot_info(etag)
        if info is not None:
            return info
        client = await self._s3()
        try:
            head = await client.head_object(Bucket=self.bucket, Key=self._blob_key(etag))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        return BlobInfo(etag, int(head["ContentLength"]), head["LastModified"].timestamp())

    def cached_path(self, etag: str) -> Path | None:
        info = self._hot_info(etag)
        if info is None:
            return None
        path = self.blob_path(etag)
        self._touch_hot(path, info.last_access)
        return path

    @_storage_errors
    async def local_path(self, etag: str, progress: CopyProgress | None = None) -> Path | None:
        path = self.cached_path(etag)
        if path is not None:
            return path
        # One download per blob in this process; shielded, so a client that hangs up does not cancel it for others.
        task = self._hot_fetches.get(etag)
        if task is None:
            task = asyncio.create_task(self._fetch_to_hot(etag, progress), name=f"hot:{etag[:12]}")
            self._hot_fetches[etag] = task
            task.add_done_callback(lambda _t: self._hot_fetches.pop(etag, None))
        return await asyncio.shield(task)

    async def _fetch_to_hot(self, etag: str, progress: CopyProgress | None) -> Path | None:
        """Copy a bucket blob into the hot tier, hashed against its etag on the way."""
        if self.blob_path(etag).exists():  # another worker process on this host fetched it meanwhile
            return self.blob_path(etag)
        client = await self._s3()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=self._blob_key(etag))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        size = int(response["ContentLength"])
        hasher = BlobHasher(etag, size)
        tmp = self.tmp_dir / f"{etag}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._busy.add(etag)
        try:
            received = 0
            with open(tmp, "wb", buffering=0) as f:  # unbuffered: what progress reports is in the file
                body = response["Body"]
                try:
                    while chunk := await body.read(_READ_CHUNK):
                        await asyncio.to_thread(_write_fully, f, chunk)
                        hasher.update(chunk)
                        received += len(chunk)
                        if progress is not None:
                            progress(tmp, received)
                finally:
                    body.close()
            if received != size or not hasher.matches():
                raise IntegrityError(f"bucket object for blob {etag} does not match its etag "
                                     f"({received} of {size} bytes read)")
            return await self._enter_hot(etag, tmp, size)
        finally:
            self._busy.discard(etag)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def partial_path(self, etag: str) -> Path:
        return self.partials_dir / f"{etag}.part"

    @_storage_errors
    async def commit(self, etag: str, partial: Path) -> Path:
        size = os.stat(partial).st_size
        self._busy.add(etag)
        try:
            if size <= _SINGLE_PUT_MAX:
                await self._put_small(etag, partial)
            else:
                await self._put_multipart(etag, partial, size)
            return await self._enter_hot(etag, partial, size)
        finally:
            self._busy.discard(etag)

    async def adopt(self, etag: str, copy: Path) -> Path | None:
        info = await self.stat(etag)
        if info is None:
            return None
        if self.blob_path(etag).exists() or os.stat(copy).st_size != info.size:
            copy.unlink(missing_ok=True)
            return await self.local_path(etag)
        self._busy.add(etag)
        try:
            return await self._enter_hot(etag, copy, info.size)
        finally:
            self._busy.discard(etag)

    async def _put_small(self, etag: str, partial: Path) -> None:
        data = await asyncio.to_thread(partial.read_bytes)
        client = await self._s3()
        try:
            await client.put_object(Bucket=self.bucket, Key=self._blob_key(etag), Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if _status(exc) not in (409, 412):  # 412: already there (same etag, same bytes): that is success
                raise

    async def _put_multipart(self, etag: str, partial: Path, size: int) -> None:
        client = await self._s3()
        key = self._blob_key(etag)
        part_size = max(_PART_SIZE, -(-size // _MAX_PARTS))
        upload = await client.create_multipart_upload(Bucket=self.bucket, Key=key)
        upload_id = upload["UploadId"]
        semaphore = asyncio.Semaphore(_UPLOAD_CONCURRENCY)  # bounds memory to concurrency x part size

        async def put_part(number: int) -> dict[str, Any]:
            async with semaphore:
                offset = (number - 1) * part_size
                data = await asyncio.to_thread(_read_range, partial, offset, min(part_size, size - offset))
                part = await client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                PartNumber=number, Body=data)
                return {"PartNumber": number, "ETag": part["ETag"]}

        try:
            parts = await asyncio.gather(*(put_part(n) for n in range(1, -(-size // part_size) + 1)))
            await client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                   MultipartUpload={"Parts": list(parts)})
        except BaseException:
            with contextlib.suppress(Exception):
                await client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    @_storage_errors
    async def delete(self, etag: str) -> bool:
        """Remove the blob from the bucket (every node) and from this node's hot tier."""
        existed = False
        with contextlib.suppress(FileNotFoundError):
            self.blob_path(etag).unlink()
            existed = True
            self._hot_bytes = None
        client = await self._s3()
        key = self._blob_key(etag)
        try:
            await client.head_object(Bucket=self.bucket, Key=key)
            existed = True
        except ClientError as exc:
            if _status(exc) != 404:
                raise
        await client.delete_object(Bucket=self.bucket, Key=key)
        return existed

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob in the bucket (last access is the commit time: S3 keeps no read times)."""
        client = await self._s3()
        paginator = client.get_paginator("list_objects_v2")
        base = f"{self.prefix}blobs/"
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=base):
            for item in page.get("Contents", []):
                name = item["Key"][len(base):].rsplit("/", 1)[-1]
                if name and not name.startswith("."):
                    yield BlobInfo(name, int(item["Size"]), item["LastModified"].timestamp())

    async def touch(self, etag: str) -> None:
        info = self._hot_info(etag)
        if info is not None:
            self._touch_hot(self.blob_path(etag), info.last_access)

    # --- hot tier ---------------------------------------------------------------------------------------------------

    def _touch_hot(self, path: Path, mtime: float) -> None:
        now = time.time()
        if now - mtime > _TOUCH_EVERY:
            with contextlib.suppress(OSError):
                os.utime(path, (now, now))

    async def _enter_hot(self, etag: str, source: Path, size: int) -> Path:
        """Move a whole, verified file of the blob into the hot tier (the caller marks ``etag`` busy)."""
        target = self.blob_path(etag)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)  # readers hold descriptors on the source: a rename keeps them valid
        if self._hot_bytes is not None:
            self._hot_bytes += size
        await self._evict(keep=etag)
        return target

    def hot_tier_usage(self) -> tuple[int, int]:
        """(bytes, blobs) in this node's hot tier."""
        entries = self._scan_hot()
        return sum(size for _, size, _ in entries), len(entries)

    def _scan_hot(self) -> list[tuple[Path, int, float]]:
        out: list[tuple[Path, int, float]] = []
        for shard in os.scandir(self.blobs_dir):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(shard.path):
                if entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
                        out.append((Path(entry.path), st.st_size, st.st_mtime))
        return out

    async def _evict(self, keep: str) -> None:
        """Bring the hot tier under its bound, least recently used first. The bucket keeps every blob; a blob being
        served stays readable (open descriptors survive an unlink), and the newest arrival is never evicted, even
        when it alone is over the bound."""
        limit = self.hot_tier_max_size
        if not limit or (self._hot_bytes is not None and self._hot_bytes <= limit):
            return
        # Several workers share the hot tier: the estimate is only a trigger, the scan is the truth.
        entries = await asyncio.to_thread(self._scan_hot)
        total = sum(size for _, size, _ in entries)
        for path, size, _ in sorted(entries, key=lambda e: e[2]):
            if total <= limit:
                break
            if path.name == keep or path.name in self._busy:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                total -= size
                log.debug("hot tier: evicted %s (%d bytes)", path.name, size)
        self._hot_bytes = total

    def _sweep_tmp(self) -> None:
        now = time.time()
        for entry in os.scandir(self.tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime > _HOT_TMP_MAX_AGE:
                    os.unlink(entry.path)

    # --- leases -----------------------------------------------------------------------------------------------------

    @_storage_errors
    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> bool:
        held = self._held.get(etag)
        if held is not None and held.owner == owner:
            return True
        if held is not None:
            return False  # another owner of this very process holds it
        client = await self._s3()
        key = self._lease_key(etag)
        for _ in range(3):  # a lease deleted between our failed create and our read: try again
            try:
                put = await client.put_object(Bucket=self.bucket, Key=key, Body=_lease_body(owner, ttl, peer),
                                              IfNoneMatch="*", ContentType="application/json")
            except ClientError as exc:
                if _status(exc) not in (409, 412):
                    raise
            else:
                return await self._won(etag, owner, ttl, put["ETag"], peer)
            current = await self._read_lease_object(etag)
            if current is None:
                continue
            record, lease_etag, remaining = current
            if record.get("owner") == owner:  # ours from before (e.g. an earlier call of this owner): keep it
                replaced = await self._conditional_replace(etag, owner, ttl, lease_etag, peer)
                return replaced is not None and await self._won(etag, owner, ttl, replaced, peer)
            if remaining > 0:
                return False
            # Expired: take it over. If-Match on the version we read makes exactly one contender win.
            replaced = await self._conditional_replace(etag, owner, ttl, lease_etag, peer)
            if replaced is None:
                return False
            log.info("took over the expired fill lease of %s from %s", etag, record.get("owner", "?"))
            return await self._won(etag, owner, ttl, replaced, peer)
        return False

    async def _won(self, etag: str, owner: str, ttl: float, lease_etag: str, peer: PeerAddress | None) -> bool:
        held = _HeldLease(owner, ttl, lease_etag, peer)
        self._held[etag] = held
        client = await self._s3()
        try:
            await client.head_object(Bucket=self.bucket, Key=self._blob_key(etag))
        except ClientError as exc:
            if _status(exc) != 404:
                await self.release_lease(etag, owner)
                raise
        else:
            # Committed by another node between the caller's stat and our lease: no fill is needed.
            await self.release_lease(etag, owner)
            return False
        held.task = asyncio.create_task(self._keep_alive(etag, held), name=f"lease:{etag[:12]}")
        return True

    async def _conditional_replace(self, etag: str, owner: str, ttl: float, lease_etag: str,
                                   peer: PeerAddress | None) -> str | None:
        """Write our lease over exactly version ``lease_etag``; the new version's ETag, or None if it changed."""
        client = await self._s3()
        try:
            put = await client.put_object(Bucket=self.bucket, Key=self._lease_key(etag),
                                          Body=_lease_body(owner, ttl, peer), IfMatch=lease_etag,
                                          ContentType="application/json")
        except ClientError as exc:
            if _status(exc) in (404, 409, 412):
                return None
            raise
        return str(put["ETag"])

    async def _keep_alive(self, etag: str, held: _HeldLease) -> None:
        interval = max(held.ttl / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self._refresh(etag, held):
                    log.warning("lost the fill lease of %s (another node took it over)", etag)
                    if self._held.get(etag) is held:
                        del self._held[etag]
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store hiccup: try again next tick, the ttl has slack
                log.warning("could not refresh the fill lease of %s: %s", etag, exc)

    async def _refresh(self, etag: str, held: _HeldLease) -> bool:
        replaced = await self._conditional_replace(etag, held.owner, held.ttl, held.lease_etag, held.peer)
        if replaced is None:
            return False
        held.lease_etag = replaced
        return True

    @_storage_errors
    async def refresh_lease(self, etag: str, owner: str, ttl: float) -> bool:
        held = self._held.get(etag)
        if held is None or held.owner != owner:
            return False
        held.ttl = ttl
        if await self._refresh(etag, held):
            return True
        self._held.pop(etag, None)
        if held.task is not None:
            held.task.cancel()
        return False

    @_storage_errors
    async def release_lease(self, etag: str, owner: str) -> None:
        held = self._held.get(etag)
        if held is None or held.owner != owner:
            return
        del self._held[etag]
        if held.task is not None and held.task is not asyncio.current_task():
            held.task.cancel()
        client = await self._s3()
        key = self._lease_key(etag)
        try:
            # Delete only our version: if another node took the lease over meanwhile, it keeps it.
            await client.delete_object(Bucket=self.bucket, Key=key, IfMatch=held.lease_etag)
        except ClientError as exc:
            status = _status(exc)
            if status in (404, 412):
                return
            if status not in (400, 501):
                raise
            # The store does not do conditional deletes: check the owner, then delete (a narrow race, and a lease
            # lost this way only costs a duplicate upstream download, never wrong bytes).
            current = await self._read_lease_object(etag)
            if current is not None and current[0].get("owner") == owner:
                await client.delete_object(Bucket=self.bucket, Key=key)

    @_storage_errors
    async def read_lease(self, etag: str) -> Lease | None:
        """The live lease of ``etag``, or None when there is none or it has expired (it is free to take)."""
        current = await self._read_lease_object(etag)
        if current is None:
            return None
        record, _, remaining = current
        if remaining <= 0:
            return None
        peer = record.get("peer")
        address = (PeerAddress(str(peer.get("url", "")), str(peer.get("token", "")))
                   if isinstance(peer, dict) and peer.get("url") else None)
        return Lease(etag, str(record.get("owner", "?")), time.time() + remaining, address)

    async def _read_lease_object(self, etag: str) -> tuple[dict[str, Any], str, float] | None:
        """(record, object ETag, seconds left on the store's clock), or None when there is no lease object."""
        client = await self._s3()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=self._lease_key(etag))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        body = response["Body"]
        try:
            raw = await body.read()
        finally:
            body.close()
        try:
            record = json.loads(raw or b"{}")
        except ValueError:
            record = {}
        ttl = float(record.get("ttl", 0) or 0)
        server_now = _server_date(response) or time.time()
        remaining = response["LastModified"].timestamp() + ttl - server_now
        return record, str(response["ETag"]), remaining


class _HeldLease:
    def __init__(self, owner: str, ttl: float, lease_etag: str, peer: PeerAddress | None) -> None:
        self.owner = owner
        self.ttl = ttl
        self.lease_etag = lease_etag
        self.peer = peer
        self.task: asyncio.Task[None] | None = None


def _lease_body(owner: str, ttl: float, peer: PeerAddress | None) -> bytes:
    now = time.time()
    # "refreshed" makes every write distinct, so each version has its own ETag for If-Match.
    record: dict[str, Any] = {"owner": owner, "ttl": ttl, "host": socket.gethostname(), "pid": os.getpid(),
                              "refreshed": now, "nonce": uuid.uuid4().hex[:8]}
    if peer is not None:
        # Whoever can read the bucket's leases can read its blobs too: the token opens nothing more than that.
        record["peer"] = {"url": peer.url, "token": peer.token}
    return json.dumps(record).encode()


def _server_date(response: dict[str, Any]) -> float | None:
    raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not raw:
        return None
    try:
        return email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError):
        return None


def _status(exc: ClientError) -> int:
    meta = exc.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    if not status and _code(exc) in ("404", "NoSuchKey", "NotFound"):
        return 404
    return status


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "?"))


def _write_fully(f: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[f.write(view):]


def _read_range(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)

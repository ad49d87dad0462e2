"""What the upstream client returns: the mirror's own values, never a transport's response objects.

A caller (the service, the fill engine) reads these and nothing else of the upstream; only :mod:`mirror.upstream`
imports an HTTP client library.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from mirror.upstream.bulk import BulkBody
from mirror.upstream.rate import RateLimit


@dataclass(frozen=True)
class UpstreamFileMeta:
    commit: str
    etag: str
    size: int
    cdn_url: str | None  # absolute URL of a cross-origin redirect (the CDN), never shown to clients
    xet_hash: str | None = None  # upstream's X-Xet-Hash of the file (mirror.xet names the file by it, never by another)


@dataclass(frozen=True)
class UpstreamAnswer:
    """A whole, size-bounded upstream answer (API JSON, errors): the mirror's own value, not a transport object."""

    status_code: int
    headers: Mapping[str, str]  # case-insensitive
    content: bytes
    reason_phrase: str = ""

    def json(self) -> object:
        return json.loads(self.content)

    async def aclose(self) -> None:
        """Nothing to release: the body is read (retries close every answer alike)."""


@dataclass(frozen=True)
class RelayBody:
    """An upstream answer relayed as it arrives, never held whole: status, headers and the body's chunks."""

    status_code: int
    headers: Mapping[str, str]  # case-insensitive
    chunks: AsyncIterator[bytes]


@dataclass(frozen=True)
class FileBody:
    """The bytes of a file opened for a fill: a body that a worker thread reads, and the signed CDN URL they came
    from (``None`` when the upstream served them itself), which a resume may ask again directly."""

    body: BulkBody
    cdn_url: str | None
    rate: RateLimit | None = None  # the process's upstream bandwidth bucket: the reader takes from it per read

"""What the run asks of a way to reach the cache (:mod:`mirror.sync.cache_dir_backend`,
:mod:`mirror.sync.mirror_backend`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from mirror import hf
from mirror.access import AccessPolicy
from mirror.config import Settings
from mirror.fill import FillManager
from mirror.index import MetadataIndex
from mirror.metrics import Metrics
from mirror.service import MirrorService
from mirror.storage.base import BlobStore
from mirror.sync.jobs import RemoteFile, RevisionJob
from mirror.sync.manifest import Manifest
from mirror.upstream import UpstreamClient


class CacheParts(Protocol):
    """What the cache backend works with: the parts the one wiring built (:func:`mirror.parts.build_parts`),
    handed down by the CLI (a sync run) or by the server (a warm job)."""

    settings: Settings
    metrics: Metrics
    store: BlobStore
    index: MetadataIndex
    upstream: UpstreamClient
    fills: FillManager
    access: AccessPolicy
    service: MirrorService

    async def aclose(self, grace: float | None = None) -> None: ...


class Backend(Protocol):
    pins_supported: bool
    default_token: str | None

    async def list_repos(self, repo_type: hf.RepoType, query: list[tuple[str, str]], token: str | None
                         ) -> list[dict[str, Any]]:
        """Every row of upstream's list API (``/api/{type}s?...``), following its ``Link`` pages."""
        ...
    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]: ...
    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]: ...
    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None: ...
    async def cached(self, job: RevisionJob, item: RemoteFile) -> bool: ...
    def partial_bytes(self, item: RemoteFile) -> int: ...
    async def fetch(self, job: RevisionJob, item: RemoteFile, progress: Callable[[int], None]) -> int | None:
        """Bytes taken from upstream for this file; ``None`` when it turned out to be cached already."""
        ...
    def pin(self, manifest: Manifest) -> None: ...
    async def aclose(self) -> None: ...

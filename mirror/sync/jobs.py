"""The plan of a sync: one job per (repo, revision), the files it selects, and what happened to them."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from mirror.errors import HubError, MirrorError
from mirror.hubjson import TreeFile
from mirror.sync.manifest import RepoSpec

# A file of the revision's tree, as mirror.hubjson reads it (path, etag, size, LFS, Xet hash).
RemoteFile = TreeFile


@dataclass
class RevisionJob:
    spec: RepoSpec
    revision: str
    token: str | None = None
    commit: str | None = None
    files: list[RemoteFile] = field(default_factory=list)  # selected by the patterns
    missing: list[RemoteFile] = field(default_factory=list)  # selected and not cached
    fetched: int = 0
    fetched_bytes: int = 0
    failed_files: int = 0
    error: str | None = None
    note: str | None = None
    stale: bool = False  # upstream could not confirm the revision: the cached commit was kept (a failed job)
    repo_missing: bool = False  # upstream answered that the repo does not exist (or is not visible): never pinned

    @property
    def label(self) -> str:
        return f"{self.spec.label}@{self.revision}"


def error_text(exc: BaseException) -> str:
    if isinstance(exc, HubError):
        return f"{exc.status} {exc.code or ''}: {exc.message}".replace("  ", " ")
    if isinstance(exc, MirrorError):
        return exc.message
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"

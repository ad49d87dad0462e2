"""The plan of a sync: one job per (repo, revision), the files it selects, and what happened to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from mirror.errors import HubError, MirrorError
from mirror.index import blob_key
from mirror.sync.manifest import RepoSpec


@dataclass(frozen=True)
class RemoteFile:
    path: str
    etag: str
    size: int
    lfs: bool


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


def tree_files(entries: list[dict[str, Any]]) -> list[RemoteFile]:
    """Tree entries -> files: the etag is ``lfs.oid`` (sha256) for LFS files, ``oid`` (git blob sha1) otherwise."""
    files = []
    for entry in entries:
        if entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
        oid = (lfs or {}).get("oid") or entry.get("oid")
        if not isinstance(oid, str) or not oid or not isinstance(entry.get("path"), str):
            continue
        files.append(RemoteFile(entry["path"], blob_key(oid), int(entry.get("size") or 0), lfs is not None))
    return files


def error_text(exc: BaseException) -> str:
    if isinstance(exc, HubError):
        return f"{exc.status} {exc.code or ''}: {exc.message}".replace("  ", " ")
    if isinstance(exc, MirrorError):
        return exc.message
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"

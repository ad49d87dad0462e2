"""The API JSON a ``cache import`` synthesises for the repos it imports (``/revision/{rev}`` info and the tree
listings), under the server's own cache keys. Listings from an incomplete snapshot are stored as *stale*: an online
mirror asks upstream again, an offline one (or one whose upstream is down) answers from them."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from mirror import hf
from mirror.hubjson import LS_QUERY, TREE_QUERY, lfs_etag, listing_pages
from mirror.index import ApiEntry, MetadataIndex, api_query_key, api_route_key

_JSON_HEADERS = (("content-type", "application/json"),)


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_entry(path: str, etag: str, size: int, blob_id: str | None = None) -> dict[str, Any]:
    """A Hub tree entry for a file. For LFS files the ``oid`` is the git blob sha1 of the pointer file."""
    if lfs_etag(etag):
        pointer = lfs_pointer(etag, size)
        return {"type": "file", "oid": blob_id or git_blob_sha1(pointer), "size": size, "path": path,
                "lfs": {"oid": etag, "size": size, "pointerSize": len(pointer)}}
    return {"type": "file", "oid": blob_id or etag, "size": size, "path": path}


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def synthesize_api(index: MetadataIndex, repo: hf.RepoRef, commit: str, files: dict[str, tuple[str, int]],
                   revisions: list[str], *, complete: bool, modified: float) -> int:
    """Write info and tree JSON for ``repo`` at ``commit`` (path -> (etag, size)); returns entries written.

    ``complete``: the file list is the commit's whole tree, so the JSON is stored as immutable; otherwise it is
    stored as already stale, so an online mirror replaces it with upstream's answer. Existing entries are kept.
    """
    written = 0
    fetched_at = time.time() if complete else 0.0

    def put(revision: str | None, route: str, query: list[tuple[str, str]], data: Any, immutable: bool) -> None:
        nonlocal written
        key_query = api_query_key(list(query), None)
        if index.get_api(repo, revision, route, key_query) is not None:
            return
        body = json.dumps(data, separators=(",", ":")).encode()
        index.put_api(repo, revision, route, key_query,
                      ApiEntry(200, _JSON_HEADERS, body, fetched_at if immutable else 0.0, immutable=immutable))
        written += 1

    entries = [tree_entry(path, etag, size) for path, (etag, size) in sorted(files.items())]
    pages = listing_pages(entries)
    directories = [e for children in pages.values() for e in children if e["type"] == "directory"]
    recursive = sorted(directories, key=lambda e: e["path"]) + entries
    info = {
        "_id": hashlib.sha1(repo.key.encode()).hexdigest()[:24], "id": repo.repo_id, "sha": commit,
        "private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [],
        "lastModified": _iso(modified), "createdAt": _iso(modified),
        "siblings": [{"rfilename": path} for path in sorted(files)],
    }
    # By commit (immutable when the listing is complete), and by every branch/tag that pointed at it (always
    # stale: a branch moves, so an online mirror asks upstream again).
    for revision, immutable in [(commit, complete), *((rev, False) for rev in revisions)]:
        put(revision, api_route_key("tree", ""), TREE_QUERY, recursive, immutable)
        for directory, children in pages.items():
            put(revision, api_route_key("tree", directory), LS_QUERY, children, immutable)
        put(revision, api_route_key("revision", ""), [], info, immutable)
    if "main" in revisions:
        put(None, api_route_key("info", ""), [], info, False)
    return written

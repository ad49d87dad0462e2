"""A commit's recursive tree listing, as the index caches it, read back as the file entries it names
(``snapshot_download`` lists the tree, then sends a HEAD per file: those HEADs need no upstream call of their own)."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

from mirror import hf
from mirror.index import FileEntry, MetadataIndex, api_query_key, api_route_key, blob_key


def entry_from_listing(index: MetadataIndex, repo: hf.RepoRef, commit: str, path: str) -> FileEntry | None:
    """A file's entry from the recursive tree listing of its commit, when the index holds it (``snapshot_download``
    lists the tree, then sends a HEAD per file: those HEADs need no upstream call of their own). The listing
    gives size, oid and LFS sha256; the commit is known. Served through the same access check as any cached
    entry (:meth:`mirror.service.files.FileService._check_content_access`): a gated or private repo's listing helps
    only a confirmed caller."""
    query: list[tuple[str, str]] | None = [("recursive", "true"), ("expand", "false")]
    found = None
    pages = 0
    while query is not None and pages < 1000:
        cached = index.get_api(repo, commit, api_route_key("tree", ""), api_query_key(query, None))
        if cached is None or cached.status != 200:
            return found
        try:
            listing = json.loads(cached.body)
        except ValueError:
            return found
        for item in listing if isinstance(listing, list) else ():
            entry = _listed_file(commit, item)
            if entry is not None:  # the whole page at once: the next HEADs find their entry directly
                index.put_file(repo, entry)
                found = entry if entry.path == path else found
        if found is not None:
            return found
        query = _next_page(cached.headers)
        pages += 1
    return found


def _listed_file(commit: str, item: object) -> FileEntry | None:
    """A tree listing's file entry as the index keeps it: the etag is the LFS sha256, else the git blob oid."""
    if not isinstance(item, dict) or item.get("type") != "file" or not isinstance(item.get("path"), str):
        return None
    lfs = item.get("lfs")
    etag = lfs.get("oid") or lfs.get("sha256") if isinstance(lfs, dict) else item.get("oid")
    size = item.get("size")
    if not isinstance(etag, str) or not isinstance(size, int):
        return None
    lfs_file = bool(hf.SHA256_RE.match(etag))
    if not lfs_file and not hf.SHA1_RE.match(etag):
        return None
    return FileEntry(commit, item["path"], blob_key(etag), size, lfs=lfs_file)


def _next_page(headers: tuple[tuple[str, str], ...]) -> list[tuple[str, str]] | None:
    """The query of a cached listing page's next page (its ``Link: <...>; rel="next"``), if any."""
    for name, value in headers:
        if name.lower() == "link" and 'rel="next"' in value:
            url = value.split("<", 1)[-1].split(">", 1)[0]
            return parse_qsl(urlsplit(url).query, keep_blank_values=True)
    return None

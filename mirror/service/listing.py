"""A commit's recursive tree listing, as the index caches it, read back as the file entries it names
(``snapshot_download`` lists the tree, then sends a HEAD per file: those HEADs need no upstream call of their own)."""

from __future__ import annotations

import json

from mirror import hf
from mirror.hubjson import TREE_QUERY, next_page_query, tree_files
from mirror.index import FileEntry, MetadataIndex, api_query_key, api_route_key


def entry_from_listing(index: MetadataIndex, repo: hf.RepoRef, commit: str, path: str) -> FileEntry | None:
    """A file's entry from the recursive tree listing of its commit, when the index holds it (``snapshot_download``
    lists the tree, then sends a HEAD per file: those HEADs need no upstream call of their own). The listing
    gives size, oid and LFS sha256; the commit is known. Served through the same access check as any cached
    entry (:meth:`mirror.service.files.FileService._check_content_access`): a gated or private repo's listing helps
    only a confirmed caller."""
    query: list[tuple[str, str]] | None = list(TREE_QUERY)
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
        for file in tree_files(listing) if isinstance(listing, list) else ():
            # the whole page at once: the next HEADs find their entry directly
            entry = FileEntry(commit, file.path, file.etag, file.size, lfs=file.lfs)
            index.put_file(repo, entry)
            found = entry if entry.path == path else found
        if found is not None:
            return found
        query = next_page_query(cached.headers)
        pages += 1
    return found

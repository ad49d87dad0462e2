"""The one reader of the Hub's JSON shapes (values; no I/O): tree and paths-info entries, the queries a tree
listing is asked with, the non-recursive pages derived from a recursive listing, and ``Link`` pagination.

Every part that reads a listing reads it here (the sync, the service's listing, ``cache import``, the Xet catalog),
so "tree entry -> path, etag, size, LFS, Xet hash" has one rule:

- only ``"type": "file"`` entries with a string ``path`` and an integer ``size`` are files;
- an entry with an ``lfs`` object is an LFS file: its etag is ``lfs.oid`` (``lfs.sha256`` in older answers), a
  sha256; any other file's etag is its ``oid``, the git blob sha1. An etag of any other shape is no file;
- ``xetHash``, when upstream sent it, is the file's Xet hash.

When only the etag is known (a blob of a local Hugging Face cache), a sha256 says LFS (:func:`lfs_etag`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from mirror import hf

# The queries clients list a tree with (huggingface_hub's list_repo_tree / snapshot_download): the whole tree, and one
# directory's children. The API cache keys them as sent; the sync and ``cache import`` write under the same keys.
TREE_QUERY = [("recursive", "true"), ("expand", "false")]
LS_QUERY = [("recursive", "false"), ("expand", "false")]


@dataclass(frozen=True)
class TreeFile:
    """A file of a tree or paths-info answer."""

    path: str
    etag: str  # the LFS sha256, else the git blob sha1
    size: int
    lfs: bool
    xet_hash: str | None = None


def lfs_etag(etag: str) -> bool:
    """Whether a file whose etag is all that is known is an LFS file: its etag is a sha256 (a git blob sha1 else)."""
    return bool(hf.SHA256_RE.match(etag))


def tree_file(item: object) -> TreeFile | None:
    """One entry of a tree or paths-info answer as a file; ``None`` for a directory or an entry of no known shape."""
    if not isinstance(item, dict) or item.get("type") != "file":
        return None
    path, size, lfs = item.get("path"), item.get("size"), item.get("lfs")
    if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool):
        return None
    if isinstance(lfs, dict):
        etag = lfs.get("oid") or lfs.get("sha256")
        if not isinstance(etag, str) or not hf.SHA256_RE.match(etag):
            return None
    else:
        etag = item.get("oid")
        if not isinstance(etag, str) or not hf.SHA1_RE.match(etag):
            return None
    xet_hash = item.get("xetHash")
    return TreeFile(path, etag, size, isinstance(lfs, dict), xet_hash if isinstance(xet_hash, str) else None)


def tree_files(entries: Iterable[object]) -> list[TreeFile]:
    """The files of a tree or paths-info answer (a JSON list), in its order."""
    return [file for file in map(tree_file, entries) if file is not None]


# --- pagination: the Hub pages listings with ``Link: <url>; rel="next"`` --------------------------------------------

def parse_links(value: str) -> list[dict[str, str]]:
    """A ``Link`` header's links, each ``{"url": ..., param: value}``: the rule of httpx's ``Response.links``, which
    huggingface_hub pages listings by (the mirror reads its own and upstream's links as the clients do)."""
    links: list[dict[str, str]] = []
    strip = " '\""
    value = value.strip(strip)
    if not value:
        return links
    for one in re.split(", *<", value):
        url, _, params = one.partition(";")
        link = {"url": url.strip("<> '\"")}
        for param in params.split(";") if params else ():
            key, sep, val = param.partition("=")
            if not sep or "=" in val:
                break
            link[key.strip(strip)] = val.strip(strip)
        links.append(link)
    return links


def next_link(value: str | None) -> str | None:
    """The URL of the ``rel="next"`` link of a ``Link`` header value, if any."""
    for link in parse_links(value or ""):
        if link.get("rel") == "next":
            return link["url"]
    return None


def next_page_query(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The query string of the next page of a listing (its headers' ``Link`` next URL), if any."""
    for name, value in headers:
        if name.lower() == "link":
            url = next_link(value)
            if url is not None:
                return parse_qsl(urlsplit(url).query, keep_blank_values=True)
    return None


# --- the non-recursive pages of a recursive listing (the sync and ``cache import`` write them) ----------------------

def _dirs_of(paths: Iterable[str]) -> set[str]:
    dirs: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def listing_pages(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Non-recursive listings (directory -> its direct children, directories first) from a recursive one."""
    known_dirs = {e["path"] for e in entries if e.get("type") == "directory" and isinstance(e.get("path"), str)}
    file_entries = [e for e in entries if e.get("type") == "file" and isinstance(e.get("path"), str)]
    all_dirs = known_dirs | _dirs_of(e["path"] for e in file_entries)
    by_path = {e["path"]: e for e in entries if isinstance(e.get("path"), str)}
    pages: dict[str, list[dict[str, Any]]] = {d: [] for d in all_dirs | {""}}
    for d in sorted(all_dirs):
        parent = d.rsplit("/", 1)[0] if "/" in d else ""
        pages[parent].append(by_path.get(d) or {"type": "directory", "oid": _fake_tree_oid(d), "size": 0, "path": d})
    for e in sorted(file_entries, key=lambda e: e["path"]):
        parent = e["path"].rsplit("/", 1)[0] if "/" in e["path"] else ""
        pages[parent].append(e)
    return pages


def _fake_tree_oid(path: str) -> str:
    return hashlib.sha1(f"tree {path}".encode()).hexdigest()

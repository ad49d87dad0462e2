"""Tree listings: the queries clients send, the pagination link, and the non-recursive pages derived from a
recursive listing (the sync writes them, ``cache import`` too)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

# Paths the clients probe (HEAD) whose absence must be answerable with upstream down (datasets, §8 of the protocol).
PROBED_PATHS = (".huggingface.yaml", "dataset_infos.json", "README.md")
TREE_QUERY = [("recursive", "true"), ("expand", "false")]
LS_QUERY = [("recursive", "false"), ("expand", "false")]
LINK_NEXT_RE = re.compile(r"<([^>]*)>\s*;[^,]*rel=\"?next\"?")


def next_query(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]] | None:
    for name, value in headers:
        if name.lower() == "link":
            match = LINK_NEXT_RE.search(value)
            if match:
                return parse_qsl(urlsplit(match.group(1)).query, keep_blank_values=True)
    return None


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

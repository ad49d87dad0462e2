"""Which files of a revision to fetch: huggingface_hub's ``allow_patterns`` / ``ignore_patterns`` semantics."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable


def _dir_wildcard(pattern: str) -> str:
    pattern = pattern.replace("\\", "/")
    return pattern + "*" if pattern.endswith("/") else pattern


def select(paths: Iterable[str], allow: Iterable[str] | None, ignore: Iterable[str] | None) -> list[str]:
    """fnmatchcase, ``*`` crossing ``/``, a trailing ``/`` meaning the whole directory: as snapshot_download."""
    allowed = [_dir_wildcard(p) for p in allow] if allow is not None else None
    ignored = [_dir_wildcard(p) for p in ignore] if ignore is not None else None
    out = []
    for path in paths:
        if allowed is not None and not any(fnmatch.fnmatchcase(path, p) for p in allowed):
            continue
        if ignored is not None and any(fnmatch.fnmatchcase(path, p) for p in ignored):
            continue
        out.append(path)
    return out

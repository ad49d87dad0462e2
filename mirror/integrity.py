"""The etag -> hash rule: a blob is what the Hub says it is (sha256 for LFS, git blob sha1 for regular files).

At the bottom of the house: the fill engine hashes a download with it, storage hashes a bucket blob it copies to
the hot tier, cache maintenance re-hashes blobs (verify, import).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from mirror import hf


class BlobHasher:
    """sha256 for LFS etags (64 hex), git blob sha1 for regular-file etags (40 hex), size only otherwise."""

    def __init__(self, etag: str, size: int) -> None:
        self.etag = etag
        if hf.SHA256_RE.match(etag):
            self._hash: hashlib._Hash | None = hashlib.sha256()
        elif hf.SHA1_RE.match(etag):
            self._hash = hashlib.sha1()
            self._hash.update(b"blob %d\0" % size)
        else:
            self._hash = None

    def update(self, data: bytes | memoryview) -> None:
        if self._hash is not None:
            self._hash.update(data)

    def matches(self) -> bool:
        return self._hash is None or self._hash.hexdigest() == self.etag


def hash_file(path: Path, etag: str, size: int, chunk: int = 4 * 1024 * 1024,
              pace: Callable[[int], None] | None = None) -> bool:
    """Re-hash a file against its etag (used by verify, import, resume and the scrub). ``pace(n)`` is called after
    each block read (the scrub sleeps there to keep its disk reads under a rate)."""
    hasher = BlobHasher(etag, size)
    total = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            hasher.update(block)
            total += len(block)
            if pace is not None:
                pace(len(block))
    return total == size and hasher.matches()

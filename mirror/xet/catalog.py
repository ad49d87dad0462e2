"""Which upstream Xet hash names which file: learned only from upstream's own answers, kept in the index.

The mirror names a file by a Xet hash only when upstream gave that hash for that file (a resolve ``X-Xet-Hash``, a
tree or paths-info ``xetHash``) and only for LFS files, whose blob the mirror verifies against the sha256 etag. Keys
(all under the repo, so ``MetadataIndex.delete_repo`` drops them with it):

    ("xet", type, repo, "p", commit, path) -> (xet_hash, etag)           a hint for resolve and tree answers
    ("xet", type, repo, "h", xet_hash)     -> XetFile                    the CAS's lookup: never across repos
    ("xet", type, repo, "probe")           -> (commit, path)             a file the token route probes access with

In a fleet (``metadata_url``) what one node learns is shared through the database (:class:`SharedMetadata`): a node
asks it for what its index does not hold (a hash a client's token names, the hints of a file or a listing another
node fetched from upstream) before it lists the commit upstream (:mod:`mirror.xet.finder`).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mirror.hf import SHA256_RE, RepoRef
from mirror.hubjson import tree_file, tree_files
from mirror.index import MetadataIndex
from mirror.metadata.base import XetRecord
from mirror.metadata.sharing import SharedMetadata

XET_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
_MEMO = 20_000


@dataclass(frozen=True)
class XetFile:
    commit: str
    path: str
    etag: str  # the blob (sha256 of the content) the mirror verifies and stores
    size: int


class XetCatalog:
    def __init__(self, index: MetadataIndex, shared: SharedMetadata | None = None) -> None:
        self.index = index
        self.shared = shared  # the fleet's database (metadata_url): asked behind the index, told what upstream said
        self._memo: OrderedDict[tuple[str, ...], Any] = OrderedDict()

    def record(self, repo: RepoRef, commit: str, path: str, xet_hash: str | None, etag: str, size: int) -> None:
        """Upstream said ``path`` at ``commit`` is Xet file ``xet_hash`` with LFS blob ``etag``."""
        learnt = self._keep(repo, commit, path, xet_hash, etag, size)
        if learnt is not None and self.shared is not None:
            self.shared.share_xet(repo, [learnt])

    def _keep(self, repo: RepoRef, commit: str, path: str, xet_hash: str | None, etag: str,
              size: int) -> XetRecord | None:
        """Into the index; the record when it is new here (None: malformed, or known already)."""
        xet_hash = (xet_hash or "").lower()
        if not XET_HASH_RE.match(xet_hash) or not SHA256_RE.match(etag) or size < 0:
            return None
        key = (repo.key, "p", commit, path)
        if self._get(repo, "p", commit, path) == (xet_hash, etag):
            return None
        self.index.put_xet(repo, ("p", commit, path), (xet_hash, etag))
        self.index.put_xet(repo, ("h", xet_hash), XetFile(commit, path, etag, size))
        self.index.put_xet(repo, ("probe",), (commit, path))
        self._memo.pop(key, None)
        return XetRecord(commit, path, xet_hash, etag, size)

    async def recall(self, repo: RepoRef, commit: str, paths: list[str]) -> None:
        """What the fleet learnt of those of ``paths`` this node has no hash for (another node fetched them)."""
        unknown = [path for path in paths if self._get(repo, "p", commit, path) is None]
        if self.shared is None or not unknown:
            return
        for found in await self.shared.xet_files(repo, commit, unknown):
            if found.commit == commit and found.path in unknown:
                self._keep(repo, commit, found.path, found.xet_hash, found.etag, found.size)

    async def recall_listing(self, repo: RepoRef, commit: str, data: object) -> None:
        """:meth:`recall` for the LFS files of a (Xet-stripped) tree / paths-info answer another node fetched."""
        if isinstance(data, list):
            await self.recall(repo, commit, [file.path for file in tree_files(data) if file.lfs])

    async def find(self, repo: RepoRef, xet_hash: str) -> XetFile | None:
        """:meth:`file`, or the fleet's record of the hash in ``repo`` (kept here too)."""
        found = self.file(repo, xet_hash)
        if found is not None or self.shared is None or not XET_HASH_RE.match(xet_hash):
            return found
        record = await self.shared.xet_file(repo, xet_hash)
        if record is None or record.xet_hash != xet_hash:
            return None
        self._keep(repo, record.commit, record.path, record.xet_hash, record.etag, record.size)
        return XetFile(record.commit, record.path, record.etag, record.size)

    def hint(self, repo: RepoRef, commit: str, path: str, etag: str) -> str | None:
        """The Xet hash to announce for ``path`` at ``commit``, if upstream gave one for this very blob."""
        found = self._get(repo, "p", commit, path)
        if found and found[1] == etag:
            return str(found[0])
        return None

    def file(self, repo: RepoRef, xet_hash: str) -> XetFile | None:
        """The file of ``repo`` that upstream named ``xet_hash``; ``None`` for any other repo's."""
        if not XET_HASH_RE.match(xet_hash):
            return None
        found = self.index.get_xet(repo, ("h", xet_hash))
        return found if isinstance(found, XetFile) else None

    def probe_path(self, repo: RepoRef) -> tuple[str, str] | None:
        found = self.index.get_xet(repo, ("probe",))
        return (str(found[0]), str(found[1])) if found else None

    def learn_listing(self, repo: RepoRef, commit: str, data: object) -> None:
        """Record the ``xetHash`` of every LFS file entry of a tree / paths-info answer at ``commit``."""
        if not isinstance(data, list):
            return
        learnt = [self._keep(repo, commit, file.path, file.xet_hash, file.etag, file.size)
                  for file in tree_files(data) if file.lfs and file.xet_hash is not None]
        if self.shared is not None:  # a page's records in one write
            self.shared.share_xet(repo, [record for record in learnt if record is not None])

    def annotate_listing(self, repo: RepoRef, commit: str, data: object) -> bool:
        """Put ``xetHash`` back on the LFS entries of a (Xet-stripped) listing whose blob upstream named; returns
        whether anything was added."""
        if not isinstance(data, list):
            return False
        added = False
        for item in data:
            file = tree_file(item)
            if file is None or not file.lfs:
                continue
            xet_hash = self.hint(repo, commit, file.path, file.etag)
            if xet_hash and isinstance(item, dict):
                item["xetHash"] = xet_hash
                added = True
        return added

    def _get(self, repo: RepoRef, *parts: str) -> Any:
        key = (repo.key, *parts)
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = self.index.get_xet(repo, parts)
        if value is not None:  # only present values are memoised: a later record must be seen at once
            self._memo[key] = value
            if len(self._memo) > _MEMO:
                self._memo.popitem(last=False)
        return value

"""A Xet hash this node has not seen yet: in the fleet's database, else found in upstream's listing of the token's
commit.

A client's HEAD (or tree listing) may have gone to another node of a fleet: the node whose CAS is asked then knows
nothing of the hash. It lists the commit (the recursive tree, every page, asked with the token's caller through the
API cache, which records each entry's ``xetHash`` in the catalog) and looks again. Only the token's own repo is
listed, so a token never reads another repo's file by hash. One listing per (repo, commit, caller) at a time; a
listing done is not redone for a while, so unknown hashes cost one cached lookup each.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.errors import MirrorError, UpstreamUnavailable
from mirror.hubjson import TREE_QUERY, next_page_query
from mirror.service import MirrorService
from mirror.xet.catalog import XET_HASH_RE, XetCatalog, XetFile

_MAX_PAGES = 100  # 100,000 files at the Hub's 1,000 a page
_LISTED_FOR = 300.0  # seconds a finished listing is not asked again for a missing hash
_LISTED_MAX = 10_000


class XetFinder:
    def __init__(self, service: MirrorService, catalog: XetCatalog) -> None:
        self.service = service
        self.catalog = catalog
        self._listing: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        self._listed: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    async def file(self, repo: hf.RepoRef, commit: str, xet_hash: str, caller: Caller) -> XetFile | None:
        """The file of ``repo`` named ``xet_hash``: known, or found in upstream's listing of ``commit``."""
        found = await self.catalog.find(repo, xet_hash)
        if found is not None or not hf.is_commit(commit) or not XET_HASH_RE.match(xet_hash):
            return found  # a malformed hash lists nothing
        key = (repo.key, commit, token_digest(caller.token))
        listed = self._listed.get(key)
        if listed is not None and time.monotonic() - listed < _LISTED_FOR:
            return None
        task = self._listing.get(key)
        if task is None:
            self._listing[key] = task = asyncio.ensure_future(self._list(repo, commit, caller))
            task.add_done_callback(lambda _: self._listing.pop(key, None))
        await asyncio.shield(task)
        self._listed[key] = time.monotonic()
        self._listed.move_to_end(key)
        if len(self._listed) > _LISTED_MAX:
            self._listed.popitem(last=False)
        return await self.catalog.find(repo, xet_hash)

    async def _list(self, repo: hf.RepoRef, commit: str, caller: Caller) -> None:
        """Every page of the commit's recursive tree through the API cache (which records the Xet hashes)."""
        target = hf.ApiTarget(repo, "tree", commit, "")
        raw_path = f"{repo.api_path()}/tree/{commit}"
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            query = TREE_QUERY + ([("cursor", cursor)] if cursor else [])
            try:
                answer = await self.service.api(target, "GET", raw_path, query, None, caller)
            except UpstreamUnavailable:
                raise
            except MirrorError:
                return  # refused or missing upstream (a revoked token, offline): nothing more is learned
            cursor = dict(next_page_query(answer.headers) or ()).get("cursor")
            if answer.status != 200 or not cursor:
                return

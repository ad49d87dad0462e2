"""``--cache-dir DIR`` (the default): the sync works on the cache with the server's own parts.

The parts come from the one wiring (:func:`mirror.parts.build_parts`, called by the CLI), and every blob is fetched by
:meth:`mirror.fill.FillManager.fetch`, the server's own fill path. Its cross-process lease means a running
server and a sync never download one blob twice, and a running server sees each blob the moment it is
committed. The metadata the server needs to answer with upstream down is written too, through
:class:`mirror.service.MirrorService` (so cache keys and JSON rewriting are the server's): the
``/revision/{rev}`` JSON and ref, the recursive tree listing (every page), a file entry per path,
non-recursive listings of every directory, and the "missing" answers for the probes ``datasets`` sends.
The manifest's repos are pinned."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

from mirror import hf
from mirror.access import Caller
from mirror.config import Settings
from mirror.errors import MirrorError
from mirror.fill import Fill, FillManager, FillSpec
from mirror.hubjson import LS_QUERY, TREE_QUERY, listing_pages, next_page_query, tree_files
from mirror.index import ApiEntry, FileEntry, api_query_key, api_route_key
from mirror.metrics import Outcome
from mirror.service.answers import ApiResult, ResolvedFile
from mirror.sync.backend import CacheParts
from mirror.sync.jobs import RemoteFile, RevisionJob
from mirror.sync.listings import PROBED_PATHS
from mirror.sync.manifest import Manifest
from mirror.upstream import hub_error

log = logging.getLogger("hf_mirror.sync")


class CountingFillManager(FillManager):
    """The server's fill engine, remembering how many bytes each of its own downloads took from upstream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.downloaded: dict[str, int] = {}

    async def _download(self, fill: Fill) -> None:
        try:
            existing = os.stat(fill.partial).st_size
        except FileNotFoundError:
            existing = 0
        await super()._download(fill)
        self.downloaded[fill.spec.etag] = fill.spec.size - min(existing, fill.spec.size)


class CacheDirBackend:
    """Works on the cache directory with the server's own parts."""

    pins_supported = True

    def __init__(self, settings: Settings, *, dry_run: bool, parts: CacheParts, owns_parts: bool = False) -> None:
        """``parts``: the server's own (the one wiring, store included), built by the CLI for a sync run (which
        then owns and closes them), or a running server's for a warm job (:mod:`mirror.sync.warm`)."""
        self.settings = settings
        self.dry_run = dry_run
        self.default_token = settings.upstream_token
        self._owns_parts = owns_parts
        self.parts = parts
        self.fills = self.parts.fills
        self.metrics = self.parts.metrics
        self.store = self.parts.store
        self.index = self.parts.index
        self.upstream = self.parts.upstream
        self.access = self.parts.access
        self.service = self.parts.service

    def _caller(self, job: RevisionJob) -> Caller:
        return Caller(job.token, own_token=job.spec.token_env is not None)

    async def _api(self, job: RevisionJob, sub: str, revision: str | None, path: str,
                   query: list[tuple[str, str]]) -> tuple[Any, tuple[tuple[str, str], ...], str]:
        """One API call the way a client's request reaches the server (cached under the server's keys)."""
        repo = job.spec.repo
        raw_path = repo.api_path()
        if sub:
            raw_path += f"/{sub}/{quote(revision or '', safe='')}"
            if path:
                raw_path += "/" + quote(path, safe="")
        if self.dry_run:  # nothing is written: ask upstream directly
            response = await self.upstream.api("GET", raw_path + (f"?{urlencode(query)}" if query else ""),
                                               job.token)
            if response.status_code >= 400:
                raise hub_error(response, resolve=False)
            result = ApiResult(response.status_code, tuple(response.headers.items()), response.content, "dry-run")
        else:
            target = hf.ApiTarget(repo, sub, revision, path)
            result = await self.service.api(target, "GET", raw_path, query, None, self._caller(job))
        return json.loads(result.body), result.headers, result.outcome

    async def list_repos(self, repo_type: hf.RepoType, query: list[tuple[str, str]], token: str | None
                         ) -> list[dict[str, Any]]:
        """Upstream's list API, every page (its ``Link`` next cursor), straight from upstream (listings are not
        cached: the server relays them too)."""
        rows: list[dict[str, Any]] = []
        page: list[tuple[str, str]] | None = list(query)
        seen: set[str] = set()
        while page is not None:
            path_qs = f"/api/{repo_type.value}s?{urlencode(page)}"
            if path_qs in seen:
                raise MirrorError("the list API's pagination loops (a next link repeats a page)")
            seen.add(path_qs)
            response = await self.upstream.api("GET", path_qs, token)
            if response.status_code >= 400:
                raise hub_error(response, resolve=False)
            data = json.loads(response.content)
            if not isinstance(data, list):
                raise MirrorError("the list API's answer is not a JSON list")
            rows.extend(r for r in data if isinstance(r, dict))
            page = next_page_query(response.headers.items())
        return rows

    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]:
        data, _, outcome = await self._api(job, "revision", job.revision, "", [])
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not hf.is_commit(sha):
            raise MirrorError(f"upstream's /revision/{job.revision} answer carries no commit sha")
        note = None
        if outcome == Outcome.STALE:
            note = "upstream unreachable: kept the cached commit"
            job.stale = True
        if not self.dry_run and not hf.is_commit(job.revision):
            if outcome == Outcome.STALE:
                pass  # keep the ref's confirmation time: it was not confirmed now
            else:
                self.index.put_ref(job.spec.repo, job.revision, sha)
        return sha, note

    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]:
        assert job.commit is not None
        entries: list[dict[str, Any]] = []
        query: list[tuple[str, str]] | None = list(TREE_QUERY)
        seen: set[str] = set()
        while query is not None:
            key = repr(sorted(query))
            if key in seen:
                raise MirrorError("the tree listing's pagination loops (a next link repeats a page)")
            seen.add(key)
            data, headers, _ = await self._api(job, "tree", job.commit, "", query)
            if not isinstance(data, list):
                raise MirrorError("the tree listing is not a JSON list")
            entries.extend(e for e in data if isinstance(e, dict))
            query = next_page_query(headers)
        return entries

    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None:
        """Write what the server needs to answer for this revision with upstream down."""
        if self.dry_run:
            return
        repo = job.spec.repo
        commit = job.commit
        assert commit is not None
        all_files = tree_files(entries)
        for n, item in enumerate(all_files, 1):
            if self.index.get_file(repo, commit, item.path) is None:
                self.index.put_file(repo, FileEntry(commit, item.path, item.etag, item.size, lfs=item.lfs))
            if n % 256 == 0:
                await asyncio.sleep(0)  # the index is synchronous: a server's clients get the loop in between
        present = {f.path for f in all_files} | {e.get("path") for e in entries}
        name = repo.repo_id.rsplit("/", 1)[-1]
        for probe in (*PROBED_PATHS, f"{name}.py"):
            if probe not in present and self.index.get_file(repo, commit, probe) is None:
                self.index.put_file(repo, FileEntry(commit, probe, missing=True))
        # Non-recursive listings (HfFileSystem ls, datasets' data-dir probe), derived from the complete recursive
        # listing and stored under the keys the server computes: by commit (immutable; kept when already cached)
        # and by the branch or tag just resolved (with the recursive listing too, so list_repo_files(revision=
        # "main") is answered while upstream is down; the server refreshes these after the revision TTL).
        headers = (("content-type", "application/json"),)
        now = time.time()
        listings = [(directory, LS_QUERY, children) for directory, children in listing_pages(entries).items()]
        keyed: list[tuple[str, bool]] = [(commit, True)]
        if job.revision != commit:
            keyed.append((job.revision, False))
        for revision, immutable in keyed:
            rows = listings if immutable else [("", TREE_QUERY, entries), *listings]
            for directory, query, children in rows:
                route, key_query = api_route_key("tree", directory), api_query_key(list(query), None)
                if immutable and self.index.get_api(repo, revision, route, key_query) is not None:
                    continue
                body = json.dumps(children, separators=(",", ":")).encode()
                self.index.put_api(repo, revision, route, key_query,
                                   ApiEntry(200, headers, body, now, immutable=immutable))
        # Info JSON by commit (datasets pins the commit and asks again), and the repo's info route.
        for sub, revision in (("revision", commit), ("", None)):
            try:
                await self._api(job, sub, revision, "", [])
            except MirrorError as exc:
                log.info("could not cache %s info of %s: %s", sub or "repo", job.label, exc.message)
        # Confirm content access once (a HEAD unless already known), as the server records it: with upstream
        # down, cached content is then served to the callers upstream allowed.
        if job.files:
            await self.service.resolve_file(hf.ResolveTarget(repo, commit, job.files[0].path), self._caller(job))

    async def cached(self, job: RevisionJob, item: RemoteFile) -> bool:
        return await self.store.stat(item.etag) is not None

    def partial_bytes(self, item: RemoteFile) -> int:
        try:
            return min(os.stat(self.store.partial_path(item.etag)).st_size, item.size)
        except FileNotFoundError:
            return 0

    async def fetch(self, job: RevisionJob, item: RemoteFile, progress: Callable[[int], None]) -> int | None:
        assert job.commit is not None
        if self.service.admission is not None:  # the admission policy: a refused file is not fetched (or is held)
            entry = FileEntry(job.commit, item.path, item.etag, item.size, lfs=item.lfs)
            await self.service.admit_bytes(ResolvedFile(job.spec.repo, entry, Outcome.MISS), self._caller(job))
        spec = FillSpec(job.spec.repo, job.commit, item.path, item.etag, item.size, token=job.token, detached=True)
        task = asyncio.create_task(self.fills.fetch(spec))
        try:
            while not task.done():
                for fill in self.fills.active:
                    if fill.spec.etag == item.etag:
                        progress(fill.written)
                await asyncio.wait({task}, timeout=0.2)
            await task
        finally:
            if not task.done():
                task.cancel()
        progress(item.size)
        if isinstance(self.fills, CountingFillManager):
            return self.fills.downloaded.pop(item.etag, 0)  # 0: another process (a server) filled it meanwhile
        return item.size

    def pin(self, manifest: Manifest) -> None:
        self.index.set_pins([spec.repo for spec in manifest.repos], source=manifest.source)

    @property
    def total_fetched(self) -> int:
        return int(self.metrics.bytes_fetched._value.get())  # noqa: SLF001

    async def aclose(self) -> None:
        # Fills are done when the run ends normally; on an interrupt they are cancelled now (and stay resumable).
        if self._owns_parts:
            await self.parts.aclose(grace=0.5)

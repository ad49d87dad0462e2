"""``--mirror URL``: the sync drives a running mirror over HTTP (revision, tree, then a GET of every file, bytes
discarded); the mirror's own fill path does the work. The mirror has no pin endpoint: pins need
``--cache-dir``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from mirror import hf
from mirror.config import Settings
from mirror.errors import HubError, MirrorError
from mirror.hubjson import LS_QUERY, TREE_QUERY, next_link
from mirror.metrics import Outcome
from mirror.sync.jobs import RemoteFile, RevisionJob
from mirror.sync.manifest import Manifest

log = logging.getLogger("hf_mirror.sync")


class MirrorBackend:
    """Drives a running mirror over HTTP: the mirror's own fill path downloads and stores the files."""

    pins_supported = False

    def __init__(self, url: str, settings: Settings, *, dry_run: bool) -> None:
        self.base = url.rstrip("/")
        self.dry_run = dry_run
        self.default_token = settings.upstream_token
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.read_timeout * 4, connect=settings.connect_timeout),
            follow_redirects=True, headers={"user-agent": "hf-mirror-sync/0.1"},
        )
        self.total_fetched = 0

    def _headers(self, job: RevisionJob, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if job.token:
            headers["authorization"] = f"Bearer {job.token}"
        return headers

    async def _get_json(self, job: RevisionJob, url: str, params: list[tuple[str, str]] | None = None
                        ) -> tuple[Any, httpx.Response]:
        response = await self.client.get(url, params=params, headers=self._headers(job))
        if response.status_code >= 400:
            code = response.headers.get(hf.H_ERROR_CODE)
            message = response.headers.get(hf.H_ERROR_MESSAGE) or response.text[:200]
            raise HubError(response.status_code, code, message)
        return response.json(), response

    async def list_repos(self, repo_type: hf.RepoType, query: list[tuple[str, str]], token: str | None
                         ) -> list[dict[str, Any]]:
        """The list API through the mirror (relayed with this token, its ``Link`` pointed at the mirror)."""
        rows: list[dict[str, Any]] = []
        url: str | None = f"{self.base}/api/{repo_type.value}s"
        params: list[tuple[str, str]] | None = list(query)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        headers["cache-control"] = "no-cache"  # the mirror keeps listings read_ttl seconds: this run needs today's
        seen: set[str] = set()
        while url is not None:
            key = url + repr(params)
            if key in seen:
                raise MirrorError("the list API's pagination loops (a next link repeats a page)")
            seen.add(key)
            response = await self.client.get(url, params=params, headers=headers)
            if response.status_code >= 400:
                raise HubError(response.status_code, response.headers.get(hf.H_ERROR_CODE),
                               response.headers.get(hf.H_ERROR_MESSAGE) or response.text[:200])
            data = response.json()
            if not isinstance(data, list):
                raise MirrorError("the list API's answer is not a JSON list")
            rows.extend(r for r in data if isinstance(r, dict))
            url, params = next_link(response.headers.get("link")), None
        return rows

    def _api_url(self, job: RevisionJob, sub: str, revision: str) -> str:
        return f"{self.base}{job.spec.repo.api_path()}/{sub}/{quote(revision, safe='')}"

    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]:
        data, response = await self._get_json(job, self._api_url(job, "revision", job.revision))
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not hf.is_commit(sha):
            raise MirrorError(f"the mirror's /revision/{job.revision} answer carries no commit sha")
        job.stale = response.headers.get(hf.H_MIRROR_CACHE) == Outcome.STALE
        return sha, "mirror's upstream unreachable: kept its cached commit" if job.stale else None

    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]:
        assert job.commit is not None
        entries: list[dict[str, Any]] = []
        url: str | None = self._api_url(job, "tree", job.commit)
        params: list[tuple[str, str]] | None = list(TREE_QUERY)
        seen: set[str] = set()
        while url is not None:
            if url in seen:
                raise MirrorError("the tree listing's pagination loops (a next link repeats a page)")
            seen.add(url)
            data, response = await self._get_json(job, url, params)
            if not isinstance(data, list):
                raise MirrorError("the tree listing is not a JSON list")
            entries.extend(e for e in data if isinstance(e, dict))
            url, params = next_link(response.headers.get("link")), None
        return entries

    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None:
        """Ask the mirror for what clients ask, so it caches it: info by commit, root listing."""
        if self.dry_run or job.commit is None:
            return
        for url, params in ((self._api_url(job, "revision", job.commit), None),
                            (self._api_url(job, "tree", job.commit), list(LS_QUERY))):
            try:
                await self._get_json(job, url, params)
            except (HubError, httpx.HTTPError, ValueError) as exc:
                log.info("could not warm %s: %s", url, exc)

    def _resolve_url(self, job: RevisionJob, item: RemoteFile) -> str:
        assert job.commit is not None
        return self.base + job.spec.repo.resolve_path(job.commit, item.path)

    async def cached(self, job: RevisionJob, item: RemoteFile) -> bool:
        if not self.dry_run:
            return False  # the GET itself tells (X-Mirror-Cache: hit), and stops at once on a hit
        response = await self.client.head(self._resolve_url(job, item), headers=self._headers(job))
        # "hit" on a HEAD: the mirror has the metadata and the blob.
        return response.status_code == 200 and response.headers.get(hf.H_MIRROR_CACHE) == Outcome.HIT

    def partial_bytes(self, item: RemoteFile) -> int:
        return 0

    async def fetch(self, job: RevisionJob, item: RemoteFile, progress: Callable[[int], None]) -> int | None:
        received = 0
        async with self.client.stream("GET", self._resolve_url(job, item),
                                      headers=self._headers(job, {"accept-encoding": "identity"})) as response:
            if response.status_code >= 400:
                await response.aread()
                raise HubError(response.status_code, response.headers.get(hf.H_ERROR_CODE),
                               response.headers.get(hf.H_ERROR_MESSAGE) or response.text[:200])
            if response.headers.get(hf.H_MIRROR_CACHE) == Outcome.HIT:
                progress(item.size)
                return None  # cached: the body is not read, the connection is closed
            if response.headers.get(hf.H_MIRROR_CACHE) == "passthrough":
                raise MirrorError(f"the mirror has no disk room for {item.path} ({item.size} bytes): it would "
                                  "relay the file without storing it; free disk or lower --min-free-space")
            async for chunk in response.aiter_raw(1024 * 1024):
                received += len(chunk)
                progress(received)
        if received != item.size:
            raise MirrorError(f"the mirror sent {received} of {item.size} bytes")
        self.total_fetched += received
        return received

    def pin(self, manifest: Manifest) -> None:
        pass

    async def aclose(self) -> None:
        await self.client.aclose()

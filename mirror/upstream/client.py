"""The upstream client: the Hub's requests, over :class:`~mirror.upstream.connection.UpstreamConnection`.

A file's metadata the way ``hf_hub_download`` reads it, its bytes (opened for a fill, relayed as they arrive, or read
from another node's fill in progress), API answers and the read routes the mirror relays. Every answer leaves as a
value of :mod:`mirror.upstream.values`; upstream errors become the exceptions of :mod:`mirror.errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urljoin

import httpx

from mirror import hf
from mirror.errors import RangeIgnored, UpstreamUnavailable, UrlExpired
from mirror.upstream.bulk import BulkBody, BulkResponse
from mirror.upstream.connection import (
    MAX_ERROR_BODY,
    REDIRECTS,
    RepoGuard,
    UpstreamConnection,
    checked_chunks,
    in_send_pool,
    origin_of,
    read_capped,
    read_error,
)
from mirror.upstream.values import FileBody, RelayBody, UpstreamAnswer, UpstreamFileMeta


class UpstreamClient(UpstreamConnection):
    async def head_file(self, repo: hf.RepoRef, revision: str, path: str, token: str | None,
                        guard: RepoGuard | None = None) -> UpstreamFileMeta:
        """The metadata of a file, the way ``hf_hub_download`` reads it: follows same-origin redirects only."""
        url = self.base + repo.resolve_path(revision, path)

        async def attempt() -> httpx.Response:
            response, _ = await self._send(
                "HEAD", url, token=token, headers={"accept-encoding": "identity"}, follow="same-origin", guard=guard
            )
            return response

        response = await self._with_retries(attempt)
        if response.status_code >= 400:
            raise self.error(response, resolve=True)
        commit = response.headers.get(hf.H_REPO_COMMIT)
        etag = hf.parse_etag(response.headers.get(hf.H_LINKED_ETAG) or response.headers.get("etag"))
        size_header = response.headers.get(hf.H_LINKED_SIZE)
        if size_header is None and response.status_code not in REDIRECTS:
            size_header = response.headers.get("content-length")
        if not commit or not etag or size_header is None or not size_header.isdigit():
            raise UpstreamUnavailable(
                f"Upstream {self.display} answered {response.status_code} for {path!r} without the file metadata "
                "(X-Repo-Commit, ETag, size)"
            )
        cdn_url = None
        location = response.headers.get("location")
        if response.status_code in REDIRECTS and location:
            cdn_url = urljoin(url, location)
        return UpstreamFileMeta(commit=commit, etag=etag, size=int(size_header), cdn_url=cdn_url,
                                xet_hash=response.headers.get("x-xet-hash"))

    @asynccontextmanager
    async def open_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int = 0,
                        cdn_url: str | None = None, end: int | None = None) -> AsyncIterator[FileBody]:
        """Open the bytes of a file from ``start`` (to ``end``, exclusive) for a fill: a body a worker thread reads
        in large blocks.

        With ``cdn_url`` the CDN is asked directly (saving the Hub a request on resume); a refusal there raises
        :class:`UrlExpired` so the caller re-resolves. The answer is checked to be 200, or 206 from ``start``
        (always 206 for a window with an ``end``: :class:`RangeIgnored` otherwise).
        """
        headers = self._range_headers(start, None if end is None else end - 1)
        hub_url = self.base + repo.resolve_path(commit, path)
        url = cdn_url or hub_url

        async def attempt() -> BulkResponse:
            return await in_send_pool(self._send_bulk, url, token, headers)

        response = await self._with_retries(attempt)
        try:
            self._check_signed_url(response.status_code, response.url)
            if response.status_code >= 400:
                body = await asyncio.to_thread(response.body.read, MAX_ERROR_BODY)
                answer = UpstreamAnswer(response.status_code, response.headers, body, response.reason_phrase)
                raise self.error(answer, resolve=True)
            if end is not None and response.status_code != 206:
                raise RangeIgnored(f"Upstream ignored Range for {path!r} (status {response.status_code})")
            self._check_range(response.status_code, start, path)
            yield FileBody(response.body, None if response.url == hub_url else response.url, self.rate)
        finally:
            await response.aclose()

    @asynccontextmanager
    async def stream_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int, end: int,
                          chunk_size: int) -> AsyncIterator[RelayBody]:
        """Relay the bytes ``start..end`` (inclusive) of a file as they arrive, in chunks of up to ``chunk_size``.

        A transport failure in the middle of the body is raised as :class:`UpstreamUnavailable`.
        """
        headers = self._range_headers(start, end)
        url = self.base + repo.resolve_path(commit, path)

        async def attempt() -> httpx.Response:
            response, _ = await self._send("GET", url, token=token, headers=headers, stream=True)
            return response

        response = await self._with_retries(attempt)
        try:
            self._check_signed_url(response.status_code, str(response.request.url))
            if response.status_code >= 400:
                raise self.error(await read_error(response), resolve=True)
            self._check_range(response.status_code, start, path)
            yield RelayBody(response.status_code, response.headers, checked_chunks(response.aiter_raw(chunk_size)))
        finally:
            await response.aclose()

    @staticmethod
    def _range_headers(start: int, end: int | None) -> dict[str, str]:
        headers = {"accept-encoding": "identity"}
        if start or end is not None:
            headers["range"] = f"bytes={start}-{'' if end is None else end}"
        return headers

    def _check_signed_url(self, status: int, final_url: str) -> None:
        if status in (403, 410) and origin_of(final_url) != self.origin:
            raise UrlExpired(f"signed URL refused with {status}")

    @staticmethod
    def _check_range(status: int, start: int, path: str) -> None:
        if start and status != 206:
            raise UpstreamUnavailable(f"Upstream ignored Range for {path!r} (status {status})")

    @asynccontextmanager
    async def stream_peer(self, url: str, token: str, start: int, end: int | None = None) -> AsyncIterator[BulkBody]:
        """Open another mirror node's fill in progress (``/_mirror/fills/<etag>``) from byte ``start`` (to ``end``,
        inclusive: a Range read relayed from the node that fills the file)."""
        headers = {"accept-encoding": "identity", hf.H_PEER_TOKEN.lower(): token}
        ranged = bool(start) or end is not None
        if ranged:
            headers["range"] = f"bytes={start}-{'' if end is None else end}"
        response = await in_send_pool(self._send_bulk, url, None, headers, False)
        try:
            if response.status_code != (206 if ranged else 200):
                raise UpstreamUnavailable(f"peer {url} answered {response.status_code}")
            yield response.body
        finally:
            await response.aclose()

    # --- API ------------------------------------------------------------------------------------------------------

    async def api(
        self, method: str, path_qs: str, token: str | None, form: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None, guard: RepoGuard | None = None,
    ) -> UpstreamAnswer:
        """An API request, its body read up to ``max_api_body``. ``path_qs``: the raw path plus query string."""
        url = self.base + path_qs

        async def attempt() -> UpstreamAnswer:
            response, _ = await self._send(method, url, token=token, headers=headers, data=form, stream=True,
                                           guard=guard)
            try:
                return await read_capped(response, self.settings.max_api_body, path_qs.split("?")[0])
            finally:
                await response.aclose()

        return await self._with_retries(attempt)

    @asynccontextmanager
    async def relay(self, path_qs: str, token: str | None) -> AsyncIterator[RelayBody]:
        """A read route relayed as it arrives (bounded memory); errors are raised Hub-shaped, scrubbed."""
        url = self.base + path_qs

        async def attempt() -> httpx.Response:
            response, _ = await self._send("GET", url, token=token, stream=True, follow="same-origin")
            return response

        response = await self._with_retries(attempt)
        try:
            if response.status_code >= 400:
                raise self.error(await read_error(response), resolve=False, infer=False)
            yield RelayBody(response.status_code, response.headers, response.aiter_bytes())
        finally:
            await response.aclose()

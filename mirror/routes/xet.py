"""Xet on the mirror's own address (issue 17): the token route, the CAS, and the hints on resolve and tree answers.

The flow (what hf_xet does with it, read from huggingface_hub 2.4 / hf_xet 1.8 and xet-core's CAS spec):

1. A resolve ``HEAD``/``GET`` of an LFS file that upstream marks as Xet-backed carries upstream's ``X-Xet-Hash`` and
   ``Link: <{mirror}/api/{type}s/{repo}/xet-read-token/{commit}>; rel="xet-auth"``; tree and paths-info entries carry
   ``xetHash``. Nothing of upstream's Xet (its CAS, its token, its links) ever reaches a client.
2. ``GET /api/{type}s/{repo}/xet-read-token/{rev}``: after the very access check a resolve of that repo's content
   makes for this caller, the mirror's own signed token (:mod:`mirror.xet.tokens`), its expiry and the CAS URL
   ``{mirror}/_xet``, as headers and as the JSON body hf_xet's refresh reads.
3. ``GET {mirror}/_xet/v2/reconstructions/{xet_hash}`` (also ``/v1/...`` and the unprefixed form of hf_xet 1.2),
   ``Authorization: Bearer <token>``, ``Range`` windows, 416 past the end: terms over virtual xorbs of the file
   (:mod:`mirror.xet.xorb`) whose byte-range URLs are ``{mirror}/_xet/xorb/{hash}?p=<signed>``. A token reads only
   files of its own repo, by the Xet hash upstream gave them.
4. ``GET {mirror}/_xet/xorb/...`` with ``Range``: the file's bytes framed as uncompressed chunks, from the blob store
   or from the fill in progress (only the asked bytes are waited for; the fill runs on detached, once; the file's
   last byte waits for its verification, as on the plain path).

Uploads (``/v1/xorbs``, ``/v1/shards``, ``/v2/shards``, ``/v1/chunks``, any method but GET/HEAD) are refused;
``POST /v1/telemetry`` is accepted and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qs, quote

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.asgi import Receive, Scope, Send
from mirror.config import Settings
from mirror.errors import EntryNotFound, HubError, MethodNotAllowed, MirrorError, RouteNotFound
from mirror.fill import FillManager
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import bearer_token, header, mirror_base, parse_range, send_error
from mirror.service import MirrorService
from mirror.service.answers import ApiResult, Cached, FileEntry, Filling, Relay, ResolvedFile
from mirror.xet import CAS_PREFIX, XetCatalog, XetSigner, xorb

log = logging.getLogger("hf_mirror.xet")

_FRAMES_PER_READ = 16  # chunks framed per read: 1 MiB of file bytes
_TELEMETRY_MAX = 1024 * 1024
_UPLOAD_ROUTES = ("/v1/xorbs", "/v1/shards", "/v2/shards", "/v1/chunks", "/shards", "/xorbs")


class XetHandler:
    def __init__(self, settings: Settings, service: MirrorService, fills: FillManager, catalog: XetCatalog,
                 signer: XetSigner, metrics: Metrics) -> None:
        self.settings = settings
        self.service = service
        self.fills = fills
        self.catalog = catalog
        self.signer = signer
        self.metrics = metrics
        self.token_ttl = settings.xet_token_ttl

    # --- hints on the mirror's own answers -------------------------------------------------------------------------

    def resolve_headers(self, scope: Scope, resolved: ResolvedFile) -> list[tuple[bytes, bytes]]:
        """``X-Xet-Hash`` and the ``xet-auth`` link (the mirror's token route) for a file upstream marks as Xet."""
        entry = resolved.entry
        if not entry.lfs:
            return []
        xet_hash = self.catalog.hint(resolved.repo, entry.commit, entry.path, entry.etag)
        if xet_hash is None:
            return []
        route = f"{mirror_base(scope)}{resolved.repo.api_path()}/xet-read-token/{entry.commit}"
        return [(b"x-xet-hash", xet_hash.encode()), (b"link", f'<{route}>; rel="xet-auth"'.encode("latin-1"))]

    def annotate(self, target: hf.ApiTarget, result: ApiResult) -> ApiResult:
        """Tree and paths-info answers: ``xetHash`` back on the entries whose blob upstream named."""
        if target.sub not in ("tree", "paths-info") or result.status != 200 or b'"lfs"' not in result.body:
            return result
        commit = self._commit(target.repo, target.revision)
        if commit is None:
            return result
        try:
            data = json.loads(result.body)
        except ValueError:
            return result
        if not self.catalog.annotate_listing(target.repo, commit, data):
            return result
        body = json.dumps(data, separators=(",", ":")).encode()
        return ApiResult(result.status, result.headers, body, result.outcome)

    def _commit(self, repo: hf.RepoRef, revision: str | None) -> str | None:
        if not revision:
            return None
        if hf.is_commit(revision):
            return revision
        ref = self.service.index.get_ref_fresh(repo, revision, self.settings.revision_ttl)
        return ref.commit if ref else None

    # --- the token route -------------------------------------------------------------------------------------------

    async def token(self, scope: Scope, send: Send, target: hf.ApiTarget, caller: Caller) -> Outcome:
        head = scope["method"] == "HEAD"
        try:
            repo = target.repo
            commit = self._commit(repo, target.revision) or (
                (ref := self.service.index.get_ref(repo, target.revision or "")) and ref.commit)
            probe = self.catalog.probe_path(repo)
            if probe is None:
                raise EntryNotFound(commit or None, "No Xet-backed file of this repo is known to the mirror")
            if not commit and target.revision:
                # A branch the mirror has not resolved yet (HfFileSystem asks the token for "main" after a tree
                # listing): resolve it as a resolve would, with this caller's access check.
                try:
                    commit = (await self.service.resolve_file(
                        hf.ResolveTarget(repo, target.revision, probe[1]), caller)).entry.commit
                except EntryNotFound as exc:
                    if not exc.commit:
                        raise
                    commit = exc.commit
            if not commit:
                raise EntryNotFound(None, f"Revision {target.revision!r} is not known to the mirror yet")
            # The access check a resolve of this repo's content makes for this caller (gated, private, offline).
            await self.service.resolve_file(hf.ResolveTarget(repo, probe[0], probe[1]), caller)
            claims = {"t": repo.type.value, "r": repo.repo_id, "c": commit, "u": token_digest(caller.token),
                      **self._caller_claims(caller)}
            token, exp = self.signer.sign("access", claims, self.token_ttl)
        except MirrorError as exc:
            self.metrics.requests.labels(route="xet-token", outcome=Outcome.ERROR).inc()
            await send_error(send, exc, head=head)
            return Outcome.ERROR
        cas_url = mirror_base(scope) + CAS_PREFIX
        body = json.dumps({"accessToken": token, "exp": exp, "casUrl": cas_url}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store"), (b"x-xet-cas-url", cas_url.encode("latin-1")),
                   (b"x-xet-access-token", token.encode()), (b"x-xet-token-expiration", str(exp).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})
        self.metrics.requests.labels(route="xet-token", outcome=Outcome.HIT).inc()
        return Outcome.HIT

    def _caller_claims(self, caller: Caller) -> dict[str, str]:
        """How the CAS reads upstream for this caller: its own token (sealed), none, or the service token (``svc``:
        never written into a claim; the CAS takes it from the settings again)."""
        if caller.token is None:
            return {"m": "anon"}
        if caller.own_token:
            return {"m": "own", "a": self.signer.seal(caller.token)}
        return {"m": "svc"}

    def _caller(self, claims: dict) -> Caller | None:
        mode = claims.get("m")
        if mode == "anon":
            return Caller(None)
        if mode == "svc":
            return Caller(self.settings.upstream_token)
        if mode == "own":
            token = self.signer.unseal(str(claims.get("a", "")))
            return Caller(token, own_token=True) if token else None
        return None

    # --- the CAS ---------------------------------------------------------------------------------------------------

    async def cas(self, scope: Scope, receive: Receive, send: Send, path: str) -> Outcome:
        """Everything under ``{mirror}/_xet``; ``path`` is the rest (``/v2/reconstructions/{hash}``...)."""
        method = scope["method"]
        head = method == "HEAD"
        try:
            if method == "POST" and path.rstrip("/") == "/v1/telemetry":
                await _drain(receive, _TELEMETRY_MAX)
                await _send_json(send, 200, {"accepted": True}, head=False)
                return Outcome.HIT
            if method not in ("GET", "HEAD"):
                raise MethodNotAllowed(f"{method} is not allowed here: the mirror's Xet CAS is read-only")
            if path.startswith(_UPLOAD_ROUTES):
                raise MethodNotAllowed("the mirror's Xet CAS is read-only")
            parts = path.strip("/").split("/")
            if len(parts) == 3 and parts[0] in ("v1", "v2") and parts[1] == "reconstructions":
                return await self._reconstruction(scope, send, parts[2], 2 if parts[0] == "v2" else 1)
            if len(parts) == 2 and parts[0] == "reconstructions":  # hf_xet 1.2: no version prefix
                return await self._reconstruction(scope, send, parts[1], 1)
            if len(parts) == 2 and parts[0] == "xorb":
                return await self._xorb(scope, receive, send, parts[1])
            raise RouteNotFound(f"{CAS_PREFIX}{path[:200]} is not a route of the mirror's Xet CAS")
        except MirrorError as exc:
            self.metrics.requests.labels(route="xet-cas", outcome=Outcome.ERROR).inc()
            await send_error(send, exc, head=head)
            return Outcome.ERROR

    async def _reconstruction(self, scope: Scope, send: Send, file_hash: str, version: int) -> Outcome:
        claims = self.signer.verify("access", bearer_token(scope))
        if claims is None:
            raise HubError(401, None, "Missing, invalid or expired Xet token: ask the xet-read-token route again",
                           headers={"www-authenticate": "Bearer"})
        repo = hf.RepoRef(hf.RepoType(claims["t"]), claims["r"])
        file = self.catalog.file(repo, file_hash.lower())
        if file is None:  # not a file of the token's repo (another repo's hash reads nothing)
            raise HubError(404, "EntryNotFound", "No such file in the repo this Xet token is for")
        if file.size == 0:
            data = xorb.reconstruction(file_hash, 0, 0, 0, str, version)
        else:
            byte_range = parse_range(header(scope, b"range"), file.size)  # 416 past the end
            start, end = byte_range if byte_range is not None else (0, file.size - 1)
            grant = {"t": repo.type.value, "r": repo.repo_id, "c": file.commit, "p": file.path, "e": file.etag,
                     "s": file.size, "f": file_hash.lower(), **{k: claims[k] for k in ("m", "a") if k in claims}}
            base = mirror_base(scope) + CAS_PREFIX

            def url(index: int) -> str:
                signed, _ = self.signer.sign("xorb", {**grant, "k": index}, self.token_ttl)
                return f"{base}/xorb/{xorb.xorb_hash(file_hash.lower(), index)}?p={quote(signed)}"

            data = xorb.reconstruction(file_hash.lower(), file.size, start, end, url, version)
        self.metrics.requests.labels(route="xet-reconstruction", outcome=Outcome.HIT).inc()
        await _send_json(send, 200, data, head=scope["method"] == "HEAD")
        return Outcome.HIT

    async def _xorb(self, scope: Scope, receive: Receive, send: Send, digest: str) -> Outcome:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        claims = self.signer.verify("xorb", (query.get("p") or [""])[0])
        if claims is None or xorb.xorb_hash(claims["f"], claims["k"]) != digest:
            # 403: hf_xet asks the reconstruction again for fresh URLs.
            raise HubError(403, None, "Invalid or expired Xet byte-range URL")
        caller = self._caller(claims)
        if caller is None:
            raise HubError(403, None, "Invalid Xet byte-range URL")
        size, index = int(claims["s"]), int(claims["k"])
        if not 0 <= index < xorb.xorb_count(size):
            raise HubError(403, None, "Invalid Xet byte-range URL")
        length = xorb.xorb_length(size, index)
        byte_range = parse_range(header(scope, b"range"), length)
        first, last = byte_range if byte_range is not None else (0, length - 1)
        file_start, file_end = xorb.file_span(size, index, first, last)
        repo = hf.RepoRef(hf.RepoType(claims["t"]), claims["r"])
        resolved = ResolvedFile(repo, FileEntry(claims["c"], claims["p"], claims["e"], size, lfs=True), Outcome.HIT)
        source = await self.service.open_blob(resolved, caller, file_start, file_end - 1, detached=True)
        if type(source) is Relay and file_end == size:
            fill = self.fills.get(claims["e"])  # the file's last byte comes only from a verified fill
            if fill is not None:
                source = Filling(fill, source.outcome)
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(last - first + 1).encode()),
                   (b"accept-ranges", b"bytes"), (hf.H_MIRROR_CACHE.lower().encode(), source.outcome.encode())]
        status = 200
        if byte_range is not None:
            status = 206
            headers.append((b"content-range", f"bytes {first}-{last}/{length}".encode()))
        self.metrics.requests.labels(route="xet-xorb", outcome=source.outcome).inc()
        if scope["method"] == "HEAD":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return source.outcome
        async with self._reader(source, file_start, file_end) as read:
            # The first bytes before the headers: a fill that fails at once is an error answer, not a cut body.
            first_stop = min(last, (first // xorb.FRAME + _FRAMES_PER_READ) * xorb.FRAME - 1)
            pending = await self._framed(read, size, index, first, first_stop)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            counter = self.metrics.bytes_served.labels(source="xet")
            position = first_stop + 1
            try:
                while True:
                    more = position <= last
                    await send({"type": "http.response.body", "body": pending, "more_body": more})
                    counter.inc(len(pending))
                    if not more:
                        break
                    stop = min(last, (position // xorb.FRAME + _FRAMES_PER_READ) * xorb.FRAME - 1)
                    pending = await self._framed(read, size, index, position, stop)
                    position = stop + 1
            except Exception as exc:  # noqa: BLE001 - headers are out: cut the connection, never fake the end
                log.warning("aborting Xet range of %s %s: %s", repo.key, claims["p"], exc)
                return Outcome.ABORTED
        return source.outcome

    @staticmethod
    async def _framed(read: Callable[[int, int], Awaitable[bytes]], size: int, index: int, first: int,
                      last: int) -> bytes:
        start, end = xorb.file_span(size, index, first, last)
        data = await read(start, end)
        return xorb.frame(size, index, first, last, data, start)

    def _reader(self, source: Cached | Filling | Relay, start: int, end: int) -> _Reader:
        return _Reader(self, source, start, end)


class _Reader:
    """``read(a, b)`` of file bytes ``[a, b)``, in increasing order, from a cached blob, a fill or a relay."""

    def __init__(self, handler: XetHandler, source: Cached | Filling | Relay, start: int, end: int) -> None:
        self.handler = handler
        self.source = source
        self.start, self.end = start, end
        self._closers: list[Callable[[], None]] = []
        self._contexts: list[contextlib.AbstractAsyncContextManager] = []

    async def __aenter__(self) -> Callable[[int, int], Awaitable[bytes]]:
        source = self.source
        loop = asyncio.get_running_loop()
        if type(source) is Cached:
            fd = os.open(source.path, os.O_RDONLY)
            self._closers.append(lambda: os.close(fd))

            async def read_cached(a: int, b: int) -> bytes:
                data = await loop.run_in_executor(None, os.pread, fd, b - a, a)
                if len(data) != b - a:
                    raise OSError("stored blob shorter than its size")
                return data

            return read_cached
        if type(source) is Filling:
            fill = source.fill
            context = self.handler.fills.reading(fill)
            fd = await context.__aenter__()
            self._contexts.append(context)

            async def read_fill(a: int, b: int) -> bytes:
                if b > a and await FillManager.readable(fill, b - 1) < b:  # waits for these bytes only
                    raise OSError("the fill ended before these bytes")
                data = await loop.run_in_executor(None, os.pread, fd, b - a, a)
                if len(data) != b - a:
                    raise OSError("fill file shorter than announced")
                return data

            return read_fill
        assert isinstance(source, Relay)
        context = self.handler.service.relay_file(source, 1024 * 1024)
        chunks: AsyncIterator[bytes] = await context.__aenter__()
        self._contexts.append(context)
        buffer = bytearray()
        buffer_start = self.start

        async def read_relay(a: int, b: int) -> bytes:
            nonlocal buffer, buffer_start
            del buffer[:a - buffer_start]
            buffer_start = a
            while len(buffer) < b - a:
                try:
                    buffer += await chunks.__anext__()
                except StopAsyncIteration:
                    raise MirrorError("upstream range ended short") from None
            return bytes(buffer[:b - a])

        return read_relay

    async def __aexit__(self, *exc: object) -> None:
        for close in self._closers:
            close()
        for context in reversed(self._contexts):
            await context.__aexit__(*exc)


async def _drain(receive: Receive, limit: int) -> None:
    total = 0
    while True:
        message = await receive()
        total += len(message.get("body", b""))
        if total > limit:
            raise HubError(413, None, "telemetry body too large")
        if not message.get("more_body"):
            return


async def _send_json(send: Send, status: int, data: object, *, head: bool) -> None:
    body = json.dumps(data, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})

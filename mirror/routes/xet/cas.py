"""The mirror's Xet CAS under ``{mirror}/_xet`` (:mod:`mirror.routes.xet`, steps 3 and 4): reconstructions over
virtual xorbs, the xorbs' byte ranges framed from the blob store, the fill in progress or a relay; uploads refused,
telemetry accepted and dropped."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, quote

from mirror import hf
from mirror.access import Caller
from mirror.asgi import Receive, Scope, Send
from mirror.audit import note_file
from mirror.audit.event import ANONYMOUS
from mirror.config import Settings
from mirror.errors import ErrorCode, HubError, MethodNotAllowed, MirrorError, RouteNotFound
from mirror.fill import FillManager
from mirror.metrics import Metrics, Outcome
from mirror.routes.common import bearer_token, header, mirror_base, outcome_headers, parse_range, send_error
from mirror.routes.xet.reader import SourceReader
from mirror.service import MirrorService
from mirror.service.answers import BlobSource
from mirror.xet import CAS_PREFIX, XetCatalog, XetFile, XetSigner, xorb
from mirror.xet.finder import XetFinder

log = logging.getLogger("hf_mirror.xet")

_FRAMES_PER_READ = 16  # chunks framed per read: 1 MiB of file bytes
_TELEMETRY_MAX = 1024 * 1024
_UPLOAD_ROUTES = ("/v1/xorbs", "/v1/shards", "/v2/shards", "/v1/chunks", "/shards", "/xorbs")


class XetCas:
    def __init__(self, settings: Settings, service: MirrorService, fills: FillManager, catalog: XetCatalog,
                 signer: XetSigner, metrics: Metrics, *, audited: bool = False) -> None:
        self.settings = settings
        self.service = service
        self.fills = fills
        self.catalog = catalog
        self.signer = signer
        self.metrics = metrics
        self.token_ttl = settings.xet_token_ttl
        self.finder = XetFinder(service, catalog)
        self.audited = audited  # the audit log is on: a reconstruction is the event of an Xet download (mirror.audit)

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
        caller = self._caller(claims)
        if caller is None:
            raise HubError(401, None, "Invalid Xet token: ask the xet-read-token route again",
                           headers={"www-authenticate": "Bearer"})
        # Known to this node, or found in upstream's listing of the token's commit (its HEAD may have gone to another
        # node): only ever among the token's own repo's files.
        file = await self.finder.file(repo, str(claims.get("c", "")), file_hash.lower(), caller)
        if file is None:  # not a file of the token's repo (another repo's hash reads nothing)
            raise HubError(404, ErrorCode.ENTRY_NOT_FOUND, "No such file in the repo this Xet token is for")
        # The admission policy, by hash as by name (its xorbs are held to it again: open_blob).
        await self.service.admit_lfs_file(repo, file.commit, file.path, file.etag, file.size, caller)
        if self.audited and scope["method"] == "GET":
            await self._note(scope, repo, file, claims)
        if file.size == 0:
            data = xorb.reconstruction(file_hash, 0, 0, 0, str, version)
        else:
            byte_range = parse_range(header(scope, b"range"), file.size)  # 416 past the end
            start, end = byte_range if byte_range is not None else (0, file.size - 1)
            grant = {"t": repo.type.value, "r": repo.repo_id, "c": file.commit, "p": file.path, "e": file.etag,
                     "s": file.size, "f": file_hash.lower(), **{k: claims[k] for k in ("m", "a") if k in claims}}
            if start == 0 and end == file.size - 1:
                grant["W"] = 1  # a download of the whole file: its xorb ranges fill it whole (never sparse)
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
        source = await self.service.open_xorb(repo, claims["c"], claims["p"], claims["e"], size, caller, file_start,
                                              file_end - 1, whole=bool(claims.get("W")))
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(last - first + 1).encode()),
                   (b"accept-ranges", b"bytes"), *outcome_headers(source.outcome)]
        status = 200
        if byte_range is not None:
            status = 206
            headers.append((b"content-range", f"bytes {first}-{last}/{length}".encode()))
        self.metrics.requests.labels(route="xet-xorb", outcome=source.outcome).inc()
        if scope["method"] == "HEAD":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return source.outcome
        async with self._reader(source, file_start, file_end, claims["e"]) as read:
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

    async def _note(self, scope: Scope, repo: hf.RepoRef, file: XetFile, claims: dict) -> None:
        """The audit log's view of this download: the file behind the hash, the bytes this reconstruction hands out
        (its Range, else the file), whether they are cached, and the caller the token was issued to. The byte ranges
        that follow are the same client session: they add no event."""
        byte_range = parse_range(header(scope, b"range"), file.size) if file.size else None
        length = file.size if byte_range is None else byte_range[1] - byte_range[0] + 1
        cache = await self.service.lfs_outcome(repo, file.commit, file.path, file.etag, file.size)
        mode = claims.get("m")
        caller = claims.get("w") or (f"token:{str(claims.get('u', ''))[:16]}" if mode == "own" else ANONYMOUS)
        note_file(scope, repo.type.value, repo.repo_id, file.path, None, commit=file.commit, etag=file.etag,
                  size=length, via="xet", caller=str(caller), cache=str(cache))

    @staticmethod
    async def _framed(read: Callable[[int, int], Awaitable[bytes]], size: int, index: int, first: int,
                      last: int) -> bytes:
        start, end = xorb.file_span(size, index, first, last)
        data = await read(start, end)
        return xorb.frame(size, index, first, last, data, start)

    def _reader(self, source: BlobSource, start: int, end: int, etag: str) -> SourceReader:
        return SourceReader(self.fills, self.service, source, start, end, etag)

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

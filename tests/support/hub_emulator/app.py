"""The emulator's ASGI app: the Hub host and its CDN host, with the real Hub's wire behaviour and injectable faults.

Hub host: ``resolve`` answers a relative 307 to ``/api/resolve-cache/...`` for regular files and a 302 to the CDN
host with a signed, expiring URL (plus Xet headers) for LFS files; the API routes (info, revision, tree with cursor
pagination and an absolute ``Link``, paths-info, refs, commits, xet-read-token); gated (401/403 ``GatedRepo``) and
private (``RepoNotFound``) repos; ``X-Error-Code`` on every error. CDN host: the LFS bytes, with Range, rejecting
expired or forged signatures with 403. Control routes under ``/_emulator/`` (stats, reset, faults, push).
Every other request, on either host, is recorded (host, method, raw path with query, ``Authorization``) so a test
can assert what did and did not reach upstream.
Routing uses ``raw_path`` so ``refs%2Fpr%2F1`` stays one segment, as on the Hub.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from mirror.asgi import Receive, Scope, Send, answer_lifespan, read_body, send_response
from tests.support.hub_emulator import community
from tests.support.hub_emulator import viewer as viewer_host
from tests.support.hub_emulator.fixtures import (
    CREATED_AT,
    LAST_MODIFIED,
    VALID_TOKENS,
    Commit,
    Fixtures,
    Repo,
    RepoFile,
)

Headers = dict[str, str]
TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
API_ACTIONS = ("revision", "tree", "paths-info", "refs", "commits", "xet-read-token", "xet-write-token")
SECRET = b"emulator-cdn-signing-key"
CHUNK = 1 << 20
MAX_RECORDED = 2000
ECHOED_COOKIE = "cookie: session=abc"  # what an upstream that echoes request headers would also echo


@dataclass
class Faults:
    throttle_bps: float = 0.0  # body bytes per second per response; 0 = unthrottled
    drop_after_bytes: int = 0  # cut file bodies after this many bytes ...
    drop_count: int = 0  # ... this many times
    status_burst: int = 0  # answer the next N Hub-host requests with ``burst_status``
    burst_status: int = 503
    retry_after: int | None = None
    corrupt_next: int = 0  # flip one byte in the next N file bodies
    latency_s: float = 0.0  # delay before every Hub-host response
    expired_before: float = 0.0  # CDN URLs issued before this unix time are rejected (403)
    down: bool = False  # every request answers 503 (a Hub outage that still accepts TCP)
    expire_on_drop: bool = False  # a drop also expires every signed URL issued so far (a long download outliving it)
    # Renamed repos, as the Hub answers them: a 307 from every URL of the old id ("acme/old") to the same URL of the
    # new one; keys and values are repo ids of models.
    renamed: dict[str, str] = field(default_factory=dict)
    echo_auth_in_error: bool = False  # Hub host answers 400 echoing the Authorization header (and a cookie)
    viewer_down: bool = False  # the dataset viewer's host answers 503 (the Hub itself stays up)
    # A WAN profile: every response of either host (Hub and CDN) waits this long before its first byte (a round
    # trip), and the file bodies of all responses together share ``link_bps`` bytes/s (0: no cap) on top of each
    # response's own ``throttle_bps``.
    first_byte_s: float = 0.0
    link_bps: float = 0.0
    # One connection that crawls (a stalled tail): the next ``slow_count`` file bodies whose range starts at byte
    # ``slow_start`` are sent at ``slow_bps`` bytes/s (e.g. 1 % of ``throttle_bps``), in small chunks.
    slow_start: int = -1
    slow_bps: float = 0.0
    slow_count: int = 1


class Response(Exception):
    """Raised to answer early: an error or a redirect."""

    def __init__(self, status: int, headers: Headers | None = None, body: bytes = b"") -> None:
        self.status, self.headers, self.body = status, headers or {}, body


def hub_error(status: int, code: str | None, message: str, extra: Headers | None = None) -> Response:
    headers = {"content-type": "application/json", "x-error-message": message, **(extra or {})}
    if code:
        headers["x-error-code"] = code
    return Response(status, headers, json.dumps({"error": message}).encode())


@dataclass
class Emulator:
    files: Fixtures
    url_ttl: float = 300.0
    page_size: int = 1000
    cdn_port: int = 0
    hub_port: int = 0
    viewer_port: int = 0  # the dataset viewer's host (also: any request whose Host is datasets-server.*)
    faults: Faults = field(default_factory=Faults)
    counts: Counter[str] = field(default_factory=Counter)
    fetches: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    bytes_served: int = 0
    log: list[str] = field(default_factory=list)
    requests: deque[dict[str, str | None]] = field(default_factory=lambda: deque(maxlen=MAX_RECORDED))

    # --- ASGI --------------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        body = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, raw = scope["method"], scope["raw_path"].decode("latin-1")
        query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)
        is_cdn = scope["server"][1] == self.cdn_port
        is_viewer = (scope["server"][1] == self.viewer_port and self.viewer_port != 0) or headers.get(
            "host", "").startswith("datasets-server.")
        self.counts["requests"] += 1
        host = "cdn" if is_cdn else "viewer" if is_viewer else "hub"
        self.log.append(f"{host} {method} {raw}")
        del self.log[:-500]
        if not raw.startswith("/_emulator/"):
            query_string = scope.get("query_string", b"").decode("latin-1")
            self.requests.append({"host": host, "method": method,
                                  "path": raw + (f"?{query_string}" if query_string else ""),
                                  "auth": headers.get("authorization"), "range": headers.get("range"),
                                  "ua": headers.get("user-agent")})
        if self.faults.first_byte_s and not raw.startswith("/_emulator/"):
            await asyncio.sleep(self.faults.first_byte_s)
        try:
            if raw.startswith("/_emulator/"):
                raise self.control(method, raw, body)
            if self.faults.down:
                raise hub_error(503, None, "emulated outage")
            if is_viewer:
                raise self.viewer(method, raw, query, headers)
            if is_cdn:
                if "authorization" in headers:
                    self.counts["cdn_requests_with_auth"] += 1
                file, start, end, status, out = self.cdn(method, raw, query, headers)
            else:
                await self.hub_faults(headers)
                file, start, end, status, out = self.hub(method, raw, query, headers, body)
        except Response as answer:
            await send_response(send, method, answer.status, answer.headers, answer.body)
            return
        await self.send_file(send, method, file, start, end, status, out, receive)

    def viewer(self, method: str, raw: str, query: dict[str, list[str]], headers: Headers) -> Response:
        """The dataset viewer's host (tests.support.hub_emulator.viewer)."""
        self.counts["viewer"] += 1
        if self.faults.viewer_down:
            return hub_error(503, None, "emulated viewer outage")
        endpoint = raw.split("?")[0].strip("/")
        if method not in ("GET", "HEAD") or endpoint not in viewer_host.ENDPOINTS:
            return hub_error(404, "ResponseNotFound", "Not found.")
        dataset = (query.get("dataset") or [""])[0]
        if not dataset:
            return hub_error(422, "MissingRequiredParameter", "Parameter 'dataset' is required")
        token = headers.get("authorization", "").removeprefix("Bearer ").strip() or None
        # The viewer asks the Hub's auth-check with the caller's token: its 401 (no token, or one the Hub does not
        # know) -> 401 ExternalUnauthenticatedError; its 403/404 (a gate not accepted, a private or missing dataset)
        # -> 404 ExternalAuthenticatedError, so that a token learns nothing of what it may not read.
        try:
            if token and token not in VALID_TOKENS:
                raise hub_error(401, None, "Invalid username or password.")
            repo = self.readable_repo("dataset", dataset, token)
        except Response as denied:
            if denied.status == 401:
                return hub_error(401, "ExternalUnauthenticatedError", viewer_host.UNAUTHENTICATED)
            return hub_error(404, "ExternalAuthenticatedError", viewer_host.AUTHENTICATED)
        try:
            viewer_host.viewer(repo, endpoint, query, f"http://127.0.0.1:{self.hub_port}")
        except viewer_host.ViewerAnswer as answer:
            return Response(answer.status, {"content-type": "application/json", **answer.headers},
                            json.dumps(answer.body).encode())
        raise AssertionError("unreachable")

    async def hub_faults(self, headers: Headers) -> None:
        if self.faults.latency_s:
            await asyncio.sleep(self.faults.latency_s)
        if self.faults.echo_auth_in_error:
            # An upstream that quotes the request's headers back in its error (the message and the JSON body).
            auth = headers.get("authorization", "")
            message = f"bad request; you sent authorization: {auth}; {ECHOED_COOKIE}"
            body = json.dumps({"error": message, "headers": f"authorization: {auth}\n{ECHOED_COOKIE}\n"}).encode()
            raise Response(400, {"content-type": "application/json", "x-error-message": message}, body)
        if self.faults.status_burst > 0:
            self.faults.status_burst -= 1
            extra = {"retry-after": str(self.faults.retry_after)} if self.faults.retry_after is not None else {}
            if self.faults.burst_status == 429:
                extra["ratelimit"] = '"api";r=0;t=1'
                extra["ratelimit-policy"] = '"fixed window";"api";q=1000;w=300'
            raise hub_error(self.faults.burst_status, None, "emulated upstream error", extra)

    async def send_file(self, send: Send, method: str, file: RepoFile, start: int, end: int, status: int,
                        headers: Headers, receive: Receive | None = None) -> None:
        key = headers.pop("x-emulator-file")
        headers["content-length"] = str(end - start)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
        if method == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        self.fetches[key] += 1
        faults = self.faults
        drop_at = None
        if faults.drop_count > 0 and faults.drop_after_bytes < end - start:
            faults.drop_count -= 1
            drop_at = start + faults.drop_after_bytes
        corrupt = faults.corrupt_next > 0
        if corrupt:
            faults.corrupt_next -= 1
        rate, step = faults.throttle_bps, CHUNK
        if faults.slow_count > 0 and faults.slow_bps and start == faults.slow_start:
            faults.slow_count -= 1
            rate, step = faults.slow_bps, max(4096, min(CHUNK, int(faults.slow_bps / 20)))
            self.counts["slow_bodies"] += 1
        # The client hanging up ends the body (uvicorn's send would take the rest silently): the bytes counted are
        # the ones a client could have read, and a crawling body cut by a hedge stops there.
        gone = asyncio.ensure_future(receive()) if receive is not None else None
        try:
            await self._send_body(send, file, start, end, rate, step, drop_at, corrupt, gone)
        finally:
            if gone is not None:
                gone.cancel()

    async def _send_body(self, send: Send, file: RepoFile, start: int, end: int, rate: float, step: int,
                         drop_at: int | None, corrupt: bool, gone: asyncio.Future[Any] | None) -> None:
        faults = self.faults
        began, sent, pos = time.monotonic(), 0, start
        while pos < end:
            if gone is not None and gone.done():
                return
            chunk = file.read(pos, min(end, pos + step))
            if corrupt and pos <= (start + end) // 2 < pos + len(chunk):
                i = (start + end) // 2 - pos
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
            if drop_at is not None and pos + len(chunk) > drop_at:
                await send({"type": "http.response.body", "body": chunk[: drop_at - pos], "more_body": True})
                self.bytes_served += drop_at - pos
                if faults.expire_on_drop:
                    faults.expired_before = time.time() + 0.001
                raise ConnectionAbortedError("emulated connection drop")  # uvicorn closes the socket mid-body
            pos += len(chunk)
            sent += len(chunk)
            self.bytes_served += len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": pos < end})
            if rate:
                ahead = sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            if faults.link_bps:
                await self.link_take(len(chunk), faults.link_bps)
        if start == end:
            await send({"type": "http.response.body", "body": b""})

    async def link_take(self, n: int, rate: float) -> None:
        """The shared link: every body's bytes queue on one schedule of ``rate`` bytes/s."""
        now = time.monotonic()
        self._link_free = max(getattr(self, "_link_free", 0.0), now) + n / rate
        if self._link_free - now > 0:
            await asyncio.sleep(self._link_free - now)

    # --- control -----------------------------------------------------------------------------------------------

    def control(self, method: str, raw: str, body: bytes) -> Response:
        action = raw.removeprefix("/_emulator/")
        payload = json.loads(body) if body else {}
        if action == "stats":
            result: Any = {"counts": dict(self.counts), "fetches": dict(self.fetches), "tokens": dict(self.tokens),
                           "bytes_served": self.bytes_served, "log": self.log[-200:], "requests": list(self.requests)}
        elif action == "reset":
            self.counts.clear()
            self.requests.clear()
            self.fetches.clear()
            self.tokens.clear()
            self.log.clear()
            self.bytes_served = 0
            result = {"ok": True}
        elif action == "faults":
            if payload.pop("expire_urls", False):
                payload["expired_before"] = time.time() + 0.001
            self.faults = Faults(**payload) if payload.pop("replace", True) else self.faults
            result = {"faults": self.faults.__dict__}
        elif action == "create-repo":
            files = {p: d.encode("latin-1") for p, d in payload.get("files", {}).items()}
            try:
                sha = self.files.create_repo(payload["type"], payload["repo"], files, payload.get("tags"),
                                             bool(payload.get("private")))
            except ValueError as exc:
                raise hub_error(409, None, str(exc)) from None
            result = {"sha": sha}
        elif action == "delete-repo":
            if (payload["type"], payload["repo"]) not in self.files.repos:
                raise hub_error(404, "RepoNotFound", "Repository not found")
            self.files.delete_repo(payload["type"], payload["repo"])
            result = {"ok": True}
        elif action == "push":
            changes = {p: d.encode("latin-1") for p, d in payload["changes"].items()}
            result = {"sha": self.files.push(payload["type"], payload["repo"], payload["branch"], changes)}
        else:
            raise hub_error(404, None, f"unknown control {action}")
        return Response(200, {"content-type": "application/json"}, json.dumps(result).encode())

    # --- Hub host ----------------------------------------------------------------------------------------------

    def hub(self, method: str, raw: str, query: dict[str, list[str]], headers: Headers,
            body: bytes) -> tuple[RepoFile, int, int, int, Headers]:
        token = headers.get("authorization", "").removeprefix("Bearer ").strip() or None
        if token:
            self.tokens[token] += 1
            if token not in VALID_TOKENS:
                raise hub_error(401, None, "Invalid credentials in Authorization header")
        for old_id, new_id in self.faults.renamed.items():
            for prefix in ("/", "/api/models/"):
                if raw.startswith(prefix + old_id + "/") or raw == prefix + old_id:
                    raise Response(307, {"location": prefix + new_id + raw[len(prefix + old_id):]})
        segments = raw.split("/")[1:]
        if segments[:2] == ["api", "resolve-cache"]:
            return self.resolve_cache(method, segments[2:], headers, token)
        if segments[0] == "api":
            self.counts["api"] += 1
            raise self.api(method, segments[1:], query, headers, body, token)
        if segments[0] == "papers" and method in ("GET", "HEAD"):  # /papers/{id}.md: a paper as Markdown
            raise community_response(community.fixed(segments, query, token, headers.get("host", ""))
                                     or (404, {"error": "Not Found"}, {}))
        repo_type = "model"
        if segments[0] in ("datasets", "spaces"):
            repo_type, segments = TYPES[segments[0]], segments[1:]
        if "resolve" not in segments[:3] or method not in ("GET", "HEAD"):
            raise hub_error(404, None, "Not Found")
        at = segments.index("resolve")
        repo_id = "/".join(segments[:at])
        if len(segments) < at + 3:
            raise hub_error(404, "EntryNotFound", "missing file path")
        rev, path = unquote(segments[at + 1]), unquote("/".join(segments[at + 2:]))
        self.counts[f"resolve_{method.lower()}"] += 1
        repo = self.readable_repo(repo_type, repo_id, token)
        commit = self.commit(repo, rev)
        file = commit.files.get(path)
        base = {"x-repo-commit": commit.sha, "accept-ranges": "bytes"}
        if file is None:
            raise hub_error(404, "EntryNotFound", f"{path} does not exist at {rev}", base)
        if not file.lfs:  # the real Hub: a same-host relative 307 to its resolve-cache route
            location = f"/api/resolve-cache/{repo_type}s/{repo_id}/{commit.sha}/{quote(path)}"
            raise Response(307, {**base, "location": location, "etag": f'"{file.etag}"',
                                 "x-linked-size": str(file.size), "x-linked-etag": f'"{file.etag}"'})
        issued = f"{time.time():.6f}"
        expires = math.ceil(time.time() + self.url_ttl)
        signature = self.sign(file.sha256, expires, issued)
        cdn = f"http://127.0.0.1:{self.cdn_port}/lfs/{file.sha256}?expires={expires}&t={issued}&sig={signature}"
        xet_hash = file.entry()["xetHash"]
        xet_route = f"/api/{repo_type}s/{repo_id}/xet-read-token/{commit.sha}"
        raise Response(302, {**base, "location": cdn, "etag": f'"{file.oid}"', "x-linked-etag": f'"{file.etag}"',
                             "x-linked-size": str(file.size), "x-xet-hash": xet_hash,
                             "x-xet-refresh-route": xet_route,
                             "link": f'<http://{headers.get("host", "")}{xet_route}>; rel="xet-auth"'})

    def resolve_cache(self, method: str, segments: list[str], headers: Headers,
                      token: str | None) -> tuple[RepoFile, int, int, int, Headers]:
        repo_type = TYPES.get(segments[0]) if segments else None
        if repo_type is None or len(segments) < 4:
            raise hub_error(404, None, "Not Found")
        self.counts[f"resolve_cache_{method.lower()}"] += 1
        rest = segments[1:]
        n = 2 if (repo_type, "/".join(rest[:2])) in self.files.repos else 1
        repo = self.readable_repo(repo_type, "/".join(rest[:n]), token)
        commit = self.commit(repo, unquote(rest[n]))
        path = unquote("/".join(rest[n + 1:]))
        file = commit.files.get(path)
        if file is None:
            raise hub_error(404, "EntryNotFound", f"{path} does not exist", {"x-repo-commit": commit.sha})
        out = {"x-repo-commit": commit.sha, "etag": f'"{file.etag}"', "content-type": "application/octet-stream",
               "x-emulator-file": f"{repo.repo_type}:{repo.repo_id}/{path}"}
        return (file, *self.byte_range(file, headers, out), out)

    def readable_repo(self, repo_type: str, repo_id: str, token: str | None) -> Repo:
        repo = self.files.repos.get((repo_type, repo_id))
        if repo is None or not repo.visible_to(token):
            # The Hub says 401 without a token (it cannot tell you the repo exists) and 404 with one.
            raise hub_error(404 if token else 401, "RepoNotFound", "Repository not found")
        if not repo.readable_by(token):
            raise hub_error(403 if token else 401, "GatedRepo",
                            f"Access to model {repo_id} is restricted. You must have access to it and be authenticated"
                            " to access it. Please log in." if not token else
                            f"Access to model {repo_id} is restricted and you are not in the authorized list.")
        return repo

    def commit(self, repo: Repo, rev: str) -> Commit:
        commit = repo.resolve(rev)
        if commit is None:
            raise hub_error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    # --- API ---------------------------------------------------------------------------------------------------

    def api(self, method: str, segments: list[str], query: dict[str, list[str]], headers: Headers, body: bytes,
            token: str | None) -> Response:
        if segments == ["agent-harnesses"]:
            return json_response({"standardEnvVars": [], "harnesses": {}})
        if method in ("GET", "HEAD") and (answer := community.fixed(segments, query, token,
                                                                    headers.get("host", ""))) is not None:
            return community_response(answer)
        repo_type = TYPES.get(segments[0]) if segments else None
        if repo_type is not None and len(segments) == 1 and method in ("GET", "HEAD"):
            return self.list_repos(repo_type, query, headers, token)
        if repo_type is None or len(segments) < 2:
            return hub_error(404, None, "Not Found")
        rest = segments[1:]
        n = 2 if len(rest) >= 2 and (rest[1] not in API_ACTIONS or (repo_type, "/".join(rest[:2])) in
                                     self.files.repos) else 1
        repo_id, action, args = "/".join(rest[:n]), (rest[n] if len(rest) > n else ""), rest[n + 1:]
        self.counts[f"api_{action or 'info'}"] += 1
        if action in ("xet-read-token", "xet-write-token"):
            repo = self.readable_repo(repo_type, repo_id, token)
            return Response(200, {"x-xet-cas-url": f"http://127.0.0.1:{self.cdn_port}", "x-xet-access-token": "xet",
                                  "x-xet-token-expiration": str(int(time.time()) + 600),
                                  "content-type": "application/json"}, b"{}")
        repo = self.readable_repo(repo_type, repo_id, token)
        if action not in API_ACTIONS and action not in ("", "parquet", "treesize"):
            answer = community.repo_route(repo_type, repo_id, action, [unquote(a) for a in args], query, token,
                                          headers.get("host", ""))
            return community_response(answer) if answer is not None else hub_error(404, None, "Not Found")
        if action == "parquet" and repo_type == "dataset":
            self.counts["api_parquet"] += 1
            try:
                viewer_host.hub_parquet(repo, [unquote(a) for a in args], f"http://{headers.get('host', '')}")
            except viewer_host.ViewerAnswer as answer:
                if answer.status == 302:
                    return Response(302, answer.headers)
                return Response(answer.status, {"content-type": "application/json", **answer.headers},
                                json.dumps(answer.body).encode())
        if action == "refs":
            return json_response(self.refs(repo, bool(query.get("include_prs"))))
        if action in ("", "revision"):
            commit = self.commit(repo, unquote(args[0]) if args else "main")
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            info = self.info(repo, commit, blobs)
            if query.get("securityStatus", ["false"])[0].lower() == "true":  # model_info(securityStatus=True)
                info["securityRepoStatus"] = {
                    "scansDone": repo.scans_done,
                    "filesWithIssues": [{"path": p, "level": level} for p, level in sorted(repo.security.items())
                                        if repo.scans_done and p in commit.files and level in ("unsafe", "caution")]}
            return json_response(info)
        if not args:
            return hub_error(404, None, "Not Found")
        commit = self.commit(repo, unquote(args[0]))
        if action == "tree":
            base = unquote("/".join(args[1:])).strip("/")
            return self.tree(repo, commit, base, query, headers)
        if action == "paths-info" and method == "POST":
            paths = self.paths_from_body(body, headers)
            entries = [e for p in paths if (e := self.entry(commit, p.strip("/"))) is not None]
            if self.expand_from_body(body, headers):  # the Hub's per-file scan (RepoFile.security)
                for e in entries:
                    if e["type"] == "file":
                        level = repo.security.get(e["path"], "safe") if repo.scans_done else "unscanned"
                        # The keys huggingface_hub's RepoFile reads (status, avScan, pickleImportScan).
                        e["securityFileStatus"] = {
                            "status": level, "avScan": {"virusFound": False, "virusNames": None},
                            "pickleImportScan": {"highestSafetyLevel": "dangerous" if level == "unsafe"
                                                 else "innocuous", "imports": []}}
            return json_response(entries)
        if action == "commits":
            return json_response([{"id": commit.sha, "title": commit.title, "message": "", "authors": [],
                                   "date": LAST_MODIFIED}])
        return hub_error(404, None, "Not Found")

    def list_repos(self, repo_type: str, query: dict[str, list[str]], headers: Headers,
                   token: str | None) -> Response:
        """``/api/{models,datasets,spaces}``: the Hub's list API. ``author`` (exact), ``search`` (substring of the
        id, case-insensitive), every ``filter`` value among the repo's tags (or its id), private repos only for a
        token that may see them; pages of ``limit`` (at most 1000; default the emulator's page size) with the
        Hub's ``Link: <...cursor=...>; rel="next"``."""
        self.counts["api_list"] += 1
        author = (query.get("author") or [""])[0]
        search = (query.get("search") or [""])[0].lower()
        filters = [f for value in query.get("filter", []) for f in value.split(",") if f]
        rows = []
        for (kind, repo_id), repo in sorted(self.files.repos.items()):
            if kind != repo_type or not repo.visible_to(token):
                continue
            if author and ("/" not in repo_id or repo_id.split("/")[0] != author):
                continue
            if search and search not in repo_id.lower():
                continue
            if not all(f in repo.hub_tags or f == repo_id for f in filters):
                continue
            main = repo.commits[repo.branches["main"]] if "main" in repo.branches else None
            row: dict[str, Any] = {"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id,
                                   "author": repo_id.split("/")[0] if "/" in repo_id else None,
                                   "private": repo.private, "gated": "manual" if repo.gated else False,
                                   "downloads": 7, "likes": 1, "tags": list(repo.hub_tags), "createdAt": CREATED_AT}
            if repo_type == "model":
                row["modelId"] = repo_id
            if repo_type == "dataset" and main is not None:
                row["sha"] = main.sha
            rows.append(row)
        try:
            limit = min(int((query.get("limit") or [str(self.page_size)])[0]), 1000)
            cursor = int((query.get("cursor") or ["0"])[0] or 0)
        except ValueError:
            return hub_error(400, None, "Invalid limit or cursor")
        limit = max(limit, 1)
        out: Headers = {}
        if cursor + limit < len(rows):
            params = [(k, v) for k, values in query.items() if k != "cursor" for v in values]
            params.append(("cursor", str(cursor + limit)))
            qs = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in params)
            out["link"] = f'<http://{headers.get("host", "")}/api/{repo_type}s?{qs}>; rel="next"'
        return json_response(rows[cursor: cursor + limit], out)

    @staticmethod
    def paths_from_body(body: bytes, headers: Headers) -> list[str]:
        if headers.get("content-type", "").startswith("application/json"):
            return list(json.loads(body or b"{}").get("paths", []))
        return parse_qs(body.decode(), keep_blank_values=True).get("paths", [])

    @staticmethod
    def expand_from_body(body: bytes, headers: Headers) -> bool:
        if headers.get("content-type", "").startswith("application/json"):
            return bool(json.loads(body or b"{}").get("expand"))
        return parse_qs(body.decode()).get("expand", ["false"])[0].lower() == "true"

    def info(self, repo: Repo, commit: Commit, blobs: bool) -> dict[str, Any]:
        siblings = []
        for path, file in sorted(commit.files.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=file.size, blobId=file.oid)
                if file.lfs:
                    sibling["lfs"] = {"sha256": file.sha256, "size": file.size, "pointerSize": len(file.pointer)}
            siblings.append(sibling)
        return {"_id": commit.sha[:24], "id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": commit.sha,
                "private": repo.private, "gated": "manual" if repo.gated else False, "disabled": False,
                "downloads": 7, "likes": 1, "tags": [], "lastModified": LAST_MODIFIED, "createdAt": CREATED_AT,
                "siblings": siblings, "usedStorage": sum(f.size for f in commit.files.values()),
                **self.card(repo, commit)}

    @staticmethod
    def card(repo: Repo, commit: Commit) -> dict[str, Any]:
        if repo.card_license is not None:
            return {"cardData": {"license": repo.card_license}} if repo.card_license else {"cardData": {}}
        return {"cardData": {"license": "mit"}} if "README.md" in commit.files else {}

    def refs(self, repo: Repo, include_prs: bool) -> dict[str, Any]:
        def ref(kind: str, name: str, sha: str) -> dict[str, str]:
            return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}

        out: dict[str, Any] = {"branches": [ref("heads", n, s) for n, s in repo.branches.items()],
                               "converts": [ref("convert", n, s) for n, s in repo.converts.items()],
                               "tags": [ref("tags", n, s) for n, s in repo.tags.items()]}
        if include_prs:
            out["pullRequests"] = [{"name": n.rsplit("/", 1)[-1], "ref": n, "targetCommit": s}
                                   for n, s in repo.prs.items()]
        return out

    def entry(self, commit: Commit, path: str) -> dict[str, Any] | None:
        if path in commit.files:
            return commit.files[path].entry()
        if path in commit.dirs():
            return {"type": "directory", "oid": hashlib.sha1(f"{commit.sha}/{path}".encode()).hexdigest(),
                    "size": 0, "path": path}
        return None

    def tree(self, repo: Repo, commit: Commit, base: str, query: dict[str, list[str]], headers: Headers) -> Response:
        if base and base not in commit.dirs():
            return hub_error(404, "EntryNotFound", f"{base} does not exist", {"x-repo-commit": commit.sha})
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{base}/" if base else ""
        depth = prefix.count("/")
        paths = sorted(p for p in commit.dirs() | set(commit.files)
                       if p.startswith(prefix) and (recursive or p.count("/") == depth))
        cursor = int(query.get("cursor", ["0"])[0] or 0)
        page = paths[cursor: cursor + self.page_size]
        out: Headers = {}
        if cursor + self.page_size < len(paths):
            params = {k: v[0] for k, v in query.items() if k != "cursor"}
            params["cursor"] = str(cursor + self.page_size)
            qs = "&".join(f"{k}={quote(v)}" for k, v in params.items())
            path = f"/api/{repo.repo_type}s/{repo.repo_id}/tree/{quote(commit.sha)}"
            path += f"/{quote(base, safe='')}" if base else ""
            out["link"] = f'<http://{headers.get("host", "")}{path}?{qs}>; rel="next"'
        return json_response([e for p in page if (e := self.entry(commit, p)) is not None], out)

    # --- CDN host ----------------------------------------------------------------------------------------------

    @staticmethod
    def sign(sha256: str, expires: int, issued: str) -> str:
        return hmac.new(SECRET, f"{sha256}:{expires}:{issued}".encode(), hashlib.sha256).hexdigest()[:32]

    def cdn(self, method: str, raw: str, query: dict[str, list[str]],
            headers: Headers) -> tuple[RepoFile, int, int, int, Headers]:
        self.counts[f"cdn_{method.lower()}"] += 1
        sha256 = raw.removeprefix("/lfs/")
        try:
            expires, issued = int(query["expires"][0]), float(query["t"][0])
            good = hmac.compare_digest(query["sig"][0], self.sign(sha256, expires, query["t"][0]))
        except (KeyError, ValueError):
            good, expires, issued = False, 0, 0.0
        if not good or expires < time.time() or issued < self.faults.expired_before:
            # What S3/CloudFront answer for an expired or forged presigned URL.
            raise Response(403, {"content-type": "application/xml"},
                           b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>")
        for (repo_type, repo_id), repo in self.files.repos.items():
            for commit in repo.commits.values():
                for path, file in commit.files.items():
                    if file.lfs and file.sha256 == sha256:
                        out = {"etag": f'"{sha256}"', "content-type": "application/octet-stream",
                               "x-emulator-file": f"{repo_type}:{repo_id}/{path}"}
                        return (file, *self.byte_range(file, headers, out), out)
        raise Response(404, {}, b"NoSuchKey")

    @staticmethod
    def byte_range(file: RepoFile, headers: Headers, out: Headers) -> tuple[int, int, int]:
        """``(start, end, status)`` for the request's Range; 416 past the end."""
        out["accept-ranges"] = "bytes"
        spec = headers.get("range", "")
        if not spec.startswith("bytes="):
            return 0, file.size, 200
        first, _, last = spec.removeprefix("bytes=").split(",")[0].partition("-")
        try:
            if first:
                start, end = int(first), (int(last) + 1 if last else file.size)
            else:
                start, end = max(file.size - int(last), 0), file.size
        except ValueError:
            return 0, file.size, 200
        if start >= file.size or start >= end:
            raise Response(416, {"content-range": f"bytes */{file.size}"})
        end = min(end, file.size)
        out["content-range"] = f"bytes {start}-{end - 1}/{file.size}"
        return start, end, 206


def community_response(answer: community.Answer) -> Response:
    status, body, headers = answer
    if isinstance(body, str):
        return Response(status, {"content-type": "text/markdown; charset=utf-8", **headers}, body.encode())
    return Response(status, {"content-type": "application/json", **headers}, json.dumps(body).encode())


def json_response(data: Any, headers: Headers | None = None) -> Response:
    return Response(200, {"content-type": "application/json", **(headers or {})}, json.dumps(data).encode())

"""A fake upstream Hub at the upstream client's own interface, for in-process tests of the service and the fill.

:class:`FakeUpstream` answers what the service and the fill call on :class:`mirror.upstream.UpstreamClient`
(``head_file``, ``open_file``, ``stream_file``, ``api``, ``relay``, ``error``, ``settings``, ``aclose``) with the
values of :mod:`mirror.upstream` (``UpstreamFileMeta``, ``FileBody``, ``UpstreamAnswer``, ``RelayBody``), and raises
the mirror's own exceptions the way the real client does (its error answers go through the same ``hub_error``).
No HTTP transport is faked: the fake stands where the client stands.

It holds a tiny Hub in memory: repos with branches, commits of files, who may read a gated or private repo. Faults are
set on it: ``down`` (every request fails as an unreachable upstream does), ``corrupt`` (bytes that do not match the
etag), ``body`` (a hook giving each opened file's :class:`FakeBody`: a drop mid-way, a read held until released).
Every request is counted in ``calls`` (method name, repo id, revision or commit, path).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import httpx

from mirror import hf
from mirror.config import Settings
from mirror.errors import MirrorError, UpstreamTimeout, UpstreamUnavailable
from mirror.upstream import FileBody, RelayBody, RepoGuard, UpstreamAnswer, UpstreamFileMeta, hub_error

PIECE = 16 * 1024  # the most a fake body gives per read


def git_blob_sha1(content: bytes) -> str:
    """The Hub's etag of a regular (non-LFS) file: the git blob hash."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class FakeFile:
    content: bytes
    lfs: bool

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.content).hexdigest() if self.lfs else git_blob_sha1(self.content)


@dataclass
class FakeRepo:
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, FakeFile]] = field(default_factory=dict)
    private: bool = False
    gated: bool = False
    readers: set[str] = field(default_factory=set)  # the tokens that may read a private or gated repo


class FakeBody:
    """The bytes of a file opened for a fill, read by the fill's thread (:class:`mirror.upstream.BulkBody`'s
    methods). It may drop after ``drop_after`` bytes, or hold its reads at ``hold_at`` until ``release`` (a fill
    in progress that readers can join)."""

    def __init__(self, data: bytes, *, drop_after: int | None = None, hold_at: int | None = None) -> None:
        self.data = data
        self.position = 0
        self.drop_after = drop_after
        self.hold_at = hold_at
        self.held = threading.Event()  # set once a read reached ``hold_at``
        self.released = threading.Event()
        self.aborted = threading.Event()

    def release(self) -> None:
        self.released.set()

    def read_some(self, size: int) -> bytes:
        if self.drop_after is not None and self.position >= self.drop_after:
            raise _reset()
        if self.hold_at is not None and self.position >= self.hold_at and not self.released.is_set():
            self.held.set()
            while not self.released.wait(0.05):
                if self.aborted.is_set():
                    raise _reset()
        limit = min(size, PIECE)
        for mark in (self.drop_after, self.hold_at if not self.released.is_set() else None):
            if mark is not None and mark > self.position:
                limit = min(limit, mark - self.position)
        data = self.data[self.position:self.position + limit]
        self.position += len(data)
        return data

    def read(self, size: int) -> bytes:
        out = bytearray()
        while len(out) < size and (data := self.read_some(size - len(out))):
            out += data
        return bytes(out)

    def abort(self) -> None:
        self.aborted.set()

    def close(self) -> None:
        pass


def _reset() -> UpstreamUnavailable:
    return UpstreamUnavailable("upstream read failed: connection reset (fake)")


@dataclass(frozen=True)
class Opened:
    """One ``open_file`` request: what was asked."""

    path: str
    commit: str
    start: int
    end: int | None
    token: str | None


BodyHook = Callable[[Opened, bytes], FakeBody]


def whole_body(opened: Opened, data: bytes) -> FakeBody:
    return FakeBody(data)


def _answer(status: int, headers: dict[str, str] | None = None, body: bytes = b"", reason: str = "") -> UpstreamAnswer:
    return UpstreamAnswer(status, httpx.Headers(headers or {}), body, reason)


class FakeUpstream:
    """The Hub the service and the fill see through the upstream client's interface; see the module's docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base = settings.upstream
        self.display = settings.upstream_display
        self.rate = None  # no bandwidth bucket: the fill's reader takes nothing
        self.healthy: bool | None = None
        self.last_error: str | None = None
        self.repos: dict[hf.RepoRef, FakeRepo] = {}
        self.down = False
        self.corrupt = False
        self.body: BodyHook = whole_body
        self.calls: Counter[tuple[str, ...]] = Counter()
        self.opened: list[Opened] = []
        self.bodies: list[FakeBody] = []
        self._commits = itertools.count(1)

    # --- the tiny Hub ---------------------------------------------------------------------------------------------

    def push(self, repo: hf.RepoRef, files: dict[str, bytes], *, branch: str = "main", lfs: tuple[str, ...] = (),
             private: bool = False, gated: bool = False, readers: tuple[str, ...] = ()) -> str:
        """A new commit of ``files`` on ``branch`` (the repo created on its first push); returns the commit.
        ``lfs``: the paths stored as LFS files (etag sha256); the others are regular (git blob sha1)."""
        fake = self.repos.setdefault(repo, FakeRepo(private=private, gated=gated, readers=set(readers)))
        commit = hashlib.sha1(f"{repo.key}:{next(self._commits)}".encode()).hexdigest()
        fake.commits[commit] = {path: FakeFile(content, path in lfs) for path, content in files.items()}
        fake.refs[branch] = commit
        return commit

    def file(self, repo: hf.RepoRef, path: str, revision: str = "main") -> FakeFile:
        fake = self.repos[repo]
        return fake.commits[fake.refs.get(revision, revision)][path]

    def count(self, method: str) -> int:
        """How many ``method`` requests were sent (any repo, any path)."""
        return sum(n for key, n in self.calls.items() if key[0] == method)

    def _reach(self, *call: str) -> None:
        self.calls[call] += 1
        if self.down:
            self.healthy = False
            raise UpstreamTimeout(f"Upstream {self.display} is unreachable: ConnectError (fake)")
        self.healthy = True

    def _refusal(self, repo: hf.RepoRef, token: str | None) -> UpstreamAnswer | None:
        """The Hub's answer to a caller who may not read ``repo`` (none when they may)."""
        fake = self.repos.get(repo)
        if fake is None or (fake.private and token not in fake.readers):
            return _answer(401, {hf.H_ERROR_CODE: "RepoNotFound", hf.H_ERROR_MESSAGE: "Repository Not Found"})
        if fake.gated and token not in fake.readers:
            return _answer(401 if token is None else 403, {hf.H_ERROR_CODE: "GatedRepo",
                                                           hf.H_ERROR_MESSAGE: "Access to this repo is restricted"})
        return None

    def _lookup(self, repo: hf.RepoRef, revision: str, path: str,
                token: str | None) -> tuple[str, FakeFile] | UpstreamAnswer:
        refusal = self._refusal(repo, token)
        if refusal is not None:
            return refusal
        fake = self.repos[repo]
        commit = fake.refs.get(revision, revision)
        if commit not in fake.commits:
            return _answer(404, {hf.H_ERROR_CODE: "RevisionNotFound", hf.H_ERROR_MESSAGE: "Invalid rev id"})
        found = fake.commits[commit].get(path)
        if found is None:
            return _answer(404, {hf.H_ERROR_CODE: "EntryNotFound", hf.H_ERROR_MESSAGE: f"{path} does not exist",
                                 hf.H_REPO_COMMIT: commit})
        return commit, found

    # --- the client's interface -----------------------------------------------------------------------------------

    def error(self, response: UpstreamAnswer, *, resolve: bool, infer: bool = True) -> MirrorError:
        return hub_error(response, resolve=resolve, infer=infer)

    async def head_file(self, repo: hf.RepoRef, revision: str, path: str, token: str | None,
                        guard: RepoGuard | None = None) -> UpstreamFileMeta:
        self._reach("head_file", repo.repo_id, revision, path)
        found = self._lookup(repo, revision, path, token)
        if isinstance(found, UpstreamAnswer):
            raise self.error(found, resolve=True)
        commit, file = found
        return UpstreamFileMeta(commit=commit, etag=file.etag, size=len(file.content), cdn_url=None)

    @asynccontextmanager
    async def open_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int = 0,
                        cdn_url: str | None = None, end: int | None = None) -> AsyncIterator[FileBody]:
        self._reach("open_file", repo.repo_id, commit, path)
        found = self._lookup(repo, commit, path, token)
        if isinstance(found, UpstreamAnswer):
            raise self.error(found, resolve=True)
        content = found[1].content
        if self.corrupt:
            content = bytes(b ^ 0xFF for b in content)
        opened = Opened(path, commit, start, end, token)
        self.opened.append(opened)
        body = self.body(opened, content[start:end])
        self.bodies.append(body)
        yield FileBody(body, None, None)  # type: ignore[arg-type]  # a FakeBody reads as a BulkBody does

    @asynccontextmanager
    async def stream_file(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, start: int, end: int,
                          chunk_size: int) -> AsyncIterator[RelayBody]:
        self._reach("stream_file", repo.repo_id, commit, path)
        found = self._lookup(repo, commit, path, token)
        if isinstance(found, UpstreamAnswer):
            raise self.error(found, resolve=True)
        data = found[1].content[start:end + 1]

        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, len(data), chunk_size):
                yield data[offset:offset + chunk_size]

        yield RelayBody(206 if start else 200, httpx.Headers({"content-length": str(len(data))}), chunks())

    async def api(self, method: str, path_qs: str, token: str | None, form: list[tuple[str, str]] | None = None,
                  headers: dict[str, str] | None = None, guard: RepoGuard | None = None) -> UpstreamAnswer:
        """``/api/{type}s/{id}`` (info), ``.../revision/{rev}`` and ``.../tree/{rev}[/{path}]``; else a 404."""
        path = urlsplit(path_qs).path
        self._reach("api", path)
        target = hf.parse_api(path)
        if target is None or target.sub not in ("", "revision", "tree"):
            return _answer(404, {hf.H_ERROR_MESSAGE: "Not Found"}, reason="Not Found")
        refusal = self._refusal(target.repo, token)
        if refusal is not None:
            return refusal
        fake = self.repos[target.repo]
        commit = fake.refs.get(target.revision or "main", target.revision or "main")
        if commit not in fake.commits:
            return _answer(404, {hf.H_ERROR_CODE: "RevisionNotFound", hf.H_ERROR_MESSAGE: "Invalid rev id"})
        files = fake.commits[commit]
        if target.sub == "tree":
            prefix = unquote(target.path).strip("/")
            listing = [{"type": "file", "path": p, "oid": f.etag if not f.lfs else git_blob_sha1(b""),
                        "size": len(f.content), **({"lfs": {"oid": f.etag, "size": len(f.content)}} if f.lfs else {})}
                       for p, f in sorted(files.items()) if not prefix or p.startswith(prefix + "/")]
            body = json.dumps(listing).encode()
        else:
            body = json.dumps({"id": target.repo.repo_id, "sha": commit, "private": fake.private,
                               "gated": "auto" if fake.gated else False,
                               "siblings": [{"rfilename": p} for p in sorted(files)]}).encode()
        return _answer(200, {"content-type": "application/json", hf.H_REPO_COMMIT: commit}, body)

    @asynccontextmanager
    async def relay(self, path_qs: str, token: str | None) -> AsyncIterator[RelayBody]:
        answer = await self.api("GET", path_qs, token)
        if answer.status_code >= 400:
            raise self.error(answer, resolve=False, infer=False)

        async def chunks() -> AsyncIterator[bytes]:
            yield answer.content

        yield RelayBody(answer.status_code, answer.headers, chunks())

    def scrub(self, text: str) -> str:
        return text

    async def aclose(self) -> None:
        pass

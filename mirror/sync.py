"""``hf-mirror sync --manifest sync.toml``: pre-fetch a declared list of repos into the mirror's cache.

Two ways to reach the cache:

- ``--cache-dir DIR`` (default): the parts are built as the server builds them (:class:`mirror.app.Mirror`), and
  every blob is fetched by :meth:`mirror.fill.FillManager.fetch`, the server's own fill path. Its cross-process
  lease means a running server and a sync never download one blob twice, and a running server sees each blob the
  moment it is committed. The metadata the server needs to answer with upstream down is written too, through
  :class:`mirror.service.MirrorService` (so cache keys and JSON rewriting are the server's): the ``/revision/{rev}``
  JSON and ref, the recursive tree listing (every page), a file entry per path, non-recursive listings of every
  directory, and the "missing" answers for the probes ``datasets`` sends. The manifest's repos are pinned.
- ``--mirror URL``: a running mirror is driven over HTTP (revision, tree, then a GET of every file, bytes
  discarded); the mirror's own fill path does the work. The mirror has no pin endpoint: pins need ``--cache-dir``.

Resumable (a fill resumes from the partial file an interrupted run left), idempotent (a second run fetches nothing
and says so), ``--dry-run`` lists what would be fetched. Exit code 1 when any repo failed, with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import hashlib
import json
import logging
import os
import re
import signal
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import httpx

from mirror import hf
from mirror.access import Caller
from mirror.config import ConfigError, Settings, format_size
from mirror.errors import BadRequest, HubError, MirrorError
from mirror.fill import Fill, FillManager, FillSpec
from mirror.index import ApiEntry, FileEntry
from mirror.parts import build_parts
from mirror.service import ApiResult, _blob_key, _normalise_query
from mirror.upstream import hub_error

log = logging.getLogger("hf_mirror.sync")

DEFAULT_CONCURRENCY = 4
_REPO_KEYS = frozenset({"type", "id", "revisions", "allow", "ignore", "token_env"})
_TOP_KEYS = frozenset({"concurrency", "repo"})
_LINK_NEXT_RE = re.compile(r"<([^>]*)>\s*;[^,]*rel=\"?next\"?")
# Paths the clients probe (HEAD) whose absence must be answerable with upstream down (datasets, §8 of the protocol).
_PROBED_PATHS = (".huggingface.yaml", "dataset_infos.json", "README.md")
_TREE_QUERY = [("recursive", "true"), ("expand", "false")]
_LS_QUERY = [("recursive", "false"), ("expand", "false")]


# --- manifest ------------------------------------------------------------------------------------------------------


class ManifestError(ConfigError):
    """The manifest cannot be used; the message says where and why."""


@dataclass(frozen=True)
class RepoSpec:
    repo: hf.RepoRef
    revisions: tuple[str, ...]
    allow: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    token_env: str | None = None

    @property
    def label(self) -> str:
        return f"{self.repo.type.value}:{self.repo.repo_id}"


@dataclass(frozen=True)
class Manifest:
    path: Path
    repos: tuple[RepoSpec, ...]
    concurrency: int | None = None

    @property
    def source(self) -> str:
        """The name pins are recorded under (the manifest's absolute path)."""
        return str(self.path.resolve())


def _patterns(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ManifestError(f"{where}: must be a list of glob patterns")
    return tuple(value)


def parse_manifest(data: dict[str, Any], path: Path) -> Manifest:
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ManifestError(f"{path}: unknown key(s) {', '.join(unknown)} (expected concurrency and [[repo]] tables)")
    concurrency = data.get("concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise ManifestError(f"{path}: concurrency must be a positive integer")
    tables = data.get("repo", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: repos are [[repo]] tables")
    repos: list[RepoSpec] = []
    for number, table in enumerate(tables, 1):
        where = f"{path}: [[repo]] #{number}"
        unknown = sorted(set(table) - _REPO_KEYS)
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}")
        repo_type = table.get("type", "model")
        try:
            kind = hf.RepoType(repo_type)
        except ValueError:
            raise ManifestError(f"{where}: type must be model, dataset or space, not {repo_type!r}") from None
        repo_id = table.get("id")
        if not isinstance(repo_id, str):
            raise ManifestError(f"{where}: id (\"namespace/name\") is required")
        try:
            hf.validate_repo_id(repo_id)
        except BadRequest as exc:
            raise ManifestError(f"{where}: {exc.message}") from None
        where = f"{path}: {kind.value}:{repo_id}"
        revisions = table.get("revisions", ["main"])
        if isinstance(revisions, str):
            revisions = [revisions]
        if not isinstance(revisions, list) or not revisions or not all(isinstance(r, str) for r in revisions):
            raise ManifestError(f"{where}: revisions must be a non-empty list of branches, tags or commit shas")
        for revision in revisions:
            try:
                hf.validate_revision(revision)
            except BadRequest as exc:
                raise ManifestError(f"{where}: {exc.message}") from None
        token_env = table.get("token_env")
        if token_env is not None and (not isinstance(token_env, str) or not token_env):
            raise ManifestError(f"{where}: token_env must be the name of an environment variable")
        repos.append(RepoSpec(hf.RepoRef(kind, repo_id), tuple(dict.fromkeys(revisions)),
                              _patterns(table.get("allow"), f"{where}: allow"),
                              _patterns(table.get("ignore"), f"{where}: ignore"), token_env))
    seen: set[str] = set()
    for spec in repos:
        if spec.label in seen:
            raise ManifestError(f"{path}: {spec.label} is listed twice; put all its revisions in one table")
        seen.add(spec.label)
    return Manifest(path, tuple(repos), concurrency)


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {path} is not valid TOML: {exc}") from None
    return parse_manifest(data, Path(path))


# --- file selection (huggingface_hub's allow_patterns / ignore_patterns semantics) ---------------------------------


def _dir_wildcard(pattern: str) -> str:
    pattern = pattern.replace("\\", "/")
    return pattern + "*" if pattern.endswith("/") else pattern


def select(paths: Iterable[str], allow: Iterable[str] | None, ignore: Iterable[str] | None) -> list[str]:
    """fnmatchcase, ``*`` crossing ``/``, a trailing ``/`` meaning the whole directory: as snapshot_download."""
    allowed = [_dir_wildcard(p) for p in allow] if allow is not None else None
    ignored = [_dir_wildcard(p) for p in ignore] if ignore is not None else None
    out = []
    for path in paths:
        if allowed is not None and not any(fnmatch.fnmatchcase(path, p) for p in allowed):
            continue
        if ignored is not None and any(fnmatch.fnmatchcase(path, p) for p in ignored):
            continue
        out.append(path)
    return out


# --- plan and results ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    path: str
    etag: str
    size: int
    lfs: bool


@dataclass
class RevisionJob:
    spec: RepoSpec
    revision: str
    token: str | None = None
    commit: str | None = None
    files: list[RemoteFile] = field(default_factory=list)  # selected by the patterns
    missing: list[RemoteFile] = field(default_factory=list)  # selected and not cached
    fetched: int = 0
    fetched_bytes: int = 0
    failed_files: int = 0
    error: str | None = None
    note: str | None = None

    @property
    def label(self) -> str:
        return f"{self.spec.label}@{self.revision}"


def tree_files(entries: list[dict[str, Any]]) -> list[RemoteFile]:
    """Tree entries -> files: the etag is ``lfs.oid`` (sha256) for LFS files, ``oid`` (git blob sha1) otherwise."""
    files = []
    for entry in entries:
        if entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else None
        oid = (lfs or {}).get("oid") or entry.get("oid")
        if not isinstance(oid, str) or not oid or not isinstance(entry.get("path"), str):
            continue
        files.append(RemoteFile(entry["path"], _blob_key(oid), int(entry.get("size") or 0), lfs is not None))
    return files


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, HubError):
        return f"{exc.status} {exc.code or ''}: {exc.message}".replace("  ", " ")
    if isinstance(exc, MirrorError):
        return exc.message
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


# --- progress ------------------------------------------------------------------------------------------------------


class Reporter(Protocol):
    def start(self, total_bytes: int) -> None: ...
    def file_started(self, key: str, label: str, size: int) -> None: ...
    def file_progress(self, key: str, done: int) -> None: ...
    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None: ...
    def info(self, message: str) -> None: ...
    def stop(self) -> None: ...


class PlainReporter:
    """Log lines, for cron and journald."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self._started: dict[str, float] = {}

    def _print(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=self.stream, flush=True)

    def start(self, total_bytes: int) -> None:
        pass

    def file_started(self, key: str, label: str, size: int) -> None:
        self._started[key] = time.monotonic()
        self._print(f"fetching {label} ({format_size(size)})")

    def file_progress(self, key: str, done: int) -> None:
        pass

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        elapsed = time.monotonic() - self._started.pop(key, time.monotonic())
        word = ("cached" if message == "already cached" else "fetched") if ok else "FAILED"
        self._print(f"{word} {label}: {message} ({elapsed:.1f}s)")

    def info(self, message: str) -> None:
        self._print(message)

    def stop(self) -> None:
        pass


class RichReporter:
    """Progress bars on a terminal: one overall bar, one bar per file in flight."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = Console()
        self.progress = Progress(
            TextColumn("{task.description}", justify="left"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self._overall: Any = None
        self._tasks: dict[str, Any] = {}
        self._done: dict[str, int] = {}
        self._base: dict[str, int] = {}

    def start(self, total_bytes: int) -> None:
        self.progress.start()
        self._overall = self.progress.add_task("[bold]total", total=total_bytes)

    def file_started(self, key: str, label: str, size: int) -> None:
        short = label if len(label) <= 60 else "…" + label[-59:]
        self._tasks[key] = self.progress.add_task(short, total=size)
        self._done[key] = 0

    def file_progress(self, key: str, done: int) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        delta = done - self._done.get(key, 0)
        self._done[key] = done
        self.progress.update(task, completed=done)
        if self._overall is not None and delta:
            self.progress.advance(self._overall, delta)

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        task = self._tasks.pop(key, None)
        self._done.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)
        if not ok:
            self.progress.console.print(f"[red]FAILED[/red] {label}: {message}")

    def info(self, message: str) -> None:
        self.progress.console.print(message)

    def stop(self) -> None:
        self.progress.stop()


# --- backends ------------------------------------------------------------------------------------------------------


class Backend(Protocol):
    pins_supported: bool
    default_token: str | None

    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]: ...
    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]: ...
    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None: ...
    async def cached(self, job: RevisionJob, item: RemoteFile) -> bool: ...
    def partial_bytes(self, item: RemoteFile) -> int: ...
    async def fetch(self, job: RevisionJob, item: RemoteFile, progress: Callable[[int], None]) -> int | None:
        """Bytes taken from upstream for this file; ``None`` when it turned out to be cached already."""
        ...
    def pin(self, manifest: Manifest) -> None: ...
    async def aclose(self) -> None: ...


def _next_query(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]] | None:
    for name, value in headers:
        if name.lower() == "link":
            match = _LINK_NEXT_RE.search(value)
            if match:
                return parse_qsl(urlsplit(match.group(1)).query, keep_blank_values=True)
    return None


def _dirs_of(paths: Iterable[str]) -> set[str]:
    dirs: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def listing_pages(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Non-recursive listings (directory -> its direct children, directories first) from a recursive one."""
    known_dirs = {e["path"] for e in entries if e.get("type") == "directory" and isinstance(e.get("path"), str)}
    file_entries = [e for e in entries if e.get("type") == "file" and isinstance(e.get("path"), str)]
    all_dirs = known_dirs | _dirs_of(e["path"] for e in file_entries)
    by_path = {e["path"]: e for e in entries if isinstance(e.get("path"), str)}
    pages: dict[str, list[dict[str, Any]]] = {d: [] for d in all_dirs | {""}}
    for d in sorted(all_dirs):
        parent = d.rsplit("/", 1)[0] if "/" in d else ""
        pages[parent].append(by_path.get(d) or {"type": "directory", "oid": _fake_tree_oid(d), "size": 0, "path": d})
    for e in sorted(file_entries, key=lambda e: e["path"]):
        parent = e["path"].rsplit("/", 1)[0] if "/" in e["path"] else ""
        pages[parent].append(e)
    return pages


def _fake_tree_oid(path: str) -> str:
    return hashlib.sha1(f"tree {path}".encode()).hexdigest()


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

    def __init__(self, settings: Settings, *, dry_run: bool) -> None:
        self.settings = settings
        self.dry_run = dry_run
        self.default_token = settings.upstream_token
        self.parts = build_parts(settings, fill_manager=CountingFillManager)  # the server's wiring, store included
        assert isinstance(self.parts.fills, CountingFillManager)
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

    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]:
        data, _, outcome = await self._api(job, "revision", job.revision, "", [])
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not hf.is_commit(sha):
            raise MirrorError(f"upstream's /revision/{job.revision} answer carries no commit sha")
        note = None
        if outcome == "stale":
            note = "upstream unreachable: kept the cached commit"
        if not self.dry_run and not hf.is_commit(job.revision):
            if outcome == "stale":
                pass  # keep the ref's confirmation time: it was not confirmed now
            else:
                self.index.put_ref(job.spec.repo, job.revision, sha)
        return sha, note

    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]:
        assert job.commit is not None
        entries: list[dict[str, Any]] = []
        query: list[tuple[str, str]] | None = list(_TREE_QUERY)
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
            query = _next_query(headers)
        return entries

    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None:
        """Write what the server needs to answer for this revision with upstream down."""
        if self.dry_run:
            return
        repo = job.spec.repo
        commit = job.commit
        assert commit is not None
        all_files = tree_files(entries)
        for item in all_files:
            if self.index.get_file(repo, commit, item.path) is None:
                self.index.put_file(repo, FileEntry(commit, item.path, item.etag, item.size, lfs=item.lfs))
        present = {f.path for f in all_files} | {e.get("path") for e in entries}
        name = repo.repo_id.rsplit("/", 1)[-1]
        for probe in (*_PROBED_PATHS, f"{name}.py"):
            if probe not in present and self.index.get_file(repo, commit, probe) is None:
                self.index.put_file(repo, FileEntry(commit, probe, missing=True))
        # Non-recursive listings (HfFileSystem ls, datasets' data-dir probe), derived from the complete recursive
        # listing and stored under the keys the server computes: by commit (immutable; kept when already cached)
        # and by the branch or tag just resolved (with the recursive listing too, so list_repo_files(revision=
        # "main") is answered while upstream is down; the server refreshes these after the revision TTL).
        headers = (("content-type", "application/json"),)
        now = time.time()
        listings = [(directory, _LS_QUERY, children) for directory, children in listing_pages(entries).items()]
        keyed: list[tuple[str, bool]] = [(commit, True)]
        if job.revision != commit:
            keyed.append((job.revision, False))
        for revision, immutable in keyed:
            rows = listings if immutable else [("", _TREE_QUERY, entries), *listings]
            for directory, query, children in rows:
                route, key_query = f"tree:{directory}", _normalise_query(list(query), None)
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
        return self.fills.downloaded.pop(item.etag, 0)  # 0: another process (a server) filled it meanwhile

    def pin(self, manifest: Manifest) -> None:
        self.index.set_pins([spec.repo for spec in manifest.repos], source=manifest.source)

    @property
    def total_fetched(self) -> int:
        return int(self.metrics.bytes_fetched._value.get())  # noqa: SLF001

    async def aclose(self) -> None:
        # Fills are done when the run ends normally; on an interrupt they are cancelled now (and stay resumable).
        await self.parts.aclose(grace=0.5)


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

    def _api_url(self, job: RevisionJob, sub: str, revision: str) -> str:
        return f"{self.base}{job.spec.repo.api_path()}/{sub}/{quote(revision, safe='')}"

    async def resolve(self, job: RevisionJob) -> tuple[str, str | None]:
        data, response = await self._get_json(job, self._api_url(job, "revision", job.revision))
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not hf.is_commit(sha):
            raise MirrorError(f"the mirror's /revision/{job.revision} answer carries no commit sha")
        stale = response.headers.get(hf.H_MIRROR_CACHE) == "stale"
        return sha, "mirror's upstream unreachable: kept its cached commit" if stale else None

    async def list_tree(self, job: RevisionJob) -> list[dict[str, Any]]:
        assert job.commit is not None
        entries: list[dict[str, Any]] = []
        url: str | None = self._api_url(job, "tree", job.commit)
        params: list[tuple[str, str]] | None = list(_TREE_QUERY)
        seen: set[str] = set()
        while url is not None:
            if url in seen:
                raise MirrorError("the tree listing's pagination loops (a next link repeats a page)")
            seen.add(url)
            data, response = await self._get_json(job, url, params)
            if not isinstance(data, list):
                raise MirrorError("the tree listing is not a JSON list")
            entries.extend(e for e in data if isinstance(e, dict))
            link = response.headers.get("link") or ""
            match = _LINK_NEXT_RE.search(link)
            url, params = (match.group(1), None) if match else (None, None)
        return entries

    async def prepare(self, job: RevisionJob, entries: list[dict[str, Any]]) -> None:
        """Ask the mirror for what clients ask, so it caches it: info by commit, root listing."""
        if self.dry_run or job.commit is None:
            return
        for url, params in ((self._api_url(job, "revision", job.commit), None),
                            (self._api_url(job, "tree", job.commit), list(_LS_QUERY))):
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
        return response.status_code == 200 and response.headers.get(hf.H_MIRROR_CACHE) == "hit"

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
            if response.headers.get(hf.H_MIRROR_CACHE) == "hit":
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


# --- the run -------------------------------------------------------------------------------------------------------


@dataclass
class SyncResult:
    jobs: list[RevisionJob]
    fetched_files: int
    fetched_bytes: int
    to_fetch_files: int
    to_fetch_bytes: int
    dry_run: bool
    elapsed: float

    @property
    def failed(self) -> list[RevisionJob]:
        return [j for j in self.jobs if j.error]


async def _plan(backend: Backend, job: RevisionJob, reporter: Reporter) -> None:
    spec = job.spec
    if spec.token_env is not None:
        job.token = os.environ.get(spec.token_env) or None
        if job.token is None:
            job.error = f"the token variable {spec.token_env} is not set"
            return
    else:
        job.token = backend.default_token  # --upstream-token / HF_TOKEN, as the server uses for anonymous callers
    try:
        job.commit, job.note = await backend.resolve(job)
        entries = await backend.list_tree(job)
        all_files = tree_files(entries)
        chosen = set(select([f.path for f in all_files], spec.allow, spec.ignore))
        job.files = [f for f in all_files if f.path in chosen]
        if not job.files and (spec.allow is not None or spec.ignore is not None):
            job.note = "no file matches the allow/ignore patterns"
        await backend.prepare(job, entries)
        job.missing = [f for f in job.files if not await backend.cached(job, f)]
    except (MirrorError, httpx.HTTPError, ValueError) as exc:
        job.error = _error_text(exc)
        return
    if job.note and job.note.startswith(("upstream unreachable", "mirror's upstream")):
        job.error = job.note
    reporter.info(f"{job.label} -> {job.commit[:12] if job.commit else '?'}: {len(job.files)} files, "
                  f"{len(job.missing)} to fetch ({format_size(sum(f.size for f in job.missing))})")


async def run_sync(manifest: Manifest, backend: Backend, reporter: Reporter, *, concurrency: int,
                   dry_run: bool) -> SyncResult:
    started = time.monotonic()
    jobs = [RevisionJob(spec, revision) for spec in manifest.repos for revision in spec.revisions]
    plan_limit = asyncio.Semaphore(max(1, min(concurrency, 4)))

    async def plan(job: RevisionJob) -> None:
        async with plan_limit:
            await _plan(backend, job, reporter)

    await asyncio.gather(*(plan(job) for job in jobs))
    if not dry_run and backend.pins_supported:
        backend.pin(manifest)

    # One download per blob, even when revisions share it.
    work: dict[str, tuple[RevisionJob, RemoteFile]] = {}
    sharers: dict[str, list[RevisionJob]] = {}
    for job in jobs:
        for item in job.missing:
            work.setdefault(item.etag, (job, item))
            sharers.setdefault(item.etag, []).append(job)
    to_fetch_bytes = sum(item.size - backend.partial_bytes(item) for _, item in work.values())
    if dry_run:
        for job, item in work.values():
            partial = backend.partial_bytes(item)
            extra = f", {format_size(partial)} already in a partial file" if partial else ""
            reporter.info(f"would fetch {job.label} {item.path} ({format_size(item.size)}{extra})")
        return SyncResult(jobs, 0, 0, len(work), to_fetch_bytes, True, time.monotonic() - started)
    if not work:
        reporter.info(f"nothing to fetch: all {sum(len(j.files) for j in jobs)} selected files of "
                      f"{len(jobs)} revision(s) are cached")
        return SyncResult(jobs, 0, 0, 0, 0, False, time.monotonic() - started)

    reporter.info(f"fetching {len(work)} files, {format_size(to_fetch_bytes)} with concurrency {concurrency}")
    reporter.start(sum(item.size for _, item in work.values()))
    limit = asyncio.Semaphore(max(1, concurrency))
    fetched_files = 0

    async def fetch(etag: str, job: RevisionJob, item: RemoteFile) -> None:
        nonlocal fetched_files
        label = f"{job.spec.repo.repo_id}@{job.revision}/{item.path}"
        async with limit:
            reporter.file_started(etag, label, item.size)
            try:
                got = await backend.fetch(job, item, lambda done: reporter.file_progress(etag, done))
            except (MirrorError, httpx.HTTPError, OSError) as exc:
                message = _error_text(exc)
                reporter.file_finished(etag, label, False, message)
                for sharer in sharers[etag]:
                    sharer.failed_files += 1
                    sharer.error = sharer.error or f"{item.path}: {message}"
                return
            if got is None:
                reporter.file_finished(etag, label, True, "already cached")
                return
            reporter.file_finished(etag, label, True, format_size(got))
            fetched_files += 1
            job.fetched_bytes += got
            for sharer in sharers[etag]:
                sharer.fetched += 1

    try:
        await asyncio.gather(*(fetch(etag, job, item) for etag, (job, item) in work.items()))
    finally:
        reporter.stop()
    if fetched_files == 0 and not any(j.failed_files for j in jobs):
        reporter.info(f"nothing to fetch: all {len(work)} selected files were already cached")
    for job in jobs:
        if job.failed_files > 1 and job.error:
            job.error = f"{job.failed_files} files failed; first: {job.error}"
    total = int(getattr(backend, "total_fetched", sum(j.fetched_bytes for j in jobs)))
    return SyncResult(jobs, fetched_files, total, len(work), to_fetch_bytes, False, time.monotonic() - started)


def print_summary(result: SyncResult, *, pins_note: str | None = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="dry run: nothing was fetched" if result.dry_run else "sync summary",
                  box=box.SIMPLE if sys.stdout.isatty() else box.ASCII)
    for column in ("repo", "revision", "commit", "files", "fetched" if not result.dry_run else "to fetch",
                   "bytes", "status"):
        table.add_column(column, overflow="fold")
    for job in result.jobs:
        if job.error:
            status = f"FAILED: {job.error}"
        else:
            status = "ok" + (f" ({job.note})" if job.note else "")
        count = len(job.missing) if result.dry_run else job.fetched
        size = sum(f.size for f in job.missing) if result.dry_run else job.fetched_bytes
        table.add_row(job.spec.label, job.revision, (job.commit or "-")[:12], str(len(job.files)), str(count),
                      format_size(size), status)
    console.print(table)
    if result.dry_run:
        console.print(f"dry run: {result.to_fetch_files} files, {result.to_fetch_bytes} bytes "
                      f"({format_size(result.to_fetch_bytes)}) to fetch", highlight=False)
    else:
        console.print(f"fetched {result.fetched_files} files, {result.fetched_bytes} bytes "
                      f"({format_size(result.fetched_bytes)}) in {result.elapsed:.1f}s; "
                      f"{len(result.failed)} of {len(result.jobs)} revision(s) failed", highlight=False)
    if pins_note:
        console.print(pins_note, highlight=False)


# --- CLI -----------------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``sync``'s own flags; the CLI adds the settings flags (``--cache-dir``, ``--upstream``, ...) beside them."""
    parser.add_argument("--manifest", type=Path, required=True,
                        help="TOML manifest of repos (see deploy/sync.example.toml)")
    parser.add_argument("--mirror", metavar="URL",
                        help="drive a running mirror over HTTP instead of the cache directory (no pins then)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched and how many bytes")
    parser.add_argument("--concurrency", type=int, help=f"files fetched in parallel (default: the manifest's, "
                        f"else {DEFAULT_CONCURRENCY})")
    parser.add_argument("--progress", choices=("auto", "bars", "plain"), default="auto",
                        help="progress bars (terminal) or plain log lines (default: auto)")


def _configure_logging(settings: Settings) -> None:
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    # Fill and upstream chatter stays at warning unless asked for: the reporter prints per-file lines.
    logging.basicConfig(level=max(level, logging.WARNING), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run(args: argparse.Namespace, settings: Settings) -> int:
    _configure_logging(settings)
    manifest = load_manifest(args.manifest)
    concurrency = args.concurrency or manifest.concurrency or DEFAULT_CONCURRENCY
    if concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    bars = args.progress == "bars" or (args.progress == "auto" and sys.stdout.isatty())
    reporter: Reporter = RichReporter() if bars else PlainReporter()
    backend: Backend
    if args.mirror:
        if not args.mirror.startswith(("http://", "https://")):
            raise ConfigError(f"--mirror must be an http(s) URL, got {args.mirror!r}")
        backend = MirrorBackend(args.mirror, settings, dry_run=args.dry_run)
        pins_note = ("note: repos are not pinned in --mirror mode (the mirror has no pin endpoint); run "
                     "`hf-mirror sync --cache-dir DIR` on the mirror host to pin them against eviction")
    else:
        backend = CacheDirBackend(settings, dry_run=args.dry_run)
        pins_note = None if args.dry_run else f"pinned {len(manifest.repos)} repo(s) for {manifest.source}"
    target = args.mirror or str(settings.cache_dir)
    reporter.info(f"sync {manifest.path} -> {target}{' (dry run)' if args.dry_run else ''}: "
                  f"{len(manifest.repos)} repo(s)")

    async def main() -> SyncResult:
        try:
            return await run_sync(manifest, backend, reporter, concurrency=concurrency, dry_run=args.dry_run)
        finally:
            await _close(backend.aclose())

    # systemd and timeouts stop with SIGTERM: treated as Ctrl-C (fills cancelled, partial files kept, exit 130).
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        result = asyncio.run(main())
    except KeyboardInterrupt:
        reporter.stop()
        print("sync interrupted: partial files are kept, run it again to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_summary(result, pins_note=pins_note)
    return 1 if result.failed else 0


async def _close(closing: Awaitable[None]) -> None:
    try:
        await closing
    except Exception as exc:  # noqa: BLE001 - closing must not hide the run's result
        log.warning("closing: %s", exc)

"""The metadata index, on diskcache (SQLite: safe across worker processes).

Keys and what they mean:

    ("ref", type, repo, revision)          -> RefEntry        branch/tag -> commit, re-checked after the TTL
    ("file", type, repo, commit, path)     -> FileEntry       immutable: a path at a commit (or its absence)
    ("api", type, repo, rev, route, query) -> ApiEntry        cached API JSON; immutable when rev is a commit sha
                                                              (route: api_route_key, query: api_query_key)
    ("read", path, token digest, query)    -> ApiEntry        a route of mirror.routetable not about one repo
                                                              (expires after READ_KEEP: anyone's input)
    ("public", type, repo)                 -> bool            whether an anonymous caller may read the repo
    ("access", subject, kind, repo key)    -> (bool, time)    a token's (or "public") access, see mirror.access
    ("pin", type, repo)                    -> manifest name   repos that eviction must keep
    ("xet", type, repo, ...)               -> see mirror.xet.catalog: upstream's Xet hash of a file
    ("secret", name)                       -> bytes           a secret generated once (mirror.metadata.embedded)

diskcache's defaults (1 GiB size limit, least-recently-stored eviction) would silently drop entries: the index is
opened with ``eviction_policy="none"`` and no size limit; blobs are evicted by ``mirror.cache``, never by diskcache.
Negative entries (remembered 404s and refusals: anyone's input, since any path or repo name can be asked for) carry
diskcache's tag ``neg`` and are bounded in number and bytes, the oldest dropped first (:meth:`negative_usage`).
Immutable file entries are also kept in a small in-process LRU, since the warm HEAD path reads them on every request.

Every key is built in this module, blob names (:func:`blob_key`) included; the index lives in :func:`index_dir`.
"""

from __future__ import annotations

import hashlib
import pickle
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import diskcache

from mirror import hf
from mirror.hf import RepoRef


@dataclass(frozen=True)
class RefEntry:
    commit: str
    fetched_at: float


@dataclass(frozen=True)
class FileEntry:
    """A file at a commit. ``etag`` names the blob; ``missing`` records a cached 404 (EntryNotFound)."""

    commit: str
    path: str
    etag: str = ""
    size: int = 0
    lfs: bool = False
    missing: bool = False


@dataclass(frozen=True)
class ApiEntry:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fetched_at: float
    immutable: bool = False
    public: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


NEGATIVE_TTL = 86400.0  # seconds a remembered 404 (file, tree path) is kept; a commit's content never changes
NEGATIVE_MAX_ENTRIES = 10_000
NEGATIVE_MAX_BYTES = 16 * 1024**2
_NEGATIVE = "neg"  # the diskcache tag of negative entries
# What one entry holds on disk beyond its key and value: the row's other columns and SQLite's per-row cost (the key
# is counted twice: the row and the key index). 2,000 remembered 404s: 547 bytes each on disk, 544 counted.
_ROW_OVERHEAD = 128
_ROW_BYTES = f"2 * length(key) + COALESCE(length(value), 0) + size + {_ROW_OVERHEAD}"
# A trim goes down to this share of each bound: one trim makes room for many new entries.
_NEGATIVE_LOW_WATER = 0.9
# Each process counts the negative entries again (one SQL query) after this many of its own: other workers' entries
# are then seen too, so the bound holds across processes within that many entries each.
_NEGATIVE_RECOUNT = 256
READ_KEEP = 86400.0  # seconds an answer of the route table is kept (served stale when upstream fails), then culled
_SEP = "\x1f"  # string keys: diskcache stores str natively, tuples are pickled (slow on the hot path)


def _key(*parts: str | None) -> str:
    if None in parts:  # rare: a missing query or token digest; the common case joins without a generator
        parts = tuple("" if part is None else part for part in parts)
    return _SEP.join(parts)  # type: ignore[arg-type]


def blob_key(etag: str) -> str:
    """Blob names are the etag when it is a hex digest (always, for the Hub); otherwise a digest of it."""
    if hf.SHA1_RE.match(etag) or hf.SHA256_RE.match(etag):
        return etag
    return "x" + hashlib.sha256(etag.encode()).hexdigest()


def api_route_key(route: str, path: str) -> str:
    """The route part of an API entry's key: the route and the path under it (``tree:sub/dir``, ``info:``)."""
    return f"{route}:{path}"


def api_query_key(query: list[tuple[str, str]], form: list[tuple[str, str]] | None) -> str:
    """One key for equivalent queries: sorted, booleans lower-cased (``True`` from old clients), the cursor last,
    then a POST's form."""
    items = [(k, v.lower() if v in ("True", "False") else v) for k, v in query if k != "cursor"]
    cursor = [v for k, v in query if k == "cursor"]
    items.sort()
    key = urlencode(items)
    if cursor:
        key += "&cursor=" + cursor[0]
    if form is not None:
        key += "|" + urlencode(sorted((k, v.lower() if v in ("True", "False") else v) for k, v in form))
    return key


def _entry_bytes(key: str, value: Any) -> int:
    """An entry's bytes as :data:`_ROW_BYTES` counts them (diskcache stores a pickle of the value)."""
    return 2 * len(key.encode()) + len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)) + _ROW_OVERHEAD


class _Lru:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        value = self.data.get(key)
        if value is not None:
            self.data.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        if len(self.data) > self.capacity:
            self.data.popitem(last=False)


class MetadataIndex:
    def __init__(self, directory: Path, *, negative_max_entries: int = NEGATIVE_MAX_ENTRIES,
                 negative_max_bytes: int = NEGATIVE_MAX_BYTES) -> None:
        # tag_index: the negative entries are counted and trimmed through diskcache's index on (tag, rowid).
        self._cache = diskcache.Cache(str(directory), size_limit=2**62, eviction_policy="none", cull_limit=0,
                                      tag_index=True)
        self._files = _Lru(50_000)
        self._refs: dict[tuple[str, str], RefEntry] = {}
        self.negative_bounds = (negative_max_entries, negative_max_bytes)
        # (entries, bytes) of the negative entries as last counted, plus this process's since (never less than the
        # truth but for other workers' entries); None: not counted yet.
        self._negative: tuple[int, int] | None = None
        self._negative_puts = 0

    def close(self) -> None:
        self._cache.close()

    # refs ------------------------------------------------------------------------------------------------------
    def get_ref(self, repo: RepoRef, revision: str) -> RefEntry | None:
        key = (repo.key, revision)
        entry = self._refs.get(key)
        stored = self._cache.get(_key("ref", repo.type.value, repo.repo_id, revision))
        if stored is not None and (entry is None or stored.fetched_at > entry.fetched_at):
            entry = stored  # another worker refreshed it
            self._refs[key] = entry
        return entry

    def put_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        entry = RefEntry(commit, time.time())
        self._refs[(repo.key, revision)] = entry
        self._cache.set(_key("ref", repo.type.value, repo.repo_id, revision), entry)

    def get_ref_fresh(self, repo: RepoRef, revision: str, ttl: float) -> RefEntry | None:
        """The ref if it was confirmed within ``ttl`` seconds. Checks memory first: no SQLite on a warm hit."""
        entry = self._refs.get((repo.key, revision))
        if entry is not None and time.time() - entry.fetched_at < ttl:
            return entry
        entry = self.get_ref(repo, revision)
        if entry is not None and time.time() - entry.fetched_at < ttl:
            return entry
        return None

    # files -----------------------------------------------------------------------------------------------------
    def get_file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        key = _key("file", repo.type.value, repo.repo_id, commit, path)
        entry = self._files.get(key)
        if entry is None:
            entry = self._cache.get(key)
            if entry is not None:
                self._files.put(key, entry)
        return entry

    def put_file(self, repo: RepoRef, entry: FileEntry) -> None:
        key = _key("file", repo.type.value, repo.repo_id, entry.commit, entry.path)
        self._files.put(key, entry)
        if entry.missing:  # a known absence is anyone's input (any path can be asked for): expires, and bounded
            self._put_negative(key, entry, NEGATIVE_TTL)
        else:
            self._cache.set(key, entry)

    # API JSON --------------------------------------------------------------------------------------------------
    def get_api(self, repo: RepoRef, revision: str | None, route: str, query: str) -> ApiEntry | None:
        return self._cache.get(_key("api", repo.type.value, repo.repo_id, revision, route, query))

    def put_api(self, repo: RepoRef, revision: str | None, route: str, query: str, entry: ApiEntry,
                expire: float | None = None) -> None:
        key = _key("api", repo.type.value, repo.repo_id, revision, route, query)
        if entry.status >= 400:
            self._put_negative(key, entry, NEGATIVE_TTL)
        else:
            self._cache.set(key, entry, expire=expire)

    def get_read(self, path: str, token_digest: str, query: str) -> ApiEntry | None:
        return self._cache.get(_key("read", path, token_digest, query))

    def put_read(self, path: str, token_digest: str, query: str, entry: ApiEntry) -> None:
        # Any caller can make these in unbounded variety (searches, listings, missing pages): they live under the
        # same count and byte bounds as remembered 404s, oldest dropped first, counted in the cache's usage.
        self._put_negative(_key("read", path, token_digest, query), entry, READ_KEEP)

    # Xet hashes upstream gave (mirror.xet.catalog) --------------------------------------------------------------
    def get_xet(self, repo: RepoRef, parts: tuple[str, ...]) -> Any:
        return self._cache.get(_key("xet", repo.type.value, repo.repo_id, *parts))

    def put_xet(self, repo: RepoRef, parts: tuple[str, ...], value: Any) -> None:
        self._cache.set(_key("xet", repo.type.value, repo.repo_id, *parts), value)

    # Secrets generated once (the embedded metadata store's; a fleet's are in its database) ------------------------
    def setdefault_secret(self, name: str, candidate: bytes) -> bytes:
        """The secret ``name``, ``candidate`` stored first when there is none (the first worker process wins)."""
        key = _key("secret", name)
        self._cache.add(key, candidate)
        return bytes(self._cache.get(key))

    # The last usage snapshot of the cache (mirror/cache/usage.py): a restart answers from it at once.
    def get_usage(self) -> Any:
        try:
            return self._cache.get(_key("usage"))
        except Exception:  # noqa: BLE001 - written by another version of the mirror: a new scan replaces it
            return None

    def put_usage(self, value: Any) -> None:
        self._cache.set(_key("usage"), value)

    def volume(self) -> int:
        """Bytes the index holds on disk (SQLite file and value files)."""
        return int(self._cache.volume())

    def cull_expired(self) -> int:
        """Drop expired entries (negative answers, access records); returns how many."""
        return int(self._cache.expire())

    # visibility and access -------------------------------------------------------------------------------------
    def get_public(self, repo: RepoRef) -> bool | None:
        return self._cache.get(_key("public", repo.type.value, repo.repo_id))

    def put_public(self, repo: RepoRef, public: bool) -> None:
        self._cache.set(_key("public", repo.type.value, repo.repo_id), public)

    def get_access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        """(allowed, when) for a token digest (or ``public``) and an access kind (``meta``/``content``)."""
        return self._cache.get(_key("access", subject, kind, repo.key))

    def put_access(self, subject: str, kind: str, repo: RepoRef, value: tuple[bool, float],
                   expire: float | None = None) -> None:
        key = _key("access", subject, kind, repo.key)
        if value[0]:
            self._cache.set(key, value, expire=expire)
        else:  # a refusal: any repo name, any token can be sent; dropped early, it is only asked again
            self._put_negative(key, value, expire)

    # negative entries ------------------------------------------------------------------------------------------
    def _put_negative(self, key: str, value: Any, expire: float | None) -> None:
        self._cache.set(key, value, expire=expire, tag=_NEGATIVE)
        entries, size = self._negative if self._negative is not None else self._count_negative()
        entries, size = entries + 1, size + _entry_bytes(key, value)
        self._negative, self._negative_puts = (entries, size), self._negative_puts + 1
        max_entries, max_bytes = self.negative_bounds
        if entries > max_entries or size > max_bytes or self._negative_puts >= _NEGATIVE_RECOUNT:
            self.trim_negative()

    def _count_negative(self) -> tuple[int, int]:
        entries, size = self._cache._sql(
            f"SELECT COUNT(*), COALESCE(SUM({_ROW_BYTES}), 0) FROM Cache WHERE tag = ?", (_NEGATIVE,)).fetchone()
        return int(entries), int(size)

    def negative_usage(self, *, exact: bool = True) -> tuple[int, int]:
        """(entries, bytes on disk, estimated) of the negative entries; ``exact=False``: this process's running
        count, no SQL (for the quota on the fill path)."""
        if exact or self._negative is None:
            self._negative = self._count_negative()
            self._negative_puts = 0
        return self._negative

    def trim_negative(self) -> int:
        """Over either bound, drop the oldest negative entries down to ``_NEGATIVE_LOW_WATER`` of both; returns how
        many went. (Expired ones are the oldest: they go first.)"""
        entries, size = self.negative_usage()
        max_entries, max_bytes = self.negative_bounds
        if entries <= max_entries and size <= max_bytes:
            return 0
        keep_entries, keep_bytes = int(max_entries * _NEGATIVE_LOW_WATER), int(max_bytes * _NEGATIVE_LOW_WATER)
        rows = self._cache._sql(
            f"SELECT key, {_ROW_BYTES} FROM Cache WHERE tag = ? ORDER BY store_time, rowid", (_NEGATIVE,)).fetchall()
        dropped = 0
        with self._cache.transact():
            for key, row_bytes in rows:
                if entries <= keep_entries and size <= keep_bytes:
                    break
                if self._cache.delete(key):
                    self._files.data.pop(key, None)
                    dropped += 1
                entries, size = entries - 1, size - row_bytes
        self._negative = (max(entries, 0), max(size, 0))
        return dropped

    # pins ------------------------------------------------------------------------------------------------------
    def set_pins(self, repos: list[RepoRef], source: str) -> None:
        for key in list(self.iter_keys("pin")):
            if self._cache.get(_SEP.join(key)) == source:
                self._cache.delete(_SEP.join(key))
        for repo in repos:
            self._cache.set(_key("pin", repo.type.value, repo.repo_id), source)

    def pinned_repos(self) -> set[tuple[str, str]]:
        return {(key[1], key[2]) for key in self.iter_keys("pin")}

    # iteration (CLI and gc; not on request paths) --------------------------------------------------------------
    def iter_keys(self, kind: str) -> Iterator[tuple[str, ...]]:
        """Keys of one kind, split into their parts (``("file", type, repo, commit, path)``)."""
        prefix = kind + _SEP
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._cache._sql(  # a range scan of SQLite's key index: no visit of the other kinds' entries
            "SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1 AND (expire_time IS NULL OR expire_time > ?)",
            (prefix, upper, time.time()))
        for (key,) in rows:
            yield tuple(key.split(_SEP))

    def iter_files(self) -> Iterator[tuple[str, str, FileEntry]]:
        """Every file entry as (repo type, repo id, entry), in one SQL pass over the file keys (a million entries:
        seconds, not one lookup per key)."""
        for key, entry in self._rows_with_prefix("file" + _SEP):
            parts = key.split(_SEP)
            if len(parts) >= 3 and isinstance(entry, FileEntry):
                yield parts[1], parts[2], entry

    def delete_repo(self, repo: RepoRef) -> int:
        """Every entry of ``repo`` (access records aside): range queries on its key prefixes, no scan."""
        removed = 0
        for kind in ("ref", "file", "api", "public", "pin", "xet"):
            prefix = _key(kind, repo.type.value, repo.repo_id)
            keys = [key for key, _ in self._rows_with_prefix(prefix + _SEP)]
            if self._cache.get(prefix) is not None:  # ("public"|"pin", type, repo) has nothing after the id
                keys.append(prefix)
            for key in keys:
                removed += bool(self._cache.delete(key))
        self._files.data.clear()
        self._refs = {k: v for k, v in self._refs.items() if k[0] != repo.key}
        return removed

    # sync, import and export (CLI; not on request paths) ------------------------------------------------------
    def put_ref_at(self, repo: RepoRef, revision: str, commit: str, fetched_at: float) -> None:
        """Record a ref as confirmed at ``fetched_at`` (0: known but never confirmed upstream, e.g. imported)."""
        entry = RefEntry(commit, fetched_at)
        self._refs[(repo.key, revision)] = entry
        self._cache.set(_key("ref", repo.type.value, repo.repo_id, revision), entry)

    def iter_refs(self) -> Iterator[tuple[str, str, str, RefEntry]]:
        """Every ref as (repo type, repo id, revision, entry), in one SQL pass."""
        for key, entry in self._rows_with_prefix("ref" + _SEP):
            parts = key.split(_SEP)
            if len(parts) == 4 and isinstance(entry, RefEntry):
                yield parts[1], parts[2], parts[3], entry

    def files_at(self, repo: RepoRef, commit: str) -> list[FileEntry]:
        """The file entries (present and missing) known for ``repo`` at ``commit``."""
        return [entry for entry in self.repo_files(repo) if entry.commit == commit]

    # --- operator actions and whole-index reads in one SQL pass (the status page, gc; issue 19) -------------------
    # Added for the status page: one range query instead of a lookup per key (a million ``get`` calls take minutes).

    def _rows_with_prefix(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """(key, value) of every live entry whose key starts with ``prefix``: one range scan of SQLite's key index."""
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._cache._sql(
            "SELECT key, mode, filename, value FROM Cache WHERE key >= ? AND key < ? AND raw = 1"
            " AND (expire_time IS NULL OR expire_time > ?)", (prefix, upper, time.time()))
        disk = self._cache._disk
        for key, mode, filename, value in rows:
            try:
                yield key, disk.fetch(mode, filename, value, False)
            except OSError:  # deleted meanwhile
                continue

    def repo_files(self, repo: RepoRef) -> list[FileEntry]:
        """One repo's file entries (every commit), from a range query on its key prefix: no scan of the index."""
        prefix = _key("file", repo.type.value, repo.repo_id, "")
        return [entry for _key_, entry in self._rows_with_prefix(prefix) if isinstance(entry, FileEntry)]

    def api_entries(self, repo: RepoRef) -> Iterator[tuple[str, ApiEntry]]:
        """One repo's cached API answers as (revision, entry), from a range query on its key prefix (the bill of
        materials reads the info and paths-info JSON of a revision: mirror.audit.sbom)."""
        for key, entry in self._rows_with_prefix(_key("api", repo.type.value, repo.repo_id, "")):
            parts = key.split(_SEP)
            if len(parts) >= 4 and isinstance(entry, ApiEntry):
                yield parts[3], entry

    def pin_sources(self) -> dict[tuple[str, str], str]:
        """(type, repo id) -> what pinned it: a sync manifest's name, or ``operator``."""
        out: dict[tuple[str, str], str] = {}
        for key, source in self._rows_with_prefix("pin" + _SEP):
            parts = key.split(_SEP)
            if len(parts) == 3:
                out[(parts[1], parts[2])] = str(source)
        return out

    def pin_repo(self, repo: RepoRef, source: str = "operator") -> None:
        """Pin one repo (eviction keeps its blobs). A manifest's pin is kept as it is (the sync owns it)."""
        key = _key("pin", repo.type.value, repo.repo_id)
        if self._cache.get(key) is None:
            self._cache.set(key, source)

    def unpin_repo(self, repo: RepoRef) -> str | None:
        """Unpin one repo, whatever pinned it; returns what had (a manifest pins it again at its next run)."""
        key = _key("pin", repo.type.value, repo.repo_id)
        source = self._cache.get(key)
        if source is not None:
            self._cache.delete(key)
        return source

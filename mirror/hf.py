"""The Hub's wire contract: URL grammar, repo/revision/path validation, header names, Xet stripping.

Everything the mirror knows about how huggingface.co spells things lives here, so that a change on the Hub's side
is a change in one module. Paths are parsed from the *raw* (still percent-encoded) request path, because the
revision segment carries ``%2F`` (``refs%2Fpr%2F1``) and Starlette's decoded path would split it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote, unquote, unquote_to_bytes, urlsplit

from mirror import routetable
from mirror.errors import BadRequest


class RepoType(StrEnum):
    MODEL = "model"
    DATASET = "dataset"
    SPACE = "space"

    @property
    def url_prefix(self) -> str:
        """The prefix of resolve URLs: ``""`` for models, ``datasets/`` or ``spaces/`` otherwise."""
        return "" if self is RepoType.MODEL else f"{self.value}s/"

    @property
    def plural(self) -> str:
        return f"{self.value}s"

    @classmethod
    def from_plural(cls, plural: str) -> RepoType:
        for member in cls:
            if member.plural == plural:
                return member
        raise BadRequest(f"unknown repo type {plural!r}")


# Header names the clients read.
H_REPO_COMMIT = "X-Repo-Commit"
H_LINKED_ETAG = "X-Linked-Etag"
H_LINKED_SIZE = "X-Linked-Size"
H_ERROR_CODE = "X-Error-Code"
H_ERROR_MESSAGE = "X-Error-Message"
H_MIRROR_CACHE = "X-Mirror-Cache"
H_PEER_TOKEN = "X-Mirror-Peer-Token"  # opens a fill in progress to the other nodes of a fleet (see mirror.fill)

SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHORT_SHA_RE = re.compile(r"^[0-9a-f]{7,39}$")
# Repo names: letters, digits, '-', '_', '.'; not starting or ending with '-' or '.'; no '--' or '..'; <= 96 chars.
_NAME_RE = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")
_MAX_PATH = 1024
_MAX_REVISION = 256

# The read routes of one repo, /api/{type}s/{repo}[/{sub}/{args}], with how many path segments follow ``sub``
# (min, max; None: a file path of any depth). Only these are served; the info route is ``""``.
API_READ_ROUTES: dict[str, tuple[int, int | None]] = {
    "": (0, 0), "revision": (1, 1), "tree": (1, None), "paths-info": (1, 1), "refs": (0, 0), "commits": (1, 1),
    "treesize": (1, None), "parquet": (0, 3), "xet-read-token": (1, 1),
}
# Every sub-route the Hub has after a repo id (reads and writes): they tell a repo id from a sub-route when parsing.
# The other read sub-routes (discussions, likers, ...) are in the route table, mirror.routetable.REPO_ROUTES.
API_SUBROUTES = frozenset(API_READ_ROUTES) - {""} | frozenset(routetable.REPO_ROUTES) | {
    "xet-write-token", "resolve-cache", "settings", "commit", "preupload", "super-squash", "tag", "branch", "restart",
    "pause", "duplicate", "like", "hardware", "sleeptime", "dev-mode", "logs", "volumes",
}
# The read routes whose JSON the mirror caches, and the query parameters each understands: only those go upstream
# and make up the cache key. parquet is relayed uncached; xet-read-token is answered by the mirror.
API_CACHED_ROUTES = frozenset({"info", "revision", "tree", "paths-info", "refs", "commits", "treesize"})
_INFO_PARAMS = frozenset({"expand", "blobs", "securityStatus", "files_metadata"})
API_QUERY_PARAMS: dict[str, frozenset[str]] = {
    "info": _INFO_PARAMS, "revision": _INFO_PARAMS, "tree": frozenset({"recursive", "expand", "cursor", "limit"}),
    "paths-info": frozenset({"expand"}), "refs": frozenset({"include_prs"}),
    "commits": frozenset({"p", "limit", "expand", "expand[]"}), "treesize": frozenset(),
}
# POST is a read only here: clients send paths-info as a form.
POST_READ_ROUTES = frozenset({"paths-info"})


def is_commit(revision: str) -> bool:
    return bool(SHA1_RE.match(revision))


def validate_repo_id(repo_id: str) -> str:
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(_NAME_RE.match(part) for part in parts):
        raise BadRequest(f"Invalid repo id {repo_id!r}")
    return repo_id


def validate_revision(revision: str) -> str:
    if (
        not revision
        or len(revision) > _MAX_REVISION
        or any(ch in revision for ch in "\x00\\\n\r")
        or revision.startswith("/")
        or ".." in revision.split("/")
        or any(part in ("", ".") for part in revision.split("/"))
    ):
        raise BadRequest(f"Invalid revision {revision!r}")
    return revision


def validate_path(path: str, *, allow_empty: bool = False) -> str:
    """A repo-relative file path: no traversal, no absolute path, no NUL or backslash."""
    if not path:
        if allow_empty:
            return path
        raise BadRequest("Empty file path")
    if len(path) > _MAX_PATH or any(ch in path for ch in "\x00\\") or path.startswith("/"):
        raise BadRequest(f"Invalid path {path!r}")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise BadRequest(f"Invalid path {path!r}")
    return path


def _decode(segment: str) -> str:
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError as exc:  # a percent escape that is not UTF-8: not a path the Hub has
        raise BadRequest(f"Invalid percent-encoding in {segment[:200]!r}") from exc


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_FORBIDDEN = re.compile(r"%(?:[01][0-9a-f]|7f|2e|5c)")  # control characters, '.', '\\'
_FORBIDDEN_CHAR = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and the backslash, literal


def check_canonical(raw_path: str) -> None:
    """Refuse every path that has more than one spelling, before any policy sees it.

    No literal ``.``/``..`` or empty segments (one trailing slash aside), no invalid percent-encoding or UTF-8,
    no control characters, no backslash, no encoded dot or backslash. Policies then run on the one parsed repo.
    """
    if not raw_path.startswith("/"):
        raise BadRequest("Invalid path")
    if _FORBIDDEN_CHAR.search(raw_path):
        raise BadRequest("Invalid characters in path")
    # Every request runs this (a warm HEAD's budget is some 100 us): a plain ASCII path without '%' has one
    # spelling of its bytes already, so the percent and UTF-8 checks are for the others only.
    if "%" in raw_path or not raw_path.isascii():
        if _BAD_PERCENT.search(raw_path) or _ENCODED_FORBIDDEN.search(raw_path.lower()):
            raise BadRequest("Invalid percent-encoding in path")
        try:
            unquote_to_bytes(raw_path.encode("latin-1", "strict")).decode("utf-8", "strict")
        except (UnicodeEncodeError, UnicodeDecodeError):
            raise BadRequest("Invalid percent-encoding in path") from None
    segments = raw_path.split("/")[1:]
    if segments[-1:] == [""]:
        segments.pop()
    if "" in segments or "." in segments or ".." in segments:
        raise BadRequest("Invalid path: empty, '.' or '..' segment")


@dataclass(frozen=True)
class RepoRef:
    type: RepoType
    repo_id: str

    @property
    def key(self) -> str:
        """A stable string key: ``model:acme/tiny``."""
        return f"{self.type.value}:{self.repo_id}"

    def resolve_path(self, revision: str, path: str) -> str:
        """The upstream URL path of a file, quoted the way the clients quote it."""
        return f"/{self.type.url_prefix}{self.repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    def api_path(self, suffix: str = "") -> str:
        return f"/api/{self.type.plural}/{self.repo_id}{suffix}"


@dataclass(frozen=True)
class ResolveTarget:
    """``/{prefix}{repo}/resolve/{rev}/{path}`` or ``/api/resolve-cache/{type}s/{repo}/{commit}/{path}``."""

    repo: RepoRef
    revision: str
    path: str


@dataclass(frozen=True)
class ApiTarget:
    """``/api/{type}s/{repo}[/{sub}/{rev}[/{path}]]``; ``sub`` is ``""`` for the info route."""

    repo: RepoRef
    sub: str
    revision: str | None
    path: str
    readable: bool = True  # one of API_READ_ROUTES or of the route table, with its number of segments
    read: routetable.ReadRoute | None = None  # a sub-route of the route table (its args are in ``path``)

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods the mirror answers on this route (OPTIONS aside): never a write."""
        if not self.readable:
            return ()
        return ("GET", "HEAD", "POST") if self.sub in POST_READ_ROUTES else ("GET", "HEAD")


def _split_repo(segments: list[str], marker_pos: int) -> str:
    return validate_repo_id("/".join(_decode(s) for s in segments[:marker_pos]))


@functools.lru_cache(maxsize=16384)  # the warm HEAD path parses the same few URLs over and over
def parse_resolve(raw_path: str) -> ResolveTarget | None:
    """Parse a resolve or resolve-cache URL path; ``None`` when it is neither. Raises BadRequest on bad parts."""
    segments = raw_path.lstrip("/").split("/")
    if segments[:2] == ["api", "resolve-cache"]:
        if len(segments) < 6:
            return None
        repo_type = RepoType.from_plural(segments[2])
        rest = segments[3:]
        for pos in (1, 2):  # repo ids with and without an org
            if len(rest) > pos + 1 and is_commit(rest[pos]):
                repo = RepoRef(repo_type, _split_repo(rest, pos))
                return ResolveTarget(repo, rest[pos], validate_path(_decode("/".join(rest[pos + 1 :]))))
        raise BadRequest("Invalid resolve-cache URL")
    repo_type = RepoType.MODEL
    if segments[0] in ("datasets", "spaces"):
        repo_type = RepoType.from_plural(segments[0])
        segments = segments[1:]
    for pos in (1, 2):
        if len(segments) > pos + 2 and segments[pos] == "resolve":
            repo = RepoRef(repo_type, _split_repo(segments, pos))
            revision = validate_revision(_decode(segments[pos + 1]))
            return ResolveTarget(repo, revision, validate_path(_decode("/".join(segments[pos + 2 :]))))
    return None


def parse_api(raw_path: str) -> ApiTarget | None:
    """Parse ``/api/{type}s/{repo}...``; ``None`` for API routes that are not about one repo (passed through)."""
    segments = raw_path.lstrip("/").split("/")
    if len(segments) < 3 or segments[0] != "api" or segments[1] not in ("models", "datasets", "spaces"):
        return None
    repo_type = RepoType.from_plural(segments[1])
    rest = [s for s in segments[2:]]
    if rest and rest[-1] == "":
        rest = rest[:-1]
    if rest and rest[0] in routetable.RESERVED[segments[1]]:
        return None  # /api/spaces/semantic-search, /api/spaces/hardware...: a fixed route, never a repo
    if len(rest) >= 3 and rest[2] in API_SUBROUTES:
        pos = 2
    elif len(rest) >= 2 and rest[1] in API_SUBROUTES:
        pos = 1
    elif 1 <= len(rest) <= 2:
        return ApiTarget(RepoRef(repo_type, _split_repo(rest, len(rest))), "", None, "")
    else:
        return None
    repo = RepoRef(repo_type, _split_repo(rest, pos))
    sub = rest[pos]
    args = rest[pos + 1 :]
    read = routetable.REPO_ROUTES.get(sub)
    if read is not None:
        low, high = read.arity
        if repo_type.value not in read.types or len(args) < low or (high is not None and len(args) > high):
            return ApiTarget(repo, sub, None, "", readable=False)
        return ApiTarget(repo, sub, None, validate_path(_decode("/".join(args)), allow_empty=True), read=read)
    arity = API_READ_ROUTES.get(sub)
    if arity is None or len(args) < arity[0] or (arity[1] is not None and len(args) > arity[1]):
        return ApiTarget(repo, sub, None, "", readable=False)  # a write route, or a read route misspelt
    revision = validate_revision(_decode(args[0])) if args else None
    path = validate_path(_decode("/".join(args[1:])), allow_empty=True) if len(args) > 1 else ""
    return ApiTarget(repo, sub, revision, path)


class RouteKind(StrEnum):
    RESOLVE = "resolve"
    API = "api"  # a read route of one repo
    LISTING = "listing"  # a repo-less read route of the route table, relayed with the caller's own token
    LOCAL = "local"  # answered by the mirror itself (agent-harnesses)
    OPS = "ops"  # the mirror's own pages: status, metrics, healthz, docs
    MIRROR = "mirror"  # the mirror's own API: warm on request, readiness (writes to the mirror, never upstream)
    UNKNOWN = "unknown"  # refused


@dataclass(frozen=True)
class Route:
    kind: RouteKind
    methods: tuple[str, ...] = ("GET", "HEAD")  # what the mirror answers here besides OPTIONS; never a write
    resolve: ResolveTarget | None = None
    api: ApiTarget | None = None
    read: routetable.ReadRoute | None = None  # a route of the route table (repo-scoped ones: also ``api``)


_OPS_PATHS = frozenset({"/", "/healthz", "/metrics", "/api/mirror/status", "/docs", "/openapi.json",
                        "/docs/oauth2-redirect", "/redoc"})


def classify(raw_path: str) -> Route:
    """What a (canonical) request path is. Raises BadRequest for a malformed repo id, revision or file path."""
    if "/resolve/" in raw_path or raw_path.startswith("/api/resolve-cache/"):
        resolve = parse_resolve(raw_path)
        if resolve is not None:
            return Route(RouteKind.RESOLVE, resolve=resolve)
    path = raw_path.rstrip("/") or "/"
    if path in _OPS_PATHS:
        return Route(RouteKind.OPS)
    if path == "/api/agent-harnesses":
        return Route(RouteKind.LOCAL)
    if path == "/api/mirror/warm":
        return Route(RouteKind.MIRROR, methods=("POST",))
    if path == "/api/mirror/ready" or (path.startswith("/api/mirror/warm/") and path.count("/") == 4):
        return Route(RouteKind.MIRROR)
    fixed = routetable.match_fixed(path)
    if fixed is not None:
        return Route(RouteKind.LISTING, read=fixed)
    if raw_path.startswith("/api/"):
        api = parse_api(raw_path)
        if api is not None and api.readable:
            return Route(RouteKind.API, methods=api.methods, api=api, read=api.read)
    return Route(RouteKind.UNKNOWN)


def repo_of_path(raw_path: str) -> RepoRef | None:
    """The repo a resolve or API path names (an upstream redirect's target), or ``None``."""
    try:
        target = parse_resolve(raw_path) or parse_api(raw_path)
    except BadRequest:
        return None
    return target.repo if target is not None else None


def query_flag(value: str | None) -> bool:
    """Query booleans arrive as ``true``/``false`` or, from old clients, ``True``/``False``."""
    return (value or "").strip().lower() in ("1", "true", "yes")


def parse_etag(value: str | None) -> str | None:
    """``W/"abc"`` -> ``abc``, as the clients normalise it."""
    if not value:
        return None
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"') or None


# --- Xet and upstream-address hygiene -----------------------------------------------------------------------------

_XET_LINK_RELS = ("xet-auth", "xet-reconstruction-info")
_LINK_RE = re.compile(r"<([^>]*)>\s*((?:;\s*[^,;]+)*)")


def rewrite_link_header(value: str, mirror_base: str) -> str | None:
    """Keep pagination links (pointed at the mirror); drop Xet links. ``None`` when nothing remains."""
    kept = []
    for match in _LINK_RE.finditer(value):
        url, params = match.group(1), match.group(2)
        if any(rel in params for rel in _XET_LINK_RELS):
            continue
        parts = urlsplit(url)
        local = parts.path + (f"?{parts.query}" if parts.query else "")
        kept.append(f"<{mirror_base}{local}>{params}")
    return ", ".join(kept) or None


def strip_xet_json(data: object) -> object:
    """Delete ``xetHash`` from tree / paths-info entries (and any nested dict), in place; returns ``data``."""
    if isinstance(data, dict):
        data.pop("xetHash", None)
        for value in data.values():
            if isinstance(value, dict | list):
                strip_xet_json(value)
    elif isinstance(data, list):
        for item in data:
            strip_xet_json(item)
    return data


# Headers of upstream API responses that are relayed to clients; everything else (cookies, Xet, CDN details) is not.
API_RELAYED_HEADERS = frozenset(
    {"content-type", "etag", "x-repo-commit", "x-error-code", "x-error-message", "x-total-count", "retry-after",
     "ratelimit", "ratelimit-policy", "x-request-id", "last-modified"}
)

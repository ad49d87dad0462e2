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
from urllib.parse import quote, unquote, urlsplit

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

# API sub-routes that follow the repo id: /api/{type}s/{repo}/{sub}/...
API_SUBROUTES = frozenset(
    {"revision", "tree", "paths-info", "refs", "commits", "xet-read-token", "xet-write-token", "parquet", "treesize",
     "resolve-cache", "discussions", "settings", "commit", "preupload", "lfs-files", "compare", "super-squash"}
)


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
    return unquote(segment, errors="strict")


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
    revision = validate_revision(_decode(args[0])) if args else None
    path = validate_path(_decode("/".join(args[1:])), allow_empty=True) if len(args) > 1 else ""
    return ApiTarget(repo, sub, revision, path)


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

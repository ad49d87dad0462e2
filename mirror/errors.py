"""The exception tree of the mirror, drawn once. Each error knows the Hub-shaped response it becomes.

    MirrorError                      500  (base; never raised bare)
    ├── BadRequest                   400  invalid repo id, revision, path, body
    ├── RequestTimeout               408  a client too slow to send its request head (the server's own answer)
    ├── RepoPinned                   409  an operator asked to evict a pinned repo (unpin it first)
    ├── MethodNotAllowed             405  every write: the mirror is read-only (carries ``Allow``)
    ├── RouteNotFound                404  not a read route the mirror serves (never relayed)
    ├── UnsupportedMediaType         415  the mirror's own actions take JSON only
    ├── HeadersTooLarge              431  request headers over the mirror's limit
    ├── RangeNotSatisfiable          416
    ├── TooLarge                     413  a request over a size cap (a warm over --warm-max-bytes)
    ├── RetryLater                   429/503 a bound reached (a caller's rate, a full queue); carries ``Retry-After``
    ├── AccessDenied                 401/403 mirror-side access control and allow/deny lists
    ├── PolicyBlocked                403  the admission policy refuses the file (names the rule and the file)
    ├── HubError                     any status: an error the Hub itself answered (code/message passed through)
    │   ├── RepoNotFound             404
    │   ├── RevisionNotFound         404
    │   ├── EntryNotFound            404 (carries the commit, so clients cache the miss)
    │   └── ViewerNotFound           404  the dataset viewer has no answer (``ResponseNotFound``)
    ├── UpstreamUnavailable          502  upstream unreachable / 5xx and nothing cached
    │   └── UpstreamTimeout          504
    ├── OfflineMiss                  504  --offline and not cached
    ├── IntegrityError               502  a fill's size or hash did not match (never served)
    ├── StorageUnavailable           503  the bucket could not be reached or refused a request
    ├── MetadataUnavailable          503  the fleet's database could not be reached or refused a request
    ├── LeaseLost                    503  this node no longer holds the fill lease it worked under: stop, commit nothing
    ├── NoDiskRoom                   507  no disk room to complete a sparse file (the sync, a warm): its windows kept
    ├── UrlExpired                   (a fill's signal, never answered) a signed CDN URL was refused: resolve again
    └── RangeIgnored                 (a fill's signal, never answered) upstream sent the whole file for a Range

    ConfigError (ValueError)         a setting that cannot be used: the CLI exits 2, the server does not start
    └── ManifestError                the sync manifest cannot be used

    NotCached (LookupError)          a revision, or a file of it, the cache does not know (``hf-mirror sbom``)
    AlreadyCommitted (Exception)     inside a commit's fence: another node committed the blob first (never answered)
    FillPaused (Exception)           a sparse fill stopped with its readers' windows on disk (never answered)

Routes map them to responses in one place (``mirror.hf.error_response``).
"""

from __future__ import annotations

import re
from enum import StrEnum


class ErrorCode(StrEnum):
    """The Hub's ``X-Error-Code`` values the mirror reads and writes itself (clients branch on them); every other
    code is its class's ``code``, or upstream's, relayed as it came."""

    REPO_NOT_FOUND = "RepoNotFound"
    REVISION_NOT_FOUND = "RevisionNotFound"
    ENTRY_NOT_FOUND = "EntryNotFound"
    GATED_REPO = "GatedRepo"


class MirrorError(Exception):
    status: int = 500
    code: str | None = None

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class BadRequest(MirrorError):
    status = 400
    code = "BadRequest"


class RequestTimeout(MirrorError):
    status = 408
    code = "RequestTimeout"


class RepoPinned(MirrorError):
    """An operator asked to evict a pinned repo (``409``: unpin it first)."""

    status = 409
    code = "RepoPinned"


class MethodNotAllowed(MirrorError):
    status = 405
    code = "MethodNotAllowed"

    def __init__(self, message: str, *, allow: tuple[str, ...] = ("GET", "HEAD")) -> None:
        super().__init__(message, headers={"Allow": ", ".join((*allow, "OPTIONS"))})


class RouteNotFound(MirrorError):
    """A path that is none of the read routes the mirror serves: refused, never relayed."""

    status = 404
    code = "RouteNotFound"


class UnsupportedMediaType(MirrorError):
    status = 415
    code = "UnsupportedMediaType"


class HeadersTooLarge(MirrorError):
    status = 431
    code = "HeadersTooLarge"


class RangeNotSatisfiable(MirrorError):
    status = 416
    code = "RangeNotSatisfiable"

    def __init__(self, size: int) -> None:
        super().__init__("Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})


class TooLarge(MirrorError):
    status = 413
    code = "TooLarge"


class RetryLater(MirrorError):
    """A bound was reached: this caller's rate (429) or everyone's queue (503); ``Retry-After`` says when to ask
    again (also as the ``RateLimit`` header, which the Hub's clients read on a 429)."""

    def __init__(self, message: str, *, retry_after: float, status: int = 429, code: str = "TooManyRequests",
                 policy: str = "mirror") -> None:
        seconds = max(1, int(retry_after + 0.999))
        super().__init__(message, headers={"Retry-After": str(seconds), "RateLimit": f'"{policy}";r=0;t={seconds}'})
        self.status = status
        self.code = code
        self.retry_after = seconds


class AccessDenied(MirrorError):
    code = ErrorCode.GATED_REPO

    def __init__(self, message: str, *, status: int = 403, code: str = ErrorCode.GATED_REPO) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @classmethod
    def unauthenticated(cls, message: str) -> AccessDenied:
        """The Hub's answer to a caller without a token it accepts: 401 ``RepoNotFound`` (a client then asks for
        one, or reports a missing repo)."""
        return cls(message, status=401, code=ErrorCode.REPO_NOT_FOUND)


class PolicyBlocked(MirrorError):
    """The admission policy (mirror.admission) refuses a file's bytes: a 403 whose code no client retries (the Hub's
    clients retry 429 and 5xx only) and whose message names the rule and the file."""

    status = 403
    code = "PolicyBlocked"

    def __init__(self, message: str, *, rule: str, path: str, quarantined: bool = False) -> None:
        # The rule and the outcome also as headers: the audit log records them from the answer (mirror.audit).
        super().__init__(message, headers={"X-Mirror-Policy-Rule": rule,
                                           "X-Mirror-Policy-Outcome": "quarantined" if quarantined else "refused"})
        self.rule = rule
        self.path = path
        self.quarantined = quarantined


class HubError(MirrorError):
    """An error answered by upstream: status, X-Error-Code and message are relayed unchanged."""

    def __init__(self, status: int, code: str | None, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.code = code


class RepoNotFound(HubError):
    def __init__(self, message: str = "Repository not found", status: int = 404) -> None:
        super().__init__(status, ErrorCode.REPO_NOT_FOUND, message)


class RevisionNotFound(HubError):
    def __init__(self, message: str = "Invalid rev id") -> None:
        super().__init__(404, ErrorCode.REVISION_NOT_FOUND, message)


class EntryNotFound(HubError):
    def __init__(self, commit: str | None, message: str = "Entry not found") -> None:
        super().__init__(404, ErrorCode.ENTRY_NOT_FOUND, message, headers={"X-Repo-Commit": commit} if commit else None)
        self.commit = commit


class ViewerNotFound(HubError):
    def __init__(self, message: str) -> None:
        super().__init__(404, "ResponseNotFound", message)


class UpstreamUnavailable(MirrorError):
    status = 502
    code = "UpstreamUnavailable"


class UpstreamTimeout(UpstreamUnavailable):
    status = 504
    code = "UpstreamTimeout"


class OfflineMiss(MirrorError):
    status = 504
    code = "OfflineMiss"


class IntegrityError(MirrorError):
    status = 502
    code = "IntegrityError"


class StorageUnavailable(MirrorError):
    """The bucket could not be reached or refused a request. Hot-tier hits are still served without it."""

    status = 503
    code = "StorageUnavailable"


class MetadataUnavailable(MirrorError):
    """The fleet's database could not be reached or refused a request."""

    status = 503
    code = "MetadataUnavailable"


class LeaseLost(MirrorError):
    """This process no longer holds the fill lease it worked under (another node took it over, or it could not be
    renewed): it must stop fetching, and its commit is refused."""

    status = 503
    code = "LeaseLost"


class NoDiskRoom(MirrorError):
    """The quota or the disk has no room for the rest of a sparse file that the sync or a warm would complete."""

    status = 507
    code = "NoDiskRoom"


class AlreadyCommitted(Exception):
    """Another node committed the blob first (found inside the commit's fence)."""


class FillPaused(Exception):
    """A sparse fill stopped with the windows its readers asked for on disk (and in its windows map); the next
    read or a full download resumes it."""


class NotCached(LookupError):
    """The revision, or any file of it, is not known to the mirror."""


class UrlExpired(MirrorError):
    """A signed CDN URL was refused (403/410): resolve the file again for a fresh one."""


class RangeIgnored(MirrorError):
    """Upstream answered a bounded Range with the whole file: a parallel fill falls back to one stream."""


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message says which and why."""


class ManifestError(ConfigError):
    """The manifest cannot be used; the message says where and why."""


# Credentials an upstream answer may echo (a debugging proxy, a misconfigured gateway): never relayed to a client.
_SECRET_PATTERNS = (
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+|=)[^\s,;\"']+"), r"\1\2***"),
    (re.compile(r"(?i)\b(authorization|proxy-authorization|cookie|set-cookie|x-[a-z0-9-]*token)(\s*[:=]\s*)[^\r\n]*"),
     r"\1\2***"),
    (re.compile(r"\b(hf|api_org)_[A-Za-z0-9_-]{6,}"), r"\1_***"),
)
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redact_url(text: str) -> str:
    """``https://user:secret@host/x`` -> ``https://***@host/x``, anywhere in ``text``."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


def scrub_secrets(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with anything that looks like a credential replaced by ``***`` (and each of ``secrets``)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return redact_url(text)

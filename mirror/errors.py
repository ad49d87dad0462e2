"""The exception tree of the mirror. Each error knows the Hub-shaped response it becomes.

    MirrorError                      500  (base; never raised bare)
    ├── BadRequest                   400  invalid repo id, revision, path, body
    ├── MethodNotAllowed             405
    ├── HeadersTooLarge              431  request headers over the mirror's limit
    ├── RangeNotSatisfiable          416
    ├── AccessDenied                 401/403 mirror-side access control and allow/deny lists
    ├── HubError                     any status: an error the Hub itself answered (code/message passed through)
    │   ├── RepoNotFound             404
    │   ├── RevisionNotFound         404
    │   └── EntryNotFound            404 (carries the commit, so clients cache the miss)
    ├── UpstreamUnavailable          502  upstream unreachable / 5xx and nothing cached
    │   └── UpstreamTimeout          504
    ├── OfflineMiss                  504  --offline and not cached
    └── IntegrityError               502  a fill's size or hash did not match (never served)

Routes map them to responses in one place (``mirror.hf.error_response``).
"""

from __future__ import annotations


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


class MethodNotAllowed(MirrorError):
    status = 405
    code = "MethodNotAllowed"


class HeadersTooLarge(MirrorError):
    status = 431
    code = "HeadersTooLarge"


class RangeNotSatisfiable(MirrorError):
    status = 416
    code = "RangeNotSatisfiable"

    def __init__(self, size: int) -> None:
        super().__init__("Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})


class AccessDenied(MirrorError):
    code = "GatedRepo"

    def __init__(self, message: str, *, status: int = 403, code: str = "GatedRepo") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class HubError(MirrorError):
    """An error answered by upstream: status, X-Error-Code and message are relayed unchanged."""

    def __init__(self, status: int, code: str | None, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.code = code


class RepoNotFound(HubError):
    def __init__(self, message: str = "Repository not found", status: int = 404) -> None:
        super().__init__(status, "RepoNotFound", message)


class RevisionNotFound(HubError):
    def __init__(self, message: str = "Invalid rev id") -> None:
        super().__init__(404, "RevisionNotFound", message)


class EntryNotFound(HubError):
    def __init__(self, commit: str | None, message: str = "Entry not found") -> None:
        super().__init__(404, "EntryNotFound", message, headers={"X-Repo-Commit": commit} if commit else None)
        self.commit = commit


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

"""Upstream error answers as the exceptions of :mod:`mirror.errors`, keeping the Hub's status, code, message and
commit (``X-Error-Code``, ``X-Error-Message``, a JSON ``error``, or the status alone)."""

from __future__ import annotations

import httpx

from mirror import hf
from mirror.errors import EntryNotFound, ErrorCode, HubError, MirrorError, UpstreamUnavailable
from mirror.upstream.retry import RETRY_STATUSES
from mirror.upstream.values import UpstreamAnswer

# Headers of a 429 that tell the client how long to wait (huggingface_hub reads all three).
_RATE_LIMIT_HEADERS = ("Retry-After", "RateLimit", "RateLimit-Policy")


def hub_error(response: httpx.Response | UpstreamAnswer, *, resolve: bool, infer: bool = True) -> MirrorError:
    """Map an upstream error response to a HubError that keeps its status, code, message and commit.

    ``infer=False``: an answer without ``X-Error-Code`` stays without one (the read routes relay upstream's errors as
    upstream sent them: a 404 of a listing is no RepoNotFound)."""
    code = response.headers.get(hf.H_ERROR_CODE)
    message = response.headers.get(hf.H_ERROR_MESSAGE) or _json_error(response) or response.reason_phrase
    commit = response.headers.get(hf.H_REPO_COMMIT)
    status = response.status_code
    if status in RETRY_STATUSES and status != 429:
        return UpstreamUnavailable(f"Upstream answered {status}: {message}")
    if code == ErrorCode.ENTRY_NOT_FOUND:
        return EntryNotFound(commit, message)
    if code is None and infer:  # The mirror always sends a code (clients need one over http://); infer the Hub's.
        code = {401: ErrorCode.REPO_NOT_FOUND, 403: ErrorCode.GATED_REPO,
                404: ErrorCode.ENTRY_NOT_FOUND if resolve else ErrorCode.REPO_NOT_FOUND}.get(status)
        if code == ErrorCode.ENTRY_NOT_FOUND:
            return EntryNotFound(commit, message)
    headers = {hf.H_REPO_COMMIT: commit} if commit else {}
    if status == 429:
        headers.update({name: response.headers[name] for name in _RATE_LIMIT_HEADERS if name in response.headers})
    return HubError(status, code, message, headers=headers)


def _json_error(response: httpx.Response | UpstreamAnswer) -> str | None:
    try:
        body = response.json()
    except (ValueError, httpx.ResponseNotRead, UnicodeDecodeError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, list):
        return "; ".join(map(str, error))
    return str(error) if error else None

"""One audit event: who took (or was refused) which file, when, how many bytes, and what decided it.

The JSON line is the record (append-only files, :mod:`mirror.audit.log`); the index (:mod:`mirror.audit.index`) is
built from the lines and can always be rebuilt from them. A caller is named, never identified by a secret: the
mirror token's name, or ``token:`` and a digest of the Hub token, or ``anon``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# What became of the request for a file: the mirror's cache outcomes (X-Mirror-Cache) for bytes served, and the
# admission policy's two refusals.
SERVED = ("hit", "miss", "stale", "passthrough")
REFUSALS = ("refused", "quarantined")
OUTCOMES = SERVED + REFUSALS
ANONYMOUS = "anon"
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@functools.lru_cache(maxsize=4096)  # a caller's every request: one digest per token, not one per request
def token_caller(token: str) -> str:
    """How a Hub token appears in the log: a digest (a Hub token has the entropy of a key: not guessable back)."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def iso_time(epoch: float) -> str:
    """``2026-01-31T12:00:00.123Z``: UTC, milliseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def parse_time(text: str) -> float:
    """An ISO 8601 time (``Z`` or an offset; no zone: UTC) as epoch seconds."""
    moment = datetime.fromisoformat(text.strip())
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True, slots=True)
class AuditEvent:
    ts: float  # epoch seconds; written as ISO 8601 UTC
    caller: str
    client: str  # the client's address (no port: a resumed download comes on a new connection)
    user_agent: str
    repo_type: str
    repo_id: str
    revision: str | None  # as asked (a branch, a tag, a commit); None where the client named a commit only (Xet)
    commit: str | None
    path: str
    etag: str | None
    bytes: int | None  # the body the first answer of the session announced (a Range: its length)
    outcome: str  # one of OUTCOMES
    rule: str | None = None  # the policy rule that decided a refusal (or an admission, where the policy says)
    via: str = "resolve"  # resolve | xet
    request_id: str | None = None

    def line(self) -> str:
        # Built by hand: dataclasses.asdict deep-copies, and costs as much as the rest of the event.
        return _ENCODE({"ts": iso_time(self.ts), "caller": self.caller, "client": self.client,
                        "user_agent": self.user_agent, "repo_type": self.repo_type, "repo_id": self.repo_id,
                        "revision": self.revision, "commit": self.commit, "path": self.path, "etag": self.etag,
                        "bytes": self.bytes, "outcome": self.outcome, "rule": self.rule, "via": self.via,
                        "request_id": self.request_id})

    @classmethod
    def from_line(cls, line: str | bytes) -> AuditEvent:
        data: dict[str, Any] = json.loads(line)
        data["ts"] = parse_time(data["ts"])
        return cls(**data)

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
_str = json.encoder.encode_basestring  # a JSON string literal, quotes and escapes included (C)


def _opt(value: str | None) -> str:
    return "null" if value is None else _str(value)


@functools.lru_cache(maxsize=4096)  # a caller's every request: one digest per token, not one per request
def token_caller(token: str) -> str:
    """How a Hub token appears in the log: a digest (a Hub token has the entropy of a key: not guessable back)."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]


_second: list[Any] = [-1, ""]  # the last whole second formatted, and its text: strftime once a second, not per event


def iso_time(epoch: float) -> str:
    """``2026-01-31T12:00:00.123Z``: UTC, milliseconds."""
    whole = int(epoch)
    if whole != _second[0]:
        _second[:] = [whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))]
    return f"{_second[1]}.{int((epoch - whole) * 1000):03d}Z"


def parse_time(text: str) -> float:
    """An ISO 8601 time (``Z`` or an offset; no zone: UTC) as epoch seconds."""
    moment = datetime.fromisoformat(text.strip())
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a setattr call per field
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
        """The JSON line, built field by field with json's own string encoder (C): a dict through json.dumps costs
        several times more, on every download's answer (docs/benchmarks.md)."""
        return (f'{{"ts":"{iso_time(self.ts)}","caller":{_str(self.caller)},"client":{_str(self.client)},'
                f'"user_agent":{_str(self.user_agent)},"repo_type":{_str(self.repo_type)},'
                f'"repo_id":{_str(self.repo_id)},"revision":{_opt(self.revision)},"commit":{_opt(self.commit)},'
                f'"path":{_str(self.path)},"etag":{_opt(self.etag)},'
                f'"bytes":{"null" if self.bytes is None else int(self.bytes)},"outcome":{_str(self.outcome)},'
                f'"rule":{_opt(self.rule)},"via":{_str(self.via)},"request_id":{_opt(self.request_id)}}}')

    @classmethod
    def from_line(cls, line: str | bytes) -> AuditEvent:
        data: dict[str, Any] = json.loads(line)
        data["ts"] = parse_time(data["ts"])
        return cls(**data)

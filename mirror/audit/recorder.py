"""Where requests meet the audit log: what a route says about the file it answers for, and the event written when
that answer starts.

A route (or the dispatcher, for resolve) puts a :class:`FileNote` in the ASGI scope: the repo and path asked, and
what it learns on the way (the Xet CAS: the file behind a hash). :meth:`AuditRecorder.response_started` sees the
answer's status and headers before its first byte leaves, and writes the event then:

- a GET answered 200/206 is a file served; its outcome is the ``X-Mirror-Cache`` header (hit, miss, stale,
  passthrough), its commit, etag and length the Hub headers of the answer;
- a refusal is a 403 the admission policy decided: :func:`decide` (``refused`` or ``quarantined``, and the rule),
  or an ``X-Error-Code`` beginning ``Policy`` with its rule in ``X-Mirror-Policy-Rule``; HEADs included (a client
  refused at its HEAD never sends the GET);
- a HEAD answered 200 serves no file; 404s, 401s, upstream's own refusals and errors are the access log's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from mirror.asgi import Scope
from mirror.audit.event import ANONYMOUS, REFUSALS, SERVED, AuditEvent, token_caller
from mirror.audit.log import AuditLog
from mirror.logs import clean

log = logging.getLogger("hf_mirror.audit")
AUDIT_NOTE = "hf_mirror.audit"  # scope key: the FileNote of the request
AUDIT_WHO = "hf_mirror.who"  # scope key: the mirror token's name (mirror-auth mode), set where the token is checked
_UA_MAX = 512


@dataclass(slots=True)
class FileNote:
    """What the request is about, filled in as the route learns it; ``outcome``/``rule`` set by a policy decision."""

    repo_type: str
    repo_id: str
    path: str
    revision: str | None = None
    commit: str | None = None
    etag: str | None = None
    size: int | None = None
    via: str = "resolve"
    cache: str | None = None  # the cache outcome, where the answer's headers do not say it (Xet)
    caller: str | None = None  # who, where the request's own credential does not say (a Xet token carries it)
    outcome: str | None = None
    rule: str | None = None


def note_file(scope: Scope, repo_type: str, repo_id: str, path: str, revision: str | None = None,
              **learned: object) -> FileNote:
    note = FileNote(repo_type, repo_id, path, revision)
    for name, value in learned.items():
        setattr(note, name, value)
    scope[AUDIT_NOTE] = note
    return note


def decide(scope: Scope, outcome: str, rule: str) -> None:
    """The admission policy's decision on this request's file: ``refused`` or ``quarantined``, and the rule."""
    if outcome not in REFUSALS:
        raise ValueError(f"an audit decision is one of {REFUSALS}, not {outcome!r}")
    note = scope.get(AUDIT_NOTE)
    if note is not None:
        note.outcome, note.rule = outcome, rule


def caller_of(scope: Scope) -> str:
    """Who is asking, as the audit log names them: the mirror token's name, a digest of the Hub token, or anon."""
    name = scope.get(AUDIT_WHO)
    if name:
        return str(name)
    for key, value in scope["headers"]:
        if key == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer " and text[7:].strip():
                return token_caller(text[7:].strip())
            break
    return ANONYMOUS


class AuditRecorder:
    def __init__(self, log: AuditLog, secrets: tuple[str, ...] = ()) -> None:
        self.log = log
        self.secrets = tuple(s for s in secrets if s)

    def response_started(self, scope: Scope, message: dict, request_id: str | None = None) -> None:
        """The answer's headers are about to leave: write its event now, if it is one (see the module)."""
        note: FileNote | None = scope.get(AUDIT_NOTE)
        if note is None:
            return
        try:
            self._started(scope, message, request_id, note)
        except Exception:  # a bug here must not cut a download: logged, as a write that fails is (AuditLog.failed)
            self.log.failed += 1
            log.exception("audit event not recorded for %s %s", note.repo_id, note.path)

    def _started(self, scope: Scope, message: dict, request_id: str | None, note: FileNote) -> None:
        status = message["status"]
        if note.outcome is None and status != 403 and not (status in (200, 206) and scope["method"] == "GET"):
            return  # a HEAD, a 404, an error: no file went out and nothing was refused
        headers = dict(message.get("headers", ()))
        outcome, rule = note.outcome, note.rule
        if outcome is None and status == 403:
            code = headers.get(b"x-error-code", b"").decode("latin-1")
            if not code.startswith("Policy"):
                return  # upstream's refusal (gated, private) or the mirror's access lists: not an admission decision
            quarantined = headers.get(b"x-mirror-policy-outcome") == b"quarantined" or "quarantin" in code.lower()
            outcome = "quarantined" if quarantined else "refused"
            rule = headers.get(b"x-mirror-policy-rule", b"").decode("latin-1") or code
        elif outcome is None:
            outcome = note.cache or headers.get(b"x-mirror-cache", b"hit").decode("latin-1")
            if outcome not in SERVED:
                outcome = "hit"
        commit = headers.get(b"x-repo-commit")
        commit_text = commit.decode("latin-1") if commit else note.commit
        caller = note.caller or caller_of(scope)
        client = scope.get("client")
        address = client[0] if client else ""
        raw_agent = b""
        continuation = False
        for key, value in scope["headers"]:
            if key == b"user-agent":
                raw_agent = value
            elif key == b"range":
                continuation = is_continuation(value)
        now = time.time()
        # The session first: a request continuing a client's download stops here.
        session = (caller, address, raw_agent, note.repo_type, note.repo_id.lower(), commit_text or note.revision,
                   note.path, "served" if outcome in SERVED else outcome)
        if not self.log.opens(session, now, continuation):
            return
        length = headers.get(b"content-length")
        # The answer's body is the file's bytes on resolve (a Range: its length); elsewhere (an Xet reconstruction's
        # JSON) the route says what the answer hands out.
        size = int(length) if note.via == "resolve" and length is not None and outcome in SERVED else note.size
        if size is None and outcome in SERVED and b"x-linked-size" in headers:  # nginx sends it (--accel-redirect)
            size = int(headers[b"x-linked-size"])
        etag = headers.get(b"x-linked-etag") or headers.get(b"etag")
        self.log.write(AuditEvent(
            ts=now, caller=caller, client=address,
            user_agent=clean(raw_agent.decode("latin-1")[:_UA_MAX], self.secrets), repo_type=note.repo_type,
            repo_id=note.repo_id, revision=note.revision, commit=commit_text, path=note.path,
            etag=etag.decode("latin-1").strip('"') if etag else note.etag, bytes=size, outcome=outcome, rule=rule,
            via=note.via, request_id=request_id))


def is_continuation(range_header: bytes) -> bool:
    """A ``Range`` that does not start at byte 0 (``bytes=N-``, ``bytes=N-M``, a suffix ``bytes=-N``): the rest of
    a download begun before, not a new one."""
    spec = range_header.decode("latin-1").partition("=")[2].strip()
    return bool(spec) and not spec.startswith("0-")

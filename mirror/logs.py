"""Logging setup: text or JSON lines, with tokens and URL credentials redacted and control characters escaped.

Every line goes through :func:`clean`: a client's path or header cannot forge a line (CR/LF), colour or rewrite a
terminal (ESC, C1 controls), nor carry a token or a ``user:password@`` into the log. Tracebacks keep their line
structure, but the exception messages inside them are escaped the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
import traceback
from types import TracebackType
from typing import TextIO

_TOKEN_RE = re.compile(r"(hf_[A-Za-z0-9_-]{4,}|Bearer\s+[A-Za-z0-9._~+/=-]+|eyJ[A-Za-z0-9._-]{10,})")
# ``scheme://userinfo@``: the userinfo cannot hold / ? # or whitespace; greedy, so ``u:p@ss@host`` loses all of it.
_URL_CREDENTIALS_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]+@")
# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI for many terminals) and the Unicode line separators.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
_CONTROL_BUT_NEWLINE = {c: e for c, e in _CONTROL.items() if c != 0x0A}
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def redact(text: str) -> str:
    """Tokens (``hf_…``, ``Bearer …``, JWTs) and URL credentials replaced by ``***``."""
    text = _TOKEN_RE.sub("***", text)
    if "://" in text:
        text = _URL_CREDENTIALS_RE.sub(r"\1***@", text)
    return text


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """Control characters as ``\\xNN`` escapes (``\\x1b``, ``\\x0d``, ``\\x0a``…); newlines kept if asked."""
    if _CONTROL_RE.search(text) is None:
        return text
    return text.translate(_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL)


def clean(text: str, secrets: tuple[str, ...] = (), *, keep_newlines: bool = False) -> str:
    """A string fit for a log line: secrets and tokens redacted, control characters escaped. Idempotent."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return escape_controls(redact(text), keep_newlines=keep_newlines)


def format_exception(ei: ExcInfo | tuple[None, None, None], secrets: tuple[str, ...] = ()) -> str:
    """A traceback, one frame per line as usual, with every exception message (and note) escaped and redacted."""
    try:
        te = traceback.TracebackException(*ei, compact=True)  # type: ignore[arg-type]
        stack, seen = [te], set()
        while stack:
            item = stack.pop()
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(getattr(item, "_str", None), str):  # the message, as format_exception_only prints it
                item._str = clean(item._str, secrets)
            notes = getattr(item, "__notes__", None)
            if isinstance(notes, list):
                item.__notes__ = [clean(str(n), secrets) for n in notes]
            stack.extend(x for x in (item.__cause__, item.__context__) if x is not None)
            stack.extend(getattr(item, "exceptions", None) or ())
        text = "".join(te.format())
    except Exception:  # a log line must never fail: fall back to the plain traceback
        text = "".join(traceback.format_exception(*ei))  # type: ignore[arg-type]
    return clean(text.rstrip("\n"), secrets, keep_newlines=True)


class RedactingFilter(logging.Filter):
    """Cleans every record's message (see :func:`clean`) before any handler formats it."""

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: log what there is
            message = f"{record.msg!r} {record.args!r}"
        cleaned = clean(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``; messages and tracebacks cleaned (also when no filter ran)."""

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        saved, record.exc_text = record.exc_text, None  # another handler's formatter may have cached a raw one
        try:
            return super().format(record)
        finally:
            record.exc_text = saved

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = clean(record.message, self.secrets)
        return super().formatMessage(record)

    def formatException(self, ei: ExcInfo | tuple[None, None, None]) -> str:  # type: ignore[override]  # noqa: N802
        return format_exception(ei, self.secrets)

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return clean(stack_info, self.secrets, keep_newlines=True)


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": clean(record.getMessage(), self.secrets),
        }
        for key in ("request_id", "outcome"):
            if hasattr(record, key):
                value = getattr(record, key)
                payload[key] = clean(value, self.secrets) if isinstance(value, str) else value
        if record.exc_info:
            payload["exc"] = format_exception(record.exc_info, self.secrets)
        if record.stack_info:
            payload["stack"] = clean(record.stack_info, self.secrets, keep_newlines=True)
        return json.dumps(payload)


_CLEANED_ENTRIES = 4096  # the access log's memo of cleaned paths: at most this many, none longer than
_CLEANED_LENGTH = 512


class AccessLog:
    """One line per request, in the format of the other log lines, written in batches.

    The ``logging`` machinery (record, filters, formatter, a flushed write per line) costs more than a cached HEAD
    itself; here a line is one f-string, and lines go out in one write every ``flush_every`` seconds.
    """

    def __init__(self, fmt: str, secrets: tuple[str, ...] = (), stream: TextIO | None = None,
                 flush_every: float = 0.2) -> None:
        self.json = fmt == "json"
        self.secrets = tuple(s for s in secrets if s)
        self.stream = stream or sys.stderr
        self.flush_every = flush_every
        self._lines: list[str] = []
        self._flush_pending = False
        self._second = -1
        self._stamp = ""
        self._cleaned: dict[str, str] = {}  # path or outcome -> its cleaned text (see _clean)

    def write(self, request_id: str, method: str, path: str, status: int | str, millis: float, outcome: str,
              size: int | None = None) -> None:
        """One request: ``size`` is the answer's body length as announced (``None``: not known, e.g. chunked)."""
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            pattern = "%Y-%m-%dT%H:%M:%S" if self.json else "%Y-%m-%d %H:%M:%S"
            self._stamp = time.strftime(pattern, time.gmtime(now) if self.json else time.localtime(now))
        msecs = int((now - self._second) * 1000)
        cleaned = self._cleaned
        path = cleaned.get(path) or self._clean(path)
        outcome = cleaned.get(outcome) or self._clean(outcome)
        if self.json:
            # Fields a log pipeline can filter on; ``message`` keeps the text line's words for people.
            line = json.dumps({"ts": f"{self._stamp}.{msecs:03d}Z", "level": "info", "logger": "hf_mirror.access",
                               "message": f"{request_id} {method} {path} {status} {millis:.1f}ms",
                               "request_id": request_id, "method": method, "path": path, "status": status,
                               "duration_ms": round(millis, 2), "bytes": size, "outcome": outcome})
        else:
            line = (f"{self._stamp},{msecs:03d} INFO hf_mirror.access: {request_id} {method} {path} {status} "
                    f"{millis:.1f}ms {outcome}")
        self._lines.append(line)
        if not self._flush_pending:
            self._flush_pending = True
            try:
                asyncio.get_running_loop().call_later(self.flush_every, self.flush)
            except RuntimeError:  # no loop (a test, a script): write now
                self.flush()

    def _clean(self, text: str) -> str:
        # The hot path: a cached HEAD's line has no token, URL or control character, and costs three scans; the
        # result is remembered for the paths and outcomes that come back (most of them), a bounded set.
        raw = text
        if "hf_" in text or "eyJ" in text or "Bearer" in text or "://" in text:
            text = redact(text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        text = escape_controls(text)
        if len(raw) <= _CLEANED_LENGTH and text:
            if len(self._cleaned) >= _CLEANED_ENTRIES:
                self._cleaned.clear()
            self._cleaned[raw] = text
        return text

    def flush(self) -> None:
        self._flush_pending = False
        if self._lines:
            lines, self._lines = self._lines, []
            try:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed or full log stream must not fail requests


_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ID_BATCH = 256  # new request ids drawn from the OS at once: one getrandom call per 256 requests, not one each
_id_pool: list[str] = []  # ids not handed out yet (list.pop is atomic: safe from any thread)


def _new_id() -> str:
    """A new request id: 8 random bytes in hex, as ``os.urandom(8).hex()``, drawn in batches."""
    try:
        return _id_pool.pop()
    except IndexError:
        batch = os.urandom(8 * _ID_BATCH).hex()
        _id_pool.extend(batch[start:start + 16] for start in range(0, len(batch), 16))
        return _id_pool.pop()


os.register_at_fork(after_in_child=_id_pool.clear)  # a forked child never hands out its parent's ids


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's ``X-Request-Id`` when it is well-formed (a front's id links its log line to ours), else a new
    one. Anything else (too long, spaces, controls) is replaced, never logged."""
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _REQUEST_ID_RE.fullmatch(text) and _TOKEN_RE.search(text) is None:
                return text
            break
    return _new_id()


def setup_logging(level: str = "info", fmt: str = "text", secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter(secrets))
    handler.setFormatter(JsonFormatter(secrets) if fmt == "json" else TextFormatter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)

"""Logging setup: text or JSON lines, with tokens redacted from every record."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from typing import TextIO

_TOKEN_RE = re.compile(r"(hf_[A-Za-z0-9_-]{4,}|Bearer\s+[A-Za-z0-9._~+/=-]+|eyJ[A-Za-z0-9._-]{10,})")


def redact(text: str) -> str:
    return _TOKEN_RE.sub("***", text)


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        for secret in self.secrets:
            cleaned = cleaned.replace(secret, "***")
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "outcome"):
            if hasattr(record, key):
                payload[key] = getattr(record, key)
        if record.exc_info:
            payload["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload)


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

    def write(self, request_id: str, method: str, path: str, status: int | str, millis: float, outcome: str) -> None:
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            pattern = "%Y-%m-%dT%H:%M:%S" if self.json else "%Y-%m-%d %H:%M:%S"
            self._stamp = time.strftime(pattern, time.gmtime(now) if self.json else time.localtime(now))
        msecs = int((now - self._second) * 1000)
        path = self._clean(path)
        message = f"{request_id} {method} {path} {status} {millis:.1f}ms"
        if self.json:
            line = json.dumps({"ts": f"{self._stamp}.{msecs:03d}Z", "level": "info", "logger": "hf_mirror.access",
                               "message": message, "request_id": request_id, "outcome": outcome})
        else:
            line = f"{self._stamp},{msecs:03d} INFO hf_mirror.access: {message} {outcome}"
        self._lines.append(line)
        if not self._flush_pending:
            self._flush_pending = True
            try:
                asyncio.get_running_loop().call_later(self.flush_every, self.flush)
            except RuntimeError:  # no loop (a test, a script): write now
                self.flush()

    def _clean(self, text: str) -> str:
        if "hf_" in text or "eyJ" in text or "Bearer" in text:
            text = redact(text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
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


def setup_logging(level: str = "info", fmt: str = "text", secrets: tuple[str, ...] = ()) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter(secrets))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)

"""The audit log's files: JSON lines, appended by each process to its own file, rotated by size.

Each event is one ``write(2)`` on an ``O_APPEND`` descriptor, made before the answer's first byte is sent: once a
client has an answer, its event is in the kernel, and a ``kill -9`` of the server (or a crash) loses nothing. (Not
the access log's batching: that trades the last fraction of a second of lines for speed; here an event is one
per download, and its write costs ~20 µs: docs/benchmarks.md.) A power loss may
still lose what the page cache held: the files are fsynced on rotation and on close.

Files are ``events-<UTC start>-<pid>-<n>.jsonl``: one writer per file, so workers never interleave or race on a
rotation, and sorting the names orders them by their first event. Nothing is ever deleted by the mirror: an audit
trail's retention is the operator's decision (archive or remove old files; the index keeps its rows).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

from mirror.audit.event import SERVED, AuditEvent
from mirror.audit.session import Sessions

log = logging.getLogger("hf_mirror.audit")

FILE_GLOB = "events-*.jsonl"


def event_files(directory: Path) -> list[Path]:
    """The audit files of ``directory``, oldest first."""
    return sorted(directory.glob(FILE_GLOB))


class AuditLog:
    """Appends events; rolls up the requests of a client session into the event of its first answer."""

    def __init__(self, directory: Path, *, max_file_bytes: int = 64 * 1024**2, session_idle: float = 3600.0) -> None:
        self.directory = directory
        self.max_file_bytes = max(max_file_bytes, 4096)
        self.sessions = Sessions(session_idle)
        self._fd = -1
        self._written = 0
        self._serial = 0
        self._lock = threading.Lock()  # a thread (a sync run, a test) may record too
        directory.mkdir(parents=True, exist_ok=True)
        self.failed = 0  # events that could not be written (a full disk): counted, logged, never fatal to a request

    def record(self, event: AuditEvent, continuation: bool = False) -> bool:
        """Write ``event`` unless it is the ``continuation`` of a download in an open session; returns whether it
        was written."""
        key = (event.caller, event.client, event.user_agent, event.repo_type, event.repo_id.lower(),
               event.commit or event.revision, event.path, "served" if event.outcome in SERVED else event.outcome)
        if not self.opens(key, event.ts, continuation):
            return False
        self.write(event)
        return True

    def opens(self, key: Hashable, now: float, continuation: bool = False) -> bool:
        """Whether a request of session ``key`` opens it (then :meth:`write` its event), or rolls up into it. A
        caller that can tell the key before it builds the event (the recorder) skips the rest for a roll-up."""
        with self._lock:
            return self.sessions.opens(key, now, continuation)

    def write(self, event: AuditEvent) -> None:
        data = (event.line() + "\n").encode()
        with self._lock:
            self._append(data)

    def _append(self, data: bytes) -> None:
        try:
            if self._fd < 0 or self._written >= self.max_file_bytes:
                self._rotate()
            os.write(self._fd, data)
            self._written += len(data)
        except OSError as exc:
            self.failed += 1
            log.error("audit event not written (%s): %s", exc, data[:300].decode(errors="replace"))

    def _rotate(self) -> None:
        self._close_file()
        self._serial += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.directory / f"events-{stamp}-{os.getpid()}-{self._serial}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._written = os.fstat(self._fd).st_size

    def _close_file(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1

    def close(self) -> None:
        with self._lock:
            self._close_file()


def read_events(path: Path, offset: int = 0, limit: int = 8 * 1024**2) -> Iterator[tuple[int, list[bytes]]]:
    """Complete lines of ``path`` from ``offset``, in blocks of about ``limit`` bytes: (offset after the block, its
    lines). A last line without its newline is being written: left for the next read."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = b""
        while True:
            block = f.read(limit)
            if not block:
                return
            data += block
            cut = data.rfind(b"\n")
            if cut < 0:
                continue
            lines = data[:cut].split(b"\n")
            offset += cut + 1
            data = data[cut + 1:]
            yield offset, lines

"""The audit index: SQLite over the JSON lines, for ``hf-mirror audit --repo R --path P --caller C --since T``.

Why SQLite on one node: it ships with Python (no server to run beside the mirror), a B-tree index per question
answers in milliseconds over tens of millions of rows (docs/benchmarks.md: 10M events), WAL lets the CLI read while
the server's workers add rows, and the file sits next to the events it indexes. DuckDB scans columns fast but answers
point lookups no faster and takes one writer process at a time; a fleet has its PostgreSQL (its own task): this
table, these indexes and these queries are plain SQL (``?`` placeholders and ``COLLATE NOCASE`` aside, which
become ``%s`` and an index on ``lower(repo_id)``), and :meth:`AuditIndex.catch_up` reads the same files.

The JSON lines are the record; the index can be deleted and rebuilt from them at any time. It remembers how far it
read each file (``sources``), in the same transaction as the rows: a crash mid-way leaves nothing twice.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirror.audit.event import AuditEvent, iso_time, parse_time
from mirror.audit.log import event_files, read_events

log = logging.getLogger("hf_mirror.audit")

INDEX_NAME = "index.sqlite"
COLUMNS = ("ts", "caller", "client", "user_agent", "repo_type", "repo_id", "revision", "commit_sha", "path", "etag",
           "bytes", "outcome", "rule", "via", "request_id")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    ts REAL NOT NULL, caller TEXT NOT NULL, client TEXT, user_agent TEXT, repo_type TEXT NOT NULL,
    repo_id TEXT NOT NULL COLLATE NOCASE, revision TEXT, commit_sha TEXT, path TEXT NOT NULL, etag TEXT,
    bytes INTEGER, outcome TEXT NOT NULL, rule TEXT, via TEXT, request_id TEXT
);
CREATE TABLE IF NOT EXISTS sources (name TEXT PRIMARY KEY, offset INTEGER NOT NULL);
"""
# One index per question the CLI asks: a file (repo, path), a repo, a caller, a time window; each ends in ts, so
# "since T, newest first" is a range of the index read backwards, never a sort.
INDEXES = """
CREATE INDEX IF NOT EXISTS events_file ON events (repo_id, path, ts);
CREATE INDEX IF NOT EXISTS events_repo ON events (repo_id, ts);
CREATE INDEX IF NOT EXISTS events_caller ON events (caller, ts);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
"""
_INSERT = f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def event_row(event: AuditEvent) -> tuple[Any, ...]:
    return (event.ts, event.caller, event.client, event.user_agent, event.repo_type, event.repo_id, event.revision,
            event.commit, event.path, event.etag, event.bytes, event.outcome, event.rule, event.via, event.request_id)


@dataclass(frozen=True)
class AuditQuery:
    """Which events: every given field must match; ``repo`` is ``id`` or ``type:id`` (``model:acme/x``)."""

    repo: str | None = None
    path: str | None = None
    caller: str | None = None
    since: float | None = None
    until: float | None = None
    outcome: str | None = None
    limit: int = 100

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.repo:
            kind, sep, repo_id = self.repo.partition(":")
            if sep and kind in ("model", "dataset", "space"):
                clauses.append("repo_type = ?")
                params.append(kind)
            else:
                repo_id = self.repo
            clauses.append("repo_id = ?")
            params.append(repo_id)
        for column, value in (("path", self.path), ("caller", self.caller), ("outcome", self.outcome)):
            if value:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.since is not None:
            clauses.append("ts >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            params.append(self.until)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class AuditIndex:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE), so two workers catching up serialize.
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses no committed row's file offset
        self.db.executescript(_SCHEMA + INDEXES)

    def close(self) -> None:
        self.db.close()

    def catch_up(self, directory: Path) -> int:
        """Index what the audit files of ``directory`` hold beyond what was read before; returns the new rows."""
        added = 0
        for path in event_files(directory):
            try:
                size = path.stat().st_size
            except FileNotFoundError:  # archived away meanwhile
                continue
            row = self.db.execute("SELECT offset FROM sources WHERE name = ?", (path.name,)).fetchone()
            done = row[0] if row else 0
            if size <= done:
                continue
            for offset, lines in read_events(path, done):
                rows = list(_rows(lines, path))
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    # Another worker may have read this block meanwhile: only one that finds it unread adds it.
                    current = self.db.execute("SELECT offset FROM sources WHERE name = ?", (path.name,)).fetchone()
                    if (current[0] if current else 0) != done:
                        self.db.execute("ROLLBACK")
                        break
                    self.db.executemany(_INSERT, rows)
                    self.db.execute("INSERT INTO sources (name, offset) VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
                                    "SET offset = excluded.offset", (path.name, offset))
                    self.db.execute("COMMIT")
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
                added += len(rows)
                done = offset
        return added

    def add(self, events: Iterable[AuditEvent]) -> None:
        """Rows straight into the index (the benchmark's generated events; tests)."""
        self.db.execute("BEGIN")
        self.db.executemany(_INSERT, (event_row(e) for e in events))
        self.db.execute("COMMIT")

    def query(self, query: AuditQuery) -> list[dict[str, Any]]:
        """The matching events, newest first, at most ``query.limit``."""
        where, params = query.where()
        cursor = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM events{where} ORDER BY ts DESC LIMIT ?",
                                 [*params, query.limit])
        rows = []
        for values in cursor:
            data = dict(zip(COLUMNS, values, strict=True))
            data["commit"] = data.pop("commit_sha")
            data["ts"] = iso_time(data["ts"])
            rows.append(data)
        return rows

    def decisions(self, repo_type: str, repo_id: str, commit: str) -> dict[str, tuple[str, str | None]]:
        """The admission policy's latest refusal per path of one commit: path -> (outcome, rule)."""
        rows = self.db.execute(
            "SELECT path, outcome, rule FROM events WHERE repo_id = ? AND repo_type = ? AND commit_sha = ? "
            "AND outcome IN ('refused', 'quarantined') ORDER BY ts", (repo_id, repo_type, commit))
        return {path: (outcome, rule) for path, outcome, rule in rows}

    def count(self, query: AuditQuery) -> int:
        where, params = query.where()
        return int(self.db.execute(f"SELECT count(*) FROM events{where}", params).fetchone()[0])


def _rows(lines: list[bytes], path: Path) -> Iterable[tuple[Any, ...]]:
    for line in lines:
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            yield (parse_time(data["ts"]), data["caller"], data.get("client"), data.get("user_agent"),
                   data["repo_type"], data["repo_id"], data.get("revision"), data.get("commit"), data["path"],
                   data.get("etag"), data.get("bytes"), data["outcome"], data.get("rule"), data.get("via"),
                   data.get("request_id"))
        except (ValueError, KeyError, TypeError) as exc:  # a damaged line is reported, never a stop to the rest
            log.warning("audit file %s: a line that is not an event (%s): %.200r", path.name, exc, line)

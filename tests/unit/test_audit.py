"""The audit log's parts in-process: sessions, the event at an answer's start (refusals with their rule), and the
index catching up with files a writer is still appending to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mirror.audit import AUDIT_NOTE, AuditIndex, AuditLog, AuditQuery, AuditRecorder, decide, note_file
from mirror.audit.event import AuditEvent
from mirror.audit.recorder import is_continuation
from mirror.audit.session import Sessions


def scope(method: str = "GET", token: str | None = None) -> dict:
    headers = [(b"user-agent", b"ua/1")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return {"type": "http", "method": method, "headers": headers, "client": ("10.0.0.7", 51234)}


def start(status: int, *headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def lines(directory: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(directory.glob("events-*.jsonl")) for line in p.read_text().splitlines()]


def test_sessions_roll_up_continuations_within_the_idle_window() -> None:
    sessions = Sessions(idle=10)
    assert sessions.opens("a", 0)
    assert not sessions.opens("a", 9, continuation=True)
    assert not sessions.opens("a", 18, continuation=True)  # idle is counted from the last request
    assert sessions.opens("a", 29, continuation=True)  # came back too late: a session of its own
    assert sessions.opens("a", 30)  # from byte 0 again: a new download
    assert sessions.opens("b", 30, continuation=True)  # a resume of a download this process never saw
    small = Sessions(idle=100, max_open=2)
    for key in "xyz":
        small.opens(key, 0)
    assert len(small) == 2 and small.opens("x", 1, continuation=True)  # closed early: one event more, never less
    assert [is_continuation(v) for v in (b"bytes=0-", b"bytes=0-99", b"bytes=100-", b"bytes=-500", b"bytes=5-9")] \
        == [False, False, True, True, True]


def test_served_refused_and_not_recorded(tmp_path: Path) -> None:
    recorder = AuditRecorder(AuditLog(tmp_path), secrets=("svc_secret",))
    served = scope(token="hf_secret_token_1")
    note_file(served, "model", "acme/x", "w.bin", "main")
    recorder.response_started(served, start(200, (b"content-length", b"42"), (b"x-mirror-cache", b"hit"),
                                            (b"etag", b'"abc"'), (b"x-repo-commit", b"c" * 40)), "req1")
    head = scope("HEAD")
    note_file(head, "model", "acme/x", "w.bin", "main")
    recorder.response_started(head, start(200), None)  # a HEAD serves no file
    missing = scope()
    note_file(missing, "model", "acme/x", "nope", "main")
    recorder.response_started(missing, start(404), None)
    gated = scope()
    note_file(gated, "model", "acme/x", "g.bin", "main")
    recorder.response_started(gated, start(403, (b"x-error-code", b"GatedRepo")), None)  # upstream's, not ours
    blocked = scope("HEAD")  # a refusal counts on a HEAD too: the client stops there
    note_file(blocked, "model", "acme/x", "evil.pkl", "main")
    recorder.response_started(blocked, start(403, (b"x-error-code", b"PolicyBlocked"),
                                             (b"x-mirror-policy-rule", b"file-types")), None)
    quarantined = scope()
    note_file(quarantined, "model", "acme/x", "bad.bin", "main")
    decide(quarantined, "quarantined", "scan:os.system")
    recorder.response_started(quarantined, start(403, (b"x-error-code", b"PolicyBlocked")), None)
    no_note = scope()
    recorder.response_started(no_note, start(200), None)
    with pytest.raises(ValueError):
        decide(quarantined, "hit", "x")
    recorder.log.close()

    events = lines(tmp_path)
    assert [(e["path"], e["outcome"], e["rule"]) for e in events] == [
        ("w.bin", "hit", None), ("evil.pkl", "refused", "file-types"), ("bad.bin", "quarantined", "scan:os.system")]
    first = events[0]
    assert first["bytes"] == 42 and first["etag"] == "abc" and first["commit"] == "c" * 40
    assert first["client"] == "10.0.0.7" and first["user_agent"] == "ua/1" and first["request_id"] == "req1"
    assert first["caller"].startswith("token:") and "hf_secret" not in json.dumps(events)


def test_mirror_token_name_and_xet_caller(tmp_path: Path) -> None:
    recorder = AuditRecorder(AuditLog(tmp_path))
    named = scope(token="mt_ci_secret")
    named["hf_mirror.who"] = "ci"
    note_file(named, "dataset", "acme/d", "a.parquet", "main")
    recorder.response_started(named, start(206, (b"content-length", b"10")), None)
    xet = scope(token="xet-access-token")
    note_file(xet, "model", "acme/x", "w.bin", None, commit="c" * 40, etag="e" * 64, size=1000, via="xet",
              caller="ci", cache="miss")
    recorder.response_started(xet, start(200, (b"content-length", b"321")), None)  # the reconstruction's JSON
    recorder.log.close()
    events = lines(tmp_path)
    assert [(e["caller"], e["outcome"], e["bytes"], e["via"]) for e in events] == [
        ("ci", "hit", 10, "resolve"), ("ci", "miss", 1000, "xet")]
    assert AUDIT_NOTE in xet


def test_index_catches_up_and_leaves_a_line_being_written(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, max_file_bytes=4096, session_idle=0)
    for n in range(100):  # past the rotation size: several files
        log.record(AuditEvent(ts=1_700_000_000 + n, caller=f"c{n % 3}", client="1.2.3.4", user_agent="ua",
                              repo_type="model", repo_id="Acme/X" if n % 2 else "acme/y", revision="main",
                              commit=None, path=f"f{n % 5}", etag=None, bytes=n, outcome="hit"))
    log.close()
    files = sorted(tmp_path.glob("events-*.jsonl"))
    assert len(files) > 1
    with open(files[-1], "ab") as f:
        f.write(b'{"ts": "2026-01-01T00:00:00Z", "caller": "half')  # a writer mid-line
    index = AuditIndex(tmp_path / "index.sqlite")
    assert index.catch_up(tmp_path) == 100
    assert index.catch_up(tmp_path) == 0  # read once
    assert index.count(AuditQuery(repo="acme/x")) == 50  # repo ids are case-insensitive, as on the Hub
    assert index.count(AuditQuery(repo="dataset:acme/x")) == 0
    assert index.count(AuditQuery(repo="model:acme/x", path="f1", caller="c1")) == 4
    newest = index.query(AuditQuery(since=1_700_000_090, limit=3))
    assert [e["bytes"] for e in newest] == [99, 98, 97]
    assert newest[0]["ts"] == "2023-11-14T22:14:59.000Z"
    assert index.decisions("model", "acme/x", "c" * 40) == {}
    with open(files[-1], "ab") as f:
        f.write(b'"}\n')  # the line completes: a damaged event is skipped, never a stop
    assert index.catch_up(tmp_path) == 0
    index.close()

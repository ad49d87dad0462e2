"""The audit log (issue 27 item 4), against a real mirror process: one event per file per client session, counted
against the requests sent (a resumed download and a real hf_hub_download over Xet included); every event of a
completed answer is there after ``kill -9``; ``hf-mirror audit`` answers by repo, path, caller and time."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mirror.audit import AuditEvent, AuditLog
from tests.support.hub_emulator.fixtures import GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import REPO_ROOT, MirrorProcess, run_client

pytestmark = pytest.mark.e2e

MODEL = "acme/tiny-model"


def audit(cache: Path, *args: str) -> list[dict]:
    """``hf-mirror audit --json`` as a process (the CLI an operator runs), its events newest first."""
    proc = subprocess.run([sys.executable, "-m", "mirror", "audit", "--cache-dir", str(cache), "--json", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _indexed(cache: Path, count: int, timeout: float = 20.0) -> bool:
    """Whether the index (read as it is, no catch-up) holds ``count`` events within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with contextlib.closing(sqlite3.connect(cache / "audit" / "index.sqlite")) as db:
                if db.execute("SELECT count(*) FROM events").fetchone()[0] == count:
                    return True
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    return False


def _followers(cache: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mirror.audit.follower" in command and str(cache / "audit").encode() in command:
            found.append(int(pid))
    return found


def get(mirror: MirrorProcess, path: str, agent: str, token: str | None = None, **headers: str) -> httpx.Response:
    headers = {"user-agent": agent, **headers}
    if token:
        headers["authorization"] = f"Bearer {token}"
    response = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/{path}", headers=headers, timeout=30)
    assert response.status_code in (200, 206), (response.status_code, response.text[:300])
    return response


def test_one_event_per_file_per_client_session(emulator: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    size = len(emulator.files.file_bytes("model", MODEL, "main", "model.safetensors"))
    with MirrorProcess(emulator.url, cache) as mirror:
        # Client A: a file and a HEAD (a HEAD serves no file: one event).
        get(mirror, "config.json", "client-a")
        assert httpx.head(f"{mirror.url}/{MODEL}/resolve/main/config.json").status_code == 200
        # Client A: a download cut after 1000 bytes and resumed with Range (one event).
        assert len(get(mirror, "model.safetensors", "client-a", range="bytes=0-999").content) == 1000
        rest = get(mirror, "model.safetensors", "client-a", range="bytes=1000-")
        assert len(rest.content) == size - 1000
        # Client C downloads a file twice from byte 0: two downloads, two events.
        get(mirror, "sub/nested.txt", "client-c")
        get(mirror, "sub/nested.txt", "client-c")
        # Client B, with its own Hub token: the same file is its own event.
        get(mirror, "config.json", "client-b", token=GOOD_TOKEN)
        # The real client over HTTP (HEAD then GET: one event), and over Xet (HEAD, token, reconstruction, byte
        # ranges: one event).
        code = f"""
import json
from huggingface_hub import hf_hub_download
print(json.dumps(hf_hub_download("{MODEL}", "{{name}}")))
"""
        run_client(code.replace("{name}", "README.md"), mirror.url, tmp_path / "http-home")
        run_client(code.replace("{name}", "model.safetensors"), mirror.url, tmp_path / "xet-home",
                   HF_HUB_DISABLE_XET="0")
        indexed_by_the_server = _indexed(cache, 7)
        events = audit(cache)
        log = mirror.log()

    assert indexed_by_the_server  # the server's own follower indexed them, before any `hf-mirror audit`
    assert len(events) == 7, json.dumps(events, indent=1)
    assert [e["user_agent"] for e in events if e["path"] == "sub/nested.txt"] == ["client-c", "client-c"]
    by_key = {(e["user_agent"].split("/")[0].split(";")[0], e["path"]): e for e in events}
    a_config = by_key[("client-a", "config.json")]
    assert a_config["outcome"] == "miss" and a_config["caller"] == "anon" and a_config["client"] == "127.0.0.1"
    assert a_config["repo_type"] == "model" and a_config["repo_id"] == MODEL and a_config["revision"] == "main"
    assert len(a_config["commit"]) == 40 and a_config["etag"] and a_config["via"] == "resolve"
    assert a_config["bytes"] == len(emulator.files.file_bytes("model", MODEL, "main", "config.json"))
    resumed = by_key[("client-a", "model.safetensors")]
    assert resumed["bytes"] == 1000  # the session's first answer; the resume rolled up into it
    b_config = by_key[("client-b", "config.json")]
    assert b_config["caller"] == "token:" + hashlib.sha256(GOOD_TOKEN.encode()).hexdigest()[:16]
    xet = [e for e in events if e["via"] == "xet"]
    assert len(xet) == 1 and xet[0]["path"] == "model.safetensors" and xet[0]["bytes"] == size
    assert xet[0]["etag"] == resumed["etag"] and xet[0]["commit"] == resumed["commit"]
    assert all(e["rule"] is None for e in events)
    # Never a token: not in the events, not in the files.
    files = "".join(p.read_text() for p in (cache / "audit").glob("events-*.jsonl"))
    assert GOOD_TOKEN not in files and GOOD_TOKEN not in json.dumps(events)
    assert len(files.splitlines()) == 7
    assert "Traceback" not in log


def test_events_survive_kill_9_and_answer_the_query(emulator: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    mirror = MirrorProcess(emulator.url, cache).start()
    try:
        started = time.time()
        for path in ("config.json", "sub/nested.txt", "tokenizer.json"):
            get(mirror, path, "before-crash")
        get(mirror, "config.json", "other", token=GOOD_TOKEN)
    finally:
        mirror.kill9()  # at once: the background index pass may not have run
    assert len(audit(cache)) == 4
    # The server's index follower (its child) exits by itself once the server is gone.
    deadline = time.monotonic() + 20
    while _followers(cache) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _followers(cache)
    assert [e["path"] for e in audit(cache, "--repo", MODEL, "--path", "config.json")] == ["config.json"] * 2
    assert {e["path"] for e in audit(cache, "--repo", f"model:{MODEL}")} == {"config.json", "sub/nested.txt",
                                                                             "tokenizer.json"}
    assert audit(cache, "--repo", f"dataset:{MODEL}") == []
    caller = "token:" + hashlib.sha256(GOOD_TOKEN.encode()).hexdigest()[:16]
    assert [e["user_agent"] for e in audit(cache, "--caller", caller)] == ["other"]
    assert len(audit(cache, "--caller", "anon", "--since", "1h")) == 3
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started - 5))
    assert len(audit(cache, "--since", since)) == 4
    assert audit(cache, "--since", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))) == []
    # Newest first, and the count.
    events = audit(cache)
    assert [e["ts"] for e in events] == sorted((e["ts"] for e in events), reverse=True)
    count = subprocess.run([sys.executable, "-m", "mirror", "audit", "--cache-dir", str(cache), "--count",
                            "--repo", MODEL], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert count.stdout.strip() == "4"


def test_sbom_of_a_cached_revision_validates(emulator: EmulatorHandle, tmp_path: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    cache = tmp_path / "cache"
    paths = ("config.json", "README.md", "model.safetensors")
    with MirrorProcess(emulator.url, cache) as mirror:
        for path in paths:
            get(mirror, path, "sbom")
        info = httpx.get(f"{mirror.url}/api/models/{MODEL}/revision/main", timeout=30).json()
    # A refusal the admission policy made (written as its hook would): the BOM carries the mirror's decision.
    refusals = AuditLog(cache / "audit")
    refusals.write(AuditEvent(ts=time.time(), caller="anon", client="10.0.0.1", user_agent="x", repo_type="model",
                              repo_id=MODEL, revision="main", commit=info["sha"], path="README.md", etag=None,
                              bytes=None, outcome="quarantined", rule="scan:os.system"))
    refusals.close()
    out = tmp_path / "bom.json"
    proc = subprocess.run([sys.executable, "-m", "mirror", "sbom", f"{MODEL}@main", "--cache-dir", str(cache),
                           "-o", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    bom = json.loads(text)
    subject = bom["metadata"]["component"]
    assert subject["type"] == "machine-learning-model" and subject["name"] == MODEL
    assert subject["version"] == info["sha"]
    assert subject["licenses"] == [{"license": {"id": "MIT"}}]
    assert subject["purl"] == f"pkg:huggingface/acme/tiny-model@{info['sha']}"
    files = {c["name"]: c for c in bom["components"]}
    assert set(files) == set(paths)
    for path in paths:
        digest = hashlib.sha256(emulator.files.file_bytes("model", MODEL, "main", path)).hexdigest()
        assert {"alg": "SHA-256", "content": digest} in files[path]["hashes"], path
        props = {p["name"]: p["value"] for p in files[path]["properties"]}
        assert props["hf-mirror:cached"] == "true"
        decided = (props.get("hf-mirror:admission"), props.get("hf-mirror:rule"))
        assert decided == (("quarantined", "scan:os.system") if path == "README.md" else (None, None))
    # Not cached: a clear refusal, no BOM.
    missing = subprocess.run([sys.executable, "-m", "mirror", "sbom", "acme/nothing@main", "--cache-dir", str(cache)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "not known" in missing.stderr

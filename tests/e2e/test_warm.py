"""Warm on request (issue 19): POST /api/mirror/warm, GET /api/mirror/warm/{id}, GET /api/mirror/ready, driven the
way an init container drives them, against a real mirror in front of the emulator."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.mirror_proc import MirrorProcess

MODEL = "acme/tiny-model"


@pytest.fixture
def mirror(emulator, tmp_path: Path):
    with MirrorProcess(emulator.url, tmp_path / "cache") as proc:
        yield proc


def bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def wait_done(client: httpx.Client, job_id: str, headers: dict[str, str] | None = None) -> dict:
    deadline = time.monotonic() + 60
    while True:
        state = client.get(f"/api/mirror/warm/{job_id}", headers=headers or {}).json()
        if state["state"] in ("done", "failed"):
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


def test_warm_then_ready_like_an_init_container(emulator, mirror):
    files = emulator.files.repo("model", MODEL).commits[emulator.files.repo("model", MODEL).branches["main"]].files
    with httpx.Client(base_url=mirror.url, timeout=30) as client:
        ready = client.get("/api/mirror/ready", params={"repo": MODEL, "type": "model", "revision": "main"})
        assert ready.status_code == 503
        assert ready.json()["ready"] is False and set(ready.json()["missing"]) == set(files)
        emulator.reset_stats()
        started = client.post("/api/mirror/warm", json={"repo": MODEL, "type": "model", "revision": "main"})
        assert started.status_code == 202, started.text
        body = started.json()
        assert len(body["commit"]) == 40 and body["id"]
        state = wait_done(client, body["id"])
        assert state["state"] == "done", state
        assert state["files_total"] == len(files) == state["files_done"] and not state["errors"]
        assert state["bytes_done"] == state["bytes_total"] == sum(f.size for f in files.values())
        ready = client.get("/api/mirror/ready", params={"repo": MODEL, "type": "model", "revision": "main"})
        assert ready.status_code == 200 and ready.json() == {
            "ready": True, "commit": body["commit"], "files_total": len(files), "files_missing": 0, "missing": []}
        # Each file came from upstream once; a client download now is a hit.
        for path in files:
            assert emulator.fetch_count("model", MODEL, path) <= 1, path
        hit = client.get(f"/{MODEL}/resolve/main/config.json")
        assert hit.status_code == 200 and hit.headers["x-mirror-cache"] == "hit"
        # Warming again fetches nothing.
        again = wait_done(client, client.post("/api/mirror/warm", json={"repo": MODEL}).json()["id"])
        assert again["state"] == "done" and again["files_done"] == len(files)


def test_ready_with_patterns_and_a_partial_warm(emulator, mirror):
    with httpx.Client(base_url=mirror.url, timeout=30) as client:
        job = client.post("/api/mirror/warm", json={"repo": MODEL, "allow_patterns": ["*.json"]}).json()
        state = wait_done(client, job["id"])
        assert state["state"] == "done" and state["files_total"] >= 1
        json_only = client.get("/api/mirror/ready", params={"repo": MODEL, "allow_patterns": "*.json"})
        assert json_only.status_code == 200, json_only.text
        everything = client.get("/api/mirror/ready", params={"repo": MODEL})
        assert everything.status_code == 503
        assert all(not p.endswith(".json") for p in everything.json()["missing"])


def test_warm_follows_the_callers_access(emulator, mirror):
    with httpx.Client(base_url=mirror.url, timeout=30) as client:
        emulator.reset_stats()
        anon = client.post("/api/mirror/warm", json={"repo": "acme/gated-model"})
        assert anon.status_code == 401 and anon.headers["x-error-code"]
        denied = client.post("/api/mirror/warm", json={"repo": "acme/gated-model"}, headers=bearer(DENIED_TOKEN))
        assert denied.status_code in (401, 403), denied.text  # its access is checked before any job starts
        assert emulator.fetch_count("model", "acme/gated-model", "model.safetensors") == 0
        good = client.post("/api/mirror/warm", json={"repo": "acme/gated-model"}, headers=bearer(GOOD_TOKEN))
        assert good.status_code == 202
        assert wait_done(client, good.json()["id"], bearer(GOOD_TOKEN))["state"] == "done"
        # The job's status follows the repo's read rule: to anyone else, it is unknown.
        assert client.get(f"/api/mirror/warm/{good.json()['id']}").status_code == 404
        # Ready is a read like any other: anonymous callers learn nothing of a gated repo's files.
        assert client.get("/api/mirror/ready", params={"repo": "acme/gated-model"}).status_code in (401, 403)
        assert client.get("/api/mirror/ready", params={"repo": "acme/gated-model"},
                          headers=bearer(GOOD_TOKEN)).status_code == 200
        # Nothing reached upstream with a token other than the callers' own.
        assert all(r["auth"] in (None, f"Bearer {GOOD_TOKEN}", f"Bearer {DENIED_TOKEN}")
                   for r in emulator.requests())


@pytest.mark.parametrize("body, status", [
    ({}, 400), ({"repo": "a/b/c"}, 400), ({"repo": MODEL, "type": "bucket"}, 400),
    ({"repo": MODEL, "allow_patterns": "x" * 300}, 400), ({"repo": MODEL, "color": "red"}, 400),
    ([1, 2], 400), ({"repo": "acme/no-such-repo"}, 404),
])
def test_bad_warm_requests_get_a_clear_error(mirror, body, status):
    response = httpx.post(mirror.url + "/api/mirror/warm", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert response.headers["x-error-code"] and response.json()["error"]


def test_warm_needs_json_and_unknown_jobs_are_404(mirror):
    form = httpx.post(mirror.url + "/api/mirror/warm", data={"repo": MODEL}, timeout=30)
    assert form.status_code == 415
    # No page on another origin can start jobs: its preflight is granted nothing, its request is refused.
    preflight = httpx.options(mirror.url + "/api/mirror/warm", timeout=30, headers={
        "origin": "https://evil.example", "access-control-request-method": "POST",
        "access-control-request-headers": "content-type"})
    assert "access-control-allow-headers" not in preflight.headers
    assert "access-control-allow-methods" not in preflight.headers
    cross = httpx.post(mirror.url + "/api/mirror/warm", json={"repo": MODEL}, timeout=30,
                       headers={"origin": "https://evil.example", "sec-fetch-site": "cross-site"})
    assert cross.status_code == 403 and cross.headers["x-error-code"] == "CrossSiteRequest"
    assert httpx.get(mirror.url + "/api/mirror/warm/0123456789abcdef", timeout=30).status_code == 404
    assert httpx.get(mirror.url + "/api/mirror/warm", timeout=30).status_code == 405

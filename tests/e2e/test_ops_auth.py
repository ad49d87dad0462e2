"""Who may change the cache over HTTP (issue 23, items 1, 3, 6 and 12), with real mirror processes in front of the
emulator: unpin and evict need an operator credential (``--admin-token``, or a mirror token marked admin); pin and
warm are open only for repos whose content the caller may read; a warm job's status follows its repo's read rule; a
scoped mirror token sees only its repos on the ops routes; a warm of a missing repo names it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, blob, wait_for

ADMIN_TOKEN = "adm_operator_secret_value"
SCOPED_TOKEN = "mt_scoped_tiny"
WIDE_TOKEN = "mt_wide_everything"
ADMIN_MIRROR_TOKEN = "mt_admin_ops"
JWT_KEY = "a-jwt-signing-key-of-32-bytes-at-least"
GATED = "acme/gated-model"
PRIVATE = "acme/private-model"
PUBLIC = "acme/tiny-model"


def bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def etag(emulator: EmulatorHandle, repo_id: str, path: str, kind: str = "model") -> str:
    repo = emulator.files.repo(kind, repo_id)
    return repo.commits[repo.branches["main"]].files[path].etag


def action(mirror: MirrorProcess, repo_id: str, name: str, token: str | None = None,
           kind: str = "model") -> httpx.Response:
    return httpx.post(f"{mirror.url}/api/mirror/repos/{kind}/{repo_id}/{name}", json={}, headers=bearer(token),
                      timeout=30)


def warm(mirror: MirrorProcess, repo_id: str, token: str | None = None, kind: str = "model") -> httpx.Response:
    return httpx.post(mirror.url + "/api/mirror/warm", json={"repo": repo_id, "type": kind}, headers=bearer(token),
                      timeout=30)


def wait_done(mirror: MirrorProcess, job_id: str, token: str | None) -> dict:
    deadline = time.monotonic() + 60
    while True:
        state = httpx.get(f"{mirror.url}/api/mirror/warm/{job_id}", headers=bearer(token), timeout=30).json()
        if state["state"] in ("done", "failed"):
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


@pytest.fixture(scope="module")
def plain(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    """The default mode, with no --admin-token: unpin and evict are for the CLI on the host."""
    with MirrorProcess(emulator.url, tmp_path_factory.mktemp("plain") / "cache") as proc:
        yield proc


def test_without_an_admin_token_nobody_unpins_or_evicts_over_http(emulator, plain):
    gated_blob = blob(plain.cache_dir, etag(emulator, GATED, "model.safetensors"))
    got = httpx.get(f"{plain.url}/{GATED}/resolve/main/model.safetensors", headers=bearer(GOOD_TOKEN), timeout=30)
    assert got.status_code == 200
    wait_for(gated_blob.is_file)  # stored once the fill commits
    for token in (None, DENIED_TOKEN, GOOD_TOKEN, ADMIN_TOKEN):  # even the entitled user is no operator
        for name in ("evict", "unpin"):
            refused = action(plain, GATED, name, token)
            assert refused.status_code == 403, (token, name, refused.text)
            assert refused.headers["x-error-code"] == "OperatorRequired"
            assert "--admin-token" in refused.json()["error"] and "hf-mirror cache rm" in refused.json()["error"]
    assert action(plain, PUBLIC, "evict").status_code == 403  # public repos too: an eviction is an operator's
    assert gated_blob.is_file()
    # The entitled user still gets the cached file.
    hit = httpx.get(f"{plain.url}/{GATED}/resolve/main/model.safetensors", headers=bearer(GOOD_TOKEN), timeout=30)
    assert hit.status_code == 200 and hit.headers["x-mirror-cache"] == "hit"


def test_pin_and_warm_are_open_only_for_content_the_caller_may_read(emulator, plain):
    httpx.get(f"{plain.url}/{GATED}/resolve/main/config.json", headers=bearer(GOOD_TOKEN), timeout=30)
    httpx.get(f"{plain.url}/api/models/{GATED}", timeout=30)  # its metadata is public: its content is not
    emulator.reset_stats()
    for token in (None, DENIED_TOKEN):
        for repo_id in (GATED, PRIVATE):
            pin = action(plain, repo_id, "pin", token)
            assert pin.status_code in (401, 403, 404) and pin.headers["x-error-code"], (token, repo_id, pin.text)
            warmed = warm(plain, repo_id, token)
            assert warmed.status_code in (401, 403, 404) and warmed.headers["x-error-code"], (token, repo_id)
    status = httpx.get(plain.url + "/api/mirror/status", timeout=30).json()
    assert not any(r["pinned"] for r in status["repos"])
    assert emulator.fetch_count("model", GATED, "model.safetensors") == 0
    assert emulator.fetch_count("model", PRIVATE, "config.json") == 0
    # The entitled caller may pin and warm them; anyone may pin and warm a public repo.
    assert action(plain, GATED, "pin", GOOD_TOKEN).status_code == 200
    good = warm(plain, PRIVATE, GOOD_TOKEN)
    assert good.status_code == 202 and wait_done(plain, good.json()["id"], GOOD_TOKEN)["state"] == "done"
    public = warm(plain, PUBLIC)
    assert public.status_code == 202 and wait_done(plain, public.json()["id"], None)["state"] == "done"
    assert action(plain, PUBLIC, "pin").status_code == 200


def test_a_warm_jobs_status_follows_its_repos_read_rule(emulator, plain):
    started = warm(plain, PRIVATE, GOOD_TOKEN)
    assert started.status_code == 202
    job_id = started.json()["id"]
    unknown = httpx.get(f"{plain.url}/api/mirror/warm/{'0' * 16}", timeout=30)
    assert unknown.status_code == 404
    for token in (None, DENIED_TOKEN, "hf_made_up"):
        answer = httpx.get(f"{plain.url}/api/mirror/warm/{job_id}", headers=bearer(token), timeout=30)
        assert answer.status_code == 404, (token, answer.text)
        assert (answer.headers["x-error-code"], answer.json()) == (unknown.headers["x-error-code"], unknown.json())
    entitled = httpx.get(f"{plain.url}/api/mirror/warm/{job_id}", headers=bearer(GOOD_TOKEN), timeout=30)
    assert entitled.status_code == 200 and entitled.json()["repo"] == PRIVATE


@pytest.mark.parametrize("kind, repo_id", [("model", "acme/no-such-repo"), ("dataset", "acme/nothing-here")])
@pytest.mark.parametrize("token", [None, GOOD_TOKEN])
def test_a_warm_of_a_missing_repo_is_a_404_that_names_it(plain, kind, repo_id, token):
    missing = warm(plain, repo_id, token, kind=kind)
    assert missing.status_code == 404 and missing.headers["x-error-code"] == "RepoNotFound", missing.text
    assert f"{kind} {repo_id} not found upstream, or not visible" in missing.json()["error"]


def test_with_an_admin_token_the_operator_unpins_and_evicts(emulator, tmp_path: Path):
    cache = tmp_path / "cache"
    with MirrorProcess(emulator.url, cache, env={"HF_MIRROR_ADMIN_TOKEN": ADMIN_TOKEN}) as mirror:
        gated_blob = blob(cache, etag(emulator, GATED, "model.safetensors"))
        got = httpx.get(f"{mirror.url}/{GATED}/resolve/main/model.safetensors", headers=bearer(GOOD_TOKEN),
                        timeout=30)
        assert got.status_code == 200
        wait_for(gated_blob.is_file)  # stored once the fill commits
        # The operator's status lists every cached repo; anyone else's only the public ones.
        wait_for(lambda: [r["id"] for r in httpx.get(mirror.url + "/api/mirror/status", headers=bearer(ADMIN_TOKEN),
                                                     timeout=30).json()["repos"]] == [GATED], timeout=30)
        assert httpx.get(mirror.url + "/api/mirror/status", timeout=30).json()["repos"] == []
        emulator.reset_stats()
        for token in (None, GOOD_TOKEN, ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x"):
            refused = action(mirror, GATED, "evict", token)
            assert refused.status_code == 403 and refused.headers["x-error-code"] == "OperatorRequired", token
            assert "hf-mirror cache rm" not in refused.json()["error"]  # one is set: send it
        assert gated_blob.is_file()
        # The operator pins and unpins any repo, and evicts it: its blobs leave the disk.
        assert action(mirror, GATED, "pin", ADMIN_TOKEN).status_code == 200
        assert action(mirror, GATED, "evict", ADMIN_TOKEN).status_code == 409  # pinned
        unpinned = action(mirror, GATED, "unpin", ADMIN_TOKEN)
        assert unpinned.status_code == 200 and unpinned.json()["was_pinned_by"] == "operator"
        evicted = action(mirror, GATED, "evict", ADMIN_TOKEN)
        assert evicted.status_code == 200 and evicted.json()["blobs"] == 1, evicted.text
        assert not gated_blob.exists()
        # The admin token is no Hub token and never goes upstream: the operator's warm reads as an anonymous one.
        assert warm(mirror, PUBLIC, ADMIN_TOKEN).status_code == 202
        assert warm(mirror, GATED, ADMIN_TOKEN).status_code in (401, 403)
        assert not any(ADMIN_TOKEN in (r["auth"] or "") for r in emulator.requests())
        assert emulator.fetch_count("model", GATED, "model.safetensors") == 0


def test_a_scoped_mirror_token_sees_only_its_repos_and_admin_tokens_evict(emulator, tmp_path: Path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "scoped"\ntoken = "{SCOPED_TOKEN}"\nrepos = ["model:acme/tiny-*"]\n'
                      f'[[token]]\nname = "wide"\ntoken = "{WIDE_TOKEN}"\nrepos = ["*"]\n'
                      f'[[token]]\nname = "ops"\ntoken = "{ADMIN_MIRROR_TOKEN}"\nrepos = ["*"]\nadmin = true\n')
    with MirrorProcess(emulator.url, tmp_path / "cache", "--auth-tokens-file", str(tokens), "--jwt-secret", JWT_KEY,
                       "--upstream-token", GOOD_TOKEN, env={"HF_MIRROR_SHUTDOWN_GRACE": "1"}) as mirror:
        for path in (f"/{PUBLIC}/resolve/main/config.json", f"/{GATED}/resolve/main/config.json",
                     "/datasets/acme/tiny-jsonl/resolve/main/train.jsonl"):
            assert httpx.get(mirror.url + path, headers=bearer(WIDE_TOKEN), timeout=30).status_code == 200
        deadline = time.monotonic() + 30  # a fresh usage snapshot
        while httpx.get(mirror.url + "/api/mirror/status", headers=bearer(WIDE_TOKEN),
                        timeout=30).json()["repos_total"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        # A warm in progress (throttled upstream) of a repo outside the scoped token's patterns.
        emulator.set_faults(throttle_bps=200_000)
        try:
            job = warm(mirror, "acme/big-data", WIDE_TOKEN, kind="dataset")
            assert job.status_code == 202
            job_id = job.json()["id"]
            deadline = time.monotonic() + 30
            while not (wide := httpx.get(mirror.url + "/api/mirror/status", headers=bearer(WIDE_TOKEN),
                                         timeout=30).json())["warming"]:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            scoped = httpx.get(mirror.url + "/api/mirror/status", headers=bearer(SCOPED_TOKEN), timeout=30).json()
            page = httpx.get(mirror.url + "/", headers=bearer(SCOPED_TOKEN), timeout=30).text
            job_scoped = httpx.get(f"{mirror.url}/api/mirror/warm/{job_id}", headers=bearer(SCOPED_TOKEN), timeout=30)
            job_wide = httpx.get(f"{mirror.url}/api/mirror/warm/{job_id}", headers=bearer(WIDE_TOKEN), timeout=30)
            metrics = httpx.get(mirror.url + "/metrics", headers=bearer(SCOPED_TOKEN), timeout=30).text
        finally:
            emulator.clear_faults()
        # The warm's small files may already be stored (its repo then listed too): the wide token sees it either way.
        assert {(r["type"], r["id"]) for r in wide["repos"]} - {("dataset", "acme/big-data")} == {
            ("model", PUBLIC), ("model", GATED), ("dataset", "acme/tiny-jsonl")}
        assert [j["repo"] for j in wide["warming"]] == ["acme/big-data"]
        assert [(r["type"], r["id"]) for r in scoped["repos"]] == [("model", PUBLIC)] and scoped["repos_total"] == 1
        assert scoped["warming"] == [] and scoped["fills"] == []
        assert PUBLIC in page and GATED not in page and "tiny-jsonl" not in page and "big-data" not in page
        assert job_scoped.status_code == 404 and job_wide.status_code == 200
        assert "acme/" not in metrics  # no repo names as labels
        # In auth mode the operator is a mirror token marked admin (or the --admin-token).
        for token in (SCOPED_TOKEN, WIDE_TOKEN):
            refused = action(mirror, PUBLIC, "evict", token)
            assert refused.status_code == 403 and refused.headers["x-error-code"] == "OperatorRequired"
        assert action(mirror, PUBLIC, "evict").status_code == 401
        evicted = action(mirror, PUBLIC, "evict", ADMIN_MIRROR_TOKEN)
        assert evicted.status_code == 200 and evicted.json()["blobs"] == 1
        claims = {"sub": "ci", "repos": ["*"], "exp": int(time.time()) + 600}
        assert action(mirror, PUBLIC, "unpin", jwt.encode(claims, JWT_KEY, algorithm="HS256")).status_code == 403
        admin_jwt = jwt.encode({**claims, "admin": True}, JWT_KEY, algorithm="HS256")
        assert action(mirror, PUBLIC, "unpin", admin_jwt).status_code == 200
        assert action(mirror, GATED, "pin", SCOPED_TOKEN).status_code == 403  # outside its patterns
        assert action(mirror, PUBLIC, "pin", SCOPED_TOKEN).status_code == 200

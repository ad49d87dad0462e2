"""The Xet token route and the CAS behind a fleet (issue 23, item 4).

- The token route runs resolve's access check before anything else: a private repo and a missing one get the one
  answer upstream gives (no existence oracle), whatever this node has seen of either.
- An entitled caller gets a token on a node that never saw a HEAD of the repo, and the CAS of a node that never saw
  the file finds its hash in upstream's listing of the token's commit (asked with the caller's token).
- With ``--xet-signing-secret``, every node accepts every node's tokens and byte-range URLs; another secret does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_xet import XET_ON, sha256, token_for, xet_hash
from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, free_port, run_client, wait_for
from tests.support.nginx_front import NginxFront, nginx_binary

pytest.importorskip("hf_xet")
pytestmark = pytest.mark.e2e

PRIVATE = "acme/private-model"
MISSING = "acme/no-such-model"
DATASET = "acme/tiny-parquet"
SECRET = "fleet-secret-" + "0123456789abcdef" * 3
OTHER_SECRET = "other-secret-" + "fedcba9876543210" * 3


@pytest.fixture(scope="module")
def fleet(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MirrorProcess]]:
    """Two nodes sharing a signing secret (A by flag, B by env), a third with another one; separate caches."""
    root = tmp_path_factory.mktemp("xet-fleet")
    with MirrorProcess(emulator.url, root / "cache-a", "--xet-signing-secret", SECRET) as a, \
            MirrorProcess(emulator.url, root / "cache-b", env={"HF_MIRROR_XET_SIGNING_SECRET": SECRET}) as b, \
            MirrorProcess(emulator.url, root / "cache-c", "--xet-signing-secret", OTHER_SECRET) as c:
        yield [a, b, c]


def error_shape(answer: httpx.Response) -> tuple:
    return answer.status_code, answer.headers.get("x-error-code"), answer.headers.get("x-error-message"), \
        answer.headers.get("content-type"), answer.json()


def test_private_and_missing_repos_get_one_answer(emulator, fleet):
    """Anonymous and not-member callers: the same status, code, message and body for a private repo and a missing
    one, before and after an entitled caller made the private repo known to the node."""
    a = fleet[0]
    commit = emulator.files.commit("model", PRIVATE, "main")
    for rev in ("main", commit):
        anon = [error_shape(token_for(a, repo, rev)) for repo in (PRIVATE, MISSING)]
        assert anon[0] == anon[1] and anon[0][:2] == (401, "RepoNotFound"), anon
        denied = [error_shape(token_for(a, repo, rev, DENIED_TOKEN)) for repo in (PRIVATE, MISSING)]
        assert denied[0] == denied[1] and denied[0][:2] == (404, "RepoNotFound"), denied
    # The node now knows the private repo, its file and its Xet hash: still the one answer.
    head = httpx.head(f"{a.url}/{PRIVATE}/resolve/main/model.safetensors",
                      headers={"authorization": f"Bearer {GOOD_TOKEN}"})
    assert head.status_code == 200 and head.headers.get("x-xet-hash")
    for rev in ("main", commit):
        anon = [error_shape(token_for(a, repo, rev)) for repo in (PRIVATE, MISSING)]
        assert anon[0] == anon[1] and anon[0][:2] == (401, "RepoNotFound"), anon
        denied = [error_shape(token_for(a, repo, rev, DENIED_TOKEN)) for repo in (PRIVATE, MISSING)]
        assert denied[0] == denied[1] and denied[0][:2] == (404, "RepoNotFound"), denied
    assert token_for(a, PRIVATE, commit, GOOD_TOKEN).status_code == 200


def reconstruct(cas: MirrorProcess, token: str, xh: str) -> httpx.Response:
    return httpx.get(f"{cas.url}/_xet/v2/reconstructions/{xh}", headers={"authorization": f"Bearer {token}"})


def first_bytes(rec: httpx.Response, n: int = 10) -> bytes:
    url = next(iter(rec.json()["xorbs"].values()))[0]["url"]
    got = httpx.get(url, headers={"range": f"bytes=8-{8 + n - 1}"})  # past the first chunk's 8-byte header
    assert got.status_code == 206, got.text
    return got.content


def test_token_and_cas_on_a_node_that_saw_no_head(emulator, fleet):
    """Node B has seen nothing of the private repo: an entitled caller still gets a token there, and B's CAS finds
    the file's hash in upstream's listing of the commit, asked with that caller's token."""
    b = fleet[1]
    commit = emulator.files.commit("model", PRIVATE, "main")
    xh = xet_hash(emulator, "model", PRIVATE, "model.safetensors")
    emulator.reset_stats()
    answer = token_for(b, PRIVATE, "main", GOOD_TOKEN)
    assert answer.status_code == 200, answer.text
    rec = reconstruct(b, answer.json()["accessToken"], xh)
    assert rec.status_code == 200, rec.text
    assert first_bytes(rec) == emulator.files.file_bytes("model", PRIVATE, "main", "model.safetensors")[:10]
    records = emulator.requests()
    assert not [r for r in records if r["method"] == "HEAD" and r["path"].endswith("/model.safetensors")], records
    listings = [r for r in records if f"/api/models/{PRIVATE}/tree/{commit}" in r["path"]]
    assert listings and all(r["auth"] == f"Bearer {GOOD_TOKEN}" for r in listings), records
    # The listing of one repo never names another repo's file: a public repo's token reads no private hash.
    public = token_for(b, "acme/tiny-model", "main")
    assert public.status_code == 200
    assert reconstruct(b, public.json()["accessToken"], xh).status_code == 404
    # A file past the listing's first page (the emulator pages by 3), in a dataset: found too.
    path = "data/train-00000-of-00001.parquet"
    dataset_commit = emulator.files.commit("dataset", DATASET, "main")
    token = httpx.get(f"{b.url}/api/datasets/{DATASET}/xet-read-token/{dataset_commit}").json()["accessToken"]
    emulator.reset_stats()
    rec = reconstruct(b, token, xet_hash(emulator, "dataset", DATASET, path))
    assert rec.status_code == 200, rec.text
    assert first_bytes(rec) == emulator.files.file_bytes("dataset", DATASET, "main", path)[:10]
    assert any("cursor=" in r["path"] for r in emulator.requests() if "/tree/" in r["path"])


def test_nodes_sharing_a_secret_accept_each_others_tokens(emulator, fleet):
    a, b, c = fleet
    xh = xet_hash(emulator, "model", PRIVATE, "model.safetensors")
    data = emulator.files.file_bytes("model", PRIVATE, "main", "model.safetensors")
    token = token_for(a, PRIVATE, "main", GOOD_TOKEN).json()["accessToken"]
    # A's token at B's CAS (the caller's own Hub token, sealed by A, opened by B for the fill upstream).
    rec = reconstruct(b, token, xh)
    assert rec.status_code == 200, rec.text
    assert first_bytes(rec) == data[:10]
    # A's byte-range URLs at B.
    rec_a = reconstruct(a, token, xh)
    url = next(iter(rec_a.json()["xorbs"].values()))[0]["url"]
    at_b = httpx.get(url.replace(a.url, b.url), headers={"range": "bytes=8-17"})
    assert at_b.status_code == 206 and at_b.content == data[:10]
    # Another secret: the token and the URLs are refused.
    refused = reconstruct(c, token, xh)
    assert refused.status_code == 401 and "www-authenticate" in refused.headers
    assert httpx.get(url.replace(a.url, c.url), headers={"range": "bytes=8-17"}).status_code == 403
    # And C's own tokens are refused by A.
    own = token_for(c, PRIVATE, "main", GOOD_TOKEN)
    assert own.status_code == 200
    assert reconstruct(a, own.json()["accessToken"], xh).status_code == 401


def split_front(tmp: Path, resolve_to: MirrorProcess, rest_to: MirrorProcess) -> Path:
    """An nginx front that is not sticky in the worst way: every resolve goes to one node, every other request (the
    token route, the CAS, the byte ranges) to another."""
    for sub in ("logs", "temp"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    temps = "".join(f"    {name}_temp_path {tmp / 'temp' / name};\n"
                    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root root;\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(f"""{user}worker_processes 1;
pid {tmp / 'nginx.pid'};
error_log {tmp / 'logs' / 'error.log'};
events {{ worker_connections 256; }}
http {{
{temps}    access_log {tmp / 'logs' / 'access.log'};
    server {{
        listen 127.0.0.1:{free_port()};
        proxy_http_version 1.1;
        proxy_set_header Host $http_host;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_request_buffering off;
        location ~ /resolve/ {{ proxy_pass http://127.0.0.1:{resolve_to.port}; }}
        location / {{ proxy_pass http://127.0.0.1:{rest_to.port}; }}
    }}
}}
""")
    return conf


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")
def test_real_client_behind_a_front_that_is_not_sticky(emulator, tmp_path):
    """hf_hub_download with hf_xet, an entitled caller, a private repo: its HEAD goes to node A, its token, its
    reconstruction and its byte ranges to a fresh node B (same secret), which downloads the file through."""
    with MirrorProcess(emulator.url, tmp_path / "cache-a", "--xet-signing-secret", SECRET) as a, \
            MirrorProcess(emulator.url, tmp_path / "cache-b", "--xet-signing-secret", SECRET) as b, \
            NginxFront(split_front(tmp_path / "front", a, b)) as front:
        code = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
p = hf_hub_download("{PRIVATE}", "model.safetensors", token="{GOOD_TOKEN}")
print(json.dumps(hashlib.sha256(open(p, "rb").read()).hexdigest()))
"""
        got = run_client(code, front.url, tmp_path / "home", **XET_ON)
        assert got == sha256(emulator.files.file_bytes("model", PRIVATE, "main", "model.safetensors"))
        wait_for(lambda: "/_xet/xorb/" in b.log() and "/resolve/" in a.log(), timeout=5)  # lines go out every 0.2 s
        a_log, b_log = a.log(), b.log()
        assert "/resolve/main/model.safetensors" in a_log and "/resolve/" not in b_log, b_log[-2000:]
        for route in ("/xet-read-token/", "/_xet/v", "/_xet/xorb/"):
            assert route in b_log and route not in a_log, (route, b_log[-2000:])


def test_offline_token_from_what_the_node_knows(emulator, tmp_path):
    """Offline, with the revision's info never cached (only a HEAD went through): the token still follows resolve's
    offline rules: a caller whose access upstream confirmed gets it, an anonymous one is refused."""
    gated = "acme/gated-model"
    commit = emulator.files.commit("model", gated, "main")
    with MirrorProcess(emulator.url, tmp_path / "cache") as online:
        head = httpx.head(f"{online.url}/{gated}/resolve/{commit}/model.safetensors",
                          headers={"authorization": f"Bearer {GOOD_TOKEN}"})
        assert head.status_code == 200 and head.headers.get("x-xet-hash")
    with MirrorProcess(emulator.url, tmp_path / "cache", "--offline") as offline:
        emulator.reset_stats()
        assert token_for(offline, gated, commit, GOOD_TOKEN).status_code == 200
        refused = token_for(offline, gated, commit)
        assert refused.status_code == 401, refused.text
        assert emulator.requests() == []

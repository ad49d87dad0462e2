"""Xet through the mirror (issue 17): the real client (huggingface_hub 2.x with hf_xet) takes the Xet path and
every request of it lands on the mirror: the token route, the CAS's reconstructions and the byte ranges.

The emulator speaks Xet like the Hub (real Xet hashes from hf_xet's ``hash_files``, ``xet-auth`` links to itself,
``xetHash`` in trees, its own token route): none of that may reach a client, only the mirror's own hints. Gated and
private content goes through the same per-caller access rules as on the resolve route, at the token route and at
the CAS.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, run_client

pytest.importorskip("hf_xet")
pytestmark = pytest.mark.e2e

MODEL = "acme/tiny-model"
GATED = "acme/gated-model"
PRIVATE = "acme/private-model"
XET_ON = {"HF_HUB_DISABLE_XET": "0"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def xet_mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    cache = tmp_path_factory.mktemp("xet-mirror") / "cache"
    with MirrorProcess(emulator.url, cache, "--serve-xet") as proc:
        yield proc


def xet_hash(emulator: EmulatorHandle, repo_type: str, repo_id: str, path: str, rev: str = "main") -> str:
    return emulator.files._file(repo_type, repo_id, rev, path).xet_hash  # noqa: SLF001


def counter(mirror: MirrorProcess, route: str) -> float:
    text = httpx.get(f"{mirror.url}/metrics").text
    total = 0.0
    for match in re.finditer(r'^hf_mirror_requests_total\{([^}]*)\} (\S+)$', text, re.M):
        if f'route="{route}"' in match.group(1) and 'outcome="error"' not in match.group(1):
            total += float(match.group(2))
    return total


def assert_no_upstream_address(emulator: EmulatorHandle, *texts: str) -> None:
    for host in (urlsplit(emulator.url).netloc, urlsplit(emulator.cdn_url).netloc):
        for text in texts:
            assert host not in text, (host, text[:300])


ROUTES = ("xet-token", "xet-reconstruction", "xet-xorb")


@contextlib.contextmanager
def xet_path_taken(emulator: EmulatorHandle, mirror: MirrorProcess) -> Iterator[None]:
    """Around a client run: the Xet path was taken on the mirror (token, reconstruction, byte ranges), and every
    request upstream saw came from the mirror (its User-Agent; no client's hf_hub / hf_xet), none of it Xet."""
    before = {route: counter(mirror, route) for route in ROUTES}
    emulator.reset_stats()
    yield
    for route, count in before.items():
        assert counter(mirror, route) > count, route
    records = emulator.requests()
    # The mirror's own User-Agent, on its API requests and its bulk fills alike.
    agents = {r.get("ua") or "" for r in records}
    assert all(ua.startswith("hf-mirror/") for ua in agents), agents
    assert not [r["path"] for r in records if "xet-" in r["path"] or "reconstructions" in r["path"]]
    assert emulator.stats()["counts"].get("cdn_requests_with_auth", 0) == 0


def token_for(mirror: MirrorProcess, repo: str, commit: str, hub_token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {hub_token}"} if hub_token else {}
    return httpx.get(f"{mirror.url}/api/models/{repo}/xet-read-token/{commit}", headers=headers)


def test_hf_hub_download_and_snapshot_download_over_xet(emulator, xet_mirror, tmp_path):
    before = {route: counter(xet_mirror, route) for route in ("xet-token", "xet-reconstruction", "xet-xorb")}
    emulator.reset_stats()
    code = f"""
import json, hashlib, os
from huggingface_hub import hf_hub_download, snapshot_download
out = {{}}
for name in ("model.safetensors", "config.json"):
    p = hf_hub_download("{MODEL}", name)
    out[name] = hashlib.sha256(open(p, "rb").read()).hexdigest()
root = snapshot_download("{MODEL}")
def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()
out["snapshot"] = {{os.path.relpath(os.path.join(d, f), root): digest(os.path.join(d, f))
                   for d, _, fs in os.walk(root) for f in fs}}
print(json.dumps(out))
"""
    out = run_client(code, xet_mirror.url, tmp_path / "home", **XET_ON)
    files = emulator.files
    assert out["model.safetensors"] == sha256(files.file_bytes("model", MODEL, "main", "model.safetensors"))
    assert out["config.json"] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert out["snapshot"] == {p: sha256(files.file_bytes("model", MODEL, "main", p))
                               for p in files.paths("model", MODEL, "main")}
    # The Xet path was taken, on the mirror: token, reconstruction and byte ranges.
    for route, count in before.items():
        assert counter(xet_mirror, route) > count, route
    # huggingface_hub 2.x kept the file in its shared blob store, under upstream's Xet hash.
    xh = xet_hash(emulator, "model", MODEL, "model.safetensors")
    shared = tmp_path / "home" / "hub" / "blobs" / xh[:2] / xh
    assert shared.is_file() and sha256(shared.read_bytes()) == out["model.safetensors"]
    # Nothing Xet of upstream's was asked for: no token, no CAS; the CDN saw the mirror only (no client token).
    paths = [r["path"] for r in emulator.requests()]
    assert not [p for p in paths if "xet-" in p or "reconstructions" in p], paths
    assert emulator.stats()["counts"].get("cdn_requests_with_auth", 0) == 0


def test_hints_token_and_cas_point_at_the_mirror_only(emulator, xet_mirror):
    base = xet_mirror.url
    commit = emulator.files.commit("model", MODEL, "main")
    xh = xet_hash(emulator, "model", MODEL, "model.safetensors")
    size = emulator.files.size("model", MODEL, "main", "model.safetensors")
    with httpx.Client(base_url=base) as client:
        head = client.head(f"/{MODEL}/resolve/main/model.safetensors")
        assert head.headers["x-xet-hash"] == xh
        assert head.headers["link"] == f'<{base}/api/models/{MODEL}/xet-read-token/{commit}>; rel="xet-auth"'
        assert "x-xet-refresh-route" not in head.headers
        regular = client.head(f"/{MODEL}/resolve/main/config.json")  # not Xet-backed upstream: stays plain
        assert "x-xet-hash" not in regular.headers and "link" not in regular.headers
        page = client.get(f"/api/models/{MODEL}/tree/{commit}", params={"recursive": "true"})
        tree = page.json()
        lfs = {e["path"]: e.get("xetHash") for e in tree if "lfs" in e}
        assert lfs.get("model.safetensors") in (xh, None)
        assert all("xetHash" not in e for e in tree if "lfs" not in e)
        info = client.post(f"/api/models/{MODEL}/paths-info/{commit}",
                           data={"paths": ["model.safetensors", "config.json"]}).json()
        by_path = {e["path"]: e for e in info}
        assert by_path["model.safetensors"]["xetHash"] == xh and "xetHash" not in by_path["config.json"]

        answer = client.get(f"/api/models/{MODEL}/xet-read-token/{commit}")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["casUrl"] == answer.headers["x-xet-cas-url"] == f"{base}/_xet"
        assert body["accessToken"] == answer.headers["x-xet-access-token"]
        assert body["exp"] == int(answer.headers["x-xet-token-expiration"])
        auth = {"authorization": f"Bearer {body['accessToken']}"}

        v2 = client.get(f"/_xet/v2/reconstructions/{xh}", headers={**auth, "range": f"bytes=0-{size - 1}"})
        assert v2.status_code == 200
        assert sum(t["unpacked_length"] for t in v2.json()["terms"]) == size
        v1 = client.get(f"/_xet/v1/reconstructions/{xh}", headers=auth)
        bare = client.get(f"/_xet/reconstructions/{xh}", headers=auth)  # hf_xet 1.2's unprefixed form
        assert v1.status_code == bare.status_code == 200 and "fetch_info" in v1.json()
        window = client.get(f"/_xet/v2/reconstructions/{xh}", headers={**auth, "range": "bytes=70000-70009"}).json()
        assert window["offset_into_first_range"] == 70000 - 65536 and len(window["terms"]) == 1
        past = client.get(f"/_xet/v2/reconstructions/{xh}", headers={**auth, "range": f"bytes={size}-{size + 9}"})
        assert past.status_code == 416
        # The byte ranges: the mirror's own URLs, the chunk format, the file's bytes.
        fetch = next(iter(v2.json()["xorbs"].values()))[0]
        got = client.get(fetch["url"], headers={"range": "bytes=0-7"})
        assert got.status_code == 206 and got.content == b"\x00\x00\x00\x01\x00\x00\x00\x01"
        assert got.headers["content-range"].startswith("bytes 0-7/")
        data = client.get(fetch["url"], headers={"range": "bytes=8-17"}).content
        assert data == emulator.files.file_bytes("model", MODEL, "main", "model.safetensors")[:10]
        texts = [head.headers.get("link", ""), answer.text, str(dict(answer.headers)), v2.text, v1.text,
                 page.text, str(dict(page.headers))]
        assert all(u.startswith(f"{base}/_xet/xorb/") for u in re.findall(r'"url":"([^"]+)"', v2.text + v1.text))
        assert_no_upstream_address(emulator, *texts)

        # Read-only: uploads refused, whatever the token; telemetry accepted and dropped.
        for path in ("/_xet/v1/xorbs/default/" + "0" * 64, "/_xet/v1/shards", "/_xet/v2/shards"):
            assert client.post(path, headers=auth, content=b"x").status_code == 405
        assert client.put(f"/_xet/v1/reconstructions/{xh}", headers=auth).status_code == 405
        assert client.post("/_xet/v1/telemetry", headers=auth, json={"event": "x"}).status_code == 200
        assert client.get("/api/models/acme/tiny-model/xet-write-token/main").status_code in (403, 404, 405)


def test_gated_and_private_callers_at_the_token_route_and_the_cas(emulator, xet_mirror, tmp_path):
    base = xet_mirror.url
    gated_commit = emulator.files.commit("model", GATED, "main")
    gated_hash = xet_hash(emulator, "model", GATED, "model.safetensors")
    # An entitled user downloads the gated file over Xet through the mirror.
    code = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
p = hf_hub_download("{GATED}", "model.safetensors", token="{GOOD_TOKEN}")
print(json.dumps(hashlib.sha256(open(p, "rb").read()).hexdigest()))
"""
    got = run_client(code, base, tmp_path / "good", **XET_ON)
    assert got == sha256(emulator.files.file_bytes("model", GATED, "main", "model.safetensors"))
    # Anonymous and not-entitled callers get no token (as on resolve: 401 / 403 GatedRepo).
    assert token_for(xet_mirror, GATED, gated_commit).status_code == 401
    denied = token_for(xet_mirror, GATED, gated_commit, DENIED_TOKEN)
    assert denied.status_code == 403 and denied.headers.get("x-error-code") == "GatedRepo"
    good = token_for(xet_mirror, GATED, gated_commit, GOOD_TOKEN)
    assert good.status_code == 200
    # And the same clients fail as they would on the Hub.
    for label, token in (("anon", None), ("denied", DENIED_TOKEN)):
        code = f"""
import json
from huggingface_hub import hf_hub_download
try:
    hf_hub_download("{GATED}", "model.safetensors", token={token!r})
    print(json.dumps("downloaded"))
except Exception as exc:
    print(json.dumps(type(exc).__name__))
"""
        assert run_client(code, base, tmp_path / label, **XET_ON) != "downloaded"

    with httpx.Client(base_url=base) as client:
        # The CAS: no token, a bogus one, a forged one.
        assert client.get(f"/_xet/v2/reconstructions/{gated_hash}").status_code == 401
        assert client.get(f"/_xet/v2/reconstructions/{gated_hash}",
                          headers={"authorization": "Bearer nope.nope"}).status_code == 401
        assert client.get(f"/_xet/v2/reconstructions/{gated_hash}",
                          headers={"authorization": f"Bearer {GOOD_TOKEN}"}).status_code == 401
        # A token for a public repo never reads the gated repo's file by its hash.
        public = client.get(f"/api/models/{MODEL}/xet-read-token/{emulator.files.commit('model', MODEL, 'main')}")
        assert public.status_code == 200
        other = client.get(f"/_xet/v2/reconstructions/{gated_hash}",
                           headers={"authorization": f"Bearer {public.json()['accessToken']}"})
        assert other.status_code == 404
        # The entitled token reads; its byte-range URLs do not survive tampering.
        auth = {"authorization": f"Bearer {good.json()['accessToken']}"}
        rec = client.get(f"/_xet/v2/reconstructions/{gated_hash}", headers=auth)
        assert rec.status_code == 200
        url = next(iter(rec.json()["xorbs"].values()))[0]["url"]
        assert client.get(url, headers={"range": "bytes=0-7"}).status_code == 206
        tampered = url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB")
        assert client.get(tampered, headers={"range": "bytes=0-7"}).status_code == 403
        assert client.get(url.split("?")[0], headers={"range": "bytes=0-7"}).status_code == 403
        # A private repo: nothing for anonymous or not-member callers.
        private_commit = emulator.files.commit("model", PRIVATE, "main")
        assert client.head(f"/{PRIVATE}/resolve/main/model.safetensors",
                           headers={"authorization": f"Bearer {GOOD_TOKEN}"}).status_code == 200
        assert token_for(xet_mirror, PRIVATE, private_commit).status_code in (401, 404)
        assert token_for(xet_mirror, PRIVATE, private_commit, DENIED_TOKEN).status_code in (403, 404)
        assert token_for(xet_mirror, PRIVATE, private_commit, GOOD_TOKEN).status_code == 200


def test_xet_off_strips_every_hint(emulator, tmp_path):
    """--no-serve-xet: plain HTTP only, every hint stripped, no token route, no CAS."""
    with MirrorProcess(emulator.url, tmp_path / "cache", "--no-serve-xet") as mirror, \
            httpx.Client(base_url=mirror.url) as client:
        head = client.head(f"/{MODEL}/resolve/main/model.safetensors")
        assert "x-xet-hash" not in head.headers and "link" not in head.headers
        assert client.get(f"/api/models/{MODEL}/xet-read-token/main").status_code == 404
        assert client.get("/_xet/v2/reconstructions/" + "0" * 64).status_code == 404


def test_snapshot_download_on_a_fresh_cache_takes_xet_from_the_tree(emulator, xet_mirror, tmp_path):
    """No HEAD of the Xet file first: snapshot_download learns the Xet hash from the tree listing alone."""
    mark = len(xet_mirror.log())
    code = f"""
import json, hashlib, os
from huggingface_hub import snapshot_download
root = snapshot_download("{MODEL}")
print(json.dumps({{os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read())
                  .hexdigest() for d, _, fs in os.walk(root) for f in fs}}))
"""
    with xet_path_taken(emulator, xet_mirror):
        out = run_client(code, xet_mirror.url, tmp_path / "home", **XET_ON)
    files = emulator.files
    assert out == {p: sha256(files.file_bytes("model", MODEL, "main", p)) for p in files.paths("model", MODEL, "main")}
    log = xet_mirror.log()[mark:]
    assert "/xet-read-token/" in log and not re.search(r"HEAD \S*/model\.safetensors", log), log[-2000:]
    xh = xet_hash(emulator, "model", MODEL, "model.safetensors")
    shared = tmp_path / "home" / "hub" / "blobs" / xh[:2] / xh
    assert shared.is_file() and sha256(shared.read_bytes()) == out["model.safetensors"]


def test_hf_cli_and_hffilesystem_over_xet(emulator, xet_mirror, tmp_path):
    code = f"""
import json, hashlib, os, subprocess, sys
from huggingface_hub import HfFileSystem
def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
hf = os.path.join(os.path.dirname(sys.executable), "hf")
proc = subprocess.run([hf, "download", "acme/big-data", "big.bin", "--repo-type", "dataset", "--local-dir", "cli"],
                      capture_output=True, text=True)
assert proc.returncode == 0, proc.stderr
fs = HfFileSystem()
fs.get_file("{MODEL}/model.safetensors", "fs.bin")
with fs.open("{MODEL}/model.safetensors", "rb") as f:
    f.seek(1000)
    part = hashlib.sha256(f.read(5000)).hexdigest()
print(json.dumps(dict(cli=sha("cli/big.bin"), get=sha("fs.bin"), part=part)))
"""
    with xet_path_taken(emulator, xet_mirror):
        out = run_client(code, xet_mirror.url, tmp_path / "home", **XET_ON)
    files = emulator.files
    weights = files.file_bytes("model", MODEL, "main", "model.safetensors")
    assert out == {"cli": sha256(files.file_bytes("dataset", "acme/big-data", "main", "big.bin")),
                   "get": sha256(weights), "part": sha256(weights[1000:6000])}


def test_hffilesystem_on_a_cold_mirror_takes_xet(emulator, tmp_path):
    """``HfFileSystem`` lists a branch before anything names its commit: on a mirror that has seen nothing of the
    repo, the listing still carries upstream's Xet hash (the mirror asks for the branch's commit first), so
    ``get_file`` takes the Xet path, which files over 50 GB need (plain HTTP refuses them)."""
    code = """
import json, hashlib
from huggingface_hub import HfFileSystem
fs = HfFileSystem()
info = fs.info("datasets/acme/big-data/big.bin")
fs.get_file("datasets/acme/big-data/big.bin", "big.bin")
print(json.dumps(dict(xet=info.get("xet_hash"), sha=hashlib.sha256(open("big.bin", "rb").read()).hexdigest())))
"""
    expected = {"xet": xet_hash(emulator, "dataset", "acme/big-data", "big.bin"),
                "sha": sha256(emulator.files.file_bytes("dataset", "acme/big-data", "main", "big.bin"))}
    with MirrorProcess(emulator.url, tmp_path / "cache", "--revision-ttl", "1") as cold, xet_path_taken(emulator, cold):
        out = run_client(code, cold.url, tmp_path / "home", **XET_ON)
    assert out == expected
    # Offline, once the branch's ref is past its TTL: the cached listing still names the Xet hash (the commit the
    # ref last named, as the token route resolves it), so the same client takes Xet from the cache.
    time.sleep(1.2)
    with MirrorProcess(emulator.url, tmp_path / "cache", "--offline", "--revision-ttl", "1") as offline, \
            xet_path_taken(emulator, offline):
        out = run_client(code, offline.url, tmp_path / "home-offline", **XET_ON)
        assert emulator.requests() == []
    assert out == expected


def test_datasets_over_xet(emulator, xet_mirror, tmp_path):
    code = """
import json
from datasets import load_dataset
ds = load_dataset("acme/tiny-parquet", split="train")
stream = load_dataset("acme/tiny-parquet", split="test", streaming=True)
print(json.dumps(dict(train=len(ds), test=len(list(stream)))))
"""
    with xet_path_taken(emulator, xet_mirror):
        out = run_client(code, xet_mirror.url, tmp_path / "home", timeout=180, **XET_ON)
    rows = emulator.files.row_count
    assert out == {"train": rows("acme/tiny-parquet", "train"), "test": rows("acme/tiny-parquet", "test")}


def test_transformers_over_xet(emulator, xet_mirror, tmp_path):
    """The weights come through ``transformers.utils.hub.cached_file``, the very call ``from_pretrained`` makes for
    ``model.safetensors`` (the tiny model's weights are not a buildable BERT, and torch is optional)."""
    code = f"""
import json, hashlib
from transformers import AutoConfig, AutoTokenizer
from transformers.utils.hub import cached_file
cfg = AutoConfig.from_pretrained("{MODEL}")
tok = AutoTokenizer.from_pretrained("{MODEL}")
weights = cached_file("{MODEL}", "model.safetensors")
print(json.dumps(dict(model_type=cfg.model_type, ids=tok("hello world")["input_ids"],
                      weights=hashlib.sha256(open(weights, "rb").read()).hexdigest())))
"""
    with xet_path_taken(emulator, xet_mirror):
        out = run_client(code, xet_mirror.url, tmp_path / "home", timeout=180, **XET_ON)
    assert out["model_type"] == "bert" and out["ids"]
    assert out["weights"] == sha256(emulator.files.file_bytes("model", MODEL, "main", "model.safetensors"))


# --- files over 50 GB (huggingface_hub refuses them over plain HTTP: constants.MAX_HTTP_DOWNLOAD_SIZE) ---------------

HUGE = "acme/huge-data"
OVER_50GB = 50 * 10**9 + 64 * 2**20
SMALL_HUGE = 300 * 2**20  # over a 256 MB window of hf_xet 1.6: two windows and a speculative third (416)

HUGE_CODE = """
import json, hashlib, os, sys, time
from huggingface_hub import constants, hf_hub_download
constants.MAX_HTTP_DOWNLOAD_SIZE = {limit}
t = time.monotonic()
try:
    path = hf_hub_download("{repo}", "huge.bin", repo_type="dataset")
except Exception as exc:
    print(json.dumps(dict(error=type(exc).__name__ + ": " + str(exc)[:300])))
    sys.exit(0)
took = time.monotonic() - t
digest = hashlib.sha256()
with open(path, "rb") as f:
    while block := f.read(16 << 20):
        digest.update(block)
print(json.dumps(dict(size=os.path.getsize(path), sha=digest.hexdigest(), seconds=took, path=path)))
"""


def peak_rss_mib(mirror: MirrorProcess) -> float:
    assert mirror.proc is not None
    status = open(f"/proc/{mirror.proc.pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def huge_through_the_mirror(tmp_path, size: int, limit: int, python: str, label: str) -> dict:
    from tests.support.hub_emulator.runner import run_emulator

    with run_emulator(tmp_path / "emulator", huge_file_size=size) as emu, \
            MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        code = HUGE_CODE.format(limit=limit, repo=HUGE)
        # Plain HTTP refuses it, as on the Hub: "The file is too large to be downloaded using the regular method".
        plain = run_client(code, mirror.url, tmp_path / "plain", python=python, timeout=60)
        assert "too large" in plain.get("error", ""), plain
        with xet_path_taken(emu, mirror):
            out = run_client(code, mirror.url, tmp_path / "xet", python=python, timeout=3600, **XET_ON)
        assert out.get("size") == size, out
        assert out["sha"] == emu.files.etag("dataset", HUGE, "main", "huge.bin")
        out["peak_rss_mib"] = peak_rss_mib(mirror)
        out["reconstruction_416"] = len(re.findall(r"reconstructions/\S+ 416", mirror.log()))
        print(f"{label}: {size / 1e9:.2f} GB over Xet through the mirror in {out['seconds']:.1f} s "
              f"({size / out['seconds'] / 1e6:.0f} MB/s, cold fill included), mirror peak RSS "
              f"{out['peak_rss_mib']:.0f} MiB, {out['reconstruction_416']} speculative windows answered 416")
        return out


def test_file_over_the_http_limit_needs_xet(tmp_path):
    """The >50 GB path with a smaller file: the client's own limit lowered below it in the client process. Plain HTTP
    refuses it; Xet through the mirror serves it, in every client generation."""
    from tests.e2e.test_old_clients import client_venv

    for label, python in (("2.x", sys.executable), ("1.33", client_venv("1.33.0")), ("0.36", client_venv("0.36.2"))):
        out = huge_through_the_mirror(tmp_path / label, SMALL_HUGE, 100 * 10**6, python, label)
        if label == "1.33":
            assert out["reconstruction_416"] >= 1  # its speculative request past the last window
        if label == "2.x":  # the shared blob store, under the Xet hash the emulator advertised
            assert os.path.islink(out["path"]) and "/hub/blobs/" in os.path.realpath(out["path"])


def test_file_over_50_gb(tmp_path):
    """A real >50 GB file (generated upstream, never stored there). The mirror stores the blob and the client its
    copy: both on this disk."""
    need = 2 * OVER_50GB + 4 * 2**30
    free = shutil.disk_usage(tmp_path).free
    if free < need:
        pytest.skip(f"a file over 50 GB needs {need / 2**30:.0f} GiB free under {tmp_path} (the mirror's blob and "
                    f"the client's copy), only {free / 2**30:.0f} GiB here; test_file_over_the_http_limit_needs_xet "
                    f"proves the same path with a smaller file, and `python -m bench.huge` runs this one with "
                    f"the client writing to /dev/null (docs/benchmarks.md)")
    out = huge_through_the_mirror(tmp_path, OVER_50GB, 50 * 10**9, sys.executable, "2.x")
    assert out["size"] > 50 * 10**9

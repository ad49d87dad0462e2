"""End to end: the real Hugging Face clients, through the mirror, against the Hub emulator.

Each test compares bytes (sha256) with the emulator's fixtures, compares the client's cache layout (commit, blob
names) with what the Hub protocol prescribes, and asserts that no mirror response carried a CDN address, and no Xet
metadata but the mirror's own (with --no-serve-xet: none at all); the emulator's CDN must see no request from a
client: every byte goes through the mirror.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.hub_emulator.fixtures import GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, run_client

pytestmark = pytest.mark.e2e

MODEL = "acme/tiny-model"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_names(hf_home: Path, folder: str) -> set[str]:
    return {p.name for p in (hf_home / "hub" / folder / "blobs").iterdir()}


def test_hf_hub_download_regular_lfs_subfolder_tag_sha(emulator, mirror, hf_home):
    code = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
out = {{}}
for name, kw in [("config", dict(filename="config.json")),
                 ("lfs", dict(filename="model.safetensors")),
                 ("sub", dict(filename="nested.txt", subfolder="sub")),
                 ("tag", dict(filename="config.json", revision="v1.0"))]:
    path = hf_hub_download("{MODEL}", **kw)
    out[name] = [path, hashlib.sha256(open(path, "rb").read()).hexdigest()]
print(json.dumps(out))
"""
    out = run_client(code, mirror.url, hf_home)
    files = emulator.files
    assert out["config"][1] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert out["lfs"][1] == sha256(files.file_bytes("model", MODEL, "main", "model.safetensors"))
    assert out["sub"][1] == sha256(files.file_bytes("model", MODEL, "main", "sub/nested.txt"))
    assert out["tag"][1] == sha256(files.file_bytes("model", MODEL, "v1.0", "config.json"))
    main_commit = files.commit("model", MODEL, "main")
    assert f"/snapshots/{main_commit}/" in out["config"][0]
    folder = "models--acme--tiny-model"
    assert (hf_home / "hub" / folder / "refs" / "main").read_text() == main_commit
    assert (hf_home / "hub" / folder / "refs" / "v1.0").read_text() == files.commit("model", MODEL, "v1.0")
    # Blob names are the Hub's etags: git sha1 for regular files, sha256 for LFS.
    blobs = blob_names(hf_home, folder)
    assert files.etag("model", MODEL, "main", "model.safetensors") in blobs
    assert files.etag("model", MODEL, "main", "config.json") in blobs
    # And a commit sha revision.
    code_sha = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
p = hf_hub_download("{MODEL}", "config.json", revision="{main_commit}")
print(json.dumps(hashlib.sha256(open(p, "rb").read()).hexdigest()))
"""
    assert run_client(code_sha, mirror.url, hf_home / "x") == out["config"][1]


def test_snapshot_download_with_patterns_and_pagination(emulator, mirror, hf_home):
    code = f"""
import json, os
from huggingface_hub import snapshot_download
root = snapshot_download("{MODEL}", allow_patterns=["*.json", "sub/*"])
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
print(json.dumps(files))
"""
    got = run_client(code, mirror.url, hf_home)
    expected = sorted(
        p for p in emulator.files.paths("model", MODEL, "main")
        if p.endswith(".json") or (p.startswith("sub/") and p.count("/") == 1)
    )
    assert got == expected


def test_hfapi_calls(emulator, mirror, hf_home):
    code = f"""
import json
from huggingface_hub import HfApi
api = HfApi()
info = api.model_info("{MODEL}")
dinfo = api.dataset_info("acme/tiny-parquet")
files = api.list_repo_files("{MODEL}")
tree = [e.path for e in api.list_repo_tree("{MODEL}", recursive=True)]
sub = [e.path for e in api.list_repo_tree("{MODEL}", path_in_repo="sub")]
paths = [e.path for e in api.get_paths_info("{MODEL}", ["config.json", "sub", "missing.txt"])]
refs = api.list_repo_refs("{MODEL}")
print(json.dumps(dict(sha=info.sha, dsha=dinfo.sha, files=sorted(files), tree=sorted(tree), sub=sorted(sub),
    paths=sorted(paths), branches=sorted(b.name for b in refs.branches), tags=sorted(t.name for t in refs.tags),
    fe=api.file_exists("{MODEL}", "config.json"), fe_missing=api.file_exists("{MODEL}", "nope.txt"),
    re=api.repo_exists("{MODEL}"), re_missing=api.repo_exists("acme/does-not-exist"))))
"""
    out = run_client(code, mirror.url, hf_home)
    files = emulator.files
    assert out["sha"] == files.commit("model", MODEL, "main")
    assert out["dsha"] == files.commit("dataset", "acme/tiny-parquet", "main")
    assert out["files"] == sorted(files.paths("model", MODEL, "main"))
    assert set(out["files"]) <= set(out["tree"])
    assert "sub/nested.txt" in out["sub"]
    assert out["paths"] == ["config.json", "sub"]
    assert "main" in out["branches"] and "dev" in out["branches"] and "v1.0" in out["tags"]
    assert out["fe"] is True and out["fe_missing"] is False
    assert out["re"] is True and out["re_missing"] is False


def test_hffilesystem_ls_info_glob_open_ranges(emulator, mirror, hf_home):
    code = f"""
import json, hashlib
from huggingface_hub import HfFileSystem
fs = HfFileSystem()
ls = sorted(e["name"] for e in fs.ls("{MODEL}", detail=True))
info = fs.info("{MODEL}/model.safetensors")
glob = sorted(fs.glob("datasets/acme/tiny-parquet/**/*.parquet"))
with fs.open("{MODEL}/model.safetensors", "rb", block_size=4096) as f:
    f.seek(1000); part = f.read(5000)
print(json.dumps(dict(ls=ls, size=info["size"], glob=glob, part=hashlib.sha256(part).hexdigest())))
"""
    out = run_client(code, mirror.url, hf_home)
    data = emulator.files.file_bytes("model", MODEL, "main", "model.safetensors")
    assert out["size"] == len(data)
    assert out["part"] == sha256(data[1000:6000])
    assert f"{MODEL}/config.json" in out["ls"]
    assert out["glob"] and all(p.endswith(".parquet") for p in out["glob"])


@pytest.mark.parametrize("repo,split_rows", [("acme/tiny-parquet", None), ("acme/tiny-jsonl", None)])
def test_datasets_streaming(emulator, mirror, hf_home, repo, split_rows):
    code = f"""
import json
from datasets import load_dataset
ds = load_dataset("{repo}", split="train", streaming=True)
rows = list(ds)
print(json.dumps(dict(n=len(rows), first=rows[0])))
"""
    out = run_client(code, mirror.url, hf_home, timeout=180)
    assert out["n"] == emulator.files.row_count(repo, "train")


def test_transformers_autoconfig_autotokenizer(emulator, mirror, hf_home):
    code = f"""
import json
from transformers import AutoConfig, AutoTokenizer
cfg = AutoConfig.from_pretrained("{MODEL}")
tok = AutoTokenizer.from_pretrained("{MODEL}")
print(json.dumps(dict(model_type=cfg.model_type, ids=tok("hello world")["input_ids"])))
"""
    out = run_client(code, mirror.url, hf_home, timeout=180)
    assert out["model_type"]
    assert out["ids"]


def test_hf_cli_download(emulator, mirror, hf_home):
    import shutil
    import subprocess
    import sys

    from tests.support.mirror_proc import client_env

    hf = shutil.which("hf", path=str(Path(sys.executable).parent))
    assert hf, "the hf CLI ships with huggingface_hub"
    target = hf_home / "out"
    proc = subprocess.run([hf, "download", MODEL, "config.json", "--local-dir", str(target)],
                          env=client_env(mirror.url, hf_home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (target / "config.json").read_bytes() == emulator.files.file_bytes("model", MODEL, "main", "config.json")


def test_errors_map_to_client_exceptions(emulator, mirror, hf_home):
    code = f"""
import json
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError,
    EntryNotFoundError)
out = {{}}
for name, kw in [("repo", dict(repo_id="acme/nope", filename="x")),
                 ("gated", dict(repo_id="acme/gated-model", filename="config.json")),
                 ("rev", dict(repo_id="{MODEL}", filename="config.json", revision="no-such-branch")),
                 ("entry", dict(repo_id="{MODEL}", filename="no-such-file.txt"))]:
    try:
        hf_hub_download(**kw)
        out[name] = "ok"
    except GatedRepoError:
        out[name] = "gated"
    except RepositoryNotFoundError:
        out[name] = "repo"
    except RevisionNotFoundError:
        out[name] = "rev"
    except EntryNotFoundError:
        out[name] = "entry"
print(json.dumps(out))
"""
    out = run_client(code, mirror.url, hf_home)
    assert out == {"repo": "repo", "gated": "gated", "rev": "rev", "entry": "entry"}


@pytest.fixture(scope="module")
def plain_mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    with MirrorProcess(emulator.url, tmp_path_factory.mktemp("plain") / "cache", "--no-serve-xet") as proc:
        yield proc


def test_xet_hints_name_the_mirror_only(emulator, mirror):
    """Xet is served by default: a Xet-backed file carries upstream's Xet hash and the mirror's own token route;
    nothing of upstream's (its hosts, its CAS, its token route) reaches a client."""
    hosts = (urlsplit(emulator.url).netloc, urlsplit(emulator.cdn_url).netloc)
    commit = emulator.files.commit("model", MODEL, "main")
    with httpx.Client(base_url=mirror.url) as client:
        head = client.head(f"/{MODEL}/resolve/main/model.safetensors")
        assert head.status_code == 200 and len(head.headers["x-xet-hash"]) == 64
        assert head.headers["link"] == f'<{mirror.url}/api/models/{MODEL}/xet-read-token/{commit}>; rel="xet-auth"'
        token = client.get(f"/api/models/{MODEL}/xet-read-token/{commit}")
        assert token.status_code == 200 and token.json()["casUrl"] == f"{mirror.url}/_xet"
        regular = client.head(f"/{MODEL}/resolve/main/config.json")
        assert "x-xet-hash" not in regular.headers and "link" not in regular.headers
        tree = client.get(f"/api/models/{MODEL}/tree/main?recursive=true")
        for response in (head, token, regular, tree):
            text = str(dict(response.headers)) + response.text
            assert not any(host in text for host in hosts), text[:300]


def test_no_cdn_address_or_xet_metadata_reaches_clients(emulator, plain_mirror):
    """With --no-serve-xet every Xet hint of upstream's is stripped: plain HTTP only."""
    cdn = emulator.cdn_url
    with httpx.Client(base_url=plain_mirror.url) as client:
        for method, path in [("HEAD", f"/{MODEL}/resolve/main/model.safetensors"),
                             ("GET", f"/{MODEL}/resolve/main/model.safetensors"),
                             ("GET", f"/api/models/{MODEL}/tree/main?recursive=true"),
                             ("GET", f"/api/models/{MODEL}?blobs=true")]:
            response = client.request(method, path)
            assert response.status_code == 200, (path, response.status_code, response.text[:200])
            assert "location" not in response.headers
            for name, value in response.headers.items():
                if name.lower() == "access-control-expose-headers":  # names X-Xet-Hash, as the Hub's does
                    continue
                assert not name.lower().startswith("x-xet"), name
                assert cdn not in value and "xet" not in value.lower(), (name, value)
            if method == "GET" and "api" in path:
                assert "xetHash" not in response.text and cdn not in response.text
        paths_info = client.post(f"/api/models/{MODEL}/paths-info/main",
                                 data={"paths": ["model.safetensors"], "expand": "false"})
        assert paths_info.status_code == 200 and "xetHash" not in paths_info.text
        assert client.get(f"/api/models/{MODEL}/xet-read-token/main").status_code == 404


def test_pagination_link_points_at_mirror(emulator, mirror):
    response = httpx.get(f"{mirror.url}/api/models/{MODEL}/tree/main?recursive=true&expand=false")
    assert response.status_code == 200
    link = response.headers.get("link", "")
    assert link.startswith(f"<{mirror.url}/api/models/{MODEL}/tree/"), link
    assert emulator.url not in link


def test_encoded_pr_revision(emulator, mirror):
    response = httpx.head(f"{mirror.url}/{MODEL}/resolve/refs%2Fpr%2F1/config.json")
    assert response.status_code == 200, response.headers
    assert response.headers["x-repo-commit"] == emulator.files.commit("model", MODEL, "refs/pr/1")
    tree = httpx.get(f"{mirror.url}/api/models/{MODEL}/tree/refs%2Fpr%2F1")
    assert tree.status_code == 200


def test_head_headers_match_hub_contract(emulator, mirror):
    files = emulator.files
    r = httpx.head(f"{mirror.url}/{MODEL}/resolve/main/model.safetensors")
    assert r.status_code == 200
    assert r.headers["x-repo-commit"] == files.commit("model", MODEL, "main")
    assert r.headers["x-linked-etag"].strip('"') == files.etag("model", MODEL, "main", "model.safetensors")
    assert int(r.headers["x-linked-size"]) == len(files.file_bytes("model", MODEL, "main", "model.safetensors"))
    assert int(r.headers["content-length"]) == int(r.headers["x-linked-size"])
    missing = httpx.head(f"{mirror.url}/{MODEL}/resolve/main/nope.txt")
    assert missing.status_code == 404
    assert missing.headers["x-error-code"] == "EntryNotFound"
    assert missing.headers["x-repo-commit"] == files.commit("model", MODEL, "main")
    ranged = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/config.json", headers={"range": "bytes=2-9"})
    assert ranged.status_code == 206 and ranged.content == files.file_bytes("model", MODEL, "main", "config.json")[2:10]
    bad = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/config.json", headers={"range": "bytes=99999-"})
    assert bad.status_code == 416 and bad.headers["content-range"].startswith("bytes */")


def test_cdn_never_saw_client_auth(emulator, mirror):
    """A caller's token goes to the Hub host only: the CDN's signed URL is fetched without it (checked on this
    test's own download, so it holds when the test runs alone)."""
    emulator.reset_stats()
    response = httpx.get(mirror.url + "/acme/gated-model/resolve/main/model.safetensors",
                         headers={"authorization": f"Bearer {GOOD_TOKEN}"}, timeout=30)
    assert response.status_code == 200
    records = emulator.requests()
    cdn = [r for r in records if r["host"] == "cdn"]
    assert cdn, records  # the bytes did come from the CDN
    assert all(r["auth"] is None for r in cdn), cdn
    assert any(r["host"] == "hub" and r["auth"] == f"Bearer {GOOD_TOKEN}" for r in records), records

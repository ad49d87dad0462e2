"""Issue 26 item 5: the mirror behind the shipped nginx front mounted at ``/hf/`` (``HF_ENDPOINT=http://front/hf``),
in both forms docs/operations.md shows: the front passes the full path and the mirror strips it (``--root-path``),
or the front strips it and says so (``X-Forwarded-Prefix``, believed from ``--trusted-proxies`` only).

The front's variant has no ``location /`` at all: a URL the mirror wrote without the prefix (a ``Link`` page, a
``casUrl``, a byte-range URL, a ``Location``) is a 404 of nginx's own, and every request the clients made is in the
front's access log, where each must be under ``/hf/``. Every client of the matrix runs through it: huggingface_hub
(downloads, snapshot, ``HfApi`` with the emulator's 3-entry pages, ``HfFileSystem``), transformers, datasets
streaming (its viewer host is ``datasets-server.<HF_ENDPOINT's host>`` under the same path), hf_xet, huggingface.js,
and the status page.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from tests.e2e.test_status_page import Browser
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.js_clients import hub_client
from tests.support.mirror_proc import MirrorProcess, run_client
from tests.support.nginx_front import NginxFront, free_port, nginx_binary, render_nginx_conf

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")]

MODEL = "acme/tiny-model"
DATASET = "acme/tiny-parquet"
PREFIX = "/hf"
# The client process maps every datasets-server.* name to 127.0.0.1, as an /etc/hosts entry would (test_viewer.py).
LOOPBACK_VIEWER = """
import socket
_gai = socket.getaddrinfo
def _loopback(host, *args, **kwargs):
    return _gai("127.0.0.1" if isinstance(host, str) and host.startswith("datasets-server.") else host, *args, **kwargs)
socket.getaddrinfo = _loopback
"""


class Mounted(NamedTuple):
    form: str
    mirror: MirrorProcess
    front: NginxFront

    @property
    def endpoint(self) -> str:
        return self.front.url + PREFIX

    def requests(self) -> list[str]:
        """The request targets the front's access log holds so far."""
        log = (self.front.prefix / "logs" / "access.log").read_text(errors="replace")
        return re.findall(r'"[A-Z]+ (\S+) HTTP/[\d.]+"', log)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module", params=["full-path", "stripped"])
def mounted(request: pytest.FixtureRequest, emulator: EmulatorHandle,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    """The mirror (Xet on, nginx sending warm hits) behind the front at /hf/, in one of the two forms."""
    form = request.param
    work = tmp_path_factory.mktemp(f"prefix-{form}")
    cache = work / "cache"
    flags = ["--root-path", PREFIX] if form == "full-path" else ["--trusted-proxies", "127.0.0.1"]
    with MirrorProcess(emulator.url, cache, "--accel-redirect", "/_hf_mirror_blobs/", *flags,
                       env={"HF_MIRROR_VIEWER_UPSTREAM": emulator.viewer_url}) as mirror:
        conf = render_nginx_conf(work / "nginx", mirror_port=mirror.port, listen_port=free_port(), cache_dir=cache,
                                 path_prefix=PREFIX, strip_prefix=form == "stripped")
        with NginxFront(conf) as front:
            yield Mounted(form, mirror, front)


def assert_all_under_prefix(mounted: Mounted) -> None:
    # /favicon.ico: a browser asks its origin's root for it by itself, whatever the page says.
    outside = [t for t in mounted.requests() if not t.startswith(PREFIX + "/") and t != "/favicon.ico"]
    assert not outside, f"requests outside {PREFIX}/ (a URL written without the prefix): {outside}"


def test_hub_clients_through_the_prefix(emulator: EmulatorHandle, mounted: Mounted, tmp_path: Path) -> None:
    """Downloads (regular and LFS), a snapshot, model_info, a paged tree listing, HfFileSystem."""
    code = f"""
import json, hashlib, os
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download
digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
out = {{name: digest(hf_hub_download("{MODEL}", name)) for name in ("config.json", "model.safetensors")}}
root = snapshot_download("{MODEL}")
out["snapshot"] = {{os.path.relpath(os.path.join(d, f), root): digest(os.path.join(d, f))
                   for d, _, fs in os.walk(root) for f in fs}}
api = HfApi()
out["sha"] = api.model_info("{MODEL}").sha
out["tree"] = sorted(e.path for e in api.list_repo_tree("{MODEL}", recursive=True) if type(e).__name__ == "RepoFile")
fs = HfFileSystem()
out["ls"] = sorted(e["name"] for e in fs.ls("{MODEL}", detail=True))
with fs.open("{MODEL}/model.safetensors", "rb", block_size=4096) as f:
    f.seek(1000); out["part"] = hashlib.sha256(f.read(5000)).hexdigest()
print(json.dumps(out))
"""
    out = run_client(code, mounted.endpoint, tmp_path / "home")
    files = emulator.files
    paths = files.paths("model", MODEL, "main")
    data = files.file_bytes("model", MODEL, "main", "model.safetensors")
    assert out["config.json"] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert out["model.safetensors"] == sha256(data)
    assert out["snapshot"] == {p: sha256(files.file_bytes("model", MODEL, "main", p)) for p in paths}
    assert out["sha"] == files.commit("model", MODEL, "main")
    assert out["tree"] == sorted(paths)  # every page of 3, the Link of each one followed through the front
    assert f"{MODEL}/config.json" in out["ls"]
    assert out["part"] == sha256(data[1000:6000])
    assert_all_under_prefix(mounted)
    tree = [t for t in mounted.requests() if f"/api/models/{MODEL}/tree/" in t]
    assert any("cursor=" in t for t in tree), tree  # a next page was asked for, at the URL the mirror wrote


def test_link_pagination_names_the_prefix(mounted: Mounted) -> None:
    answer = httpx.get(f"{mounted.endpoint}/api/models/{MODEL}/tree/main?recursive=true", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["link"].startswith(f"<{mounted.endpoint}/api/models/{MODEL}/tree/"), answer.headers
    following = httpx.get(answer.headers["link"][1:].partition(">")[0], timeout=30)
    assert following.status_code == 200 and following.json()


def test_transformers_tokenizer_through_the_prefix(mounted: Mounted, tmp_path: Path) -> None:
    code = f"""
import json
from transformers import AutoConfig, AutoTokenizer
cfg = AutoConfig.from_pretrained("{MODEL}")
tok = AutoTokenizer.from_pretrained("{MODEL}")
print(json.dumps(dict(model_type=cfg.model_type, ids=tok("hello world")["input_ids"])))
"""
    out = run_client(code, mounted.endpoint, tmp_path / "home", timeout=180)
    assert out["model_type"] and out["ids"]
    assert_all_under_prefix(mounted)


def test_datasets_streaming_uses_the_viewer_under_the_prefix(emulator: EmulatorHandle, mounted: Mounted,
                                                             tmp_path: Path) -> None:
    """``datasets`` asks ``datasets-server.<host>/hf/info``: the same front, the same path, the viewer's Host."""
    code = LOOPBACK_VIEWER + f"""
import json
from datasets import load_dataset
from datasets.utils import _dataset_viewer
used = []
_infos = _dataset_viewer.get_exported_dataset_infos
_dataset_viewer.get_exported_dataset_infos = lambda *a, **k: used.append(1) or _infos(*a, **k)
ds = load_dataset("{DATASET}", split="train", streaming=True)
rows = list(ds)
print(json.dumps(dict(n=len(rows), used=bool(used))))
"""
    out = run_client(code, mounted.endpoint, tmp_path / "home", timeout=180)
    assert out == {"n": emulator.files.row_count(DATASET, "train"), "used": True}
    assert any(t.startswith(f"{PREFIX}/info?dataset=") for t in mounted.requests())
    assert_all_under_prefix(mounted)


def test_viewer_and_parquet_urls_carry_the_prefix(mounted: Mounted) -> None:
    viewer = {"host": f"datasets-server.127.0.0.1:{mounted.front.port}"}
    listing = httpx.get(f"{mounted.endpoint}/parquet?dataset={DATASET}", headers=viewer, timeout=30)
    assert listing.status_code == 200, listing.text
    urls = [f["url"] for f in listing.json()["parquet_files"]]
    assert urls and all(u.startswith(f"{mounted.endpoint}/") for u in urls), urls
    hub_listing = httpx.get(f"{mounted.endpoint}/api/datasets/{DATASET}/parquet/default/train", timeout=30)
    assert hub_listing.status_code == 200, hub_listing.text
    assert all(u.startswith(f"{mounted.endpoint}/") for u in hub_listing.json()), hub_listing.text
    redirect = httpx.get(f"{mounted.endpoint}/api/datasets/{DATASET}/parquet/default/train/0.parquet", timeout=30)
    assert redirect.status_code == 302, redirect.text
    location = redirect.headers["location"]
    assert location.startswith(f"{PREFIX}/datasets/{DATASET}/resolve/"), location
    parquet = httpx.get(mounted.front.url + location, timeout=30)
    assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"


def test_xet_through_the_prefix(emulator: EmulatorHandle, mounted: Mounted, tmp_path: Path) -> None:
    """hf_xet takes the token route, the CAS and its byte ranges, all at the URLs the mirror wrote."""
    pytest.importorskip("hf_xet")
    commit = emulator.files.commit("model", MODEL, "main")
    head = httpx.head(f"{mounted.endpoint}/{MODEL}/resolve/main/model.safetensors", timeout=30)
    assert head.headers["link"] == f'<{mounted.endpoint}/api/models/{MODEL}/xet-read-token/{commit}>; rel="xet-auth"'
    # A client's own X-Forwarded-Prefix never reaches the mirror: the front replaces it (or drops it).
    token = httpx.get(f"{mounted.endpoint}/api/models/{MODEL}/xet-read-token/{commit}",
                      headers={"x-forwarded-prefix": "/evil"}, timeout=30)
    assert token.status_code == 200
    assert token.json()["casUrl"] == token.headers["x-xet-cas-url"] == f"{mounted.endpoint}/_xet"
    code = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
p = hf_hub_download("{MODEL}", "model.safetensors")
print(json.dumps(hashlib.sha256(open(p, "rb").read()).hexdigest()))
"""
    out = run_client(code, mounted.endpoint, tmp_path / "home", HF_HUB_DISABLE_XET="0")
    assert out == sha256(emulator.files.file_bytes("model", MODEL, "main", "model.safetensors"))
    targets = mounted.requests()
    assert any(t.startswith(f"{PREFIX}/_xet/v") and "/reconstructions/" in t for t in targets), targets
    assert any(t.startswith(f"{PREFIX}/_xet/") and "reconstructions" not in t for t in targets), targets  # ranges
    assert_all_under_prefix(mounted)


def test_huggingface_js_through_the_prefix(emulator: EmulatorHandle, mounted: Mounted) -> None:
    done = subprocess.run([*hub_client(), mounted.endpoint, MODEL, "config.json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    files = emulator.files
    assert sorted(f["path"] for f in out["listFiles"] if f["type"] == "file") == sorted(
        files.paths("model", MODEL, "main"))
    assert out["downloadFile"]["sha256"] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert_all_under_prefix(mounted)


def test_status_page_links_forms_and_scripts_carry_the_prefix(mounted: Mounted) -> None:
    page = httpx.get(f"{mounted.endpoint}/", timeout=30)
    assert page.status_code == 200 and "hf-mirror" in page.text
    assert f'<body data-base="{PREFIX}"' in page.text
    assert f"<form id='search' class='row' method='get' action='{PREFIX}/'" in page.text
    assert "`${BASE}/api/mirror/warm`" in page.text  # the page's script builds every URL from the base
    assert httpx.get(f"{mounted.endpoint}/api/mirror/status", timeout=30).json()["repos_total"] >= 0
    docs = httpx.get(f"{mounted.endpoint}/docs", timeout=30)
    assert docs.status_code == 200 and f"{PREFIX}/openapi.json" in docs.text
    assert httpx.get(f"{mounted.endpoint}/openapi.json", timeout=30).status_code == 200
    # The page's warm button posts to {base}/api/mirror/warm, same origin: served through the front.
    warm = httpx.post(f"{mounted.endpoint}/api/mirror/warm", json={"repo": MODEL, "type": "model"}, timeout=30,
                      headers={"origin": mounted.front.url})
    assert warm.status_code in (200, 202), warm.text
    job = httpx.get(f"{mounted.endpoint}/api/mirror/warm/{warm.json()['id']}", timeout=30)
    assert job.status_code == 200


def test_status_page_in_a_browser_under_the_prefix(mounted: Mounted, tmp_path: Path) -> None:
    """The page's search form and its warm button, as a person uses them, stay under /hf/."""
    browser = Browser(tmp_path / "chrome-profile")
    try:
        browser.goto(f"{mounted.endpoint}/")
        browser.eval("document.querySelector('#search input[name=q]').value = 'tiny'")
        browser.eval("document.getElementById('search').submit()")
        deadline = time.monotonic() + 30
        while browser.eval("new URLSearchParams(location.search).get('q')") != "tiny":
            assert time.monotonic() < deadline, browser.eval("location.href")
            time.sleep(0.2)
        assert browser.eval("location.pathname") == f"{PREFIX}/"
        browser.eval(f"document.getElementById('warm-repo').value = '{MODEL}'")
        done = browser.eval("mirrorAction(document.getElementById('warm-button'))")
        assert done["ok"] and done["status"] == 202, done
    finally:
        browser.close()
    assert_all_under_prefix(mounted)


def test_an_untrusted_forwarded_prefix_is_ignored(emulator: EmulatorHandle, tmp_path: Path) -> None:
    """A client that is not a trusted front writes no prefix into the URLs the mirror hands out, however it asks."""
    commit = emulator.files.commit("model", MODEL, "main")
    evil = {"x-forwarded-prefix": "/evil"}
    for flags in ((), ("--trusted-proxies", "10.9.9.9,192.168.0.0/16"), ("--root-path", PREFIX)):
        with MirrorProcess(emulator.url, tmp_path / f"cache{len(flags)}{flags[:1]}", *flags) as mirror:
            base = mirror.url + (PREFIX if flags[:1] == ("--root-path",) else "")
            tree = httpx.get(f"{base}/api/models/{MODEL}/tree/main?recursive=true", headers=evil, timeout=30)
            assert tree.headers["link"].startswith(f"<{base}/api/models/"), (flags, tree.headers)
            token = httpx.get(f"{base}/api/models/{MODEL}/xet-read-token/{commit}", headers=evil, timeout=30)
            assert token.json()["casUrl"] == f"{base}/_xet", flags
            assert "evil" not in tree.headers["link"] + token.text

"""Clients beyond Python (issue 26 item 6): @huggingface/hub under Node, transformers.js in headless Chromium on a
page of another origin, and the Rust hf-hub client's ``Range: bytes=0-0`` probe, each through the mirror."""

from __future__ import annotations

import html
import json
import re
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_cors import dump_dom, other_origin  # noqa: F401 - a fixture, used by name
from tests.support.hub_emulator.fixtures import GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.js_clients import hub_client, transformers_bundle
from tests.support.mirror_proc import MirrorProcess, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


def _huggingface_js(hub_url: str, repo: str, path: str, token: str | None = None) -> dict:
    done = subprocess.run([*hub_client(), hub_url, repo, path, *([token] if token else [])], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(("repo", "path", "token"), [
    ("acme/tiny-model", "config.json", None),  # a regular (git) file
    ("acme/tiny-model", "model.safetensors", None),  # an LFS file, redirected to the CDN upstream
    ("acme/private-model", "model.safetensors", GOOD_TOKEN),  # the caller's own token
])
def test_huggingface_js_reads_the_same_through_the_mirror(emu, tmp_path, repo, path, token):
    """modelInfo (it asks revision/HEAD), listFiles, fileDownloadInfo and downloadFile: the same answers as the
    Hub's, cold and then warm."""
    direct = _huggingface_js(emu.url, repo, path, token)
    assert "error" not in direct, direct
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        cold = _huggingface_js(mirror.url, repo, path, token)
        warm = _huggingface_js(mirror.url, repo, path, token)
    assert cold == direct and warm == direct


def test_huggingface_js_without_a_token_is_refused_a_private_repo_as_by_the_hub(emu, tmp_path):
    direct = _huggingface_js(emu.url, "acme/private-model", "config.json")
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        through = _huggingface_js(mirror.url, "acme/private-model", "config.json")
    assert "error" in direct and "error" in through
    # The same kind of error (the messages carry the URL, which differs)
    assert direct["error"].split(":")[0] == through["error"].split(":")[0]


@pytest.mark.parametrize("path", ["config.json", "model.safetensors"])
def test_the_range_probe_of_the_rust_client_is_answered_206_cold_and_warm(emu, tmp_path, path):
    """hf-hub (Rust) asks ``Range: bytes=0-0`` first and reads the size from ``Content-Range``."""
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        url = f"{mirror.url}/acme/tiny-model/resolve/main/{path}"
        whole = httpx.get(url, follow_redirects=True).content
        for label in ("warm", "warm again"):
            probe = httpx.get(url, headers={"Range": "bytes=0-0"}, follow_redirects=True)
            assert probe.status_code == 206, (label, probe.status_code)
            assert probe.headers["content-range"] == f"bytes 0-0/{len(whole)}", label
            assert probe.content == whole[:1]
    with MirrorProcess(emu.url, tmp_path / "cold-cache") as cold:
        probe = httpx.get(f"{cold.url}/acme/tiny-model/resolve/main/{path}", headers={"Range": "bytes=0-0"},
                          follow_redirects=True)
    assert probe.status_code == 206 and probe.headers["content-range"] == f"bytes 0-0/{len(whole)}"
    assert probe.content == whole[:1]


PAGE = """<!doctype html><html><body><pre id="out">pending</pre>
<script type="module">
import { env, AutoConfig, AutoTokenizer } from "./transformers.min.js";
env.allowLocalModels = false;
env.useBrowserCache = false;
env.remoteHost = %(mirror)s;
const out = document.getElementById("out");
try {
  const config = await AutoConfig.from_pretrained("acme/tiny-model");
  const tokenizer = await AutoTokenizer.from_pretrained("acme/tiny-model");
  out.textContent = JSON.stringify({model_type: config.model_type ?? null, ids: tokenizer.encode("hello world")});
} catch (e) {
  out.textContent = "ERROR " + e;
}
</script></body></html>
"""


def test_transformers_js_in_a_browser_loads_a_tokenizer_through_the_mirror(emu, tmp_path, other_origin):  # noqa: F811
    """A page on another origin (another port and host) imports transformers.js and loads acme/tiny-model's config
    and tokenizer from the mirror: CORS, redirects and the Hub's URL layout as transformers.js reads them."""
    origin, site = other_origin
    (site / "transformers.min.js").write_bytes(transformers_bundle().read_bytes())
    from tokenizers import Tokenizer

    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        mirror_url = mirror.url.replace("127.0.0.1", "localhost") + "/"
        (site / "page.html").write_text(PAGE % {"mirror": json.dumps(mirror_url)})
        dom = dump_dom(f"{origin}/page.html", tmp_path / "chrome-profile")
        tokenizer_json = httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/tokenizer.json").text
        wanted = [f"/acme/tiny-model/resolve/main/{name}" for name in ("config.json", "tokenizer.json",
                                                                       "tokenizer_config.json")]
        # The access log is written in batches (every 0.2 s): wait for the page's requests to show.
        wait_for(lambda: all(path in mirror.log() for path in wanted), timeout=30)
        log = mirror.log()
    text = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    assert text and text.group(1) != "pending" and not text.group(1).startswith("ERROR"), dom[-3000:]
    out = json.loads(html.unescape(text.group(1)))
    expected = Tokenizer.from_str(tokenizer_json).encode("hello world").ids
    assert out["ids"] == expected
    for path in wanted:
        assert path in log

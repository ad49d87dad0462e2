"""Browser clients (issue 19, item 7): a page served on another origin loads a model's files and headers from the
mirror with ``fetch()`` in headless Chromium, as transformers.js and huggingface.js do: the repo's API JSON, a file
with ``X-Repo-Commit``/``ETag``, a ``Range`` request with ``Content-Range``, a ``HEAD`` with ``X-Linked-Size``, an
error's ``X-Error-Code``, and a request with ``Authorization`` (which forces a preflight, answered by the mirror).
The page writes what it read into its DOM; the test reads it with ``--dump-dom``. The status page's actions, on the
other hand, stay closed to other origins."""

from __future__ import annotations

import html
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_status_page import chromium
from tests.support.hub_emulator.fixtures import GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>cross-origin client</title></head><body>
<pre id="out">pending</pre>
<script>
const MIRROR = %(mirror)s;
const repo = 'acme/tiny-model';
async function run() {
  const out = {origin: location.origin};
  const info = await fetch(`${MIRROR}/api/models/${repo}`);
  out.info = {status: info.status, sha: (await info.json()).sha};
  const config = await fetch(`${MIRROR}/${repo}/resolve/main/config.json`);
  out.config = {status: config.status, commit: config.headers.get('X-Repo-Commit'),
                etag: config.headers.get('ETag'), body: await config.text()};
  const part = await fetch(`${MIRROR}/${repo}/resolve/main/model.safetensors`, {headers: {Range: 'bytes=0-9'}});
  out.range = {status: part.status, contentRange: part.headers.get('Content-Range'),
               acceptRanges: part.headers.get('Accept-Ranges'), length: (await part.arrayBuffer()).byteLength};
  const head = await fetch(`${MIRROR}/${repo}/resolve/main/model.safetensors`, {method: 'HEAD'});
  out.head = {status: head.status, linkedSize: head.headers.get('X-Linked-Size'),
              linkedEtag: head.headers.get('X-Linked-ETag'), etag: head.headers.get('ETag'),
              commit: head.headers.get('X-Repo-Commit')};
  const missing = await fetch(`${MIRROR}/${repo}/resolve/main/no-such-file.bin`);
  out.missing = {status: missing.status, code: missing.headers.get('X-Error-Code'),
                 message: missing.headers.get('X-Error-Message')};
  const authed = await fetch(`${MIRROR}/${repo}/resolve/main/sub/nested.txt`,
                             {headers: {Authorization: 'Bearer %(token)s'}});
  out.authed = {status: authed.status, body: await authed.text(), commit: authed.headers.get('X-Repo-Commit')};
  const tree = await fetch(`${MIRROR}/api/models/${repo}/tree/main`);
  out.tree = {status: tree.status, files: (await tree.json()).length};
  try {
    const evict = await fetch(`${MIRROR}/api/mirror/repos/model/${repo}/evict`,
                              {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'});
    out.evict = {status: evict.status};
  } catch (e) {
    out.evict = {blocked: String(e)};
  }
  try {
    const form = await fetch(`${MIRROR}/api/mirror/repos/model/${repo}/evict`, {method: 'POST', body: 'x=1',
                             headers: {'Content-Type': 'application/x-www-form-urlencoded'}});
    out.form = {status: form.status};
  } catch (e) {
    out.form = {blocked: String(e)};
  }
  return out;
}
run().then(out => { document.getElementById('out').textContent = JSON.stringify(out); },
           err => { document.getElementById('out').textContent = 'ERROR ' + err; });
</script></body></html>
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_origin(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tiny web server on another port: another origin than the mirror's."""
    site = tmp_path / "site"
    site.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", site
    finally:
        server.shutdown()
        server.server_close()


def dump_dom(url: str, profile: Path) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=20000"]
    done = subprocess.run([chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_page_on_another_origin_loads_a_model_through_the_mirror(emu, tmp_path, other_origin):
    origin, site = other_origin
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        # The mirror is reached as "localhost", the page as "127.0.0.1": other hosts, other ports, other origins.
        mirror_url = mirror.url.replace("127.0.0.1", "localhost")
        (site / "client.html").write_text(PAGE % {"mirror": json.dumps(mirror_url), "token": GOOD_TOKEN})
        dom = dump_dom(f"{origin}/client.html", tmp_path / "chrome-profile")
        text = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
        assert text and text.group(1) not in ("pending",) and not text.group(1).startswith("ERROR"), dom[-3000:]
        out = json.loads(html.unescape(text.group(1)))
        commit = httpx.head(mirror.url + "/acme/tiny-model/resolve/main/config.json").headers["x-repo-commit"]
        log = mirror.log()

    assert out["origin"] == origin
    assert out["info"]["status"] == 200 and len(out["info"]["sha"]) == 40
    sha = out["info"]["sha"]
    assert sha == commit
    assert out["config"]["status"] == 200 and out["config"]["commit"] == sha
    assert out["config"]["etag"] and json.loads(out["config"]["body"])["model_type"] == "bert"
    assert out["range"] == {"status": 206, "contentRange": out["range"]["contentRange"], "acceptRanges": "bytes",
                            "length": 10}
    assert re.fullmatch(r"bytes 0-9/\d+", out["range"]["contentRange"]), out["range"]
    assert out["head"]["status"] == 200 and out["head"]["commit"] == sha
    assert int(out["head"]["linkedSize"]) > 75_000 and out["head"]["linkedEtag"], out["head"]
    assert out["missing"]["status"] == 404 and out["missing"]["code"] == "EntryNotFound", out["missing"]
    assert out["authed"] == {"status": 200, "body": "nested file v2\n", "commit": sha}
    assert out["tree"]["status"] == 200 and out["tree"]["files"] >= 3
    # The status page's actions: a JSON POST needs a preflight, which they never grant; a form is refused.
    assert "blocked" in out["evict"], out["evict"]
    assert out["form"].get("status") in (403, 415) or "blocked" in out["form"], out["form"]
    assert "OPTIONS" in log or "options" in log  # the Authorization header's preflight, answered by the mirror


def test_preflights_are_answered_locally_with_what_browsers_need(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        asked = httpx.options(mirror.url + "/acme/tiny-model/resolve/main/config.json",
                              headers={"origin": "http://app.example", "access-control-request-method": "GET",
                                       "access-control-request-headers": "authorization,range"})
        got = httpx.get(mirror.url + "/acme/tiny-model/resolve/main/config.json",
                        headers={"origin": "http://app.example"})
    assert asked.status_code == 204
    assert asked.headers["access-control-allow-origin"] == "*"
    allowed = asked.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "range" in allowed
    assert "GET" in asked.headers["access-control-allow-methods"]
    exposed = {h.strip().lower() for h in got.headers["access-control-expose-headers"].split(",")}
    assert {"x-repo-commit", "x-linked-etag", "x-linked-size", "etag", "content-range", "accept-ranges",
            "x-error-code", "x-error-message", "link"} <= exposed

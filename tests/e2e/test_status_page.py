"""The status page for operators (issue 19, item 6; issue 29, item 4) in a real headless Chromium, driven over the
DevTools protocol: paginated and searchable repos (also as JSON), pinned and sync state, traffic charts, and the pin /
unpin / evict / warm buttons clicked in the page, checked in the DOM after a reload and on disk; the refresh in place
(paused while the tab is hidden), sort and filter, a repo's page (revisions, files, pins), the syncs' last runs,
gated repos listed to the tokens that may read them, and screenshots at 1400 and 800 px wide. Also what the actions
refuse: other sites' pages, forms, GETs, and callers without a mirror token in auth mode."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from mirror.layout import CacheLayout
from mirror.sync.record import record_run
from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess, wait_for

MODEL_FILES = ("config.json", "model.safetensors", "sub/nested.txt")
MIRROR_TOKEN = "mt_status_operator"
ADMIN_TOKEN = "adm_status_page_operator"


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed for the browser tests (.ci/run installs it)"
    return path


# What the DevTools protocol answers an evaluation made while the page is being replaced.
_NAVIGATING = ("Inspected target navigated or closed", "Execution context was destroyed",
               "Cannot find context with specified id")


class PageNavigating(Exception):
    """The page was navigating away when asked; ask again."""


class Browser:
    """Headless Chromium over the DevTools protocol (what Playwright does, in 60 lines): navigate, evaluate a
    script and await its promise, take a screenshot."""

    def __init__(self, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--remote-debugging-port=0", "--window-size=1200,1000", f"--user-data-dir={profile}"]
        self.proc = subprocess.Popen([chromium(), *flags, "about:blank"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=20).__enter__()
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._id:
                error = message.get("error", {}).get("message", "")
                if any(sign in error for sign in _NAVIGATING):
                    raise PageNavigating(error)
                assert "error" not in message, message
                return message["result"]
            self.events.append(message)

    def goto(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert time.monotonic() < deadline, f"{url} did not load"
            self.events.append(json.loads(self.ws.recv(timeout=30)))

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def dom(self) -> str:
        return self.eval("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def width(self, pixels: int, height: int = 1400) -> None:
        """Lay the page out at this window width (the next screenshot is ``pixels`` wide)."""
        self.call("Emulation.setDeviceMetricsOverride", width=pixels, height=height, deviceScaleFactor=1,
                  mobile=False)

    def wait(self, expression: str, timeout: float = 30) -> Any:
        """Poll ``expression`` in the page until it is truthy, and return its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if value := self.eval(expression):
                    return value
            except PageNavigating:
                pass  # a click's navigation is under way: the next page answers the next poll
            assert time.monotonic() < deadline, f"never true in the page: {expression}"
            time.sleep(0.2)

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "chrome-profile")
    try:
        yield b
    finally:
        b.close()


def _click(browser: Browser, action: str, repo: str, kind: str = "model") -> dict[str, Any]:
    """Click a row's button the way a person would, and wait for the page's request to answer."""
    selector = f'button[data-action="{action}"][data-type="{kind}"][data-repo="{repo}"]'
    return browser.eval(f"mirrorAction(document.querySelector('{selector}'))")


def _blobs(cache: Path) -> int:
    return sum(1 for p in (cache / "blobs").rglob("*") if p.is_file())


def test_status_page_lists_searches_pages_and_its_buttons_pin_unpin_evict_warm(emu, tmp_path, browser):
    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, "--max-size", "10G", "--admin-token", ADMIN_TOKEN,
                       env={"HF_MIRROR_STATUS_SAMPLE": "1"}) as mirror:
        for path in MODEL_FILES:
            assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/{path}").status_code == 200
        assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/config.json").status_code == 200  # a hit
        for path in ("train.jsonl", "test.jsonl"):
            assert httpx.get(f"{mirror.url}/datasets/acme/tiny-jsonl/resolve/main/{path}").status_code == 200
        # A few samples of traffic, and a fresh usage snapshot: waited for in the JSON.
        def sampled() -> bool:
            status = httpx.get(mirror.url + "/api/mirror/status").json()
            points = status["history"]["points"]
            model = [r for r in status["repos"] if r["id"] == "acme/tiny-model"]
            return (status["repos_total"] == 2 and bool(model) and model[0]["files"] == 3
                    and sum(p["hits"] for p in points) >= 1 and sum(p["bytes_served"] for p in points) > 75_000)

        wait_for(sampled, timeout=30)

        # The JSON: paginated and searched on the server.
        everything = httpx.get(mirror.url + "/api/mirror/status").json()
        assert everything["repos_total"] == 2 and everything["pages"] == 1
        assert {(r["type"], r["id"]) for r in everything["repos"]} == {("model", "acme/tiny-model"),
                                                                        ("dataset", "acme/tiny-jsonl")}
        model = next(r for r in everything["repos"] if r["id"] == "acme/tiny-model")
        assert model["files"] == 3 and model["bytes"] > 75_000 and model["pinned"] is False and model["last_access"]
        second = httpx.get(mirror.url + "/api/mirror/status", params={"per_page": 1, "page": 2}).json()
        assert second["page"] == 2 and second["pages"] == 2 and len(second["repos"]) == 1
        assert second["repos"][0]["id"] == "acme/tiny-model"  # sorted by type, then name: dataset first
        found = httpx.get(mirror.url + "/api/mirror/status", params={"q": "JSONL"}).json()
        assert [r["id"] for r in found["repos"]] == ["acme/tiny-jsonl"] and found["repos_total"] == 1
        points = everything["history"]["points"]
        assert sum(p["hits"] for p in points) >= 1 and sum(p["bytes_served"] for p in points) > 75_000

        # The page in the browser: totals, charts, the table, search and pagination links.
        browser.goto(mirror.url + "/?per_page=1")
        browser.screenshot(tmp_path / "status.png")
        dom = browser.dom()
        for chart in ("hit-ratio", "bytes-served", "bytes-fetched", "errors", "latency"):
            assert f'id="chart-{chart}"' in dom
        assert browser.eval("document.querySelectorAll('#chart-bytes-served .series polyline, "
                            "#chart-bytes-served .series circle').length") >= 1
        assert browser.eval("document.getElementById('repo-count').textContent") == "1–1 of 2"
        assert browser.eval("!!document.getElementById('next-page')")
        browser.eval("document.getElementById('next-page').click()")
        assert browser.wait("document.querySelector('#repos').textContent.includes('acme/tiny-model')")
        browser.goto(mirror.url + "/?q=tiny-model")
        rows = browser.eval("[...document.querySelectorAll('#repos tr[data-repo]')].map(r => r.dataset.repo)")
        assert rows == ["model:acme/tiny-model"]
        assert (tmp_path / "status.png").stat().st_size > 5000

        # Pin, in the page: the row says so after a reload; eviction refuses a pinned repo.
        assert _click(browser, "pin", "acme/tiny-model")["ok"]
        browser.goto(mirror.url + "/?q=tiny-model")
        state = browser.eval("document.querySelector('tr[data-repo=\"model:acme/tiny-model\"] .pin-state')"
                             ".textContent")
        assert state == "pinned (operator)"
        assert browser.eval("!!document.querySelector('button[data-action=\"unpin\"]')")
        assert not browser.eval("!!document.querySelector('button[data-action=\"evict\"]')")
        refused = httpx.post(mirror.url + "/api/mirror/repos/model/acme/tiny-model/evict", json={},
                             headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert refused.status_code == 409 and refused.headers["x-error-code"] == "RepoPinned"
        assert httpx.get(mirror.url + "/api/mirror/status?q=tiny-model").json()["repos"][0]["pinned"] is True

        # Unpin and evict are the operator's: refused in the page until the admin token is typed in its field (kept
        # in sessionStorage across reloads), then done: the blobs leave the disk, the row leaves the list.
        assert _click(browser, "unpin", "acme/tiny-model")["status"] == 403
        assert "admin" in browser.eval("document.getElementById('action-result').textContent")
        browser.eval(f"document.getElementById('token').value = '{ADMIN_TOKEN}'")
        assert _click(browser, "unpin", "acme/tiny-model")["ok"]
        browser.goto(mirror.url + "/?q=tiny-model")
        blobs_before = _blobs(cache)
        evicted = _click(browser, "evict", "acme/tiny-model")
        assert evicted["ok"] and evicted["data"]["blobs"] == 3 and evicted["data"]["freed_bytes"] > 75_000
        assert _blobs(cache) == blobs_before - 3
        browser.goto(mirror.url + "/")
        rows = browser.eval("[...document.querySelectorAll('#repos tr[data-repo]')].map(r => r.dataset.repo)")
        assert rows == ["dataset:acme/tiny-jsonl"]

        # Warm, in the page (the warm API): the result line follows the job until it is done.
        browser.eval("document.getElementById('warm-repo').value = 'acme/tiny-model'")
        warm = browser.eval("mirrorAction(document.getElementById('warm-button'))")
        assert warm["ok"] and warm["status"] == 202
        deadline = time.monotonic() + 60
        while ": done " not in (text := browser.eval("document.getElementById('action-result').textContent")):
            assert time.monotonic() < deadline and "failed" not in text, text
            time.sleep(0.5)
        assert httpx.get(mirror.url + "/api/mirror/ready", params={"repo": "acme/tiny-model"}).status_code == 200
        deadline = time.monotonic() + 20  # the page shows the last usage snapshot while a fresh one is taken
        while not httpx.get(mirror.url + "/api/mirror/status?q=tiny-model").json()["repos"]:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        browser.goto(mirror.url + "/?q=tiny-model")
        assert "warm done" in browser.eval("document.querySelector('#repos').textContent")
        hit = httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/config.json")
        assert hit.headers["x-mirror-cache"].lower() == "hit"


def test_actions_refuse_other_sites_forms_and_other_methods(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        url = mirror.url + "/api/mirror/repos/model/acme/tiny-model/pin"
        assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/config.json").status_code == 200
        form = httpx.post(url, data={"x": "1"})  # what a plain cross-site form can send
        assert form.status_code == 415
        other = httpx.post(url, json={}, headers={"origin": "http://evil.example"})
        assert other.status_code == 403 and other.headers["x-error-code"] == "CrossSiteRequest"
        fetched = httpx.post(url, json={}, headers={"sec-fetch-site": "cross-site"})
        assert fetched.status_code == 403
        preflight = httpx.options(url, headers={"origin": "http://evil.example",
                                                "access-control-request-method": "POST",
                                                "access-control-request-headers": "content-type"})
        assert preflight.status_code == 204 and "access-control-allow-headers" not in preflight.headers
        assert httpx.get(url).status_code == 405
        assert httpx.post(mirror.url + "/api/mirror/repos/model/acme/tiny-model/destroy", json={}).status_code == 404
        private = httpx.post(mirror.url + "/api/mirror/repos/model/acme/private-model/evict", json={})
        assert private.status_code == 403  # an eviction is an operator's, and this mirror has no --admin-token
        same = httpx.post(url, json={}, headers={"origin": mirror.url})
        assert same.status_code == 200 and same.json()["pinned"] is True
        assert httpx.get(mirror.url + "/api/mirror/status").json()["repos"][0]["pinned"] is True


def test_in_auth_mode_the_page_and_the_actions_need_a_mirror_token_that_allows_the_repo(emu, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "ops"\ntoken = "{MIRROR_TOKEN}"\nrepos = ["model:acme/tiny-*"]\n')
    auth = {"authorization": f"Bearer {MIRROR_TOKEN}"}
    with MirrorProcess(emu.url, tmp_path / "cache", "--auth-tokens-file", str(tokens),
                       "--upstream-token", GOOD_TOKEN) as mirror:
        assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/config.json", headers=auth).status_code == 200
        for path in ("/", "/api/mirror/status", "/metrics"):
            assert httpx.get(mirror.url + path).status_code == 401, path
            assert httpx.get(mirror.url + path, headers={"authorization": "Bearer mt_wrong"}).status_code == 401
        assert httpx.get(mirror.url + "/healthz").status_code == 200
        url = mirror.url + "/api/mirror/repos/model/acme/tiny-model/pin"
        assert httpx.post(url, json={}).status_code == 401
        assert httpx.post(url, json={}, headers={"authorization": "Bearer mt_wrong"}).status_code == 401
        other = httpx.post(mirror.url + "/api/mirror/repos/model/acme/other/pin", json={}, headers=auth)
        assert other.status_code == 403  # the token's patterns decide
        assert httpx.post(url, json={}, headers=auth).status_code == 200
        page = httpx.get(mirror.url + "/", headers=auth).text
        assert "id='token'" in page and "pinned (operator)" in page


def _png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk (and a check that it is a PNG at all)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _shoot(browser: Browser, path: Path, width: int) -> None:
    """A screenshot at ``width`` px, checked to be a PNG of that width with something on it (a blank page of
    that size compresses to a few kilobytes); the layout is then judged by eye."""
    browser.width(width)
    time.sleep(0.3)
    browser.screenshot(path)
    assert _png_size(path) == (width, 1400)
    assert path.stat().st_size > 30_000, f"{path} looks blank"


def _rows(browser: Browser) -> list[str]:
    return browser.eval("[...document.querySelectorAll('#repos tr[data-repo]')].map(r => r.dataset.repo)")


def test_the_page_refreshes_in_place_sorts_filters_and_shows_a_repo_page(emu, tmp_path, browser):
    cache = tmp_path / "cache"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with MirrorProcess(emu.url, cache, "--max-size", "10G", "--admin-token", ADMIN_TOKEN,
                       env={"HF_MIRROR_STATUS_SAMPLE": "1"}) as mirror:
        for path in MODEL_FILES:
            assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/{path}").status_code == 200
        for path in ("train.jsonl", "test.jsonl"):
            assert httpx.get(f"{mirror.url}/datasets/acme/tiny-jsonl/resolve/main/{path}").status_code == 200
        assert httpx.get(f"{mirror.url}/acme/no-such-repo/resolve/main/x.json").status_code == 401  # an error
        gated = {"authorization": f"Bearer {GOOD_TOKEN}"}
        assert httpx.get(f"{mirror.url}/acme/gated-model/resolve/main/config.json", headers=gated).status_code == 200
        record_run(CacheLayout(cache), str(tmp_path / "nightly.toml"), ok=False, files=2, size=1234, failed=1)

        # Gated repos: listed to the admin and to a Hub token upstream confirmed, not to others (who read a note).
        def listed(**headers: str) -> dict[str, Any]:
            return httpx.get(mirror.url + "/api/mirror/status", headers=headers).json()

        def sampled() -> bool:  # a fresh usage snapshot, the sync run and the error in the traffic samples
            status = listed(authorization=f"Bearer {ADMIN_TOKEN}")
            return (len(status["repos"]) == 3 and bool(status["sync_runs"])
                    and sum(p["errors"] for p in status["history"]["points"]) >= 1)

        wait_for(sampled, timeout=30)
        anonymous = listed()
        assert [r["id"] for r in anonymous["repos"]] == ["acme/tiny-jsonl", "acme/tiny-model"]
        assert anonymous["repos_hidden"] is True
        assert "acme/gated-model" in [r["id"] for r in listed(authorization=f"Bearer {GOOD_TOKEN}")["repos"]]
        assert "acme/gated-model" in [r["id"] for r in listed(authorization=f"Bearer {ADMIN_TOKEN}")["repos"]]
        denied = listed(authorization=f"Bearer {DENIED_TOKEN}")
        assert "acme/gated-model" not in [r["id"] for r in denied["repos"]] and denied["repos_hidden"] is True
        assert listed(authorization=f"Bearer {ADMIN_TOKEN}")["repos_hidden"] is False
        assert anonymous["version"] and anonymous["uptime"] > 0 and anonymous["disk"]["total"] > 0
        [run] = anonymous["sync_runs"]
        assert run["manifest"] == "nightly.toml" and run["ok"] is False and run["failed"] == 1
        assert sum(p["errors"] for p in anonymous["history"]["points"]) >= 1

        # The page refreshes itself: a number moves without a reload (a value set in the page survives).
        browser.goto(mirror.url + "/?refresh=1")
        assert browser.eval("document.getElementById('repos-hidden').textContent").startswith("Some cached repos")
        assert browser.eval("document.querySelector('#sync-runs td.bad').textContent") == "FAILED"
        assert "of 9.3 GiB" in browser.eval("document.getElementById('disk-usage').textContent")
        assert browser.eval("document.getElementById('version').textContent").startswith("version ")
        browser.eval("window.stayed = 'no reload'")
        hits = int(browser.eval("document.getElementById('hit-count').textContent"))
        for _ in range(3):
            assert httpx.get(f"{mirror.url}/acme/tiny-model/resolve/main/config.json").status_code == 200
        browser.wait(f"Number(document.getElementById('hit-count').textContent) >= {hits + 3}")
        assert browser.eval("window.stayed") == "no reload"
        assert browser.eval("document.getElementById('refreshed').textContent").startswith("updated")

        # ... and not while the tab is hidden; at once when it shows again.
        browser.eval("Object.defineProperty(document, 'hidden', {configurable: true, get: () => true})")
        time.sleep(1.2)
        before = browser.eval("Number(document.body.dataset.refreshes)")
        time.sleep(2.5)
        assert browser.eval("Number(document.body.dataset.refreshes)") == before
        browser.eval("delete document.hidden; document.dispatchEvent(new Event('visibilitychange'))")
        browser.wait(f"Number(document.body.dataset.refreshes) > {before}")

        _shoot(browser, shots / "status-1400.png", 1400)
        _shoot(browser, shots / "status-800.png", 800)
        browser.width(1400)

        # Sort by a column header, in place: biggest first, then the other way round.
        assert _rows(browser) == ["dataset:acme/tiny-jsonl", "model:acme/tiny-model"]
        browser.eval("document.querySelector('th[data-sort=\"size\"] a').click()")
        browser.wait("location.search.includes('sort=size') && document.querySelector('#repos tr[data-repo]')"
                     ".dataset.repo === 'model:acme/tiny-model'")
        browser.eval("document.querySelector('th[data-sort=\"size\"] a').click()")
        browser.wait("location.search.includes('order=asc') && document.querySelector('#repos tr[data-repo]')"
                     ".dataset.repo === 'dataset:acme/tiny-jsonl'")
        sizes = browser.eval("[...document.querySelectorAll('#repos td[data-bytes]')].map(c => +c.dataset.bytes)")
        assert sizes == sorted(sizes)

        # Filter by type (the select submits itself) and by name; the order chosen stays.
        browser.eval("const s = document.getElementById('filter-type'); s.value = 'model';"
                     "s.dispatchEvent(new Event('change', {bubbles: true}))")
        browser.wait("location.search.includes('type=model') && location.search.includes('sort=size')")
        browser.wait("document.querySelectorAll('#repos tr[data-repo]').length === 1")
        assert _rows(browser) == ["model:acme/tiny-model"]
        assert browser.eval("window.stayed") == "no reload"
        browser.goto(mirror.url + "/?pinned=yes")
        assert browser.eval("document.querySelector('#repos').textContent").count("no cached repo matches") == 1

        # The Hub token typed into the page's field lists the gated repo it may read.
        browser.goto(mirror.url + "/")
        assert "model:acme/gated-model" not in _rows(browser)
        browser.eval(f"const t = document.getElementById('token'); t.value = '{GOOD_TOKEN}';"
                     "t.dispatchEvent(new Event('change', {bubbles: true}))")
        browser.wait("[...document.querySelectorAll('#repos tr[data-repo]')].some(r => r.dataset.repo === "
                     "'model:acme/gated-model')")
        assert not browser.eval("!!document.getElementById('repos-hidden')")
        browser.eval("sessionStorage.clear(); document.getElementById('token').value = ''")

        # The repo page, from the list's link: revisions, files with sizes, the pin and who made it and why.
        browser.goto(mirror.url + "/?q=tiny-model&refresh=1")
        browser.eval("document.querySelector('a.repo-link').click()")
        browser.wait("!!document.getElementById('repo-files')")
        assert browser.eval("location.search") == "?repo=model%3Aacme%2Ftiny-model"
        files = browser.eval("[...document.querySelectorAll('#files tr[data-path]')].map(r => r.dataset.path)")
        assert files == sorted(MODEL_FILES)
        sizes = browser.eval("[...document.querySelectorAll('#files td[data-bytes]')].map(c => +c.dataset.bytes)")
        assert all(size > 0 for size in sizes) and sum(sizes) > 75_000
        assert "main" in browser.eval("document.getElementById('revisions').textContent")
        assert "config.json" in browser.eval("document.getElementById('recent-files').textContent")
        assert browser.eval("document.getElementById('pin-state').textContent") == "not pinned"
        browser.eval("window.stayed = 'repo page'")
        assert _click(browser, "pin", "acme/tiny-model")["ok"]
        browser.wait("document.getElementById('pin-state').textContent === 'pinned (operator)'")
        assert "by an operator" in browser.eval("document.getElementById('pin-reason').textContent")
        assert browser.eval("window.stayed") == "repo page"
        _shoot(browser, shots / "repo-1400.png", 1400)
        _shoot(browser, shots / "repo-800.png", 800)

        # The repo's JSON; an unknown repo and a gated one (to an anonymous caller) answer the same 404.
        detail = httpx.get(mirror.url + "/api/mirror/status", params={"repo": "model:acme/tiny-model"}).json()
        assert {f["path"] for f in detail["files"]} == set(MODEL_FILES) and detail["pinned_by"] == "operator"
        assert detail["refs"] == [{"name": "main", "commit": detail["revisions"][0]["commit"]}]
        for hidden in ("model:acme/nothing", "model:acme/gated-model", "nonsense"):
            answer = httpx.get(mirror.url + "/api/mirror/status", params={"repo": hidden})
            assert answer.status_code == 404 and answer.json()["repo"] is None, hidden
            assert httpx.get(mirror.url + "/", params={"repo": hidden}).status_code == 404
        allowed = httpx.get(mirror.url + "/api/mirror/status", params={"repo": "model:acme/gated-model"},
                            headers=gated)
        assert allowed.status_code == 200 and allowed.json()["files_total"] == 1

        # The repo evicted meanwhile (by the operator, elsewhere): its open page says so at its next refresh.
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for action in ("unpin", "evict"):
            assert httpx.post(f"{mirror.url}/api/mirror/repos/model/acme/tiny-model/{action}", json={},
                              headers=admin).status_code == 200
        browser.wait("!!document.getElementById('not-found')")
        assert browser.eval("window.stayed") == "repo page"

"""Operations: the status page in a real headless browser, /metrics as a scraper reads it, JSON logs with request
ids, and graceful shutdown during a fill."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess

BIG_URL = "/datasets/acme/big-data/resolve/main/big.bin"
SIZE = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu"), big_file_size=SIZE) as handle:
        yield handle


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is needed for the status page test (.ci/run installs it)"
    return path


def browser_dom(url: str, tmp_path: Path) -> str:
    """The DOM after the page loaded in headless Chromium, plus a screenshot next to it for a human to look at."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chrome-profile'}"]
    subprocess.run([chromium(), *flags, f"--screenshot={tmp_path / 'status.png'}", "--window-size=1200,900", url],
                   capture_output=True, timeout=60)
    dom = subprocess.run([chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def test_status_page_in_a_browser_shows_repos_usage_health_and_fills(emu, tmp_path):
    emu.clear_faults()
    # No shutdown grace: the throttled fill the browser looked at is cancelled at the end, not waited for.
    with MirrorProcess(emu.url, tmp_path / "cache", "--max-size", "10G",
                       env={"HF_MIRROR_SHUTDOWN_GRACE": "0"}) as mirror:
        for path in ("/acme/tiny-model/resolve/main/config.json", "/acme/tiny-model/resolve/main/model.safetensors"):
            assert httpx.get(mirror.url + path).status_code == 200
            assert httpx.get(mirror.url + path).status_code == 200  # a hit: 2 hits, 3 misses with big.bin below
        emu.set_faults(throttle_bps=1e6)  # a fill that stays in progress while the browser looks
        with httpx.stream("GET", mirror.url + BIG_URL, timeout=30) as response:
            next(response.iter_raw())
            dom = browser_dom(mirror.url + "/", tmp_path)
        emu.clear_faults()
    assert "acme/tiny-model" in dom
    assert re.search(r'id="upstream-health">up<', dom), dom[:2000]
    assert re.search(r'id="disk-usage">[\d.]+ KiB of 9\.3 GiB<', dom), dom[:2000]
    assert re.search(r'id="hit-ratio">40\.0%<', dom), dom[:2000]
    fills = dom[dom.index('id="fills"'):]
    assert "big.bin" in fills[:2000] and "<progress" in fills[:2000]
    assert (tmp_path / "status.png").stat().st_size > 1000


def test_metrics_are_scrapable_and_bounded(emu, tmp_path):
    emu.clear_faults()
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        httpx.get(mirror.url + "/acme/tiny-model/resolve/main/config.json")
        httpx.get(mirror.url + "/acme/tiny-model/resolve/main/config.json")
        httpx.get(mirror.url + "/acme/tiny-model/resolve/main/nope.txt")
        httpx.get(mirror.url + "/api/models/acme/tiny-model")
        text = httpx.get(mirror.url + "/metrics").text
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("hf_mirror_requests", "hf_mirror_served_bytes", "hf_mirror_upstream_bytes",
                 "hf_mirror_upstream_latency_seconds", "hf_mirror_fills_in_flight", "hf_mirror_cache_bytes",
                 "hf_mirror_cache_blobs", "hf_mirror_evictions"):
        assert name in families, name
    outcomes = {s.labels["outcome"]: s.value for s in families["hf_mirror_requests"].samples
                if s.name.endswith("_total") and s.labels["route"] == "resolve"}
    assert outcomes.get("hit", 0) >= 1 and outcomes.get("miss", 0) >= 1
    assert families["hf_mirror_cache_blobs"].samples[0].value >= 1
    assert "acme" not in text and "tiny-model" not in text  # no repo names as labels


def test_json_access_log_has_request_ids_and_timing(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache", "--log-format", "json") as mirror:
        response = httpx.get(mirror.url + "/acme/tiny-model/resolve/main/config.json",
                             headers={"authorization": "Bearer hf_good_token"})
        request_id = response.headers["x-request-id"]
        lines = [json.loads(line) for line in mirror.flushed_log().splitlines() if line.startswith("{")]
    mine = [line for line in lines if request_id in json.dumps(line)]
    assert mine, lines[-5:]
    assert any(line.get("outcome") == "miss" for line in mine)
    assert "hf_good_token" not in mirror.log()
    access = next(line for line in mine if line["logger"] == "hf_mirror.access")
    assert access["method"] == "GET" and access["path"] == "/acme/tiny-model/resolve/main/config.json"
    assert access["status"] == 200 and access["duration_ms"] >= 0 and access["bytes"] == len(response.content)


def test_a_well_formed_incoming_request_id_is_kept(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache", "--log-format", "json") as mirror:
        kept = httpx.get(mirror.url + "/healthz", headers={"x-request-id": "lb-7f3a.2"})
        assert kept.headers["x-request-id"] == "lb-7f3a.2"
        for bad in ("has space", "x" * 200, "hf_" + "a" * 30):
            replaced = httpx.get(mirror.url + "/healthz", headers={"x-request-id": bad})
            assert replaced.headers["x-request-id"] != bad and len(replaced.headers["x-request-id"]) == 16
        log = mirror.flushed_log()
    assert '"request_id": "lb-7f3a.2"' in log and "has space" not in log and "hf_aaaa" not in log


def test_sigterm_during_a_fill_exits_promptly_and_leaves_it_resumable(emu, tmp_path):
    emu.set_faults(throttle_bps=2e6)  # ~8 s for the file: longer than the grace period
    cache = tmp_path / "cache"
    mirror = MirrorProcess(emu.url, cache, env={"HF_MIRROR_SHUTDOWN_GRACE": "1"}).start()
    try:
        with httpx.stream("GET", mirror.url + BIG_URL, timeout=30) as response:
            next(response.iter_raw())
            began = time.monotonic()
            assert mirror.proc is not None
            mirror.proc.send_signal(signal.SIGTERM)
            mirror.proc.wait(timeout=30)
        assert time.monotonic() - began < 15
        partials = list((cache / "partials").glob("*.part"))
        assert partials and 0 < partials[0].stat().st_size < SIZE
        emu.clear_faults()
        mirror.start()
        full = httpx.get(mirror.url + BIG_URL, timeout=60)
        assert full.status_code == 200 and len(full.content) == SIZE
    finally:
        emu.clear_faults()
        mirror.stop()


def test_serve_lifts_a_low_open_file_limit() -> None:
    """A soft limit of 256 open files would refuse clients at about 128 concurrent downloads."""
    import sys

    code = ("import resource\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "from mirror.server import raise_open_file_limit\n"
            "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    returned, soft, hard = (int(x) for x in out)
    assert soft == returned and soft >= min(hard, 4096), out

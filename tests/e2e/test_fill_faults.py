"""The fill engine under load and faults: one upstream fetch per blob, streaming during the fill, resume, integrity,
and serving from the cache while upstream is down. Real mirror processes against the emulator."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess, blob, download, metric, run_client, wait_for

BIG = "acme/big-data"
BIG_URL = f"/datasets/{BIG}/resolve/main/big.bin"
SIZE = 24 * 1024 * 1024


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu"), page_size=3, big_file_size=SIZE) as handle:
        yield handle


@pytest.fixture(autouse=True)
def clean_emulator(emu: EmulatorHandle) -> Iterator[None]:
    if emu.proc is None:
        emu.start()
    emu.clear_faults()
    emu.reset_stats()
    yield
    if emu.proc is None:
        emu.start()
    emu.clear_faults()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def big_sha(emu: EmulatorHandle) -> str:
    return emu.files.etag("dataset", BIG, "main", "big.bin")


@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_cold_requests_make_one_upstream_fetch_and_stream_at_once(emu, cache, workers):
    emu.set_faults(throttle_bps=16e6)  # ~1.5 s for the file: followers must get bytes long before the end
    with MirrorProcess(emu.url, cache, "--workers", str(workers)) as mirror:

        async def run() -> list[tuple[int, str, float, float]]:
            return await asyncio.gather(*(download(mirror.url + BIG_URL) for _ in range(20)))

        results = asyncio.run(run())
    assert all(status == 200 and digest == big_sha(emu) for status, digest, _, _ in results)
    assert emu.fetch_count("dataset", BIG, "big.bin") == 1
    assert emu.stats()["bytes_served"] == SIZE
    slowest_first_byte = max(first for _, _, first, _ in results)
    fill_time = max(total for _, _, _, total in results)
    assert slowest_first_byte < fill_time / 2, (slowest_first_byte, fill_time)


def test_cold_head_and_far_range_do_not_wait_for_the_fill(emu, cache):
    emu.set_faults(throttle_bps=4e6)  # the whole file would take ~6 s
    with MirrorProcess(emu.url, cache) as mirror:
        # "Did not wait" without a stopwatch: each answer came while the throttled fill was still running.
        head = httpx.head(mirror.url + BIG_URL, timeout=10)
        assert head.status_code == 200 and int(head.headers["content-length"]) == SIZE
        assert not blob(cache, big_sha(emu)).exists()
        tail = httpx.get(mirror.url + BIG_URL, headers={"range": f"bytes={SIZE - 1000}-"}, timeout=10)
        assert tail.status_code == 206
        assert tail.content == emu.files.file_bytes("dataset", BIG, "main", "big.bin")[-1000:]
        assert not blob(cache, big_sha(emu)).exists()
        emu.clear_faults()
        # The Range started a background fill of the whole blob.
        wait_for(lambda: blob(cache, big_sha(emu)).exists(), timeout=30)


def test_fill_survives_the_client_hanging_up(emu, cache):
    emu.set_faults(throttle_bps=32e6)
    with MirrorProcess(emu.url, cache) as mirror:
        with httpx.stream("GET", mirror.url + BIG_URL, timeout=10) as response:
            next(response.iter_raw())  # first bytes, then hang up
        wait_for(lambda: blob(cache, big_sha(emu)).exists(), timeout=30)
        assert hashlib.sha256(blob(cache, big_sha(emu)).read_bytes()).hexdigest() == big_sha(emu)
    assert emu.fetch_count("dataset", BIG, "big.bin") == 1


def test_dropped_connections_and_expired_signed_url_resume_with_range(emu, cache):
    emu.set_faults(drop_after_bytes=3 << 20, drop_count=2, expire_on_drop=True)
    with MirrorProcess(emu.url, cache) as mirror:
        status, digest, _, _ = asyncio.run(download(mirror.url + BIG_URL))
    assert status == 200 and digest == big_sha(emu)
    stats = emu.stats()
    # Each drop is resumed from where it stopped, not from zero; the expired URL was re-resolved.
    assert stats["bytes_served"] == SIZE, stats["bytes_served"]
    counts = stats["counts"]
    assert counts.get("resolve_head", 0) + counts.get("resolve_get", 0) >= 2 and counts["cdn_get"] >= 3


def test_corrupt_upstream_bytes_are_never_served_or_cached(emu, cache):
    emu.set_faults(corrupt_next=1)
    with MirrorProcess(emu.url, cache) as mirror:
        digest = hashlib.sha256()
        with pytest.raises(httpx.HTTPError), httpx.stream("GET", mirror.url + BIG_URL, timeout=30) as response:
            for chunk in response.iter_raw():
                digest.update(chunk)
        assert not blob(cache, big_sha(emu)).exists()
        assert metric(mirror, "hf_mirror_integrity_failures_total") == 1
        # The next request fills it again, correctly.
        status, good, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and good == big_sha(emu)


def test_kill_9_mid_fill_then_restart_resumes_the_partial(emu, cache):
    emu.set_faults(throttle_bps=16e6)
    mirror = MirrorProcess(emu.url, cache).start()
    try:
        with httpx.stream("GET", mirror.url + BIG_URL, timeout=10) as response:
            got = 0
            for chunk in response.iter_raw():
                got += len(chunk)
                if got > 8 << 20:
                    break
        mirror.kill9()
        partial = cache / "partials" / f"{big_sha(emu)}.part"
        assert partial.exists() and not blob(cache, big_sha(emu)).exists()
        emu.clear_faults()
        mirror.start()
        status, digest, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and digest == big_sha(emu)
    finally:
        mirror.stop()
    assert emu.stats()["bytes_served"] < 2 * SIZE  # resumed: the first run's bytes were not fetched again


def test_upstream_down_serves_the_cache_to_real_clients(emu, cache, tmp_path):
    with MirrorProcess(emu.url, cache, "--revision-ttl", "0") as mirror:
        code = """
import json, hashlib
from huggingface_hub import hf_hub_download, snapshot_download, HfApi
p = hf_hub_download("acme/tiny-model", "config.json")
root = snapshot_download("acme/tiny-model", allow_patterns=["*.json"])
from datasets import load_dataset
rows = {r: len(list(load_dataset(r, split="train", streaming=True))) for r in ("acme/tiny-parquet", "acme/tiny-jsonl")}
print(json.dumps(dict(sha=HfApi().model_info("acme/tiny-model").sha, cfg=open(p).read(), rows=rows)))
"""
        warm = run_client(code, mirror.url, tmp_path / "a")
        emu.stop()
        began = time.monotonic()
        down = run_client(code, mirror.url, tmp_path / "b")  # a fresh client cache: every byte from the mirror
        assert down == warm and warm["rows"] == {"acme/tiny-parquet": 200, "acme/tiny-jsonl": 30}
        assert time.monotonic() - began < 30
        head = httpx.head(f"{mirror.url}/acme/tiny-model/resolve/main/config.json")
        assert head.status_code == 200 and head.headers["x-mirror-cache"] == "stale"
        # What was never cached says so with the Hub's error shape, promptly.
        miss = httpx.head(f"{mirror.url}/acme/tiny-model/resolve/main/dev.txt", timeout=15)
        assert miss.status_code >= 500 and miss.headers.get("x-error-code")


def test_one_429_is_absorbed_and_a_burst_is_relayed_with_its_rate_limit_headers(emu, cache, tmp_path):
    url = "/acme/tiny-model/resolve/main/config.json"
    emu.set_faults(status_burst=1, burst_status=429, retry_after=1)
    with MirrorProcess(emu.url, cache) as mirror:
        began = time.monotonic()
        response = httpx.get(mirror.url + url, timeout=30)
        assert response.status_code == 200
        assert response.content == emu.files.file_bytes("model", "acme/tiny-model", "main", "config.json")
        assert time.monotonic() - began >= 1  # it waited as told, rather than hammering upstream
        # A burst: one more try at most, then the client gets the 429 and the headers that tell it how long to wait.
        emu.set_faults(status_burst=5, burst_status=429, retry_after=1)
        emu.reset_stats()
        refused = httpx.get(mirror.url + "/acme/tiny-model/resolve/main/README.md", timeout=30)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert [r["method"] for r in emu.requests()] == ["HEAD", "HEAD"]


def test_no_disk_room_relays_without_storing(emu: EmulatorHandle, cache: Path, tmp_path: Path) -> None:
    """A disk that cannot take the file (here: --min-free-space above what is free) still serves it, from
    upstream, and stores nothing; the real client gets the right bytes."""
    import shutil

    impossible = str(shutil.disk_usage(tmp_path).free + 2**40)
    data = emu.files.file_bytes("dataset", BIG, "main", "big.bin")
    with MirrorProcess(emu.url, cache, "--min-free-space", impossible) as mirror:
        response = httpx.get(mirror.url + BIG_URL, timeout=60)
        assert response.status_code == 200 and response.content == data
        assert response.headers["x-mirror-cache"] == "passthrough"
        ranged = httpx.get(mirror.url + BIG_URL, headers={"range": "bytes=1000-1999"}, timeout=60)
        assert ranged.status_code == 206 and ranged.content == data[1000:2000]
        code = ("import json; from huggingface_hub import hf_hub_download; "
                "p = hf_hub_download('acme/tiny-model', 'model.safetensors'); "
                "print(json.dumps({'size': len(open(p, 'rb').read())}))")
        expected = len(emu.files.file_bytes("model", "acme/tiny-model", "main", "model.safetensors"))
        assert run_client(code, mirror.url, tmp_path / "client") == {"size": expected}
        assert not blob(cache, big_sha(emu)).exists()
        stored = [p for p in (cache / "blobs").rglob("*") if p.is_file()] if (cache / "blobs").exists() else []
        assert stored == [], stored
        assert "relaying it without storing it" in mirror.log()


def test_head_says_miss_when_only_the_metadata_is_cached(emu: EmulatorHandle, cache: Path) -> None:
    url = "/acme/tiny-model/resolve/main/config.json"
    etag = emu.files.etag("model", "acme/tiny-model", "main", "config.json")
    with MirrorProcess(emu.url, cache) as mirror:
        assert httpx.get(mirror.url + url).status_code == 200
        assert httpx.head(mirror.url + url).headers["x-mirror-cache"] == "hit"
        blob(cache, etag).unlink()  # evicted, say: the metadata stays in the index
        assert httpx.head(mirror.url + url).headers["x-mirror-cache"] == "miss"
        again = httpx.get(mirror.url + url)
        assert again.status_code == 200 and again.headers["x-mirror-cache"] == "miss"
        assert httpx.head(mirror.url + url).headers["x-mirror-cache"] == "hit"

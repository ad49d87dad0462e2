"""Parallel ranged fills (issue 18): a large file fetched upstream as concurrent Range windows, each resumed on its
own; hashed in order, streamed to followers as the prefix grows, never committed unverified. Real mirror processes
against the emulator."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, blob, download, metric, run_client, wait_for

BIG = "acme/big-data"
BIG_URL = f"/datasets/{BIG}/resolve/main/big.bin"
MIB = 1024 * 1024
SIZE = 20 * MIB
WINDOW = 4 * MIB
WINDOWS = SIZE // WINDOW
PARALLEL = ("--parallel-fill-threshold", "8MiB", "--fill-window", "4MiB", "--fill-connections", "3")
EMULATOR_FILES = {"big_file_size": SIZE}  # for ``emu`` (tests/e2e/conftest.py)


def big_sha(emu: EmulatorHandle) -> str:
    return emu.files.etag("dataset", BIG, "main", "big.bin")


def cdn_gets(emu: EmulatorHandle) -> list[dict[str, str | None]]:
    return [r for r in emu.requests() if r["host"] == "cdn" and r["method"] == "GET"]


def ranges(requests: list[dict[str, str | None]]) -> list[tuple[int, int]]:
    out = []
    for request in requests:
        spec = (request.get("range") or "").removeprefix("bytes=")
        first, _, last = spec.partition("-")
        out.append((int(first), int(last) + 1))
    return sorted(out)


def test_windows_fill_the_file_once(emu: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, *PARALLEL) as mirror:
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and sha == big_sha(emu)
        wait_for(lambda: blob(cache, big_sha(emu)).exists())
    gets = cdn_gets(emu)
    assert ranges(gets) == [(i * WINDOW, (i + 1) * WINDOW) for i in range(WINDOWS)]  # one request per window
    assert emu.stats()["bytes_served"] == SIZE  # each upstream byte once
    assert not list((cache / "partials").glob("*.prefix"))


def test_a_far_range_has_its_window_fetched_next(emu: EmulatorHandle, tmp_path: Path) -> None:
    """A Range far ahead of a windowed fill (a Xet client's parallel ranges do this) is neither relayed from upstream
    (each byte is fetched once) nor kept waiting for the whole prefix: its window is the next one a worker takes,
    and its bytes are sent as that window lands."""
    emu.set_faults(throttle_bps=8e6)  # per response: one 4 MiB window takes ~0.5 s
    start = SIZE - WINDOW + 1000  # in the last window, short of the file's last byte (that one waits for the hash)
    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, *PARALLEL) as mirror:
        tail = httpx.get(mirror.url + BIG_URL, headers={"range": f"bytes={start}-{start + 999}"}, timeout=30)
        assert tail.status_code == 206
        assert tail.content == emu.files.file_bytes("dataset", BIG, "main", "big.bin")[start:start + 1000]
        wait_for(lambda: blob(cache, big_sha(emu)).exists(), timeout=30)
    gets = cdn_gets(emu)
    assert ranges(gets) == [(i * WINDOW, (i + 1) * WINDOW) for i in range(WINDOWS)]  # no relay: one GET per window
    assert emu.stats()["bytes_served"] == SIZE
    first_taken = {int((r["range"] or "").removeprefix("bytes=").partition("-")[0]) // WINDOW for r in gets[:3]}
    assert WINDOWS - 1 in first_taken, [r["range"] for r in gets]  # the last window among the first three


def test_a_small_file_is_one_stream(emu: EmulatorHandle, tmp_path: Path) -> None:
    with MirrorProcess(emu.url, tmp_path / "cache", "--parallel-fill-threshold", "64MiB") as mirror:
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
    assert status == 200 and sha == big_sha(emu)
    assert [r["range"] for r in cdn_gets(emu)] == [None]


def test_a_drop_resumes_only_its_window(emu: EmulatorHandle, tmp_path: Path) -> None:
    emu.set_faults(drop_after_bytes=MIB + 12345, drop_count=1)
    with MirrorProcess(emu.url, tmp_path / "cache", *PARALLEL) as mirror:
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
    assert status == 200 and sha == big_sha(emu)
    got = ranges(cdn_gets(emu))
    assert len(got) == WINDOWS + 1
    resumed = [(start, end) for start, end in got if start % WINDOW]
    assert len(resumed) == 1 and resumed[0][0] % WINDOW == MIB + 12345 and resumed[0][1] % WINDOW == 0
    assert emu.stats()["bytes_served"] <= SIZE * 1.01


def test_an_expired_url_mid_fill_is_resolved_again(emu: EmulatorHandle, tmp_path: Path) -> None:
    emu.set_faults(drop_after_bytes=MIB, drop_count=1, expire_on_drop=True)
    with MirrorProcess(emu.url, tmp_path / "cache", *PARALLEL) as mirror:
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
    assert status == 200 and sha == big_sha(emu)
    requests = emu.requests()
    resolves = [r for r in requests if r["host"] == "hub" and r["method"] == "GET" and "/resolve/" in str(r["path"])]
    assert resolves, "the expired signed URL was never resolved again"
    served = [r for r in cdn_gets(emu)]
    assert len(served) >= WINDOWS + 1


def test_followers_stream_while_windows_arrive(emu: EmulatorHandle, tmp_path: Path) -> None:
    emu.set_faults(throttle_bps=4 * MIB)  # per connection: 3 windows at a time, ~1.7 s in all
    with MirrorProcess(emu.url, tmp_path / "cache", *PARALLEL) as mirror:

        async def both() -> list[tuple[int, str, float, float]]:
            return await asyncio.gather(download(mirror.url + BIG_URL), download(mirror.url + BIG_URL))

        results = asyncio.run(both())
    for status, sha, first, total in results:
        assert status == 200 and sha == big_sha(emu)
        assert first < total / 3  # bytes flowed long before the end
    assert len(cdn_gets(emu)) == WINDOWS  # one fill for both


def test_a_corrupt_window_fails_verification_and_nothing_is_committed(emu: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    emu.set_faults(corrupt_next=1)
    with MirrorProcess(emu.url, cache, *PARALLEL) as mirror:
        with pytest.raises(httpx.HTTPError):
            asyncio.run(download(mirror.url + BIG_URL))
        # The failed fill removes its partial file once its last window is stopped: waited for, not slept on.
        wait_for(lambda: not list((cache / "partials").glob("*.part"))
                 and not list((cache / "partials").glob("*.prefix")))
        assert not blob(cache, big_sha(emu)).exists()
        # The next request fills it again, correctly.
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and sha == big_sha(emu)


def test_a_restart_resumes_from_the_contiguous_prefix(emu: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    emu.set_faults(throttle_bps=2 * MIB)
    mirror = MirrorProcess(emu.url, cache, *PARALLEL).start()
    try:
        partial = cache / "partials" / f"{big_sha(emu)}.part"
        with httpx.Client(timeout=30) as client, client.stream("GET", mirror.url + BIG_URL) as response:
            for _ in response.iter_raw():
                if partial.exists() and partial.stat().st_size > 2 * WINDOW:
                    break
        mirror.kill9()
        assert partial.with_name(partial.name + ".prefix").exists()
        emu.clear_faults()
        mirror.start()
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and sha == big_sha(emu)
        wait_for(lambda: blob(cache, big_sha(emu)).exists())
        assert not partial.with_name(partial.name + ".prefix").exists()
    finally:
        mirror.stop()


def test_a_snapshot_heads_from_the_tree_listing(emu: EmulatorHandle, tmp_path: Path) -> None:
    """snapshot_download lists the tree of the commit, then HEADs every file: the listing answers the HEADs."""
    files = {f"shard/{i:03d}.{'bin' if i % 6 == 0 else 'txt'}": f"file {i}\n".encode() for i in range(30)}
    sha = emu.push("model", "acme/tiny-model", "main", files)  # the .bin files are LFS
    emu.reset_stats()
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        out = run_client(
            "import json, pathlib; from huggingface_hub import snapshot_download\n"
            "p = snapshot_download('acme/tiny-model')\n"
            "print(json.dumps(sorted(str(f.relative_to(p)) for f in pathlib.Path(p).rglob('*') if f.is_file())))",
            mirror.url, tmp_path / "client")
    assert set(files) <= set(out)  # type: ignore[arg-type]
    heads = [r["path"] for r in emu.requests() if r["method"] == "HEAD" and "/resolve/" in str(r["path"])
             and not str(r["path"]).startswith("/api/")]
    assert len(heads) <= 1, heads  # one access probe (shared by the client's concurrent HEADs); the listing: the rest
    assert sha


def test_upstream_rate_bounds_every_fill(emu: EmulatorHandle, tmp_path: Path) -> None:
    with MirrorProcess(emu.url, tmp_path / "cache", *PARALLEL, "--upstream-rate", "16MiB") as mirror:
        status, sha, _, total = asyncio.run(download(mirror.url + BIG_URL))
    assert status == 200 and sha == big_sha(emu)
    assert total >= SIZE / (16 * MIB) * 0.8  # ~1.25 s at 16 MiB/s, whatever the windows


def test_a_window_crawling_at_one_percent_is_hedged(emu: EmulatorHandle, tmp_path: Path) -> None:
    """Issue 28 item 2: the first window's first connection crawls at 1 % of the others' rate (a stalled tail: the
    file's hash waits for it, so every reader would). The mirror asks the rest of that window again on a fresh
    connection, the crawling one is cut, and the download ends byte-correct, each reader read going on: a client
    whose every read waits at most 30 s (httpx's read timeout) gets the whole file."""
    emu.set_faults(throttle_bps=4 * MIB, slow_start=0, slow_bps=40 * 1024)  # 4 MiB at 1 %: 100 s unhedged
    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, *PARALLEL, "--fill-hedge-after", "0.5") as mirror:
        digest = hashlib.sha256()
        with httpx.stream("GET", mirror.url + BIG_URL, timeout=httpx.Timeout(30.0)) as response:
            for chunk in response.iter_raw():
                digest.update(chunk)
        assert response.status_code == 200 and digest.hexdigest() == big_sha(emu)
        wait_for(lambda: blob(cache, big_sha(emu)).exists())
        assert metric(mirror, "hf_mirror_fill_hedges_total") == 1
        hedge_bytes = metric(mirror, "hf_mirror_fill_hedge_bytes_total")
    assert emu.stats()["counts"]["slow_bodies"] == 1
    first_window = [r for r in ranges(cdn_gets(emu)) if r[1] == WINDOW]
    assert len(first_window) == 2 and first_window[0][0] == 0  # the crawling request, and its hedge from where it
    assert hedge_bytes == WINDOW - first_window[1][0]  # stood (the hedge's bytes are counted)
    assert emu.stats()["bytes_served"] <= SIZE + hedge_bytes  # nothing else fetched twice


def test_ranged_reads_fetch_their_windows_and_keep_them(emu: EmulatorHandle, tmp_path: Path) -> None:
    """Issue 28 item 1: a Range on a large file that is not stored fetches only the window it covers (read-ahead
    1 MiB: still that window), counted at the emulator; the window is kept in the sparse partial file, so the same
    read is a hit, in this process and in another one on the same cache; a full download then fetches only the
    rest, and the blob is verified whole and committed."""
    cache = tmp_path / "cache"
    sparse = (*PARALLEL, "--sparse-fill-threshold", "16MiB", "--sparse-read-ahead", "1MiB")
    data = emu.files.file_bytes("dataset", BIG, "main", "big.bin")
    start, end = 9 * MIB, 10 * MIB - 1
    read = {"range": f"bytes={start}-{end}"}
    with MirrorProcess(emu.url, cache, *sparse) as mirror:
        first = httpx.get(mirror.url + BIG_URL, headers=read, timeout=30)
        assert first.status_code == 206 and first.content == data[start:end + 1]
        assert first.headers["x-mirror-cache"] == "miss"
        assert ranges(cdn_gets(emu)) == [(2 * WINDOW, 3 * WINDOW)]  # its window only
        again = httpx.get(mirror.url + BIG_URL, headers=read, timeout=30)
        assert again.content == data[start:end + 1] and again.headers["x-mirror-cache"] == "hit"
        assert len(cdn_gets(emu)) == 1
    assert not blob(cache, big_sha(emu)).exists()
    with MirrorProcess(emu.url, cache, *sparse) as mirror:  # another process, the same disk
        other = httpx.get(mirror.url + BIG_URL, headers=read, timeout=30)
        assert other.content == data[start:end + 1] and other.headers["x-mirror-cache"] == "hit"
        assert len(cdn_gets(emu)) == 1
        status, sha, _, _ = asyncio.run(download(mirror.url + BIG_URL))
        assert status == 200 and sha == big_sha(emu)
        wait_for(lambda: blob(cache, big_sha(emu)).exists())
    rest = [(i * WINDOW, (i + 1) * WINDOW) for i in (0, 1, 3, 4)]
    assert ranges(cdn_gets(emu)) == sorted([(2 * WINDOW, 3 * WINDOW), *rest])  # each byte from upstream once
    assert emu.stats()["bytes_served"] == SIZE

"""Ranged reads fetch their windows (issue 28 item 1): a Range on a large file that is not stored fetches the windows
it covers plus a bounded read-ahead, kept in a sparse partial file with a map of the windows it holds; a later read of
them is a hit (another process too); a full download fetches only the rest; a kill -9 loses no window its map
listed; held windows of a file never completed go by the quota's LRU; the status and the metrics show sparse files
apart; the share completion policy; a whole-file Xet download is a whole fill.

The large file is the emulator's generated ``acme/huge-data`` ``huge.bin`` (bytes computed from their offset, every
4 KiB page stamped with it: a byte out of place is a wrong byte), read through the mirror's Xet CAS (virtual xorbs)
and its resolve route. Upstream bytes are counted at the emulator."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.fixtures import generated_bytes
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, blob, download, metric, wait_for
from tests.support.xet_ranges import CasReader

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
SIZE = 300 * MIB  # the generated file (its sha256 is computed once per machine, then kept under the temp dir)
BIG_SIZE = 24 * MIB  # acme/big-data big.bin: below the sparse threshold, filled whole
HUGE = "acme/huge-data"
HUGE_URL = f"/datasets/{HUGE}/resolve/main/huge.bin"
BIG_URL = "/datasets/acme/big-data/resolve/main/big.bin"
WINDOW = 4 * MIB
READ_AHEAD = 4 * MIB
RANGE = 8 * MIB
SPARSE = ("--parallel-fill-threshold", "64MiB", "--fill-window", "4MiB", "--sparse-fill-threshold", "64MiB",
          "--sparse-read-ahead", "4MiB")
EMULATOR_FILES = {"big_file_size": BIG_SIZE, "huge_file_size": SIZE}  # for ``emu`` (tests/e2e/conftest.py)


def huge_sha(emu: EmulatorHandle) -> str:
    return emu.files.etag("dataset", HUGE, "main", "huge.bin")



def windows_of(start: int, end: int) -> list[tuple[int, int]]:
    """The windows a Range of bytes ``start..end`` (inclusive) fetches: those it covers and the read-ahead's."""
    last = min(end + READ_AHEAD, SIZE - 1)
    return [(w, min(w + WINDOW, SIZE)) for w in range(start - start % WINDOW, last + 1, WINDOW)]


class Cas(CasReader):
    """Ranged reads of huge.bin through a mirror's Xet CAS."""

    def __init__(self, emu: EmulatorHandle, mirror: MirrorProcess) -> None:
        xet_hash = emu.files._file("dataset", HUGE, "main", "huge.bin").xet_hash  # noqa: SLF001
        super().__init__(mirror.url, "dataset", HUGE, emu.files.commit("dataset", HUGE, "main"), xet_hash)


def check(data: bytes, start: int, end: int) -> None:
    """``data`` is the file's bytes ``start..end``."""
    assert len(data) == end + 1 - start
    assert data == generated_bytes(start, end + 1), "a byte served wrong"


def on_disk(path: Path) -> int:
    return path.stat().st_blocks * 512


# The start, the middle (unaligned, across two virtual xorbs: two terms), the end.
THREE = ((0, RANGE - 1), (141 * MIB + 4321, 141 * MIB + 4320 + RANGE), (SIZE - RANGE, SIZE - 1))


def test_ranged_xet_reads_fetch_only_their_windows(emu: EmulatorHandle, tmp_path: Path) -> None:
    """Three 8 MiB ranges (start, middle, end) of a cold 300 MiB file through the CAS fetch the windows they cover and
    the read-ahead, nothing else (at most 3 x (range + window + read-ahead) upstream), and the disk holds no more;
    read again they are hits, from another process too; the status and the metrics show the sparse file apart; a full
    download then fetches only the rest, and the blob is verified whole."""
    cache = tmp_path / "cache"
    partial = cache / "partials" / f"{huge_sha(emu)}.part"
    expected = sorted({w for start, end in THREE for w in windows_of(start, end)})
    with MirrorProcess(emu.url, cache, *SPARSE) as mirror:
        cas = Cas(emu, mirror)
        for start, end in THREE:
            data, outcomes = cas.read(start, end)
            check(data, start, end)
            assert set(outcomes) == {"miss"}
        fetched = emu.stats()["bytes_served"]
        assert emu.cdn_spans() == expected  # the windows of the three ranges and their read-ahead: each once
        assert fetched == sum(b - a for a, b in expected) <= 3 * (RANGE + WINDOW + READ_AHEAD)
        assert fetched <= on_disk(partial) <= fetched + WINDOW  # sparse: the holes take no disk
        for start, end in THREE:  # again: hits, nothing more from upstream
            data, outcomes = cas.read(start, end)
            check(data, start, end)
            assert set(outcomes) == {"hit"}
        assert emu.stats()["bytes_served"] == fetched
        wait_for(lambda: metric(mirror, "hf_mirror_fills_total", result="paused") >= 1)  # no reader left: paused
        wait_for(lambda: (metric(mirror, "hf_mirror_sparse_files"), metric(mirror, "hf_mirror_sparse_bytes"))
                 == (1, fetched))
        status = httpx.get(f"{mirror.url}/api/mirror/status", timeout=30).json()
        assert (status["sparse_files"], status["sparse_bytes"], status["cache_blobs"]) == (1, fetched, 0)
        page = httpx.get(mirror.url + "/", timeout=30).text
        assert '<span id="sparse-count">1</span> sparse files' in page
    assert not blob(cache, huge_sha(emu)).exists()
    du = subprocess.run([sys.executable, "-m", "mirror", "cache", "du", "--json", "--cache-dir", str(cache)],
                        capture_output=True, text=True, timeout=120, check=True)
    usage = json.loads(du.stdout)  # the partial file as the disk holds it (its holes take nothing), sparse apart
    assert (usage["sparse_files"], usage["sparse_bytes"]) == (1, fetched)
    assert fetched <= usage["partial_bytes"] <= fetched + WINDOW
    with MirrorProcess(emu.url, cache, *SPARSE) as mirror:  # another process on the same disk
        cas = Cas(emu, mirror)
        for start, end in THREE:
            data, outcomes = cas.read(start, end)
            check(data, start, end)
            assert set(outcomes) == {"hit"}
        assert emu.stats()["bytes_served"] == fetched
        status, sha, _, _ = asyncio.run(download(mirror.url + HUGE_URL))  # a full download: the rest only
        assert status == 200 and sha == huge_sha(emu)
        wait_for(lambda: blob(cache, huge_sha(emu)).exists())
        wait_for(lambda: metric(mirror, "hf_mirror_sparse_files") == 0 and metric(mirror, "hf_mirror_cache_blobs") == 1)
    assert emu.stats()["bytes_served"] == SIZE  # each byte from upstream once
    spans = emu.cdn_spans()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # no byte asked twice
    assert not partial.exists() and not Path(f"{partial}.windows").exists()


def test_a_kill_9_during_a_sparse_fill_loses_no_held_window(emu: EmulatorHandle, tmp_path: Path) -> None:
    """kill -9 while a ranged read's windows arrive (two connections, throttled): a new process on the same disk reuses
    every window the map held (none of those bytes is asked upstream again), serves every byte right, and a full
    download then completes the blob, verified."""
    cache = tmp_path / "cache"
    partial = cache / "partials" / f"{huge_sha(emu)}.part"
    start, end = 100 * MIB, 124 * MIB - 1  # six windows and one of read-ahead, two at a time: about 4 s
    emu.set_faults(throttle_bps=4 * MIB)
    mirror = MirrorProcess(emu.url, cache, *SPARSE, "--fill-connections", "2").start()
    failure: list[BaseException] = []

    def read() -> None:  # the reader keeps the fill going until the kill cuts it
        try:
            with httpx.stream("GET", mirror.url + HUGE_URL, headers={"range": f"bytes={start}-{end}"},
                              timeout=60) as answer:
                for _ in answer.iter_raw():
                    pass
        except httpx.HTTPError as exc:
            failure.append(exc)

    def held() -> list[tuple[int, int]]:
        try:
            return [(a, b) for a, b in json.loads(Path(f"{partial}.windows").read_text())["held"] if b > a]
        except (FileNotFoundError, ValueError):
            return []

    reader = threading.Thread(target=read)
    try:
        reader.start()
        wait_for(lambda: sum(b - a == WINDOW for a, b in held()) >= 2, timeout=60)  # two windows held, more coming
    finally:
        mirror.kill9()
        reader.join(timeout=60)
    kept = held()
    assert failure and 2 * WINDOW <= sum(b - a for a, b in kept) < 7 * WINDOW, kept
    emu.clear_faults()
    emu.reset_stats()
    with MirrorProcess(emu.url, cache, *SPARSE) as mirror:
        answer = httpx.get(mirror.url + HUGE_URL, headers={"range": f"bytes={start}-{end}"}, timeout=60)
        assert answer.status_code == 206 and answer.content == generated_bytes(start, end + 1)
        again = emu.cdn_spans()
        assert not [(a, b) for a, b in again for h0, h1 in kept if a < h1 and h0 < b], (again, kept)  # no refetch
        assert sum(b - a for a, b in [*again, *kept]) == sum(b - a for a, b in windows_of(start, end))
        status, sha, _, _ = asyncio.run(download(mirror.url + HUGE_URL))
        assert status == 200 and sha == huge_sha(emu)
        wait_for(lambda: blob(cache, huge_sha(emu)).exists())
    assert emu.stats()["bytes_served"] == SIZE - sum(b - a for a, b in kept)  # the held bytes never again
    assert hashlib.sha256(blob(cache, huge_sha(emu)).read_bytes()).hexdigest() == huge_sha(emu)


def test_held_windows_expire_by_the_quota_lru(emu: EmulatorHandle, tmp_path: Path) -> None:
    """The windows of a file never completed count in the quota and go first when they are the least recently used:
    a whole download that needs the room evicts them (and the next ranged read fetches its window again)."""
    cache = tmp_path / "cache"
    partial = cache / "partials" / f"{huge_sha(emu)}.part"
    with MirrorProcess(emu.url, cache, *SPARSE, "--max-size", "30MiB") as mirror:
        read = {"range": f"bytes={SIZE // 2}-{SIZE // 2 + MIB - 1}"}
        answer = httpx.get(mirror.url + HUGE_URL, headers=read, timeout=60)
        assert answer.status_code == 206 and answer.content == generated_bytes(SIZE // 2, SIZE // 2 + MIB)
        wait_for(lambda: metric(mirror, "hf_mirror_fills_total", result="paused") >= 1)
        wait_for(lambda: metric(mirror, "hf_mirror_sparse_bytes") == 2 * WINDOW)
        assert partial.exists()
        status, _, _, _ = asyncio.run(download(mirror.url + BIG_URL))  # 24 MiB: with the 8 held, over 30 MiB
        assert status == 200
        wait_for(lambda: not partial.exists())
        assert not Path(f"{partial}.windows").exists()
        wait_for(lambda: metric(mirror, "hf_mirror_sparse_files") == 0)
        emu.reset_stats()
        assert httpx.get(mirror.url + HUGE_URL, headers=read, timeout=60).headers["x-mirror-cache"] == "miss"
        assert emu.stats()["bytes_served"] == 2 * WINDOW


def test_a_sparse_file_completes_once_its_share_is_held(emu: EmulatorHandle, tmp_path: Path) -> None:
    """The documented completion policy: once --sparse-complete-share of the file is held, the rest is fetched in
    the background (no reader asks for it), each byte once, and the blob committed verified."""
    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, *SPARSE, "--sparse-complete-share", "0.25") as mirror:
        low = {"range": f"bytes={8 * MIB}-{40 * MIB - 1}"}  # 36 MiB held with the read-ahead: 12 %
        assert httpx.get(mirror.url + HUGE_URL, headers=low, timeout=60).status_code == 206
        wait_for(lambda: metric(mirror, "hf_mirror_fills_total", result="paused") >= 1)
        assert not blob(cache, huge_sha(emu)).exists()
        high = {"range": f"bytes={200 * MIB}-{240 * MIB - 1}"}  # 44 MiB more: 26 %, the rest follows
        answer = httpx.get(mirror.url + HUGE_URL, headers=high, timeout=60)
        assert answer.status_code == 206 and answer.content == generated_bytes(200 * MIB, 240 * MIB)
        wait_for(lambda: blob(cache, huge_sha(emu)).exists(), timeout=120)
        wait_for(lambda: metric(mirror, "hf_mirror_fills_total", result="ok") == 1)
    assert emu.stats()["bytes_served"] == SIZE


WHOLE_CLIENT = """
import json, hashlib
from huggingface_hub import hf_hub_download
path = hf_hub_download("{repo}", "huge.bin", repo_type="dataset")
digest = hashlib.sha256()
with open(path, "rb") as f:
    while block := f.read(16 << 20):
        digest.update(block)
print(json.dumps(dict(sha=digest.hexdigest())))
"""


def test_a_whole_file_over_xet_is_filled_whole(emu: EmulatorHandle, tmp_path: Path) -> None:
    """A reconstruction of the whole file is a whole download: its xorb ranges fill the whole file, never sparse
    (the last byte waits for the verified blob). One xorb range of it read, the rest comes in the background; the
    real client (hf_xet) then gets the file right, each byte from upstream once."""
    pytest.importorskip("hf_xet")
    from tests.support.mirror_proc import run_client

    cache = tmp_path / "cache"
    with MirrorProcess(emu.url, cache, *SPARSE) as mirror:
        cas = Cas(emu, mirror)
        data, outcomes = cas.read(0, MIB - 1)  # a Range: sparse, its window and read-ahead only
        check(data, 0, MIB - 1)
        assert emu.stats()["bytes_served"] == 2 * WINDOW
        out = run_client(WHOLE_CLIENT.format(repo=HUGE), mirror.url, tmp_path / "home", timeout=300,
                         HF_HUB_DISABLE_XET="0")
        assert out["sha"] == huge_sha(emu)
        wait_for(lambda: blob(cache, huge_sha(emu)).exists())
        assert metric(mirror, "hf_mirror_requests_total", route="xet-xorb") > 1
    assert emu.stats()["bytes_served"] == SIZE

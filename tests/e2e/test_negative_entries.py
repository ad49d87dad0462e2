"""Remembered 404s (issue 23, item 7): every distinct missing path an anonymous caller asks for is remembered in the
index, so their number and bytes are bounded (``--negative-max-entries``/``--negative-max-bytes``), the oldest
dropped first, and the status JSON reports them (their bytes count in the quota)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.hub_emulator.runner import run_emulator
from tests.support.mirror_proc import MirrorProcess

BOUND = 500
PATHS = 2100


def test_random_missing_paths_keep_the_negative_entries_within_their_bound(tmp_path):
    with run_emulator(tmp_path / "emu") as emu, \
            MirrorProcess(emu.url, tmp_path / "cache", "--negative-max-entries", str(BOUND),
                          "--negative-max-bytes", "4M") as mirror, \
            httpx.Client(base_url=mirror.url, timeout=30) as http:
        assert http.get("/acme/tiny-model/resolve/main/config.json").status_code == 200

        def missing(n: int) -> None:
            answer = http.get(f"/acme/tiny-model/resolve/main/missing/{n:05d}-{'x' * 60}.bin")
            assert answer.status_code == 404 and answer.headers["x-error-code"] == "EntryNotFound"

        for n in range(50):  # the earliest, in order
            missing(n)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(missing, range(50, PATHS - 50)))
        for n in range(PATHS - 50, PATHS):  # the latest, in order
            missing(n)
        status = http.get("/api/mirror/status").json()
        assert 0 < status["negative_entries"] <= BOUND, status
        assert 0 < status["negative_bytes"] <= 4 * 1024**2, status

        emu.reset_stats()
        missing(PATHS - 1)  # remembered: answered from the index
        assert not [r for r in emu.requests() if "missing/" in str(r["path"])]
        missing(0)  # the earliest went first: asked upstream again
        assert [r for r in emu.requests() if f"missing/{0:05d}" in str(r["path"])]
        assert http.get("/acme/tiny-model/resolve/main/config.json").status_code == 200  # content untouched

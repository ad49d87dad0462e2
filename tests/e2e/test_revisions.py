"""Branch → commit mappings: trusted for --revision-ttl, then asked again; --offline serves only the cache."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.hub_emulator.runner import run_emulator
from tests.support.mirror_proc import MirrorProcess

URL = "/gpt2/resolve/main/config.json"


def test_branch_moves_are_seen_after_the_revision_ttl(tmp_path: Path) -> None:
    with run_emulator(tmp_path / "emu") as emu, MirrorProcess(emu.url, tmp_path / "cache",
                                                              "--revision-ttl", "2") as mirror:
        first = httpx.get(mirror.url + URL)
        old_commit = emu.files.commit("model", "gpt2", "main")
        assert first.headers["x-repo-commit"] == old_commit
        new_commit = emu.push("model", "gpt2", "main", {"config.json": b'{"model_type": "gpt2", "n_layer": 2}'})
        within = httpx.get(mirror.url + URL)
        assert within.headers["x-repo-commit"] == old_commit and within.content == first.content
        time.sleep(2.2)
        after = httpx.get(mirror.url + URL)
        assert after.headers["x-repo-commit"] == new_commit
        assert after.content == b'{"model_type": "gpt2", "n_layer": 2}'
        # The old commit stays addressable by its sha, byte for byte.
        pinned = httpx.get(f"{mirror.url}/gpt2/resolve/{old_commit}/config.json")
        assert pinned.content == first.content
        info = httpx.get(f"{mirror.url}/api/models/gpt2").json()
        assert info["sha"] == new_commit


def test_offline_mode_serves_the_cache_and_refuses_the_rest_fast(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with run_emulator(tmp_path / "emu") as emu:
        with MirrorProcess(emu.url, cache) as mirror:
            assert httpx.get(mirror.url + URL).status_code == 200
            assert httpx.get(mirror.url + "/api/models/gpt2").status_code == 200
        emu.reset_stats()
        with MirrorProcess(emu.url, cache, "--offline") as mirror:
            hit = httpx.get(mirror.url + URL)
            assert hit.status_code == 200 and hit.content == emu.files.file_bytes("model", "gpt2", "main",
                                                                                  "config.json")
            assert httpx.get(mirror.url + "/api/models/gpt2").json()["id"] == "gpt2"
            miss = httpx.get(mirror.url + "/gpt2/resolve/main/README.md")  # answered at once: nothing is asked
            assert miss.status_code >= 400 and miss.headers["x-error-code"] and miss.json()["error"]
        assert emu.stats()["counts"].get("requests", 0) <= 1  # only the stats call itself: nothing from the mirror

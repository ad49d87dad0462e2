"""Scale of the index (issue 19, item 1): an index of ``--repos`` repos and ``--entries`` file entries, filled
directly (``mirror.index.MetadataIndex``, sparse blob files: the disk stays small), against the same at 1,000
entries. Measures, on a real ``hf-mirror serve --offline`` over that cache: ``GET /``, ``/metrics``,
``/api/mirror/status`` (the first request after a first start and after a restart, how long the first count of
the cache takes, and then medians), a ``HEAD`` hit,
an operator's eviction of one repo (``POST /api/mirror/repos/.../evict``); then ``hf-mirror cache du`` and
``hf-mirror cache gc`` evicting 10 GiB of (sparse) blobs.

    .venv/bin/python -m bench.index_scale                        # 10,000 repos / 1,000,000 entries vs 1,000
    .venv/bin/python -m bench.index_scale --entries 100000 --repos 1000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from mirror.hf import RepoRef, RepoType
from mirror.index import FileEntry, MetadataIndex
from mirror.layout import CacheLayout
from tests.support.mirror_proc import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent

TOTAL_BLOB_BYTES = 20 * 2**30  # sparse: what the quota sees, not what the disk holds
EVICT_BYTES = 10 * 2**30


def repo_name(number: int) -> str:
    return f"org{number % 100:02d}/repo-{number:05d}"


def fill(cache: Path, repos: int, entries: int) -> dict[str, float]:
    """``entries`` file entries over ``repos`` repos, one blob each (a sparse file of the entry's size)."""
    started = time.monotonic()
    index = MetadataIndex(CacheLayout(cache).index_dir)
    blobs = cache / "blobs"
    size = TOTAL_BLOB_BYTES // entries
    per_repo = entries // repos
    now = time.time()
    for shard in range(256):
        (blobs / f"{shard:02x}").mkdir(parents=True, exist_ok=True)
    for first in range(0, repos, 200):
        with index._cache.transact():  # one SQLite transaction per 200 repos: minutes, not hours
            for number in range(first, min(repos, first + 200)):
                repo = RepoRef(RepoType.MODEL, repo_name(number))
                commit = hashlib.sha1(repo.repo_id.encode()).hexdigest()
                index.put_ref(repo, "main", commit)
                index.put_public(repo, True)
                for kind in ("meta", "content"):
                    index.put_access("public", kind, repo, (True, now), expire=30 * 86400)
                for f in range(per_repo):
                    etag = hashlib.sha256(f"{number}/{f}".encode()).hexdigest()
                    index.put_file(repo, FileEntry(commit, f"file-{f:04d}.bin", etag, size, lfs=True))
                    fd = os.open(blobs / etag[:2] / etag, os.O_CREAT | os.O_WRONLY, 0o644)
                    os.ftruncate(fd, size)
                    os.close(fd)
    index.close()
    return {"fill_s": time.monotonic() - started, "blob_size": size}


def timed(fn: object, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - began)
    return {"median_ms": statistics.median(samples) * 1000, "max_ms": max(samples) * 1000}


ADMIN_TOKEN = "adm_bench_index_scale"  # an eviction over HTTP is the operator's (--admin-token)


def start_mirror(cache: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mirror", "serve", "--cache-dir", str(cache), "--port", str(port), "--offline",
           "--upstream", "http://127.0.0.1:9", "--gc-interval", "86400", "--scrub-rate", "0",
           "--admin-token", ADMIN_TOKEN]
    with open(cache.parent / f"serve-{port}.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            stop(proc)
            raise RuntimeError("the mirror did not start")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def once(fn: object) -> dict[str, float]:
    return {"median_ms": timed(fn, 1)["median_ms"], "max_ms": 0.0}


def serve_and_measure(cache: Path, runs: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    proc, url = start_mirror(cache)
    try:
        client = httpx.Client(base_url=url, timeout=600)
        commit = hashlib.sha1(repo_name(0).encode()).hexdigest()
        head = f"/{repo_name(0)}/resolve/{commit}/file-0000.bin"
        assert client.head(head).status_code == 200, client.head(head).headers
        began = time.perf_counter()
        out["first status after a first start"] = once(lambda: client.get("/api/mirror/status").raise_for_status())
        while client.get("/api/mirror/status").json()["repos_total"] == 0:  # still counting
            time.sleep(0.1)
        out["the first count, done after"] = {"median_ms": (time.perf_counter() - began) * 1000, "max_ms": 0.0}
        for name, path in (("GET /", "/"), ("GET /metrics", "/metrics"),
                           ("GET /api/mirror/status", "/api/mirror/status"),
                           ("GET /api/mirror/status?q=repo-00042", "/api/mirror/status?q=repo-00042"),
                           ("GET /?page=100", "/?page=100")):
            out[name] = timed(lambda p=path: client.get(p).raise_for_status(), runs)
        out["HEAD hit"] = timed(lambda: client.head(head).raise_for_status(), runs * 5)
        victim = f"/api/mirror/repos/model/{repo_name(1)}/evict"
        operator = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        out["POST evict one repo"] = timed(lambda: client.post(victim, json={}, headers=operator).raise_for_status(),
                                           1)
        client.close()
    finally:
        stop(proc)
    proc, url = start_mirror(cache)  # a restart answers from the count the last run kept
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            began = time.perf_counter()
            status = client.get("/api/mirror/status").json()
            out["first status after a restart"] = {"median_ms": (time.perf_counter() - began) * 1000, "max_ms": 0.0}
            assert status["repos_total"] > 0, status
    finally:
        stop(proc)
    return out


def cli(cache: Path, *args: str) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mirror", "cache", *args, "--cache-dir", str(cache)], cwd=REPO_ROOT,
                   check=True, capture_output=True, timeout=3600)
    return (time.perf_counter() - began) * 1000


def scenario(root: Path, repos: int, entries: int, runs: int) -> dict[str, object]:
    cache = root / f"cache-{entries}"
    filled = fill(cache, repos, entries)
    print(f"  filled {entries:,} entries / {repos:,} repos in {filled['fill_s']:.0f} s", file=sys.stderr)
    results: dict[str, dict[str, float]] = serve_and_measure(cache, runs)
    results["hf-mirror cache du"] = {"median_ms": cli(cache, "du", "--json"), "max_ms": 0.0}
    quota = f"{(TOTAL_BLOB_BYTES - EVICT_BYTES) // 2**20}M"
    results["hf-mirror cache gc (evict 10 GiB)"] = {"median_ms": cli(cache, "gc", "--max-size", quota), "max_ms": 0.0}
    shutil.rmtree(cache, ignore_errors=True)
    return {"repos": repos, "entries": entries, **filled, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repos", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=1_000, help="entries of the baseline (repos: entries/100)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-index-scale-"))
    try:
        small = scenario(root, max(1, args.small // 100), args.small, args.runs)
        large = scenario(root, args.repos, args.entries, args.runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"small": small, "large": large}, indent=1))
        return
    print(f"| measure | {small['entries']:,} entries / {small['repos']:,} repos | "
          f"{large['entries']:,} entries / {large['repos']:,} repos | ratio |")
    print("|---|---|---|---|")
    for name, value in large["results"].items():  # type: ignore[union-attr]
        base = small["results"][name]["median_ms"]  # type: ignore[index]
        print(f"| {name} | {base:.1f} ms | {value['median_ms']:.1f} ms (max {value['max_ms']:.0f}) | "
              f"{value['median_ms'] / base if base else float('nan'):.1f}x |")
    print(f"| fill (not a measure of the mirror) | {small['fill_s']:.1f} s | {large['fill_s']:.0f} s | |")


if __name__ == "__main__":
    main()

"""``hf-mirror sync`` against the Hub emulator: patterns and revisions, dry run, idempotence, interruption and
resume, a running server on the same cache, ``--mirror`` mode, per-repo failures, and the synced repos used by the
real clients through the mirror once the upstream is stopped."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.mirror_proc import REPO_ROOT, MirrorProcess, blob, metric, run_client

MODEL = "acme/tiny-model"
PARQUET = "acme/tiny-parquet"
BIG = "acme/big-data"
BIG_SIZE = 48 * 1024 * 1024


# --- helpers (also used by test_cache_cli) -------------------------------------------------------------------------


def run_emulator(tmp: Path, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
    from tests.support.hub_emulator.runner import run_emulator as run

    return run(tmp, **kwargs)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m mirror ...`` in a subprocess (stdout is not a TTY: plain log lines)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_MIRROR_", "HF_TOKEN"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "mirror", *args], cwd=REPO_ROOT, env=full_env, text=True,
                          capture_output=True, timeout=timeout)


def sync_cmd(manifest: Path, cache: Path, upstream: str, *extra: str) -> list[str]:
    return ["sync", "--manifest", str(manifest), "--cache-dir", str(cache), "--upstream", upstream, *extra]


def prefix(repo_type: str) -> str:
    return "" if repo_type == "model" else f"{repo_type}s/"


class Hub:
    """Ground truth read from the emulator over HTTP (before it is stopped)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(follow_redirects=True, timeout=30)

    def commit(self, repo_type: str, repo: str, rev: str) -> str:
        response = self.client.get(f"{self.url}/api/{repo_type}s/{repo}/revision/{rev}")
        response.raise_for_status()
        return response.json()["sha"]

    def files(self, repo_type: str, repo: str, rev: str) -> dict[str, tuple[str, int]]:
        """path -> (etag, size) from the recursive tree (all pages)."""
        url: str | None = f"{self.url}/api/{repo_type}s/{repo}/tree/{self.commit(repo_type, repo, rev)}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        out: dict[str, tuple[str, int]] = {}
        while url:
            response = self.client.get(url, params=params)
            response.raise_for_status()
            for entry in response.json():
                if entry["type"] == "file":
                    out[entry["path"]] = ((entry.get("lfs") or {}).get("oid") or entry["oid"], entry["size"])
            match = re.search(r'<([^>]+)>;\s*rel="next"', response.headers.get("link", ""))
            url, params = (match.group(1), None) if match else (None, None)
        return out

    def data(self, repo_type: str, repo: str, rev: str, path: str) -> bytes:
        response = self.client.get(f"{self.url}/{prefix(repo_type)}{repo}/resolve/{rev}/{path}")
        response.raise_for_status()
        return response.content


def write_manifest(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def blobs_in(cache: Path) -> set[str]:
    root = cache / "blobs"
    return {p.name for p in root.glob("*/*") if p.is_file()} if root.exists() else set()


def fetched_bytes(output: str) -> int:
    match = re.search(r"fetched (\d+) files, (\d+) bytes", output)
    assert match, output
    return int(match.group(2))


MANIFEST = f"""
concurrency = 3

[[repo]]
type = "model"
id = "{MODEL}"
revisions = ["main", "v1.0"]
allow = ["*.json", "*.safetensors", "sub/"]
ignore = ["*.md"]

[[repo]]
type = "dataset"
id = "{PARQUET}"
revisions = ["main"]
"""


def expected_selection(hub: Hub) -> dict[tuple[str, str, str], tuple[str, int]]:
    """(type, repo, rev) path -> etag: what MANIFEST selects, computed with huggingface_hub's own filter."""
    from huggingface_hub.utils import filter_repo_objects

    out = {}
    for repo_type, repo, rev, allow, ignore in [
        ("model", MODEL, "main", ["*.json", "*.safetensors", "sub/"], ["*.md"]),
        ("model", MODEL, "v1.0", ["*.json", "*.safetensors", "sub/"], ["*.md"]),
        ("dataset", PARQUET, "main", None, None),
    ]:
        files = hub.files(repo_type, repo, rev)
        for path in filter_repo_objects(list(files), allow_patterns=allow, ignore_patterns=ignore):
            out[(repo_type, repo, rev, path)] = files[path]
    return out


# --- integration ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with run_emulator(tmp_path_factory.mktemp("emu"), page_size=3, big_file_size=BIG_SIZE) as handle:
        yield handle


@pytest.fixture(scope="module")
def hub(emu: Any) -> Hub:
    return Hub(emu.url)


def test_sync_dry_run_then_sync_then_idempotent(emu: Any, hub: Hub, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "sync.toml", MANIFEST)
    cache = tmp_path / "cache"
    wanted = expected_selection(hub)
    etags = {etag for etag, _ in wanted.values()}
    total = sum(size for etag, size in {v[0]: v for v in wanted.values()}.values())

    dry = cli(*sync_cmd(manifest, cache, emu.url, "--dry-run"))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"dry run: {len(etags)} files, {total} bytes" in dry.stdout
    for (_, _, _, path) in wanted:
        assert path in dry.stdout
    assert not blobs_in(cache)
    # The rows add up to the total: a blob both revisions share is counted once, on its first row (issue 29).
    rows = [line.split("|") for line in dry.stdout.splitlines() if line.startswith("| ") and "|" in line[2:]]
    assert sum(int(row[5]) for row in rows if row[5].strip().isdigit()) == len(etags), dry.stdout

    first = cli(*sync_cmd(manifest, cache, emu.url))
    assert first.returncode == 0, first.stdout + first.stderr
    assert blobs_in(cache) == etags  # exactly the selected files: patterns and both revisions
    assert fetched_bytes(first.stdout) == total
    assert "FAILED" not in first.stdout
    mtimes = {e: blob(cache, e).stat().st_mtime_ns for e in etags}

    second = cli(*sync_cmd(manifest, cache, emu.url))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing to fetch" in second.stdout
    assert fetched_bytes(second.stdout) == 0
    assert {e: blob(cache, e).stat().st_mtime_ns for e in etags} == mtimes

    listing = json.loads(cli("cache", "ls", "--json", "--cache-dir", str(cache)).stdout)
    pinned = {row["repo"]: row["pinned"] for row in listing}
    assert pinned == {f"model:{MODEL}": True, f"dataset:{PARQUET}": True}
    revisions = {row["repo"]: row["revisions"] for row in listing}
    assert revisions[f"model:{MODEL}"] == {"main": hub.commit("model", MODEL, "main"),
                                          "v1.0": hub.commit("model", MODEL, "v1.0")}


def test_synced_repos_served_by_the_mirror_with_upstream_stopped(emu: Any, hub: Hub, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "sync.toml", MANIFEST)
    cache = tmp_path / "cache"
    assert cli(*sync_cmd(manifest, cache, emu.url)).returncode == 0
    config_main = hub.data("model", MODEL, "main", "config.json")
    config_v1 = hub.data("model", MODEL, "v1.0", "config.json")
    model_lfs = hub.data("model", MODEL, "main", "model.safetensors")
    parquet_files = sorted(hub.files("dataset", PARQUET, "main"))
    emu.stop()
    try:
        # --revision-ttl 0: every branch/tag lookup goes upstream, fails, and is answered from what sync stored.
        with MirrorProcess(emu.url, cache, "--revision-ttl", "0") as mirror:
            code = f"""
import json, hashlib, os
from huggingface_hub import hf_hub_download, snapshot_download, HfApi
h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
out = {{}}
out["main"] = h(hf_hub_download("{MODEL}", "config.json"))
out["v1"] = h(hf_hub_download("{MODEL}", "config.json", revision="v1.0"))
out["lfs"] = h(hf_hub_download("{MODEL}", "model.safetensors"))
p = snapshot_download("{MODEL}", allow_patterns=["*.json", "*.safetensors", "sub/"], ignore_patterns=["*.md"])
out["snap"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
p = snapshot_download("{PARQUET}", repo_type="dataset")
out["ds"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
out["files"] = sorted(HfApi().list_repo_files("{PARQUET}", repo_type="dataset"))
print(json.dumps(out))
"""
            (tmp_path / "hf_home").mkdir()
            out = run_client(code, mirror.url, tmp_path / "hf_home")
            assert "stale" in mirror.log() or "unreachable" in mirror.log()
    finally:
        emu.start()
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    assert out["main"] == sha(config_main)
    assert out["v1"] == sha(config_v1)
    assert out["lfs"] == sha(model_lfs)
    assert "config.json" in out["snap"] and "model.safetensors" in out["snap"]
    assert all(not p.endswith(".md") for p in out["snap"])
    assert out["ds"] == parquet_files
    assert out["files"] == parquet_files


def _big_path(hub: Hub) -> tuple[str, int]:
    files = hub.files("dataset", BIG, "main")
    path = max(files, key=lambda p: files[p][1])
    return path, files[path][1]


def _partial(cache: Path) -> Path | None:
    parts = list((cache / "partials").glob("*.part")) if (cache / "partials").exists() else []
    return parts[0] if parts else None


def _start_and_stop_midway(cmd: list[str], cache: Path, size: int, above: int, sig: int) -> tuple[int, int, str]:
    """Start a sync, deliver ``sig`` once its partial file holds more than ``above`` bytes; (rc, partial, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_MIRROR_")}
    env["HF_MIRROR_FILL_CHUNK_SIZE"] = str(64 * 1024)  # small chunks: the fill is slow enough to catch mid-way
    proc = subprocess.Popen([sys.executable, "-m", "mirror", *cmd], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            part = _partial(cache)
            current = part.stat().st_size if part is not None and part.exists() else 0
            if current > above:
                break
            if proc.poll() is not None:
                output = proc.stdout.read() if proc.stdout else ""
                pytest.fail(f"sync finished before it could be interrupted:\n{output}")
            time.sleep(0.002)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    part = _partial(cache)
    assert part is not None, output
    written = part.stat().st_size
    assert above < written < size, (above, written, size)
    return proc.returncode, written, output


def test_interrupted_sync_resumes(emu: Any, hub: Hub, tmp_path: Path) -> None:
    path, size = _big_path(hub)
    etag = hub.files("dataset", BIG, "main")[path][0]
    manifest = write_manifest(tmp_path / "big.toml", f'[[repo]]\ntype = "dataset"\nid = "{BIG}"\nrevisions = ["main"]\n'
                                                      f'allow = ["{path}"]\n')
    cache = tmp_path / "cache"
    cmd = sync_cmd(manifest, cache, emu.url, "--concurrency", "2")

    emu.set_faults(throttle_bps=20e6)  # slow enough to be caught mid-way on any machine
    try:
        rc, first, _ = _start_and_stop_midway(cmd, cache, size, 1 << 20, signal.SIGKILL)
        assert rc == -signal.SIGKILL
        rc, second, output = _start_and_stop_midway(cmd, cache, size, first + (1 << 20), signal.SIGINT)
    finally:
        emu.clear_faults()
    assert rc == 130, output
    assert "interrupted" in output and "resume" in output
    assert "Traceback" not in output and "never retrieved" not in output  # one line, no asyncio noise (issue 29)
    assert "resuming" in output or second > first  # the second run continued from the first run's bytes

    done = cli(*cmd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert fetched_bytes(done.stdout) == size - second  # the third run only fetched what was missing
    assert blob(cache, etag).stat().st_size == size
    assert _partial(cache) is None
    verify = cli("cache", "verify", "--cache-dir", str(cache))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "0 corrupt" in verify.stdout


def test_sync_and_running_server_share_one_fill(emu: Any, hub: Hub, tmp_path: Path) -> None:
    """A client asks the server for the file the sync is downloading: one upstream download in all."""
    path, size = _big_path(hub)
    etag = hub.files("dataset", BIG, "main")[path][0]
    cache = tmp_path / "cache"
    manifest = write_manifest(tmp_path / "big.toml", f'[[repo]]\ntype = "dataset"\nid = "{BIG}"\nallow = ["{path}"]\n')
    with MirrorProcess(emu.url, cache) as mirror:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_MIRROR_")}
        env["HF_MIRROR_FILL_CHUNK_SIZE"] = str(64 * 1024)
        proc = subprocess.Popen([sys.executable, "-m", "mirror", *sync_cmd(manifest, cache, emu.url)], cwd=REPO_ROOT,
                                env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                part = _partial(cache)
                if part is not None and part.exists() and part.stat().st_size > (1 << 20):
                    break
                time.sleep(0.005)
            digest = hashlib.sha256()
            with httpx.stream("GET", f"{mirror.url}/datasets/{BIG}/resolve/main/{path}", timeout=60) as response:
                assert response.status_code == 200
                for chunk in response.iter_bytes():
                    digest.update(chunk)
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, output
        assert digest.hexdigest() == etag
        server_fetched = metric(mirror, "hf_mirror_upstream_bytes_total")
    assert fetched_bytes(output) + server_fetched == size, (fetched_bytes(output), server_fetched)


def test_sync_through_a_running_mirror(emu: Any, hub: Hub, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "sync.toml", MANIFEST)
    cache = tmp_path / "cache"
    wanted = expected_selection(hub)
    with MirrorProcess(emu.url, cache) as mirror:
        dry = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert not blobs_in(cache)
        first = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "not pinned" in first.stdout
        assert blobs_in(cache) == {etag for etag, _ in wanted.values()}
        second = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "nothing to fetch" in second.stdout
        assert fetched_bytes(second.stdout) == 0


def test_sync_through_a_mirror_without_disk_room_fails_loudly(emu: Any, tmp_path: Path) -> None:
    """A mirror that relays instead of storing (no disk room) must not let a sync report success."""
    import shutil

    manifest = write_manifest(tmp_path / "sync.toml", MANIFEST)
    impossible = str(shutil.disk_usage(tmp_path).free + 2**40)
    with MirrorProcess(emu.url, tmp_path / "cache", "--min-free-space", impossible) as mirror:
        result = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "no disk room" in result.stdout + result.stderr


def test_failures_are_reported_per_repo(emu: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "sync.toml", f"""
[[repo]]
id = "acme/does-not-exist"

[[repo]]
id = "{MODEL}"
revisions = ["no-such-branch", "main"]
allow = ["config.json"]

[[repo]]
type = "dataset"
id = "{PARQUET}"
token_env = "HF_MIRROR_TEST_UNSET_TOKEN"
""")
    result = cli(*sync_cmd(manifest, tmp_path / "cache", emu.url), "--concurrency", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {line.split("|")[1].strip() + "@" + line.split("|")[2].strip(): line
            for line in result.stdout.splitlines() if line.startswith("| ") and "|" in line[2:]}
    assert "FAILED" in rows["model:acme/does-not-exist@main"] and "RepoNotFound" in rows[
        "model:acme/does-not-exist@main"]
    assert "FAILED" in rows[f"model:{MODEL}@no-such-branch"] and "RevisionNotFound" in rows[
        f"model:{MODEL}@no-such-branch"]
    assert "ok" in rows[f"model:{MODEL}@main"]
    assert "HF_MIRROR_TEST_UNSET_TOKEN" in rows[f"dataset:{PARQUET}@main"]
    assert "3 of 4 revision(s) failed" in result.stdout
    # The repo upstream does not have is not pinned; the others keep their pins (issue 29).
    assert "pinned 2 repo(s)" in result.stdout, result.stdout
    pins = cli("cache", "ls", "--cache-dir", str(tmp_path / "cache"), "--json")
    assert pins.returncode == 0, pins.stderr
    pinned = {row["repo"] for row in json.loads(pins.stdout) if row["pinned"]}
    assert "model:acme/does-not-exist" not in pinned and f"model:{MODEL}" in pinned, pinned

"""``hf-mirror cache``: ls, du, verify, rm, gc (quota with pinned repos kept, by the CLI and by the server), and the
round trips with the client cache: import of a tree the real client wrote, export read by the real client offline."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_sync import (
    MANIFEST,
    MODEL,
    PARQUET,
    Hub,
    blobs_in,
    cli,
    run_emulator,
    sync_cmd,
    write_manifest,
)
from tests.support.mirror_proc import MirrorProcess, blob, run_client

OTHER = "acme/big-data"  # the unpinned repo of the eviction test
OTHER_SIZE = 2 * 1024 * 1024


def sha1_git(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with run_emulator(tmp_path_factory.mktemp("emu"), page_size=3, big_file_size=OTHER_SIZE) as handle:
        yield handle


@pytest.fixture(scope="module")
def hub(emu: Any) -> Hub:
    return Hub(emu.url)


@pytest.fixture(scope="module")
def synced(emu: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache filled by a sync of MANIFEST (copied by the tests that change it)."""
    root = tmp_path_factory.mktemp("synced")
    manifest = write_manifest(root / "sync.toml", MANIFEST)
    result = cli(*sync_cmd(manifest, root / "cache", emu.url))
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "cache"


def copy_cache(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "cache"
    shutil.copytree(source, target, symlinks=True)
    return target


def ls(cache: Path) -> dict[str, dict[str, Any]]:
    result = cli("cache", "ls", "--json", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    return {row["repo"]: row for row in json.loads(result.stdout)}


def du(cache: Path, *extra: str) -> dict[str, Any]:
    result = cli("cache", "du", "--json", "--cache-dir", str(cache), *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_ls_du_and_rm(synced: Path, hub: Hub, tmp_path: Path) -> None:
    cache = copy_cache(synced, tmp_path)
    rows = ls(cache)
    assert set(rows) == {f"model:{MODEL}", f"dataset:{PARQUET}"}
    model = rows[f"model:{MODEL}"]
    assert model["pinned"] and model["files"] >= 3 and model["bytes"] > 0 and model["last_access"] > 0
    assert set(model["commits"]) == {hub.commit("model", MODEL, "main"), hub.commit("model", MODEL, "v1.0")}
    usage = du(cache)
    assert usage["blobs"] == len(blobs_in(cache))
    assert usage["blob_bytes"] == sum(p.stat().st_size for p in (cache / "blobs").glob("*/*"))
    assert usage["pinned_bytes"] == usage["blob_bytes"] and usage["unreferenced_blobs"] == 0
    text = cli("cache", "ls", "--cache-dir", str(cache))
    assert MODEL in text.stdout and "v1.0=" in text.stdout

    # rm accepts the three spellings; shared blobs stay with the repo that still uses them.
    model_blobs = {e for rev in ("main", "v1.0") for e, _ in hub.files("model", MODEL, rev).values()}
    parquet_blobs = {e for e, _ in hub.files("dataset", PARQUET, "main").values()} - model_blobs
    removed = cli("cache", "rm", f"datasets/{PARQUET}", "--cache-dir", str(cache))
    assert removed.returncode == 0, removed.stderr
    assert "pinned" in removed.stdout  # it tells that the next sync brings it back
    assert not (parquet_blobs & blobs_in(cache))
    assert set(ls(cache)) == {f"model:{MODEL}"}
    assert cli("cache", "rm", f"dataset:{PARQUET}", "--cache-dir", str(cache)).returncode == 1
    assert cli("cache", "rm", MODEL, "--cache-dir", str(cache)).returncode == 0
    assert not blobs_in(cache)


def test_verify_finds_removes_and_sync_refetches_a_corrupt_blob(synced: Path, emu: Any, hub: Hub,
                                                                 tmp_path: Path) -> None:
    cache = copy_cache(synced, tmp_path)
    lfs_etag = hub.files("model", MODEL, "main")["model.safetensors"][0]
    cfg_etag = hub.files("model", MODEL, "main")["config.json"][0]
    for etag in (lfs_etag, cfg_etag):  # one sha256 blob, one git-sha1 blob
        path = blob(cache, etag)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    kept = cli("cache", "verify", "--keep", "--cache-dir", str(cache))
    assert kept.returncode == 1 and lfs_etag in kept.stdout and cfg_etag in kept.stdout
    assert blob(cache, lfs_etag).exists()
    result = cli("cache", "verify", "--cache-dir", str(cache))
    assert result.returncode == 1, result.stdout
    assert "2 corrupt" in result.stdout and f"model:{MODEL}" in result.stdout
    assert not blob(cache, lfs_etag).exists() and not blob(cache, cfg_etag).exists()
    assert cli("cache", "verify", "--cache-dir", str(cache)).returncode == 0
    manifest = write_manifest(tmp_path / "sync.toml", MANIFEST)
    again = cli(*sync_cmd(manifest, cache, emu.url))
    assert again.returncode == 0, again.stdout
    assert sha(blob(cache, lfs_etag).read_bytes()) == lfs_etag


def test_a_blob_corrupted_on_disk_is_never_served_twice(synced: Path, emu: Any, hub: Hub, tmp_path: Path) -> None:
    """A size change is caught on the hit itself; a same-size corruption by the scrub's first-hit check: the next
    request gets the right bytes, fetched again."""
    cache = copy_cache(synced, tmp_path)
    lfs_etag = hub.files("model", MODEL, "main")["model.safetensors"][0]
    cfg_etag = hub.files("model", MODEL, "main")["config.json"][0]
    truncated = blob(cache, cfg_etag)
    truncated.write_bytes(truncated.read_bytes()[:-3])
    flipped = blob(cache, lfs_etag)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with MirrorProcess(emu.url, cache) as mirror:
        cfg = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/config.json", timeout=30)
        assert cfg.status_code == 200 and sha1_git(cfg.content) == cfg_etag  # never the short file
        httpx.get(f"{mirror.url}/{MODEL}/resolve/main/model.safetensors", timeout=30)  # maybe the bad bytes, once
        deadline = time.monotonic() + 20
        while blob(cache, lfs_etag).exists() and sha(blob(cache, lfs_etag).read_bytes()) != lfs_etag:
            assert time.monotonic() < deadline, "the scrub did not catch the corrupt blob"
            time.sleep(0.2)
        again = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/model.safetensors", timeout=30)
        assert again.status_code == 200 and sha(again.content) == lfs_etag
        assert "does not match its etag" in mirror.log()


def test_quota_evicts_unpinned_lru_and_keeps_pinned(synced: Path, emu: Any, hub: Hub, tmp_path: Path) -> None:
    cache = copy_cache(synced, tmp_path)
    pinned_blobs = blobs_in(cache)
    pinned_bytes = du(cache)["blob_bytes"]
    other = hub.files("dataset", OTHER, "main")
    # The unpinned repo arrives through the server (as a client download would), not through a manifest.
    with MirrorProcess(emu.url, cache) as mirror:
        manifest = write_manifest(tmp_path / "other.toml", f'[[repo]]\ntype = "dataset"\nid = "{OTHER}"\n')
        result = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url)
        assert result.returncode == 0, result.stdout + result.stderr
    other_blobs = {etag for etag, _ in other.values()}
    assert other_blobs <= blobs_in(cache)
    assert not ls(cache)[f"dataset:{OTHER}"]["pinned"]
    total = du(cache)["blob_bytes"]
    # A quota of exactly the pinned bytes: every unpinned blob goes, every pinned one stays.
    result = cli("cache", "gc", "--max-size", str(pinned_bytes), "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "evicted" in result.stdout
    left = blobs_in(cache)
    assert pinned_blobs <= left
    assert not (other_blobs - pinned_blobs) & left
    assert du(cache)["blob_bytes"] == pinned_bytes < total
    # A quota below the pinned bytes cannot be met: pinned blobs are still kept, and gc says so.
    result = cli("cache", "gc", "--max-size", "1000", "--cache-dir", str(cache))
    assert "over the quota" in result.stderr and pinned_blobs <= blobs_in(cache)


def test_server_enforces_the_quota_periodically(synced: Path, emu: Any, hub: Hub, tmp_path: Path) -> None:
    cache = copy_cache(synced, tmp_path)
    pinned_blobs = blobs_in(cache)
    pinned_bytes = du(cache)["blob_bytes"]
    other_blobs = {etag for etag, _ in hub.files("dataset", OTHER, "main").values()}
    with MirrorProcess(emu.url, cache, "--max-size", str(pinned_bytes + OTHER_SIZE // 2),
                       env={"HF_MIRROR_GC_INTERVAL": "0.3"}) as mirror:
        manifest = write_manifest(tmp_path / "other.toml", f'[[repo]]\ntype = "dataset"\nid = "{OTHER}"\n')
        result = cli("sync", "--manifest", str(manifest), "--mirror", mirror.url)
        assert result.returncode == 0, result.stdout + result.stderr
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and du(cache)["blob_bytes"] > pinned_bytes + OTHER_SIZE // 2:
            time.sleep(0.2)
    assert du(cache)["blob_bytes"] <= pinned_bytes + OTHER_SIZE // 2
    assert pinned_blobs <= blobs_in(cache)
    assert (other_blobs - pinned_blobs) - blobs_in(cache)  # the unpinned repo lost blobs


def test_the_quota_holds_while_serving(emu: Any, tmp_path: Path) -> None:
    """Each fill makes room before it starts: right after every download, the blobs are within --max-size (no
    periodic pass runs: its interval is the default 600 s)."""
    size = 3 * 1000 * 1000
    files = {f"quota/q{i}.bin": bytes([i]) * size for i in range(5)}
    emu.push("model", "gpt2", "main", files)  # a repo no other test of this module reads
    cache = tmp_path / "cache"
    quota = 7 * 1000 * 1000
    with MirrorProcess(emu.url, cache, "--max-size", str(quota)) as mirror:
        for path, data in files.items():
            response = httpx.get(f"{mirror.url}/gpt2/resolve/main/{path}", timeout=30)
            assert response.status_code == 200 and response.content == data
            # The blobs on disk, counted here (a `cache du` per download would start a process each time).
            assert stored_blob_bytes(cache) <= quota, path
        evicted = httpx.get(f"{mirror.url}/gpt2/resolve/main/quota/q0.bin", timeout=30)  # evicted: fetched again
        assert evicted.status_code == 200 and evicted.content == files["quota/q0.bin"]
        assert du(cache)["blob_bytes"] == stored_blob_bytes(cache) <= quota  # and `cache du` counts the same


def stored_blob_bytes(cache: Path) -> int:
    return sum(f.stat().st_size for f in (cache / "blobs").rglob("*") if f.is_file())


CLIENT_DOWNLOADS = f"""
import json
from huggingface_hub import hf_hub_download, snapshot_download
snapshot_download("{MODEL}")
hf_hub_download("{MODEL}", "config.json", revision="v1.0")
snapshot_download("{PARQUET}", repo_type="dataset")
print(json.dumps("ok"))
"""

CLIENT_READS = f"""
import json, hashlib, os
from huggingface_hub import hf_hub_download, snapshot_download
h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
out = {{"main": h(hf_hub_download("{MODEL}", "config.json")),
        "v1": h(hf_hub_download("{MODEL}", "config.json", revision="v1.0")),
        "lfs": h(hf_hub_download("{MODEL}", "model.safetensors")),
        "nested": h(hf_hub_download("{MODEL}", "nested.txt", subfolder="sub"))}}
p = snapshot_download("{MODEL}")
out["snap"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
p = snapshot_download("{PARQUET}", repo_type="dataset")
out["ds"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
print(json.dumps(out))
"""


def expected_reads(hub: Hub) -> dict[str, Any]:
    return {
        "main": sha(hub.data("model", MODEL, "main", "config.json")),
        "v1": sha(hub.data("model", MODEL, "v1.0", "config.json")),
        "lfs": sha(hub.data("model", MODEL, "main", "model.safetensors")),
        "nested": sha(hub.data("model", MODEL, "main", "sub/nested.txt")),
        "snap": sorted(hub.files("model", MODEL, "main")),
        "ds": sorted(hub.files("dataset", PARQUET, "main")),
    }


def test_import_a_client_cache_and_serve_it_offline(emu: Any, hub: Hub, tmp_path: Path) -> None:
    client_home = tmp_path / "client"
    client_home.mkdir()
    run_client(CLIENT_DOWNLOADS, emu.url, client_home)  # the real client fills its own cache from the Hub
    cache = tmp_path / "mirror-cache"
    cache.mkdir()
    result = cli("cache", "import", str(client_home / "hub"), "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    again = cli("cache", "import", str(client_home / "hub"), "--cache-dir", str(cache))  # idempotent
    assert again.returncode == 0 and "0 blobs added" in again.stdout
    client_blobs = {p.name for p in (client_home / "hub").glob("*/blobs/*")}
    assert blobs_in(cache) == client_blobs
    assert {row for row in ls(cache)} == {f"model:{MODEL}", f"dataset:{PARQUET}"}
    expected = expected_reads(hub)
    # Offline, visibility upstream never told counts as closed: imported repos are refused to anyone ...
    with MirrorProcess("http://127.0.0.1:9", cache, "--offline") as mirror:
        refused = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/config.json")
        assert refused.status_code == 401 and refused.headers["x-error-code"] == "RepoNotFound"
    # ... until the operator opens them: an air-gapped mirror then serves the imported repos to the real client.
    with MirrorProcess("http://127.0.0.1:9", cache, "--offline", "--open-unknown-repos") as mirror:
        reader = tmp_path / "reader"
        reader.mkdir()
        assert run_client(CLIENT_READS, mirror.url, reader) == expected


def xet_client_cache(code: str, emu: Any, client_home: Path, tmp_path: Path) -> None:
    """The real 2.x client (with hf_xet) fills its cache over Xet: the emulator's Xet hints point at a CAS only a
    mirror serves (``--serve-xet``, on by default), so it downloads through one."""
    with MirrorProcess(emu.url, tmp_path / "xet-mirror-cache") as mirror:
        run_client(code, mirror.url, client_home, HF_HUB_DISABLE_XET="0")


def test_import_a_hub_2x_cache_into_a_new_dir_and_serve_it_offline(emu: Any, hub: Hub, tmp_path: Path) -> None:
    """huggingface_hub 2.x keeps Xet-downloaded files once per cache, in its shared blob store; each repo's
    ``blobs/<etag>`` is a relative symlink into it. Import follows those links (a hardlink of the target, not of the
    link), into a cache dir that does not exist yet; an offline mirror then serves the repos the import marked
    public, and its refusal of the others names the way out."""
    client_home = tmp_path / "client"
    xet_client_cache(CLIENT_DOWNLOADS, emu, client_home, tmp_path)
    hub_cache = client_home / "hub"
    links = [p for p in hub_cache.glob("*/blobs/*") if p.is_symlink()]
    assert links and all(not os.path.isabs(os.readlink(p)) for p in links)  # the 2.x layout, relative links
    assert (hub_cache / "blobs" / ".huggingface-shared-blobs").is_file()
    cache = tmp_path / "new" / "mirror-cache"  # neither it nor its parent exists
    result = cli("cache", "import", str(hub_cache), "--public", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    client_blobs = {p.name for p in hub_cache.glob("*/blobs/*")}
    assert f"{len(client_blobs)} blobs added" in result.stdout and f"{len(client_blobs)} hardlinked" in result.stdout
    assert "skipped" not in result.stderr, result.stderr  # the shared store is no repo folder, and no blob missing
    assert blobs_in(cache) == client_blobs
    for link in links:  # the mirror's blob is the shared store's file itself (hardlinked), never a link
        stored = blob(cache, link.name)
        assert not stored.is_symlink() and os.path.samefile(stored, link.resolve())
    # Another client cache deleting its own copy leaves the mirror's intact (a hardlink, not a link).
    shutil.rmtree(client_home)
    expected = expected_reads(hub)
    with MirrorProcess("http://127.0.0.1:9", cache, "--offline") as mirror:
        reader = tmp_path / "reader"
        assert run_client(CLIENT_READS, mirror.url, reader) == expected


def test_an_offline_refusal_of_an_imported_repo_names_the_way_out(emu: Any, tmp_path: Path) -> None:
    client_home = tmp_path / "client"
    run_client(f'import json\nfrom huggingface_hub import snapshot_download\nsnapshot_download("{MODEL}")\n'
               'print(json.dumps(1))', emu.url, client_home)
    cache = tmp_path / "mirror-cache"
    result = cli("cache", "import", str(client_home / "hub"), "--copy", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    help_text = cli("cache", "import", "--help", env={"COLUMNS": "400"}).stdout
    assert "--open-unknown-repos" in " ".join(help_text.split())
    with MirrorProcess("http://127.0.0.1:9", cache, "--offline") as mirror:
        for headers in ({}, {"authorization": "Bearer hf_some_token"}):
            refused = httpx.get(f"{mirror.url}/{MODEL}/resolve/main/config.json", headers=headers)
            assert refused.status_code in (401, 403), refused.text
            message = refused.headers["x-error-message"]
            assert "cache import --public" in message and "--open-unknown-repos" in message, message
            assert refused.json()["error"] == message


def test_import_refuses_corrupt_blobs(emu: Any, tmp_path: Path) -> None:
    client_home = tmp_path / "client"
    client_home.mkdir()
    run_client(f'import json\nfrom huggingface_hub import snapshot_download\nsnapshot_download("{MODEL}")\n'
               'print(json.dumps(1))', emu.url, client_home)
    blob = next(p for p in (client_home / "hub" / "models--acme--tiny-model" / "blobs").iterdir()
                if len(p.name) == 64)
    blob.write_bytes(b"not the content" + blob.read_bytes()[15:])
    cache = tmp_path / "mirror-cache"
    cache.mkdir()
    result = cli("cache", "import", str(client_home / "hub"), "--copy", "--cache-dir", str(cache))
    assert result.returncode == 1
    assert blob.name in result.stdout and "1 corrupt" in result.stdout
    assert blob.name not in blobs_in(cache) and blobs_in(cache)


def test_export_is_read_by_the_client_offline(synced: Path, hub: Hub, tmp_path: Path) -> None:
    cache = copy_cache(synced, tmp_path)
    # Complete the model so a plain snapshot_download (no patterns) is satisfied offline.
    export_dir = tmp_path / "hf-cache"
    for spec in (f"{MODEL}@v1.0", MODEL, f"datasets/{PARQUET}@main"):
        result = cli("cache", "export", spec, "--to", str(export_dir), "--cache-dir", str(cache))
        assert result.returncode == 0, result.stdout + result.stderr
    folder = export_dir / "models--acme--tiny-model"
    commit = hub.commit("model", MODEL, "main")
    assert (folder / "refs" / "main").read_text() == commit
    link = folder / "snapshots" / commit / "sub" / "nested.txt"
    assert link.is_symlink() and os.readlink(link).startswith("../../../blobs/")
    code = f"""
import json, hashlib, os
from huggingface_hub import hf_hub_download, snapshot_download
h = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
out = {{"main": h(hf_hub_download("{MODEL}", "config.json")),
        "v1": h(hf_hub_download("{MODEL}", "config.json", revision="v1.0")),
        "sha": h(hf_hub_download("{MODEL}", "model.safetensors", revision="{commit}")),
        "nested": h(hf_hub_download("{MODEL}", "nested.txt", subfolder="sub"))}}
p = snapshot_download("{MODEL}")
out["snap"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
p = snapshot_download("{PARQUET}", repo_type="dataset")
out["ds"] = sorted(os.path.relpath(os.path.join(d, f), p) for d, _, fs in os.walk(p) for f in fs)
print(json.dumps(out))
"""
    out = run_client(code, "http://127.0.0.1:9", tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(export_dir))
    assert out["main"] == sha(hub.data("model", MODEL, "main", "config.json"))
    assert out["v1"] == sha(hub.data("model", MODEL, "v1.0", "config.json"))
    assert out["sha"] == sha(hub.data("model", MODEL, "main", "model.safetensors"))
    assert out["nested"] == sha(hub.data("model", MODEL, "main", "sub/nested.txt"))
    assert "config.json" in out["snap"] and "model.safetensors" in out["snap"]  # what the manifest synced
    assert out["ds"] == sorted(hub.files("dataset", PARQUET, "main"))

    # And back: the exported tree imports into a fresh mirror cache with the same blobs.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    result = cli("cache", "import", str(export_dir), "--cache-dir", str(fresh))
    assert result.returncode == 0, result.stdout + result.stderr
    assert blobs_in(fresh) == {p.name for p in export_dir.glob("*/blobs/*")}


def test_export_unknown_revision_fails(synced: Path, tmp_path: Path) -> None:
    result = cli("cache", "export", f"{MODEL}@nope", "--to", str(tmp_path / "x"), "--cache-dir", str(synced))
    assert result.returncode == 1 and "not known" in result.stderr

"""Beyond one machine (issue 9): mirror nodes sharing one S3 bucket, and a regional mirror chained to a central one.

Everything is a real process on 127.0.0.1: the Hub emulator, a SeaweedFS S3 server (``tests/support/s3_server.py``) and
``python -m mirror serve`` nodes (``--storage s3``), each with its own cache dir (hot tier and metadata index), as
separate machines would have. Upstream fetches are counted by the emulator (GET bodies served per file).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.test_sync import cli
from tests.support import fleet as fleet_support
from tests.support.fleet import BIG, BIG_SIZE, BIG_URL, MODEL, Fleet, fill_active, fill_written, get, sha256, wait_until
from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import metric, run_client

EMULATOR_FILES = fleet_support.EMULATOR_FILES  # for ``emu`` (tests/e2e/conftest.py)


def test_two_nodes_one_bucket_one_upstream_fetch(emu: EmulatorHandle, fleet: Fleet) -> None:
    a, b = fleet.start(2, emu.url)
    expected = sha256(emu.files.file_bytes(*BIG[:2], "main", BIG[2]))
    # Slow enough (about 2 s) that the 20 requests overlap the fill on both nodes.
    emu.set_faults(throttle_bps=4 * 2**20)
    barrier = threading.Barrier(20)

    def one(i: int) -> tuple[int, str]:
        barrier.wait()
        node = (a, b)[i % 2]  # round robin, as a load balancer would split them
        status, body, _ = get(node.url + BIG_URL)
        return status, sha256(body)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    elapsed = time.monotonic() - started
    assert results == [(200, expected)] * 20, results
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    # Clients get the last byte once the blob is verified; the upload to the bucket follows.
    wait_until(lambda: f"blobs/{etag[:2]}/{etag}" in fleet.bucket_keys(), "the blob in the bucket")
    wait_until(lambda: not any(key.startswith("leases/") for key in fleet.bucket_keys()),
              "the lease to go (a finished fill leaves none)")
    print(f"20 cold requests over 2 nodes: {elapsed:.2f}s, upstream fetches: {emu.fetch_count(*BIG)}")

    # Small files too, split over the nodes; then a brand-new node (empty hot tier, empty index) serves what
    # the others committed without fetching any body from upstream.
    emu.clear_faults()
    paths = ["config.json", "model.safetensors", "sub/nested.txt"]
    for i, path in enumerate(paths * 2):
        status, body, _ = get((a, b)[i % 2].url + f"/{MODEL}/resolve/main/{path}")
        assert status == 200 and body == emu.files.file_bytes("model", MODEL, "main", path)
    c = fleet.node(emu.url)
    for path in paths:
        status, body, headers = get(c.url + f"/{MODEL}/resolve/main/{path}")
        assert status == 200 and body == emu.files.file_bytes("model", MODEL, "main", path)
    status, body, _ = get(c.url + BIG_URL)
    assert status == 200 and sha256(body) == expected
    fetches = emu.stats()["fetches"]
    assert {k: v for k, v in fetches.items() if v != 1} == {}, fetches
    assert fetches[f"model:{MODEL}/model.safetensors"] == 1


def test_node_killed_mid_fill_the_other_completes(emu: EmulatorHandle, fleet: Fleet) -> None:
    ttl = {"HF_MIRROR_LEASE_STALE_SECONDS": "2"}  # a dead node's lease lapses after 2 s
    a, b = fleet.start(2, emu.url, env=ttl)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=2**20)  # an 8 s fill: node A is killed well inside it
    got_a: dict[str, Any] = {}
    got_b: dict[str, Any] = {}

    def read_a() -> None:
        received = 0
        try:
            with httpx.stream("GET", a.url + BIG_URL, timeout=60) as response:
                for chunk in response.iter_raw():
                    received += len(chunk)
        except httpx.HTTPError as exc:
            got_a["error"] = type(exc).__name__
        got_a["received"] = received

    def read_b() -> None:
        status, body, _ = get(b.url + BIG_URL)
        got_b.update(status=status, body=body)

    client_a = threading.Thread(target=read_a)
    client_a.start()
    wait_until(lambda: fill_written(a) > 256 * 1024, "node A to be filling")
    client_b = threading.Thread(target=read_b)
    client_b.start()
    wait_until(lambda: fill_active(b), "node B to follow node A's fill")
    a.kill9()
    killed_at = time.monotonic()
    emu.clear_faults()
    client_b.join(60)
    client_a.join(10)
    assert not client_b.is_alive()
    assert got_b["status"] == 200 and len(got_b["body"]) == len(data) and got_b["body"] == data
    assert got_a["received"] < len(data), "node A's client must see a cut transfer, not a whole file"
    # A's interrupted download and B's takeover after the lease lapsed: nothing more.
    assert emu.fetch_count(*BIG) == 2, emu.stats()["fetches"]
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    wait_until(lambda: f"blobs/{etag[:2]}/{etag}" in fleet.bucket_keys(), "the blob in the bucket")
    print(f"takeover: node B completed {time.monotonic() - killed_at:.2f}s after node A was killed")


def test_follower_node_streams_the_fill_from_the_leader(emu: EmulatorHandle, fleet: Fleet) -> None:
    """A client on node B gets bytes while node A's fill runs, not only after A commits (peer streaming)."""
    a, b = fleet.start(2, emu.url)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=2 * 2**20)  # a 4 s fill
    leader = threading.Thread(target=get, args=(a.url + BIG_URL,))
    leader.start()
    wait_until(lambda: fill_written(a) > 256 * 1024, "node A to be filling")
    received = bytearray()
    seen_during_fill = 0
    with httpx.stream("GET", b.url + BIG_URL, timeout=60) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += chunk
            if not seen_during_fill and len(received) >= 2**20:
                seen_during_fill = len(received) if fill_active(a) else -1
    leader.join(30)
    assert bytes(received) == data
    assert seen_during_fill > 0, f"node B's client got its first MiB only after A's commit:\n{b.log()[-3000:]}"
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    from_peers = metric(b, "hf_mirror_peer_bytes_total")
    assert from_peers > 0, f"node B did not stream from node A:\n{b.log()[-3000:]}"
    # B kept the verified copy it streamed as its hot-tier file (once A's upload is in the bucket): a second
    # request is a local hit.
    wait_until(lambda: not fill_active(b), "node B's fill to end with A's commit")
    status, body, headers = get(b.url + BIG_URL)
    assert status == 200 and body == data and headers.get("x-mirror-cache") == "hit", (status, headers)
    print(f"peer streaming: {from_peers / 2**20:.1f} MiB from node A; B had 1 MiB while A was still filling")


def test_peer_stream_from_a_node_with_two_workers(emu: EmulatorHandle, fleet: Fleet) -> None:
    """A peer's connection lands on either worker of the filling node: both serve it (one follows the other)."""
    (a,) = fleet.start(1, emu.url, "--workers", "2")
    (b,) = fleet.start(1, emu.url)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=2 * 2**20)
    leader = threading.Thread(target=get, args=(a.url + BIG_URL,))
    leader.start()
    wait_until(lambda: f"leases/{etag}" in fleet.bucket_keys(), "node A to hold the fill lease")
    lease = json.loads(fleet.s3.client().get_object(Bucket=fleet.s3.bucket,
                                                    Key=f"{fleet.prefix}leases/{etag}")["Body"].read())
    query = f"repo=dataset:{BIG[1]}&commit={emu.files.commit(*BIG[:2], 'main')}&path={BIG[2]}&size={BIG_SIZE}"

    def as_peer(_i: int) -> tuple[int, bytes]:
        with httpx.Client(timeout=30) as client:  # a connection of its own: either of A's workers takes it
            response = client.get(f"{a.url}/_mirror/fills/{etag}?{query}",
                                  headers={"x-mirror-peer-token": lease["peer"]["token"], "range": "bytes=100-"})
            return response.status_code, response.content

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        node_b = pool.submit(get, b.url + BIG_URL)
        peers = list(pool.map(as_peer, range(6)))  # all six on the same worker: 1 chance in 32
        assert node_b.result()[1] == data
    leader.join(30)
    assert peers == [(206, data[100:])] * 6
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    assert metric(b, "hf_mirror_peer_bytes_total") > 0, b.log()[-3000:]


def test_peer_route_needs_the_lease_token(emu: EmulatorHandle, fleet: Fleet) -> None:
    (a,) = fleet.start(1, emu.url)
    emu.set_faults(throttle_bps=2 * 2**20)
    leader = threading.Thread(target=get, args=(a.url + BIG_URL,))
    leader.start()
    wait_until(lambda: fill_active(a), "node A to be filling")
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    for headers in ({}, {"x-mirror-peer-token": "guess"}):
        response = httpx.get(f"{a.url}/_mirror/fills/{etag}", headers=headers, timeout=10)
        assert response.status_code == 404 and response.headers["x-error-code"] == "EntryNotFound"
    lease = json.loads(fleet.s3.client().get_object(Bucket=fleet.s3.bucket,
                                                    Key=f"{fleet.prefix}leases/{etag}")["Body"].read())
    assert lease["peer"]["url"] == a.url
    with httpx.stream("GET", f"{a.url}/_mirror/fills/{etag}", timeout=30,
                      headers={"x-mirror-peer-token": lease["peer"]["token"], "range": "bytes=100-"}) as response:
        assert response.status_code == 206
        assert response.headers["content-range"] == f"bytes 100-{BIG_SIZE - 1}/{BIG_SIZE}"
        body = response.read()
    assert body == emu.files.file_bytes(*BIG[:2], "main", BIG[2])[100:]
    leader.join(30)


def test_cache_commands_on_an_s3_node_work_on_the_bucket(emu: EmulatorHandle, fleet: Fleet) -> None:
    """``cache du | verify | gc`` with ``storage = "s3"`` count, hash and evict the bucket's blobs, not the node's hot
    tier (which the test empties before each command: the bucket is the cache)."""
    node = fleet.node(emu.url)
    small = ("model", MODEL, "config.json")
    blobs = {file: emu.files.etag(*file[:2], "main", file[2]) for file in (BIG, small)}
    sizes = {file: len(emu.files.file_bytes(*file[:2], "main", file[2])) for file in (BIG, small)}
    for file in (BIG, small):
        url = f"{node.url}/{'datasets/' if file[0] == 'dataset' else ''}{file[1]}/resolve/main/{file[2]}"
        assert get(url)[0] == 200
    wait_until(lambda: {f"blobs/{e[:2]}/{e}" for e in blobs.values()} <= fleet.bucket_keys(),
               "both blobs in the bucket")
    node.stop()
    storage = ("--cache-dir", str(node.cache_dir), "--storage", "s3", "--s3-endpoint", fleet.s3.endpoint,
               "--s3-bucket", fleet.s3.bucket, "--s3-prefix", fleet.prefix)

    def cache(*args: str) -> Any:
        for hot in (node.cache_dir / "blobs").rglob("*"):  # this node's disk copies: gone, the bucket keeps them
            if hot.is_file():
                hot.unlink()
        return cli("cache", *args, *storage, env=fleet.s3.env)

    result = cache("du", "--json")
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)
    assert (usage["blobs"], usage["blob_bytes"]) == (2, sum(sizes.values())), usage
    assert usage["store"] == f"s3://{fleet.s3.bucket}/{fleet.prefix}"
    assert usage["by_type"] == {"dataset": sizes[BIG], "model": sizes[small]}

    result = cache("verify")
    assert result.returncode == 0 and "verified 2 blobs" in result.stdout, result.stdout + result.stderr

    small_key = f"{fleet.prefix}blobs/{blobs[small][:2]}/{blobs[small]}"
    fleet.s3.client().put_object(Bucket=fleet.s3.bucket, Key=small_key, Body=b"not the file")
    result = cache("verify")
    assert result.returncode == 1 and f"CORRUPT {blobs[small]}" in result.stdout, result.stdout + result.stderr
    assert f"blobs/{blobs[small][:2]}/{blobs[small]}" not in fleet.bucket_keys()  # removed from the bucket

    result = cache("gc", "--max-size", "1K")
    assert result.returncode == 0 and "evicted 1 blobs" in result.stdout, result.stdout + result.stderr
    assert not {key for key in fleet.bucket_keys() if key.startswith("blobs/")}
    assert json.loads(cache("du", "--json").stdout)["blobs"] == 0

    # sync builds the same parts: on an S3 node it fills the bucket.
    manifest = node.cache_dir.parent / "sync.toml"
    manifest.write_text(f'[[repo]]\ntype = "model"\nid = "{MODEL}"\nallow = ["config.json"]\n')
    result = cli("sync", "--manifest", str(manifest), "--upstream", emu.url, *storage, env=fleet.s3.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"blobs/{blobs[small][:2]}/{blobs[small]}" in fleet.bucket_keys()


def test_chained_mirror_fetches_each_file_once(emu: EmulatorHandle, fleet: Fleet,
                                               tmp_path: Path) -> None:
    """A regional mirror (local disk) whose upstream is a central mirror (the shared bucket), driven by the real
    huggingface_hub client: the central mirror fetches each file from the Hub once, however many clients and
    regional caches ask."""
    central = fleet.node(emu.url)
    regional = fleet.node(central.url, s3=False)
    code = f"""
import json, hashlib, os
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download
def digest(p): return hashlib.sha256(open(p, "rb").read()).hexdigest()
api = HfApi()
out = {{}}
out["config"] = digest(hf_hub_download("{MODEL}", "config.json"))
out["tag"] = digest(hf_hub_download("{MODEL}", "config.json", revision="v1.0"))
out["nested"] = digest(hf_hub_download("{MODEL}", "nested.txt", subfolder="sub"))
out["big"] = digest(hf_hub_download("acme/big-data", "big.bin", repo_type="dataset"))
root = snapshot_download("{MODEL}")
out["snapshot"] = {{os.path.relpath(os.path.join(d, f), root): digest(os.path.join(d, f))
                    for d, _, fs in os.walk(root) for f in fs}}
out["sha"] = api.model_info("{MODEL}").sha
out["files"] = sorted(api.list_repo_files("{MODEL}"))
out["tags"] = sorted(t.name for t in api.list_repo_refs("{MODEL}").tags)
out["exists"] = [api.file_exists("{MODEL}", "config.json"), api.file_exists("{MODEL}", "nope.txt")]
fs = HfFileSystem()
with fs.open("{MODEL}/model.safetensors", "rb", block_size=4096) as f:
    f.seek(1000); out["range"] = hashlib.sha256(f.read(5000)).hexdigest()
print(json.dumps(out))
"""
    files = emu.files
    first = run_client(code, regional.url, tmp_path / "client1")
    assert isinstance(first, dict)
    assert first["config"] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert first["tag"] == sha256(files.file_bytes("model", MODEL, "v1.0", "config.json"))
    assert first["nested"] == sha256(files.file_bytes("model", MODEL, "main", "sub/nested.txt"))
    assert first["big"] == sha256(files.file_bytes(*BIG[:2], "main", BIG[2]))
    main_paths = files.paths("model", MODEL, "main")
    assert first["snapshot"] == {p: sha256(files.file_bytes("model", MODEL, "main", p)) for p in main_paths}
    assert first["sha"] == files.commit("model", MODEL, "main")
    assert first["files"] == sorted(main_paths)
    assert "v1.0" in first["tags"]
    assert first["exists"] == [True, False]
    weights = files.file_bytes("model", MODEL, "main", "model.safetensors")
    assert first["range"] == sha256(weights[1000:6000])
    # A second client on the regional mirror, and one straight on the central mirror: no new Hub fetch.
    second = run_client(code, regional.url, tmp_path / "client2")
    direct = run_client(code, central.url, tmp_path / "client3")
    assert second == first and direct == first
    # Once per distinct blob: config.json has two (main's and v1.0's), which the emulator counts under one path.
    expected = {f"model:{MODEL}/{path}": 1 for path in main_paths}
    expected[f"model:{MODEL}/config.json"] = 2
    expected["dataset:acme/big-data/big.bin"] = 1
    assert emu.stats()["fetches"] == expected


def test_chained_pair_streams_datasets_and_keeps_gated_files_gated(emu: EmulatorHandle, fleet: Fleet,
                                                                     tmp_path: Path) -> None:
    """Through a regional -> central chain, with Xet left on in the client: datasets streaming works, and a gated
    file cached for an entitled caller is refused to callers without the right token at both ends."""
    central = fleet.node(emu.url)
    regional = fleet.node(central.url, s3=False)
    code = """
import json
from datasets import load_dataset
rows = list(load_dataset("acme/tiny-parquet", split="train", streaming=True))
print(json.dumps({"rows": len(rows)}))
"""
    out = run_client(code, regional.url, tmp_path / "datasets", timeout=180, HF_HUB_DISABLE_XET="0")
    assert out == {"rows": emu.files.row_count("acme/tiny-parquet", "train")}
    gated = "/acme/gated-model/resolve/main/model.safetensors"
    data = emu.files.file_bytes("model", "acme/gated-model", "main", "model.safetensors")
    code = f"""
import json, hashlib
from huggingface_hub import hf_hub_download
p = hf_hub_download("acme/gated-model", "model.safetensors", token="{GOOD_TOKEN}")
print(json.dumps({{"sha": hashlib.sha256(open(p, "rb").read()).hexdigest()}}))
"""
    assert run_client(code, regional.url, tmp_path / "gated", HF_HUB_DISABLE_XET="0") == {"sha": sha256(data)}
    for node in (regional, central):  # now cached at both ends
        for headers in ({}, {"authorization": f"Bearer {DENIED_TOKEN}"}, {"authorization": "Bearer hf_bogus"}):
            response = httpx.get(node.url + gated, headers=headers, timeout=30)
            assert response.status_code in (401, 403), (node.url, headers, response.status_code)
            assert response.content != data
        assert httpx.get(node.url + gated, headers={"authorization": f"Bearer {GOOD_TOKEN}"},
                         timeout=30).content == data

"""A fleet on real engines (issue 25): 3 nodes on one bucket and one PostgreSQL database (``--metadata-url``).

Real processes on 127.0.0.1: the Hub emulator, SeaweedFS, PostgreSQL 15 (``tests/support/postgres_server.py``, a fresh
database per test) and ``python -m mirror serve --storage s3 ... --metadata-url postgresql://...`` nodes. The
database grants the fill leases (its clock, a fencing epoch), renewed by a thread of each node; followers are told
of changes by LISTEN/NOTIFY. Upstream traffic is counted by the emulator (bodies and bytes served).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_sync import cli
from tests.support import fleet as fleet_support
from tests.support import postgres_server, s3_server
from tests.support.fleet import BIG, BIG_URL, MODEL, Fleet, fill_active, fill_written, get, sha256, wait_until
from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, metric

EMULATOR_FILES = fleet_support.EMULATOR_FILES  # for ``emu`` (tests/e2e/conftest.py)
TTL = 3.0  # the fleet lease ttl of these tests (default 10): a dead or frozen filler is passed over after it
# The tests that stop the database: a node gives up on it after 2 s (default 10), so a request that needs it while
# it is down fails after that, not after the default's wait.
DATABASE_DOWN = {"HF_MIRROR_METADATA_CONNECT_TIMEOUT": "2"}


@pytest.fixture
def database(postgres: postgres_server.PostgresServer) -> str:
    return postgres.create_database()


def start_fleet(fleet: Fleet, emu: EmulatorHandle, database: str, count: int = 3,
                env: dict[str, str] | None = None) -> list[MirrorProcess]:
    """``count`` nodes on the fleet's bucket and ``database``, with the lease ttl of these tests (``env``: more
    settings for every node)."""
    return fleet.start(count, emu.url, "--metadata-url", database,
                       env={"HF_MIRROR_FLEET_LEASE_SECONDS": str(TTL), **(env or {})})


def blob_keys(fleet: Fleet) -> set[str]:
    return {key for key in fleet.bucket_keys() if key.startswith("blobs/")}


def lease_row(database: str, etag: str) -> tuple[Any, ...] | None:
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        return conn.execute("SELECT owner, epoch FROM hf_mirror_fill_leases WHERE etag = %s", (etag,)).fetchone()


def stream_into(url: str, got: dict[str, Any]) -> None:
    body = bytearray()
    try:
        with httpx.stream("GET", url, timeout=120) as response:
            got["status"] = response.status_code
            for chunk in response.iter_raw():
                body += chunk
    except httpx.HTTPError as exc:
        got["error"] = type(exc).__name__
    got["body"] = bytes(body)
    got["done"] = time.monotonic()


def test_cold_clients_on_three_nodes_one_upstream_fetch(emu: EmulatorHandle, fleet: Fleet,
                                                        database: str) -> None:
    started_nodes = start_fleet(fleet, emu, database)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=4 * 2**20)  # about 2 s: the 15 requests overlap the fill on every node
    barrier = threading.Barrier(15)

    def one(i: int) -> tuple[int, str]:
        barrier.wait()
        status, body, _ = get(started_nodes[i % 3].url + BIG_URL)
        return status, sha256(body)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(15) as pool:
        results = list(pool.map(one, range(15)))
    elapsed = time.monotonic() - started
    assert results == [(200, sha256(data))] * 15, results
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    wait_until(lambda: blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"}, "one blob in the bucket")
    assert not any(key.startswith("leases/") for key in fleet.bucket_keys()), "the database holds the leases"
    row = lease_row(database, etag)
    assert row is not None and row[0] is None, row  # released after the commit
    print(f"15 cold requests over 3 nodes (database leases): {elapsed:.2f}s, upstream fetches: 1, "
          f"upstream bytes {emu.stats()['bytes_served'] / len(data):.2f}x the file")


def test_filler_killed_at_30_percent_is_taken_over_within_the_ttl(emu: EmulatorHandle, fleet: Fleet,
                                                                 database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=2**20)  # an 8 s fill
    got: list[dict[str, Any]] = [{}, {}, {}]
    readers = [threading.Thread(target=stream_into, args=(node.url + BIG_URL, got[i]))
               for i, node in enumerate((a, b, c))]
    readers[0].start()
    wait_until(lambda: fill_written(a) > 256 * 1024, "node A to be filling")
    readers[1].start()
    readers[2].start()
    wait_until(lambda: fill_active(b) and fill_active(c), "nodes B and C to follow A's fill")
    wait_until(lambda: fill_written(a) >= 0.3 * len(data), "node A at 30 %")
    a.kill9()
    killed_at = time.monotonic()
    # What upstream sent the dead node (its socket is gone: the emulator goes on "sending" into the void, so its
    # later count is no measure; the survivors count what they fetch themselves).
    sent_to_a = emu.stats()["bytes_served"]
    emu.clear_faults()
    for reader in readers[1:]:
        reader.join(60)
    readers[0].join(10)
    for result in got[1:]:
        assert result.get("status") == 200 and result["body"] == data, {k: v for k, v in result.items() if k != "body"}
    takeover = max(result["done"] for result in got[1:]) - killed_at
    assert takeover < TTL + 5, f"the takeover took {takeover:.1f}s (ttl {TTL}s)"
    fetched = sum(metric(node, "hf_mirror_bytes_fetched_total") for node in (b, c))
    upstream = (sent_to_a + fetched) / len(data)
    assert upstream <= 1.3, f"upstream bytes {upstream:.2f}x the file: {sent_to_a} to A, {fetched} to B and C"
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    wait_until(lambda: blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"}, "one blob in the bucket")
    row = lease_row(database, etag)
    assert row is not None and row[1] >= 2, row  # granted again, under a new epoch
    print(f"filler killed at 30 %: B and C complete {takeover:.2f}s after the kill (ttl {TTL}s), "
          f"upstream bytes {upstream:.2f}x the file")


def test_filler_frozen_past_its_lease_commits_nothing(emu: EmulatorHandle, fleet: Fleet,
                                                      database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    emu.set_faults(throttle_bps=2**20)
    got: list[dict[str, Any]] = [{}, {}, {}]
    readers = [threading.Thread(target=stream_into, args=(node.url + BIG_URL, got[i]))
               for i, node in enumerate((a, b, c))]
    readers[0].start()
    wait_until(lambda: fill_written(a) > 256 * 1024, "node A to be filling")
    readers[1].start()
    readers[2].start()
    wait_until(lambda: fill_active(b) and fill_active(c), "nodes B and C to follow A's fill")
    wait_until(lambda: fill_written(a) >= 0.3 * len(data), "node A at 30 %")
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        emu.clear_faults()
        for reader in readers[1:]:
            reader.join(60)
        for result in got[1:]:
            assert result.get("status") == 200 and result["body"] == data, \
                {k: v for k, v in result.items() if k != "body"}
        moved_on = max(result["done"] for result in got[1:]) - stopped_at
        assert moved_on < TTL + 10, f"the followers were held {moved_on:.1f}s by a frozen filler (ttl {TTL}s)"
        wait_until(lambda: blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"}, "the takeover's commit")
        row = lease_row(database, etag)
        assert row is not None and row[1] >= 2, row
    finally:
        a.proc.send_signal(signal.SIGCONT)
    # A wakes up past its lease: its renewal finds the lease gone, it stops and commits nothing.
    wait_until(lambda: "lost the fill lease" in a.log(), "node A to learn it lost the lease", timeout=30)
    readers[0].join(60)
    if got[0].get("status") == 200 and len(got[0]["body"]) == len(data):
        assert got[0]["body"] == data
    assert f"as {etag}" not in a.log(), a.log()[-3000:]  # "committed <repo> <path> (<n> bytes) as <etag>"
    assert blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"}
    uploads = fleet.s3.client().list_multipart_uploads(Bucket=fleet.s3.bucket, Prefix=fleet.prefix)
    assert not uploads.get("Uploads"), uploads.get("Uploads")
    status, body, _ = get(a.url + BIG_URL)
    assert status == 200 and body == data
    print(f"filler frozen at 30 %: followers done {moved_on:.2f}s after SIGSTOP (ttl {TTL}s)")


@pytest.fixture(autouse=True)
def _needs_the_fleet_extra() -> Iterator[None]:
    pytest.importorskip("psycopg")
    yield


def test_database_down_hits_served_misses_refused_then_back(emu: EmulatorHandle, fleet: Fleet) -> None:
    """A database of its own (it is stopped and started again): hits need no database; a cold miss fails while it is
    down; once it is back, the node carries on without a restart."""
    with postgres_server.PostgresServer() as own:
        (node,) = start_fleet(fleet, emu, own.create_database(), count=1, env=DATABASE_DOWN)
        warm, cold = (f"/{MODEL}/resolve/main/{path}" for path in ("config.json", "sub/nested.txt"))
        expected = {url: emu.files.file_bytes("model", MODEL, "main", url.rsplit("/main/", 1)[1])
                    for url in (warm, cold)}
        status, body, _ = get(node.url + warm)
        assert status == 200 and body == expected[warm]
        # The client has every byte before the fill has committed the blob: a hit only once it has.
        wait_until(lambda: httpx.head(node.url + warm).headers.get("x-mirror-cache") == "hit", "the warm file stored")
        own.stop()
        for _ in range(3):
            status, body, _ = get(node.url + warm)
            assert status == 200 and body == expected[warm], status
        # No lease can be granted: the fill fails (its response may have begun: then the transfer is cut).
        try:
            status, body, _ = get(node.url + cold)
        except httpx.HTTPError:
            pass
        else:
            assert status == 503 or body != expected[cold], (status, body[:200])
        assert "MetadataUnavailable" in node.log() or "metadata database" in node.log()
        own.start()

        def served() -> bool:
            status, body, _ = get(node.url + cold)
            return status == 200 and body == expected[cold]

        wait_until(served, "the cold file once the database is back", timeout=60)


def test_main_resolved_on_one_node_is_answered_by_another_without_upstream(emu: EmulatorHandle, fleet: Fleet,
                                                                         database: str) -> None:
    a, b = start_fleet(fleet, emu, database, count=2)
    url = f"/{MODEL}/resolve/main/config.json"
    expected = emu.files.file_bytes("model", MODEL, "main", "config.json")
    status, body, headers = get(a.url + url)
    assert status == 200 and body == expected
    commit = headers["x-repo-commit"]

    def shared() -> bool:  # A hands what it learnt to the database in the background
        import psycopg

        with psycopg.connect(database, autocommit=True) as conn:
            refs = conn.execute("SELECT commit FROM hf_mirror_refs WHERE repo = %s AND revision = 'main'",
                                (f"model:{MODEL}",)).fetchall()
            files = conn.execute("SELECT count(*) FROM hf_mirror_files WHERE path = 'config.json'").fetchone()
            public = conn.execute("SELECT count(*) FROM hf_mirror_access WHERE subject = 'public'").fetchone()
        return refs == [(commit,)] and files == (1,) and public is not None and public[0] >= 1

    wait_until(shared, "A's ref, file entry and access confirmation in the database")
    emu.reset_stats()
    for _ in range(2):
        status, body, headers = get(b.url + url)
        assert status == 200 and body == expected and headers["x-repo-commit"] == commit
    asked = emu.stats()
    # (counts["requests"] counts the emulator's own control requests too, such as this stats call)
    assert not asked["requests"] and not asked["fetches"], asked["requests"]
    assert not {kind: n for kind, n in asked["counts"].items() if n and kind != "requests"}, asked["counts"]
    print("main resolved on A: B answered it (HEAD and body) with 0 upstream requests")


def test_a_pin_on_one_node_survives_a_gc_on_another(emu: EmulatorHandle, fleet: Fleet, database: str,
                                                    tmp_path: Path) -> None:
    (a,) = start_fleet(fleet, emu, database, count=1)
    small = f"/{MODEL}/resolve/main/config.json"
    assert get(a.url + small)[0] == 200 and get(a.url + BIG_URL)[0] == 200
    pinned = emu.files.etag("model", MODEL, "main", "config.json")
    big = emu.files.etag(*BIG[:2], "main", BIG[2])
    wait_until(lambda: blob_keys(fleet) == {f"blobs/{e[:2]}/{e}" for e in (pinned, big)}, "both blobs committed")
    response = httpx.post(a.url + f"/api/mirror/repos/model/{MODEL}/pin", json={}, timeout=30)
    assert response.status_code == 200, response.text
    # The gc runs on another node: a fresh cache directory, whose own index knows nothing of A's pin or files.
    other = tmp_path / "gc-node"
    other.mkdir()
    result = cli("cache", "gc", "--max-size", "1K", "--cache-dir", str(other), "--storage", "s3",
                 "--s3-endpoint", fleet.s3.endpoint, "--s3-bucket", fleet.s3.bucket, "--s3-prefix", fleet.prefix,
                 "--metadata-url", database, env=fleet.s3.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert blob_keys(fleet) == {f"blobs/{pinned[:2]}/{pinned}"}, (blob_keys(fleet), result.stdout)


# --- a local fault never destroys the shared copy (issue 25 item 5) ---------------------------------------------------


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def bucket_object(fleet: Fleet, etag: str) -> bytes | None:
    client = fleet.s3.client()
    try:
        return bytes(client.get_object(Bucket=fleet.s3.bucket, Key=f"{fleet.prefix}blobs/{etag[:2]}/{etag}")
                     ["Body"].read())
    except client.exceptions.NoSuchKey:
        return None


def verify_cli(fleet: Fleet, node: MirrorProcess, database: str) -> Any:
    return cli("cache", "verify", "--cache-dir", str(node.cache_dir), "--storage", "s3",
               "--s3-endpoint", fleet.s3.endpoint, "--s3-bucket", fleet.s3.bucket, "--s3-prefix", fleet.prefix,
               "--metadata-url", database, env=fleet.s3.env)


def test_a_flipped_byte_in_a_hot_tier_copy_never_deletes_the_bucket_object(emu: EmulatorHandle, fleet: Fleet,
                                                                          database: str) -> None:
    """Node A's scrub, then ``cache verify`` on A, find A's hot-tier copy bad: each removes that copy only, the bucket
    object (checked on its own) stays, and A serves the right bytes again, copied from the bucket, not upstream."""
    a, b = start_fleet(fleet, emu, database, count=2)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    status, body, _ = get(a.url + BIG_URL)
    assert status == 200 and body == data
    hot = hot_copy(a, etag)
    # the filler uploads to the bucket, then enters its hot tier (mirror/storage/s3/store.py): wait for both
    wait_until(lambda: blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"} and hot.exists(),
               "the blob in the bucket and in A's hot tier")
    assert hot.read_bytes() == data

    flip_a_byte(hot)
    get(a.url + BIG_URL)  # a hit on the bad copy (served this once): the scrub checks it next
    wait_until(lambda: "this node's copy of blob" in a.log(), "A's scrub to drop its bad copy")
    assert not hot.exists() or sha256(hot.read_bytes()) == etag
    assert bucket_object(fleet, etag) == data  # the bucket object passed its own check and stays
    assert "removed from the store" not in a.log(), a.log()[-3000:]
    for node in (a, b):
        status, body, _ = get(node.url + BIG_URL)
        assert status == 200 and body == data
    assert hot.read_bytes() == data  # copied back from the bucket
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]

    a.stop()
    flip_a_byte(hot)
    result = verify_cli(fleet, a, database)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"CORRUPT LOCAL COPY {etag}" in result.stdout and "removed from this node" in result.stdout, result.stdout
    assert "0 corrupt, 1 corrupt local copies" in result.stdout, result.stdout
    assert not hot.exists()
    assert bucket_object(fleet, etag) == data
    status, body, _ = get(b.url + BIG_URL)
    assert status == 200 and body == data
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    print("a flipped byte in A's hot-tier copy: the scrub and `cache verify` each dropped that copy only; the bucket "
          "object stayed, A and B served the right bytes, 1 upstream fetch in all")


def test_cache_verify_deletes_a_bucket_object_that_fails_its_own_check(emu: EmulatorHandle, fleet: Fleet,
                                                                      database: str) -> None:
    (a,) = start_fleet(fleet, emu, database, count=1)
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    status, body, _ = get(a.url + BIG_URL)
    assert status == 200 and body == data
    hot = hot_copy(a, etag)
    wait_until(lambda: blob_keys(fleet) == {f"blobs/{etag[:2]}/{etag}"} and hot.exists(),
               "the blob in the bucket and in A's hot tier")
    a.stop()
    assert hot.read_bytes() == data  # A's own copy is good: the bucket object is checked anyway
    rotten = bytearray(data)
    rotten[len(rotten) // 2] ^= 0xFF
    fleet.s3.client().put_object(Bucket=fleet.s3.bucket, Key=f"{fleet.prefix}blobs/{etag[:2]}/{etag}",
                                 Body=bytes(rotten))
    result = verify_cli(fleet, a, database)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"CORRUPT {etag}" in result.stdout and "removed from the bucket" in result.stdout, result.stdout
    assert "1 corrupt" in result.stdout
    assert bucket_object(fleet, etag) is None and not hot.exists()
    result = verify_cli(fleet, a, database)
    assert result.returncode == 0 and "verified 0 blobs" in result.stdout, result.stdout + result.stderr

# --- evictions are the fleet's (issue 25 item 4) --------------------------------------------------------------------

ADMIN = "fleet-admin-token"


def live_marks(database: str, etag: str, node: MirrorProcess | None = None) -> int:
    """Live busy marks of ``etag`` in the database (of ``node``'s process only, when given)."""
    import psycopg

    query = "SELECT count(*) FROM hf_mirror_busy WHERE etag = %s AND expires > now()"
    args: tuple[Any, ...] = (etag,)
    if node is not None:
        assert node.proc is not None
        query += " AND node LIKE %s"
        args += (f"%:{node.proc.pid}:%",)
    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()
    return int(row[0]) if row else 0


def evict(node: MirrorProcess, repo: str) -> dict[str, Any]:
    response = httpx.post(node.url + f"/api/mirror/repos/{repo}/evict", json={}, timeout=60,
                          headers={"authorization": f"Bearer {ADMIN}"})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def gc_on(node: MirrorProcess, fleet: Fleet, database: str) -> str:
    """``hf-mirror cache gc --max-size 1K`` on ``node``'s cache directory (beside the running server)."""
    result = cli("cache", "gc", "--max-size", "1K", "--cache-dir", str(node.cache_dir), "--storage", "s3",
                 "--s3-endpoint", fleet.s3.endpoint, "--s3-bucket", fleet.s3.bucket, "--s3-prefix", fleet.prefix,
                 "--metadata-url", database, env=fleet.s3.env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def hot_copy(node: MirrorProcess, etag: str) -> Path:
    return node.cache_dir / "blobs" / etag[:2] / etag


def test_an_eviction_on_one_node_waits_for_a_read_on_another_then_every_node_drops_it(
        emu: EmulatorHandle, fleet: Fleet, database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database, env={"HF_MIRROR_ADMIN_TOKEN": ADMIN})
    data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])
    etag = emu.files.etag(*BIG[:2], "main", BIG[2])
    key = f"blobs/{etag[:2]}/{etag}"
    status, body, _ = get(a.url + BIG_URL)
    assert status == 200 and body == data and emu.fetch_count(*BIG) == 1
    wait_until(lambda: blob_keys(fleet) == {key}, "A's commit")
    # B streams the blob (its copy from the bucket, then its hot tier) to a client that reads slowly.
    with httpx.Client(timeout=120) as client, client.stream("GET", b.url + BIG_URL) as slow:
        assert slow.status_code == 200
        chunks = slow.iter_raw(64 * 1024)
        received = bytearray(next(chunks))
        wait_until(lambda: live_marks(database, etag, b) > 0, "B's busy mark in the database")
        # The quota's gc and an operator's evict on A, while B's client is still reading: the fleet keeps it.
        gc_on(a, fleet, database)
        assert evict(a, f"dataset/{BIG[1]}")["blobs"] == 0
        assert blob_keys(fleet) == {key}, "a blob read on B was evicted by A"
        # C finds it in the bucket: no second upstream fetch.
        status, body, _ = get(c.url + BIG_URL)
        assert status == 200 and body == data
        for chunk in chunks:
            received += chunk
    assert bytes(received) == data  # B's reader got every byte right
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    wait_until(lambda: hot_copy(b, etag).exists() and hot_copy(c, etag).exists(), "B's and C's hot-tier copies")
    # Every read over: the next evict on A removes it, and B and C drop their hot copies when told.
    wait_until(lambda: live_marks(database, etag) == 0, "the busy marks to go once the reads ended")
    assert evict(a, f"dataset/{BIG[1]}")["blobs"] == 1
    assert blob_keys(fleet) == set()
    wait_until(lambda: not hot_copy(b, etag).exists() and not hot_copy(c, etag).exists(),
              "B and C to drop their hot copies")
    status, body, headers = get(b.url + BIG_URL)  # from upstream again, never a stale copy
    assert status == 200 and body == data and headers.get("x-mirror-cache") != "hit", headers
    assert emu.fetch_count(*BIG) == 2, emu.stats()["fetches"]
    print("evict and gc on A while B streamed: kept (0 evicted), C served from the bucket (1 upstream fetch); "
          "after the read: evicted, dropped from B's and C's hot tiers")


def test_a_pin_through_one_node_survives_an_evict_and_a_gc_on_another(emu: EmulatorHandle, fleet: Fleet,
                                                                     database: str) -> None:
    a, b = start_fleet(fleet, emu, database, count=2, env={"HF_MIRROR_ADMIN_TOKEN": ADMIN})
    url = f"/{MODEL}/resolve/main/config.json"
    status, body, _ = get(b.url + url)
    assert status == 200
    etag = emu.files.etag("model", MODEL, "main", "config.json")
    key = f"blobs/{etag[:2]}/{etag}"
    wait_until(lambda: key in blob_keys(fleet), "B's commit")
    response = httpx.post(b.url + f"/api/mirror/repos/model/{MODEL}/pin", json={}, timeout=30)
    assert response.status_code == 200, response.text
    status, _, _ = get(a.url + url)  # A knows the file too (its index has no pin of it)
    assert status == 200
    wait_until(lambda: live_marks(database, etag) == 0, "the reads' marks to go")
    assert evict(a, f"model/{MODEL}")["blobs"] == 0
    gc_on(a, fleet, database)
    assert key in blob_keys(fleet)
    assert hot_copy(b, etag).exists()
    response = httpx.post(b.url + f"/api/mirror/repos/model/{MODEL}/unpin", json={}, timeout=30,
                          headers={"authorization": f"Bearer {ADMIN}"})
    assert response.status_code == 200, response.text
    assert evict(a, f"model/{MODEL}")["blobs"] >= 1
    assert key not in blob_keys(fleet)
    wait_until(lambda: not hot_copy(b, etag).exists(), "B to drop its hot copy")

def test_bucket_down_hot_tier_hits_served_other_reads_fail_then_back(emu: EmulatorHandle,
                                                                    postgres: postgres_server.PostgresServer,
                                                                    tmp_path: Path) -> None:
    """A bucket of its own (stopped and started again): a node's hot-tier hits need no bucket; a blob only in the
    bucket, and a cold miss, fail while it is down (nothing is fetched upstream for the miss); /healthz stays up;
    once the bucket is back, both are served without a restart (docs/scale-out.md, "When the bucket is down")."""
    with s3_server.S3Server(tmp_path / "own-s3") as own:
        fleet = Fleet(own, tmp_path)
        try:
            a, b = start_fleet(fleet, emu, postgres.create_database(), count=2)
            paths = {"warm": "config.json", "only_a": "README.md", "cold": "sub/nested.txt"}
            urls = {name: f"/{MODEL}/resolve/main/{path}" for name, path in paths.items()}
            expected = {name: emu.files.file_bytes("model", MODEL, "main", path) for name, path in paths.items()}
            for node, name in ((a, "warm"), (b, "warm"), (a, "only_a")):
                status, body, _ = get(node.url + urls[name])
                assert status == 200 and body == expected[name]
            committed = {emu.files.etag("model", MODEL, "main", paths[name]) for name in ("warm", "only_a")}
            # Only committed blobs enter a hot tier: wait for the uploads before taking the bucket away.
            wait_until(lambda: blob_keys(fleet) == {f"blobs/{e[:2]}/{e}" for e in committed}, "both blobs committed")
            # ... and for each node's own copy (B's follows A's commit): a hot-tier hit only once it is there.
            warm_etag = emu.files.etag("model", MODEL, "main", paths["warm"])
            wait_until(lambda: all(hot_copy(node, warm_etag).exists() for node in (a, b)), "the hot-tier copies")
            own.stop()
            for node in (a, b):
                status, body, headers = get(node.url + urls["warm"])
                assert status == 200 and body == expected["warm"] and headers["x-mirror-cache"] == "hit"
                assert httpx.get(node.url + "/healthz", timeout=10).status_code == 200
            emu.reset_stats()
            for node, name in ((b, "only_a"), (a, "cold")):
                try:
                    status, body, _ = get(node.url + urls[name])
                except httpx.HTTPError:  # the response had begun: the transfer is cut
                    continue
                assert status == 503 or body != expected[name], (name, status)
            assert emu.fetch_count("model", MODEL, paths["cold"]) == 0, emu.stats()["fetches"]
            own.start()

            def served(node: MirrorProcess, name: str) -> bool:
                try:
                    status, body, _ = get(node.url + urls[name])
                except httpx.HTTPError:
                    return False
                return status == 200 and body == expected[name]

            wait_until(lambda: served(b, "only_a"), "B's read from the bucket once it is back", timeout=60)
            wait_until(lambda: served(a, "cold"), "the cold file once the bucket is back", timeout=60)
        finally:
            fleet.stop()

# --- shared answers, access, the database's restart, the Xet secret (#25 item 3) --------------------------------------

def upstream_asked(emu: EmulatorHandle) -> dict[str, int]:
    """What the Hub emulator was asked since its last reset, by kind (its own control requests aside)."""
    stats = emu.stats()
    asked = {kind: n for kind, n in stats["counts"].items() if n and kind != "requests"}
    return {**asked, **{f"fetch {path}": n for path, n in stats["fetches"].items() if n}}


def answers_in(database: str, repo: str) -> int:
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM hf_mirror_answers WHERE repo = %s", (repo,)).fetchone()
    return int(row[0]) if row else 0


def test_api_json_and_listings_fetched_on_one_node_are_answered_by_the_others(emu: EmulatorHandle,
                                                                             fleet: Fleet, database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database)
    commit = emu.files.commit("model", MODEL, "main")
    paths = [f"/api/models/{MODEL}", f"/api/models/{MODEL}/revision/main",
             f"/api/models/{MODEL}/tree/main?recursive=true&expand=false",
             f"/api/models/{MODEL}/tree/{commit}?recursive=true&expand=false",
             "/api/models?search=tiny"]  # a route-table read (shared by everyone who sends no token)
    first = {}
    for path in paths:
        response = httpx.get(a.url + path, timeout=30)
        assert response.status_code == 200 and response.headers["x-mirror-cache"] == "miss", (path, response.text)
        first[path] = response.json()
    listed = [item for item in first[paths[3]] if item.get("lfs")]
    # A file of the repo through A too: whether anonymous callers may read its content is then known to the fleet
    # (a listing says nothing of it: without this, B would ask upstream once, to confirm it).
    assert httpx.head(f"{a.url}/{MODEL}/resolve/main/README.md", timeout=30).status_code == 200
    assert listed and all(len(item.get("xetHash", "")) == 64 for item in listed)  # upstream's Xet hashes, kept

    def shared() -> bool:  # A hands them to the database in the background
        import psycopg

        with psycopg.connect(database, autocommit=True) as conn:
            reads = conn.execute("SELECT count(*) FROM hf_mirror_answers WHERE repo IS NULL").fetchone()
            hashes = conn.execute("SELECT count(*) FROM hf_mirror_xet WHERE commit = %s", (commit,)).fetchone()
        return answers_in(database, f"model:{MODEL}") >= 4 and reads == (1,) and hashes == (len(listed),)

    wait_until(shared, "A's answers and Xet hashes in the database")
    emu.reset_stats()
    for node in (b, c):
        for path in paths:
            response = httpx.get(node.url + path, timeout=30)
            assert response.status_code == 200 and response.headers["x-mirror-cache"] == "hit", (path, node.url)
            assert response.json() == first[path], path  # Xet hashes and all
        commit_head = httpx.head(f"{node.url}/{MODEL}/resolve/main/config.json", timeout=30)
        assert commit_head.status_code == 200 and commit_head.headers["x-repo-commit"] == commit
    assert upstream_asked(emu) == {}, emu.requests()
    print(f"{len(paths)} API answers fetched on A: B and C answered them with 0 upstream requests")


def test_a_private_repo_confirmed_on_one_node_is_refused_to_anonymous_callers_on_the_others(
        emu: EmulatorHandle, fleet: Fleet, database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database)
    private = "acme/private-model"
    good = {"authorization": f"Bearer {GOOD_TOKEN}"}
    urls = [f"/{private}/resolve/main/config.json", f"/{private}/resolve/main/model.safetensors",
            f"/api/models/{private}", f"/api/models/{private}/revision/main",
            f"/api/models/{private}/tree/main?recursive=true&expand=false"]
    secret = emu.files.file_bytes("model", private, "main", "config.json")
    for url in urls:
        response = httpx.get(a.url + url, headers=good, timeout=60)
        assert response.status_code == 200, (url, response.status_code, response.text[:200])
    wait_until(lambda: answers_in(database, f"model:{private}") >= 3, "A's answers of the private repo shared")
    for node in (b, c):
        for headers in ({}, {"authorization": f"Bearer {DENIED_TOKEN}"}):
            for url in urls:
                response = httpx.get(node.url + url, headers=headers, timeout=60)
                assert response.status_code in (401, 403, 404), (node.url, url, headers, response.status_code)
                assert response.headers.get("x-error-code"), response.headers
                assert secret not in response.content and b'"sha"' not in response.content, response.content[:300]
    emu.reset_stats()  # the confirmed token is served by B from what A learnt
    for url in urls[:3]:
        response = httpx.get(b.url + url, headers=good, timeout=60)
        assert response.status_code == 200, (url, response.status_code)
    assert httpx.get(b.url + urls[0], headers=good, timeout=60).content == secret
    assert not any(kind.startswith(("api", "resolve", "fetch", "cdn")) for kind in upstream_asked(emu)), \
        upstream_asked(emu)


def test_the_database_restarted_under_load_warm_hits_keep_succeeding(emu: EmulatorHandle,
                                                                       fleet: Fleet) -> None:
    with postgres_server.PostgresServer() as own:
        database = own.create_database()
        started = start_fleet(fleet, emu, database, env=DATABASE_DOWN)
        warm = [f"/{MODEL}/resolve/main/{path}" for path in ("config.json", "model.safetensors", "sub/nested.txt")]
        expected = {url: emu.files.file_bytes("model", MODEL, "main", url.rsplit("/main/", 1)[1]) for url in warm}
        for node in started:
            for url in warm:
                status, body, _ = get(node.url + url)
                assert status == 200 and body == expected[url]
        stop = threading.Event()
        results: list[tuple[str, int, bool]] = []
        failures: list[str] = []
        timings: list[tuple[float, float]] = []

        def client(node: MirrorProcess) -> None:
            while not stop.is_set():
                for url in warm:
                    t0 = time.monotonic()
                    try:
                        status, body, _ = get(node.url + url, timeout=60)
                    except httpx.HTTPError as exc:
                        failures.append(f"{node.url}{url}: {type(exc).__name__}")
                        continue
                    results.append((node.url, status, body == expected[url]))
                    timings.append((time.monotonic(), time.monotonic() - t0))

        clients = [threading.Thread(target=client, args=(node,)) for node in started for _ in range(2)]
        for thread in clients:
            thread.start()
        try:
            wait_until(lambda: len(results) > 30, "warm hits before the restart")
            own.stop()
            marks = [time.monotonic()]
            down_at = len(results)
            # A miss while it is down: a clear 503 (its fill cannot have a lease), never a cut transfer.
            cold = f"/datasets/{BIG[1]}/resolve/main/{BIG[2]}"
            misses = []
            for node in started:
                response = httpx.get(node.url + cold, timeout=60)
                misses.append((response.status_code, response.headers.get("x-error-code")))
            wait_until(lambda: len(results) > down_at + 60, "warm hits while the database is down", timeout=60)
            marks.append(time.monotonic())
            own.start()
            marks.append(time.monotonic())
            up_at = len(results)
            wait_until(lambda: len(results) > up_at + 30, "warm hits after the restart", timeout=60)
        finally:
            stop.set()
            for thread in clients:
                thread.join(120)
        for name, lo, hi in (("before", 0, marks[0]), ("down", marks[0], marks[1]), ("after", marks[2], 1e12)):
            part = sorted(d for t, d in timings if lo <= t < hi)
            print(name, len(part), part[len(part) // 2] if part else None, part[-1] if part else None)
        assert not failures, failures[:5]
        assert all(status == 200 and right for _, status, right in results), \
            [r for r in results if r[1] != 200 or not r[2]][:5]
        assert misses == [(503, "MetadataUnavailable")] * 3, misses
        data = emu.files.file_bytes(*BIG[:2], "main", BIG[2])

        def filled() -> bool:  # a fill needs the database's lease again
            # The node's pool reconnects with a growing delay (psycopg_pool: 1, 2, 4 s...), so a first miss after the
            # restart can still find no connection: its fill fails after the response began, a cut transfer the
            # client resumes (docs/scale-out.md), which is what this retry does.
            try:
                status, body, _ = get(started[1].url + cold)
            except httpx.TransportError:
                return False
            return status == 200 and body == data

        wait_until(filled, "a cold file filled once the database is back", timeout=60)
        # ... and what a node learns is shared again: a listing fetched on C is B's without upstream. C may not have
        # asked the database since it came back: its first try can fail, and C then leaves it alone (and drops
        # what it would write) for a few seconds, by design. So a few listings, each a new answer, until one is in.
        shared = None
        for query in ("?recursive=true&expand=false", "?recursive=true", "?expand=false", ""):
            listing = f"/api/datasets/{BIG[1]}/tree/main{query}"
            before = answers_in(database, f"dataset:{BIG[1]}")
            assert httpx.get(started[2].url + listing, timeout=30).status_code == 200
            with contextlib.suppress(AssertionError):
                wait_until(lambda: answers_in(database, f"dataset:{BIG[1]}") > before,  # noqa: B023
                          "C's listing in the database", timeout=5)
                shared = listing
                break
        assert shared is not None, "no listing fetched on C reached the database after its restart"
        listing = shared
        emu.reset_stats()
        response = httpx.get(started[1].url + listing, timeout=30)
        assert response.status_code == 200 and response.headers["x-mirror-cache"] == "hit"
        assert upstream_asked(emu) == {}, upstream_asked(emu)
        print(f"database stopped and started under load: {len(results)} warm GETs on 3 nodes, all 200 with the "
              f"right bytes; misses while it was down: {misses[0]}")


def test_a_xet_token_minted_on_one_node_is_accepted_by_another(emu: EmulatorHandle, fleet: Fleet,
                                                              database: str) -> None:
    a, b, c = start_fleet(fleet, emu, database)
    commit = emu.files.commit("model", MODEL, "main")
    head = httpx.head(f"{a.url}/{MODEL}/resolve/main/model.safetensors", timeout=30)
    assert head.status_code == 200
    xet_hash = head.headers["x-xet-hash"]
    token = httpx.get(f"{a.url}/api/models/{MODEL}/xet-read-token/{commit}", timeout=30)
    assert token.status_code == 200, token.text
    access = token.json()["accessToken"]
    wait_until(lambda: _xet_rows(database) >= 1, "A's Xet hash in the database")
    emu.reset_stats()
    for node in (b, c):  # the same secret: the token is good there, and the hash known from A (no listing upstream)
        answer = httpx.get(f"{node.url}/_xet/v1/reconstructions/{xet_hash}",
                           headers={"authorization": f"Bearer {access}"}, timeout=30)
        assert answer.status_code == 200, (node.url, answer.status_code, answer.text[:300])
        assert answer.json()["terms"], answer.text[:300]
        forged = httpx.get(f"{node.url}/_xet/v1/reconstructions/{xet_hash}",
                           headers={"authorization": f"Bearer {access[:-2]}xx"}, timeout=30)
        assert forged.status_code == 401
    assert not any(kind.startswith("api") for kind in upstream_asked(emu)), upstream_asked(emu)
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM hf_mirror_secrets").fetchone() == (1,)


def _xet_rows(database: str) -> int:
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM hf_mirror_xet").fetchone()
    return int(row[0]) if row else 0


def test_a_warm_asked_of_two_nodes_runs_once(emu: EmulatorHandle, fleet: Fleet, database: str) -> None:
    a, b = start_fleet(fleet, emu, database, count=2)
    emu.set_faults(throttle_bps=2 * 2**20)  # a warm of some seconds: the second ask comes while it runs
    warm = {"repo": BIG[1], "type": "dataset"}
    first = httpx.post(a.url + "/api/mirror/warm", json=warm, timeout=60)
    assert first.status_code == 202, first.text
    job = first.json()["id"]
    second = httpx.post(b.url + "/api/mirror/warm", json=warm, timeout=60)
    assert second.status_code == 202 and second.json()["id"] == job, (second.text, job)

    def done() -> bool:  # B answers the status of A's job from the database
        state = httpx.get(f"{b.url}/api/mirror/warm/{job}", timeout=30)
        assert state.status_code == 200, state.text
        return bool(state.json()["state"] == "done")

    wait_until(done, "the warm done, as B tells it", timeout=60)
    emu.clear_faults()
    assert emu.fetch_count(*BIG) == 1, emu.stats()["fetches"]
    assert f"warm {job} done" in a.log()
    assert not re.search(r"warm [0-9a-f]{16} (done|failed)", b.log()), b.log()[-2000:]  # B ran no warm
    again = httpx.post(b.url + "/api/mirror/warm", json=warm, timeout=60)  # a later warm is a new job (a no-op)
    assert again.status_code == 202 and again.json()["id"] != job

"""Ranged reads across a fleet (issue 28 item 1): a Range of a large file that another node fills sparse (the windows
of its own ranged reads) is relayed from that node's peer route, never fetched upstream a second time.

Two nodes on one bucket and one PostgreSQL database (``--metadata-url``), as in ``test_fleet_database.py``. Node A's
ranged read fetches its windows (and the read-ahead) and holds them while its sparse fill lingers (``sparse_linger``:
the fill keeps its lease meanwhile, which publishes A's address); node B's same ranged read is then served from A's
windows with no new upstream byte, and a Range A does not hold yet is fetched there once, for both nodes. Upstream
bytes are counted at the emulator."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_fleet_database import start_fleet
from tests.support import postgres_server
from tests.support.fleet import Fleet, wait_until
from tests.support.hub_emulator.fixtures import generated_bytes
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import metric, wait_for

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
SIZE = 128 * MIB
HUGE = ("dataset", "acme/huge-data", "huge.bin")
HUGE_URL = "/datasets/acme/huge-data/resolve/main/huge.bin"
WINDOW = 4 * MIB
READ_AHEAD = 4 * MIB
RANGE = 8 * MIB
# Both nodes: fills in 4 MiB windows, a Range of a file of 64 MiB or more is sparse, and an idle sparse fill keeps
# its lease (and so answers the other node) far longer than the test takes.
SPARSE_ENV = {"HF_MIRROR_PARALLEL_FILL_THRESHOLD": str(64 * MIB), "HF_MIRROR_FILL_WINDOW": str(WINDOW),
              "HF_MIRROR_SPARSE_FILL_THRESHOLD": str(64 * MIB), "HF_MIRROR_SPARSE_READ_AHEAD": str(READ_AHEAD),
              "HF_MIRROR_SPARSE_LINGER": "120", "HF_MIRROR_FILL_HEDGES": "0",
              "HF_MIRROR_SHUTDOWN_GRACE": "1"}  # a lingering fill does not hold the nodes' stop


EMULATOR_FILES = {"huge_file_size": SIZE}  # for ``emu`` (tests/e2e/conftest.py)


@pytest.fixture
def database(postgres: postgres_server.PostgresServer) -> str:
    return postgres.create_database()



def windows_of(start: int, end: int) -> set[tuple[int, int]]:
    """The windows a Range of bytes ``start..end`` (inclusive) fetches: those it covers and the read-ahead's."""
    last = min(end + READ_AHEAD, SIZE - 1)
    return {(w, min(w + WINDOW, SIZE)) for w in range(start - start % WINDOW, last + 1, WINDOW)}


def read(url: str, start: int, end: int) -> httpx.Response:
    response = httpx.get(url + HUGE_URL, headers={"Range": f"bytes={start}-{end}"}, timeout=120)
    assert response.status_code == 206, response.text[:300]
    assert response.content == generated_bytes(start, end + 1), "a byte served wrong"
    return response


def settled(emu: EmulatorHandle, spans: set[tuple[int, int]]) -> None:
    """Every window of ``spans`` fetched (the read-ahead lands after the read that asked it) and nothing else."""
    wait_for(lambda: set(emu.cdn_spans()) == spans and emu.stats()["bytes_served"] >= sum(b - a for a, b in spans),
             timeout=60)


def test_a_range_another_node_holds_as_windows_is_relayed_from_it(emu: EmulatorHandle, fleet: Fleet,
                                                                   database: str) -> None:
    emu.reset_stats()
    node_a, node_b = start_fleet(fleet, emu, database, count=2, env=SPARSE_ENV)
    first = (41 * MIB + 123, 41 * MIB + 122 + RANGE)  # unaligned: three windows, and one of read-ahead

    read(node_a.url, *first)
    expected = windows_of(*first)
    settled(emu, expected)
    fetched = emu.stats()["bytes_served"]
    assert fetched == sum(b - a for a, b in expected) <= RANGE + 2 * WINDOW + READ_AHEAD

    # Node B's same Range: relayed from node A's held windows, not one byte more from upstream.
    response = read(node_b.url, *first)
    assert response.headers["x-mirror-cache"] == "miss"  # not on B's disk: B relays it
    assert emu.stats()["bytes_served"] == fetched and set(emu.cdn_spans()) == expected
    assert metric(node_b, "hf_mirror_peer_bytes_total") == RANGE
    assert not list((fleet.tmp / "node1" / "cache" / "partials").glob("*.part"))  # B stores nothing of it

    # A Range neither node holds, asked on B: A fetches its windows once (as for a Range of its own), for both nodes.
    second = (100 * MIB, 100 * MIB + RANGE - 1)
    read(node_b.url, *second)
    expected |= windows_of(*second)
    settled(emu, expected)
    fetched = emu.stats()["bytes_served"]
    assert fetched == sum(b - a for a, b in expected)
    read(node_a.url, *second)  # a hit on A
    read(node_b.url, *second)  # relayed again from A
    assert emu.stats()["bytes_served"] == fetched and set(emu.cdn_spans()) == expected


def windows_rows(database: str) -> list[tuple[str, str, str, list[list[int]]]]:
    """The database's records of held windows: (etag, node url, token, spans)."""
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(  # type: ignore[misc]
            "SELECT etag, node_url, token, held FROM hf_mirror_windows ORDER BY node_url").fetchall()]


def test_the_windows_a_paused_sparse_fill_left_are_read_from_its_node(emu: EmulatorHandle, fleet: Fleet,
                                                                        database: str) -> None:
    emu.reset_stats()
    # A sparse fill pauses one second after its last reader: its lease goes, the record of its windows stays.
    node_a, node_b = start_fleet(fleet, emu, database, count=2, env={**SPARSE_ENV, "HF_MIRROR_SPARSE_LINGER": "1"})
    first = (41 * MIB + 123, 41 * MIB + 122 + RANGE)
    read(node_a.url, *first)
    expected = windows_of(*first)
    settled(emu, expected)
    wait_until(lambda: [row[1] for row in windows_rows(database)] == [node_a.url], "node A's windows recorded")
    assert metric(node_a, "hf_mirror_fills_total", result="paused") == 1
    [(etag, _, token, held)] = windows_rows(database)
    assert {(a, b) for a, b in held} == expected
    fetched = emu.stats()["bytes_served"]

    # Nobody reads those windows without the record's token (the peer route is not a way around the access checks).
    peer_url = f"{node_a.url}/_mirror/fills/{etag}?repo=dataset:acme/huge-data&commit={'0' * 40}&path=huge.bin" \
               f"&size={SIZE}"
    ranged = {"Range": f"bytes={first[0]}-{first[1]}"}
    for headers in (ranged, {**ranged, "X-Mirror-Peer-Token": "guess"}):
        assert httpx.get(peer_url, headers=headers, timeout=30).status_code == 404

    # Node B's same Range: read from node A's partial file, not one byte more from upstream, nothing kept on B.
    response = read(node_b.url, *first)
    assert response.headers["x-mirror-cache"] == "miss"
    assert emu.stats()["bytes_served"] == fetched and set(emu.cdn_spans()) == expected
    assert metric(node_b, "hf_mirror_peer_bytes_total") == RANGE
    assert not list((fleet.tmp / "node1" / "cache" / "partials").glob("*.part"))
    assert metric(node_a, "hf_mirror_fills_total", result="paused") == 1  # no fill resumed on A for it

    # A Range node A's windows do not hold: node B fills it itself (its own windows, from upstream, once).
    second = (100 * MIB, 100 * MIB + RANGE - 1)
    read(node_b.url, *second)
    expected |= windows_of(*second)
    settled(emu, expected)
    assert emu.stats()["bytes_served"] == sum(b - a for a, b in expected)
    assert metric(node_b, "hf_mirror_peer_bytes_total") == RANGE  # nothing of it from node A
    assert list((fleet.tmp / "node1" / "cache" / "partials").glob("*.part"))

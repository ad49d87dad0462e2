"""A fleet on a cold file (issue 25): 3 nodes on one S3 bucket (SeaweedFS) and one PostgreSQL database, 5 clients
per node (15 in all) GET a file none of them holds, at once. Beside it, in the same run, one node alone (same bucket
server, its own prefix and database) with the same 15 clients.

Reported per setup: upstream bytes per file byte (the emulator's count of body bytes it sent, over the file's size:
1.00 means the file crossed the upstream link once), the wall time until the last client had the whole file, and
the ratios fleet / one node. Every body is checked against the file's sha256. Each round starts every node on an
empty hot tier, a fresh bucket prefix and a fresh database, so both setups are cold; rounds alternate which setup
goes first.

    python -m bench.fleet_cold [--size 200M] [--clients-per-node 5] [--rounds 1] [--upstream-bps 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BIG_PATH, BIG_REPO, Report, emulator, machine, parse_size, write_json
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess
from tests.support.postgres_server import PostgresServer
from tests.support.s3_server import S3Server


def start_nodes(count: int, emu: EmulatorHandle, s3: S3Server, database: str, prefix: str, workdir: Path,
                ) -> list[MirrorProcess]:
    """``count`` nodes on ``prefix`` of the bucket and ``database``, each publishing its own URL to the others."""
    storage = ("--storage", "s3", "--s3-endpoint", s3.endpoint, "--s3-bucket", s3.bucket, "--s3-prefix", prefix,
               "--metadata-url", database)
    nodes = []
    for i in range(count):
        (workdir / f"node{i}").mkdir(parents=True)
        node = MirrorProcess(emu.url, workdir / f"node{i}" / "cache", *storage, env=dict(s3.env))
        node.env["HF_MIRROR_NODE_URL"] = node.url
        nodes.append(node)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda node: node.start(timeout=120), nodes))
    return nodes


def download(url: str) -> tuple[int, str, int]:
    """curl reads the body (outside this process); this thread hashes it in 1 MiB reads, which hashlib does
    without holding the interpreter's lock: (curl's exit status, the body's sha256, its size)."""
    curl = subprocess.Popen(["curl", "-sS", "-f", "--max-time", "1200", url], stdout=subprocess.PIPE)
    assert curl.stdout is not None
    digest, size = hashlib.sha256(), 0
    while chunk := curl.stdout.read(2**20):
        digest.update(chunk)
        size += len(chunk)
    curl.stdout.close()
    return curl.wait(), digest.hexdigest(), size


def cold_round(emu: EmulatorHandle, nodes: list[MirrorProcess], clients: int, expected: str, size: int,
               ) -> dict[str, Any]:
    """``clients`` concurrent GETs spread round robin over ``nodes``; every body must be the file."""
    emu.reset_stats()
    urls = [nodes[i % len(nodes)].url + BIG_PATH for i in range(clients)]
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(download, urls))
    wall = time.monotonic() - began
    bad = [(status, digest[:12], got) for status, digest, got in results
           if status != 0 or digest != expected or got != size]
    if bad:
        raise RuntimeError(f"{len(bad)} of {clients} bodies wrong (curl status, sha256, size): {bad[:5]}")
    stats = emu.stats()
    return {"wall_s": wall, "upstream_bytes": stats["bytes_served"],
            "upstream_fetches": int(stats["fetches"].get(f"dataset:{BIG_REPO}/big.bin", 0))}


def run(size: int, per_node: int, rounds: int, upstream_bps: float) -> Report:
    clients = 3 * per_node
    fleet_runs: list[dict[str, Any]] = []
    single_runs: list[dict[str, Any]] = []
    with emulator(size) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-fleet-cold-") as tmp, \
            S3Server(Path(tmp) / "s3") as s3, PostgresServer() as postgres:
        expected = hashlib.sha256(emu.files.file_bytes("dataset", BIG_REPO, "main", "big.bin")).hexdigest()
        if upstream_bps:
            emu.set_faults(throttle_bps=upstream_bps)
        for n in range(rounds):
            order = [("fleet", 3), ("single", 1)] if n % 2 == 0 else [("single", 1), ("fleet", 3)]
            for name, count in order:
                workdir = Path(tmp) / f"{name}-{n}"
                nodes = start_nodes(count, emu, s3, postgres.create_database(), f"{name}-{n}/", workdir)
                try:
                    result = cold_round(emu, nodes, clients, expected, size)
                finally:
                    for node in nodes:
                        node.stop()
                (fleet_runs if name == "fleet" else single_runs).append(result)
                print(f"round {n + 1} {name} ({count} node{'s' if count > 1 else ''}, {clients} clients): "
                      f"{result['wall_s']:.2f} s, upstream {result['upstream_bytes'] / size:.3f}x the file, "
                      f"{result['upstream_fetches']} upstream body requests", flush=True)

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)

    report = Report(f"Cold file on a fleet: 3 nodes x {per_node} clients vs 1 node x {clients} clients "
                    f"(bucket + database, {size / 2**20:.0f} MiB)")
    report.add("upstream bytes per file byte", median(fleet_runs, "upstream_bytes") / size,
               median(single_runs, "upstream_bytes") / size, "x", "one node", higher_is_better=False,
               fleet_runs=[round(r["upstream_bytes"] / size, 3) for r in fleet_runs],
               single_runs=[round(r["upstream_bytes"] / size, 3) for r in single_runs],
               fleet_fetches=[r["upstream_fetches"] for r in fleet_runs],
               single_fetches=[r["upstream_fetches"] for r in single_runs])
    report.add("wall time, last client done", median(fleet_runs, "wall_s"), median(single_runs, "wall_s"), "s",
               "one node", higher_is_better=False, clients=clients, rounds=rounds, upstream_bps=upstream_bps,
               fleet_runs=[round(r["wall_s"], 2) for r in fleet_runs],
               single_runs=[round(r["wall_s"], 2) for r in single_runs])
    report.add("aggregate throughput", clients * size / median(fleet_runs, "wall_s") / 1e6,
               clients * size / median(single_runs, "wall_s") / 1e6, "MB/s", "one node")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="200M", help="file size, e.g. 200M (default 200M)")
    parser.add_argument("--clients-per-node", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--upstream-bps", type=float, default=0.0,
                        help="throttle of each upstream response in bytes/s (default 0: as fast as loopback)")
    parser.add_argument("--json")
    args = parser.parse_args()
    size = parse_size(args.size)
    report = run(size, args.clients_per_node, args.rounds, args.upstream_bps)
    report.print()
    upstream, wall = (row["mirror"] / row["reference"] for row in report.rows[:2])
    print(f"\nfleet / one node: upstream bytes {upstream:.2f}x, wall time {wall:.2f}x")
    write_json(args.json, [report], {**machine(), "size": size, "clients_per_node": args.clients_per_node,
                                     "rounds": args.rounds, "upstream_bps": args.upstream_bps})


if __name__ == "__main__":
    main()

"""The fleet's database on the warm path: a warm HEAD /resolve on a node with ``--metadata-url`` against the same
node without one (the embedded default), both on one S3 bucket (SeaweedFS) with the blob in their hot tiers.

Rounds alternate between the two nodes (paired), so a busy machine slows both alike. The target (issue 25) is at
most 10 % slower with the database. A node answers warm HEADs from its own index: the database is asked only past
``revision_ttl``, so the expected cost is nil.

    python -m bench.fleet [--heads 300] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import BIG_PATH, Report, emulator, machine, write_json
from tests.support.mirror_proc import MirrorProcess
from tests.support.postgres_server import PostgresServer
from tests.support.s3_server import S3Server


def heads_per_second(url: str, count: int) -> float:
    with httpx.Client(timeout=30) as client:
        started = time.perf_counter()
        for _ in range(count):
            response = client.head(url)
            assert response.status_code == 200, response.status_code
        return count / (time.perf_counter() - started)


def run(heads: int, rounds: int) -> Report:
    with emulator(4 * 2**20) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-fleet-") as tmp, \
            S3Server(Path(tmp) / "s3") as s3, PostgresServer() as postgres:
        for name in ("embedded", "database"):
            (Path(tmp) / name).mkdir()
        storage = ("--storage", "s3", "--s3-endpoint", s3.endpoint, "--s3-bucket", s3.bucket)
        embedded = MirrorProcess(emu.url, Path(tmp) / "embedded" / "cache", *storage, "--s3-prefix", "e/",
                                 env=s3.env)
        shared = MirrorProcess(emu.url, Path(tmp) / "database" / "cache", *storage, "--s3-prefix", "d/",
                               "--metadata-url", postgres.create_database(), env=s3.env)
        with embedded.start(timeout=90), shared.start(timeout=90):
            for proc in (embedded, shared):
                assert httpx.get(proc.url + BIG_PATH, timeout=60).status_code == 200  # warm: blob and metadata
                heads_per_second(proc.url + BIG_PATH, 50)
            emu.reset_stats()
            pairs = [(heads_per_second(embedded.url + BIG_PATH, heads), heads_per_second(shared.url + BIG_PATH, heads))
                     for _ in range(rounds)]
            upstream = len(emu.stats()["requests"])
    without = statistics.median(p[0] for p in pairs)
    with_db = statistics.median(p[1] for p in pairs)
    report = Report("Warm HEAD /resolve with and without the fleet's database (paired rounds, 1 client)")
    report.add("HEADs per second", with_db, without, "req/s", "embedded default", rounds=rounds, heads=heads,
               upstream_requests=upstream, ratios=[round(b / a, 3) for a, b in pairs])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    report = run(args.heads, args.rounds)
    report.print()
    write_json(args.json, [report], {**machine(), "heads": args.heads, "rounds": args.rounds})


if __name__ == "__main__":
    main()

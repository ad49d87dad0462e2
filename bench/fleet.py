"""The fleet's database on the warm path: a warm HEAD /resolve on a node with ``--metadata-url`` against the same
node without one (the embedded default), both on one S3 bucket (SeaweedFS) with the blob in their hot tiers.

Rounds alternate between the two nodes (paired), so a busy machine slows both alike. The target (issue 25) is at
most 10 % slower with the database. A node answers warm HEADs from its own index: the database is asked only past
``revision_ttl``, so the expected cost is nil.

    python -m bench.fleet [--heads 2000] [--rounds 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import BIG_PATH, Report, cpu_seconds, emulator, machine, write_json
from tests.support.mirror_proc import MirrorProcess
from tests.support.postgres_server import PostgresServer
from tests.support.s3_server import S3Server


def heads_per_second(url: str, count: int, cpu: list[float] | None = None, pid: int | None = None) -> float:
    """HEADs answered per second by one client; with ``cpu`` and ``pid``, appends the CPU-seconds the node spent
    per answer (less moved by other loads on the machine than the rate)."""
    with httpx.Client(timeout=30) as client:
        spent = cpu_seconds(pid) if pid else 0.0
        started = time.perf_counter()
        for _ in range(count):
            response = client.head(url)
            assert response.status_code == 200, response.status_code
        rate = count / (time.perf_counter() - started)
        if cpu is not None and pid:
            cpu.append((cpu_seconds(pid) - spent) / count)
        return rate


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
        # Started once each (entering a MirrorProcess starts it again: the second start would find the first one
        # healthy on the port, keep a process that failed to bind as ``proc``, and leave the server running).
        with contextlib.ExitStack() as running:
            for proc in (embedded, shared):
                proc.start(timeout=90)
                running.callback(proc.stop)
            for proc in (embedded, shared):
                assert httpx.get(proc.url + BIG_PATH, timeout=60).status_code == 200  # warm: blob and metadata
                heads_per_second(proc.url + BIG_PATH, 50)
            emu.reset_stats()
            pairs = []
            cpu_without: list[float] = []
            cpu_with: list[float] = []
            assert embedded.proc is not None and shared.proc is not None
            for n in range(rounds):  # which node goes first alternates, so neither gets the quieter half
                if n % 2 == 0:
                    without = heads_per_second(embedded.url + BIG_PATH, heads, cpu_without, embedded.proc.pid)
                    pairs.append((without, heads_per_second(shared.url + BIG_PATH, heads, cpu_with, shared.proc.pid)))
                else:
                    with_db = heads_per_second(shared.url + BIG_PATH, heads, cpu_with, shared.proc.pid)
                    pairs.append((heads_per_second(embedded.url + BIG_PATH, heads, cpu_without, embedded.proc.pid),
                                  with_db))
            upstream = len(emu.stats()["requests"])
    without = statistics.median(p[0] for p in pairs)
    with_db = statistics.median(p[1] for p in pairs)
    report = Report("Warm HEAD /resolve with and without the fleet's database (paired rounds, 1 client)")
    ratios = [b / a for a, b in pairs]
    # The paired figure is the median of the per-round ratios: a round where the machine was busy moves both sides.
    report.add("HEADs per second", with_db, without, "req/s", "embedded default", rounds=rounds, heads=heads,
               upstream_requests=upstream, median_round_ratio=round(statistics.median(ratios), 3),
               ratios=[round(r, 3) for r in ratios])
    report.add("node CPU per HEAD", statistics.median(cpu_with) * 1e3, statistics.median(cpu_without) * 1e3, "ms",
               "embedded default", higher_is_better=False, with_db=[round(c * 1e3, 3) for c in cpu_with],
               without=[round(c * 1e3, 3) for c in cpu_without])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json")
    args = parser.parse_args()
    report = run(args.heads, args.rounds)
    report.print()
    cpu = report.rows[1]
    # (A few HEADs may spend less than one clock tick: then there is no CPU ratio to show.)
    cpu_ratio = f"{cpu['mirror'] / cpu['reference']:.3f}x" if cpu["mirror"] and cpu["reference"] else "not measurable"
    print(f"\nwith the database / without, median of the paired rounds: {report.rows[0]['median_round_ratio']:.3f} "
          f"(target >= 0.91: at most 10 % slower); CPU per HEAD {cpu_ratio}")
    write_json(args.json, [report], {**machine(), "heads": args.heads, "rounds": args.rounds})


if __name__ == "__main__":
    main()

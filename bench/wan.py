"""The cold path over a WAN (issue 18): the emulator holds every upstream response to ``--per-conn`` bytes/s per
connection, delays its first byte by ``--rtt`` seconds, and caps all bodies together at ``--link`` bytes/s.

In one run, medians of ``--runs``:
- a cold file through the mirror (parallel ranged fill) against one direct single-stream download (curl -L);
- time to first byte, and upstream bytes per file byte;
- ``--clients`` concurrent cold clients of the file through one fresh mirror;
- a cold ``snapshot_download`` of a repo of ``--files`` small files, through the mirror against direct.

    python -m bench.wan --size 512M --runs 3 [--json out.json]     # the recorded figures
    python -m bench.wan --size 32M --runs 1 --files 20             # a quick run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (
    BIG_PATH,
    REPO_ROOT,
    EmulatorHandle,
    Report,
    emulator,
    ensure_tools,
    mirror,
    parallel_get,
    parse_size,
    report_run,
)
from tests.support.mirror_proc import client_env

MANY_REPO = "acme/tiny-model"
SNAPSHOT = """
import json, time
from huggingface_hub import snapshot_download
began = time.monotonic()
path = snapshot_download({repo!r}, max_workers={workers})
print(json.dumps({{"seconds": time.monotonic() - began}}))
"""


def mirror_flags(size: int) -> list[str]:
    """The mirror's defaults (64 MiB threshold, 32 MiB windows, 8 connections), scaled down for a small --size."""
    window = min(32 * 2**20, max(2**20, size // 16))
    return ["--parallel-fill-threshold", str(min(64 * 2**20, size)), "--fill-window", str(window)]


def snapshot(endpoint: str, hf_home: Path, workers: int) -> float:
    code = SNAPSHOT.format(repo=MANY_REPO, workers=workers)
    proc = subprocess.run([sys.executable, "-c", code], env=client_env(endpoint, hf_home), capture_output=True,
                          text=True, timeout=900, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def upstream_counts(emu: EmulatorHandle) -> tuple[int, int]:
    stats = emu.stats()
    return int(stats["bytes_served"]), int(stats["counts"].get("requests", 0))


def run(args: argparse.Namespace) -> list[Report]:
    size = parse_size(args.size)
    profile = dict(throttle_bps=parse_size(args.per_conn), first_byte_s=args.rtt, link_bps=parse_size(args.link))
    label = (f"{parse_size(args.per_conn) / 2**20:.0f} MiB/s per connection, {args.rtt * 1000:.0f} ms to first byte, "
             f"link {parse_size(args.link) / 2**20:.0f} MiB/s")
    flags = mirror_flags(size)
    direct, cold, herd, ratios, snap_direct, snap_mirror, req_direct, req_mirror = [], [], [], [], [], [], [], []
    with emulator(size) as emu:
        emu.push("model", MANY_REPO, "main", {f"shards/{i:04d}.json": b'{"i": %d}\n' % i for i in range(args.files)})
        emu.set_faults(**profile)
        for _ in range(args.runs):
            direct.append(parallel_get(emu.url + BIG_PATH, 1, follow=True))
            with tempfile.TemporaryDirectory(prefix="hf-bench-wan-") as tmp:
                emu.reset_stats()
                with mirror(emu.url, Path(tmp) / "c1", *flags) as proc:
                    cold.append(parallel_get(proc.url + BIG_PATH, 1))
                ratios.append(upstream_counts(emu)[0] / size)
                with mirror(emu.url, Path(tmp) / "c2", *flags) as proc:
                    herd.append(parallel_get(proc.url + BIG_PATH, args.clients))
                emu.reset_stats()
                snap_direct.append(snapshot(emu.url, Path(tmp) / "h1", args.workers))
                req_direct.append(upstream_counts(emu)[1])
                emu.reset_stats()
                with mirror(emu.url, Path(tmp) / "c3", *flags) as proc:
                    snap_mirror.append(snapshot(proc.url, Path(tmp) / "h2", args.workers))
                req_mirror.append(upstream_counts(emu)[1])
        emu.clear_faults()

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    report = Report(f"Cold {size / 2**20:.0f} MiB file over a WAN ({label})")
    report.add("throughput", med(cold, "mb_s"), med(direct, "mb_s"), "MB/s", "direct single stream",
               target="≥ 4", flags=" ".join(flags))
    report.add("time to first byte", med(cold, "ttfb_s") * 1000, med(direct, "ttfb_s") * 1000, "ms", "direct",
               higher_is_better=False)
    report.add("upstream bytes per file byte", statistics.median(ratios), 1.0, "ratio", "ideal",
               higher_is_better=False, target="≤ 1.05")
    report.add(f"{args.clients} concurrent cold clients: wall", med(herd, "wall_s"), med(direct, "wall_s"), "s",
               "one direct single stream", higher_is_better=False)
    report.add(f"{args.clients} concurrent cold clients: to clients", med(herd, "mb_s"), med(direct, "mb_s"), "MB/s",
               "one direct single stream")
    snap = Report(f"Cold snapshot_download of {args.files} small files ({label}, {args.workers} client workers)")
    snap.add("wall time", statistics.median(snap_mirror), statistics.median(snap_direct), "s", "direct",
             higher_is_better=False, target="≥ 1 (not slower)")
    snap.add("upstream requests", statistics.median(req_mirror), statistics.median(req_direct), "count",
             "the client direct", higher_is_better=False)
    return [report, snap]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="512M", help="the large file (default 512M)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-conn", default="16M", help="throttle of each upstream response (default 16 MiB/s)")
    parser.add_argument("--rtt", type=float, default=0.15, help="seconds before each response's first byte")
    parser.add_argument("--link", default="400M", help="cap of all upstream bodies together (default 400 MiB/s)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--files", type=int, default=200, help="files of the snapshot repo (default 200)")
    parser.add_argument("--workers", type=int, default=8, help="snapshot_download max_workers (default 8)")
    parser.add_argument("--json")
    args = parser.parse_args()
    ensure_tools()
    began = time.monotonic()
    report_run(run(args), began, args.json, {"size": parse_size(args.size), "runs": args.runs, "argv": sys.argv[1:]})


if __name__ == "__main__":
    main()

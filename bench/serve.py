"""Warm path: the mirror serving a cached blob against nginx (sendfile) serving the very same file.

1 client and 8 in parallel, a 100 MiB Range from the middle (also through the nginx front of deploy/nginx.conf),
and HEAD /resolve requests per second at 64 connections for a bounded time (with the count of upstream requests,
which must be zero).

    python -m bench.serve --size 1G --runs 3 [--head-seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import (
    BIG_PATH,
    BLOBS_PREFIX,
    Nginx,
    NginxFront,
    PeakRss,
    Report,
    ab_head,
    add_common_arguments,
    blob_path,
    emulator,
    ensure_tools,
    free_port,
    median_of,
    mirror,
    parallel_get,
    parse_size,
    print_and_save,
    render_nginx_conf,
)

WORKERS_HELP = "mirror workers and nginx worker_processes"


def run(size: int, runs: int, workers: int, head_seconds: int) -> list[Report]:
    with emulator(size) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-") as tmp:
        cache = Path(tmp) / "cache"
        etag = emu.files.etag("dataset", "acme/big-data", "main", "big.bin")
        with mirror(emu.url, cache, "--workers", str(workers)) as proc:
            parallel_get(proc.url + BIG_PATH, 1)  # fill the cache once
            blob = blob_path(cache, etag, wait=30)
            assert blob.stat().st_size == size
            rel = blob.relative_to(cache / "blobs")
            with Nginx(cache / "blobs", Path(tmp) / "nginx", workers) as nginx:
                nginx_url = f"{nginx.url}/{rel}"
                mirror_url = proc.url + BIG_PATH
                assert proc.proc is not None
                reports = []
                middle = size // 2
                span = min(100 * 2**20, size // 2)
                cases = [("1 client", 1, None), ("8 parallel clients", 8, None),
                         (f"{span / 2**20:.0f} MiB Range from the middle", 1, f"{middle}-{middle + span - 1}")]
                reports.append(_warm_table(f"Warm GET of a cached {size / 2**20:.0f} MiB file", cases, runs,
                                           nginx_url, mirror_url, proc.proc.pid))
                reports.append(_through_front(emu.url, cache, Path(tmp), runs, cases, nginx_url))

                head = Report(f"Warm HEAD /resolve, 64 connections, {head_seconds} s")
                small = "/acme/tiny-model/resolve/main/config.json"
                parallel_get(proc.url + small, 1)
                emu.reset_stats()
                ours, ref, peaks = [], [], []
                for _ in range(runs):
                    ref.append(ab_head(nginx_url, head_seconds, 64))
                    with PeakRss(proc.proc.pid) as rss:
                        ours.append(ab_head(proc.url + small, head_seconds, 64))
                    peaks.append(rss.peak)
                upstream = emu.stats()["counts"].get("requests", 0) - 1  # minus the stats call itself
                o, r = median_of(ours), median_of(ref)
                head.add("requests/s", o["rps"], r["rps"], "req/s", "nginx HEAD of a static file",
                         upstream_requests=upstream, failed=int(o["failed"]))
                head.add("p50 latency", o["p50_ms"], r["p50_ms"], "ms", "nginx", higher_is_better=False)
                head.add("p99 latency", o["p99_ms"], r["p99_ms"], "ms", "nginx", higher_is_better=False)
                head.add("mirror peak RSS", max(peaks) / 2**20, 0, "MiB", "-", higher_is_better=False)
                reports.append(head)
    return reports


def _through_front(upstream: str, cache: Path, tmp: Path, runs: int, cases: list[tuple[str, int, str | None]],
                   nginx_url: str) -> Report:
    """The production layout: deploy/nginx.conf in front of a mirror started with ``--accel-redirect``, on the same
    cache, against plain nginx serving the blob (the front runs 2 nginx workers, as rendered for tests)."""
    with mirror(upstream, cache, "--accel-redirect", BLOBS_PREFIX) as accel:
        assert accel.proc is not None
        conf = render_nginx_conf(tmp / "front", accel.port, free_port(), cache)
        with NginxFront(conf) as front:
            return _warm_table("Warm GET through the nginx front (deploy/nginx.conf, X-Accel-Redirect)", cases,
                               runs, nginx_url, front.url + BIG_PATH, accel.proc.pid)


def _warm_table(title: str, cases: list[tuple[str, int, str | None]], runs: int, nginx_url: str, url: str,
                mirror_pid: int) -> Report:
    """Each case ``runs`` times, nginx and ``url`` taking turns; with the mirror's peak RSS while ``url`` is read."""
    report = Report(title)
    for name, clients, range_spec in cases:
        ours, ref, peaks = [], [], []
        for _ in range(runs):
            ref.append(parallel_get(nginx_url, clients, range_spec=range_spec))
            with PeakRss(mirror_pid) as rss:
                ours.append(parallel_get(url, clients, range_spec=range_spec))
            peaks.append(rss.peak)
        report.add(name, median_of(ours)["mb_s"], median_of(ref)["mb_s"], "MB/s", "nginx sendfile",
                   peak_rss_mib=round(max(peaks) / 2**20))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, workers_help=WORKERS_HELP, head_seconds=True)
    args = parser.parse_args()
    ensure_tools()
    size = parse_size(args.size)
    print_and_save(run(size, args.runs, args.workers, args.head_seconds), args, size)


if __name__ == "__main__":
    main()

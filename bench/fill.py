"""Cold path: a miss through the mirror against a direct download from the emulator (unthrottled and throttled to
200 MB/s), and 20 concurrent cold requests for one file against one cold GET through the mirror and a direct fetch.

    python -m bench.fill --size 1G --runs 3 [--json out.json]
    python -m bench.fill --size 1G --runs 5 --cold-only    # one client, unthrottled only (the CPU-bound case)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import (
    BIG_PATH,
    BIG_REPO,
    EmulatorHandle,
    PeakRss,
    Report,
    add_common_arguments,
    emulator,
    ensure_tools,
    median_of,
    mirror,
    parallel_get,
    parse_size,
    print_and_save,
)


def run(size: int, runs: int, workers: int, herd: int = 20, cold_only: bool = False) -> list[Report]:
    reports = []
    with emulator(size) as emu:
        for throttle in (0.0,) if cold_only else (0.0, 200e6):
            label = "unthrottled" if not throttle else f"upstream throttled to {throttle / 1e6:.0f} MB/s"
            emu.set_faults(throttle_bps=throttle)
            direct = [parallel_get(emu.url + BIG_PATH, 1, follow=True) for _ in range(runs)]
            cold, cold_peaks, _ = _through_mirror(emu, workers, runs, 1)
            d, c = median_of(direct), median_of(cold)

            report = Report(f"Cold GET of a {size / 2**20:.0f} MiB file ({label})")
            report.add("throughput", c["mb_s"], d["mb_s"], "MB/s", "direct download from the emulator",
                       mirror_runs=[round(r["mb_s"]) for r in cold], direct_runs=[round(r["mb_s"]) for r in direct])
            report.add("time to first byte", c["ttfb_s"] * 1000, d["ttfb_s"] * 1000, "ms", "direct",
                       higher_is_better=False)
            report.add("mirror peak RSS", max(cold_peaks) / 2**20, 0, "MiB", "-", higher_is_better=False)
            reports.append(report)
            if cold_only:
                continue

            herds, herd_peaks, fetches = _through_mirror(emu, workers, runs, herd)
            h = median_of(herds)
            report = Report(f"{herd} concurrent cold GETs of one {size / 2**20:.0f} MiB file ({label})")
            report.add("upstream fetches", max(fetches), 1, "count", "ideal", higher_is_better=False,
                       all_runs=fetches)
            report.add("wall time", h["wall_s"], c["wall_s"], "s", "one cold GET through the mirror",
                       higher_is_better=False)
            report.add("wall time vs direct", h["wall_s"], d["wall_s"], "s", "one direct fetch",
                       higher_is_better=False)
            report.add("aggregate to clients", h["mb_s"], d["mb_s"], "MB/s", "one direct fetch")
            report.add("mirror peak RSS", max(herd_peaks) / 2**20, 0, "MiB", "-", higher_is_better=False)
            reports.append(report)
        emu.clear_faults()
    return reports


def _through_mirror(emu: EmulatorHandle, workers: int, runs: int,
                    clients: int) -> tuple[list[dict[str, float]], list[int], list[int]]:
    """``runs`` times: a fresh mirror, ``clients`` concurrent cold GETs; their figures, peak RSS, upstream fetches."""
    results, peaks, fetches = [], [], []
    for _ in range(runs):
        emu.reset_stats()
        with tempfile.TemporaryDirectory(prefix="hf-bench-cache-") as tmp, \
                mirror(emu.url, Path(tmp) / "cache", "--workers", str(workers)) as proc:
            assert proc.proc is not None
            with PeakRss(proc.proc.pid) as rss:
                results.append(parallel_get(proc.url + BIG_PATH, clients))
            peaks.append(rss.peak)
        fetches.append(emu.fetch_count("dataset", BIG_REPO, "big.bin"))
    return results, peaks, fetches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--cold-only", action="store_true",
                        help="only one cold client against a direct download, upstream unthrottled")
    args = parser.parse_args()
    ensure_tools()
    size = parse_size(args.size)
    print_and_save(run(size, args.runs, args.workers, cold_only=args.cold_only), args, size)


if __name__ == "__main__":
    main()

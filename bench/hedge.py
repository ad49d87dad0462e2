"""A stalled tail (issue 28 item 2): one window of a cold parallel fill held at 1 % of the others' rate.

The emulator holds every upstream response to ``--per-conn`` bytes/s, and the first request for one window's offset
(``slow_start``) to ``--slow-share`` of that. In one run, medians of ``--runs``, each a fresh mirror with an empty
cache and one client streaming the whole file:
- the file's time with no slow window (the reference), with the first window slow, and with the last one slow (a
  window of the second round of ``--connections``: the tail that holds a whole download);
- the longest wait of the client between two body chunks (the issue: no reader 30 s without progress);
- hedges made and upstream bytes per file byte.

Without hedging, the slow window alone would take ``window / (per_conn * slow_share)`` seconds (printed).

    python -m bench.hedge --size 1G --runs 3 [--json out.json]     # the recorded figures
    python -m bench.hedge --size 64M --runs 1                      # a quick run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import BIG_PATH, EmulatorHandle, Report, emulator, ensure_tools, mirror, parse_size, report_run
from tests.support.mirror_proc import metric


def stream(url: str) -> dict[str, float]:
    """One client reading the whole file: wall seconds and the longest gap between two body chunks."""
    began = last = time.monotonic()
    gap, size = 0.0, 0
    with httpx.stream("GET", url, timeout=httpx.Timeout(60.0)) as response:
        response.raise_for_status()
        for chunk in response.iter_raw(1 << 20):
            now = time.monotonic()
            gap, last = max(gap, now - last), now
            size += len(chunk)
    return {"wall_s": time.monotonic() - began, "gap_s": gap, "bytes": size}


def one(emu: EmulatorHandle, flags: list[str], size: int, slow_start: int | None, faults: dict[str, float],
        ) -> dict[str, float]:
    emu.clear_faults()
    extra = {} if slow_start is None else {"slow_start": slow_start, "slow_bps": faults["throttle_bps"] * faults.pop(
        "slow_share")}
    emu.set_faults(**{k: v for k, v in faults.items() if k != "slow_share"}, **extra)
    emu.reset_stats()
    with tempfile.TemporaryDirectory(prefix="hf-bench-hedge-") as tmp, mirror(emu.url, Path(tmp) / "c", *flags) as proc:
        result = stream(proc.url + BIG_PATH)
        if result["bytes"] != size:
            raise RuntimeError(f"got {result['bytes']} of {size} bytes")
        result["hedges"] = metric(proc, "hf_mirror_fill_hedges_total")
    result["upstream_ratio"] = int(emu.stats()["bytes_served"]) / size
    return result


def run(args: argparse.Namespace) -> list[Report]:
    size = parse_size(args.size)
    window = -(-size // args.windows)
    per_conn = parse_size(args.per_conn)
    flags = ["--parallel-fill-threshold", str(min(size, 64 * 2**20)), "--fill-window", str(window),
             "--fill-connections", str(args.connections)]
    if args.hedge_after is not None:
        flags += ["--fill-hedge-after", str(args.hedge_after)]
    faults = {"throttle_bps": float(per_conn), "first_byte_s": args.rtt, "slow_share": args.slow_share}
    cases = {"none": None, "first": 0, "last": (args.windows - 1) * window}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    with emulator(size) as emu:
        for _ in range(args.runs):
            for name, slow_start in cases.items():
                results[name].append(one(emu, flags, size, slow_start, dict(faults)))
        emu.clear_faults()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    reference = med("none", "wall_s")
    label = (f"{args.windows} windows of {window / 2**20:.0f} MiB, {args.connections} connections, "
             f"{per_conn / 2**20:.0f} MiB/s each, the slow one at {args.slow_share:.0%}")
    report = Report(f"One window held at {args.slow_share:.0%} of the others' rate ({label})")
    report.add("file time, no slow window", reference, reference, "s", "-", higher_is_better=False)
    for name in ("first", "last"):
        wall = med(name, "wall_s")
        report.add(f"file time, the {name} window slow", wall, reference, "s", "no slow window",
                   higher_is_better=False, slowdown=round(wall / reference, 3), target="slowdown ≤ 1.15",
                   hedges=med(name, "hedges"), upstream_per_file_byte=round(med(name, "upstream_ratio"), 4))
        report.add(f"longest wait between body chunks, the {name} window slow", med(name, "gap_s"),
                   med("none", "gap_s"), "s", "no slow window", higher_is_better=False, target="< 30")
    report.add("the slow window alone without hedging (computed)", window / (per_conn * args.slow_share), reference,
               "s", "no slow window", higher_is_better=False, flags=" ".join(flags))
    return [report]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G", help="the large file (default 1G)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, default=16, help="windows the file is cut into (default 16)")
    parser.add_argument("--connections", type=int, default=8, help="--fill-connections (default 8, the mirror's)")
    parser.add_argument("--per-conn", default="8M", help="throttle of each upstream response (default 8 MiB/s)")
    parser.add_argument("--slow-share", type=float, default=0.01, help="the slow window's share of that (default 1 %%)")
    parser.add_argument("--rtt", type=float, default=0.05, help="seconds before each response's first byte")
    parser.add_argument("--hedge-after", type=float, help="--fill-hedge-after (default: the mirror's, 2 s)")
    parser.add_argument("--json")
    args = parser.parse_args()
    ensure_tools()
    began = time.monotonic()
    report_run(run(args), began, args.json, {"size": parse_size(args.size), "runs": args.runs, "argv": sys.argv[1:]})


if __name__ == "__main__":
    main()

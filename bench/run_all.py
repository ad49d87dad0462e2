"""Every benchmark in one run: ``python bench/run_all.py [--size 1G] [--runs 3] [--json bench.json]``."""

from __future__ import annotations

import argparse

import fill
import serve
from common import ensure_tools, machine, write_json

from mirror.config import parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="1G", help="file size, e.g. 1G, 64M (default 1G)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="mirror workers and nginx worker_processes")
    parser.add_argument("--head-seconds", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    ensure_tools()
    size = parse_size(args.size.replace("G", "GiB").replace("M", "MiB")) or 0
    reports = serve.run(size, args.runs, args.workers, args.head_seconds) + fill.run(size, args.runs, args.workers)
    for report in reports:
        report.print()
    write_json(args.json, reports, {**machine(), "size": size, "runs": args.runs, "workers": args.workers})


if __name__ == "__main__":
    main()

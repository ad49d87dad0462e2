"""Every benchmark in one run: ``python -m bench.run_all [--size 1G] [--runs 3] [--json bench.json]``."""

from __future__ import annotations

import argparse

from bench import fill, serve
from bench.common import add_common_arguments, ensure_tools, parse_size, print_and_save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_common_arguments(parser, workers_help=serve.WORKERS_HELP, head_seconds=True)
    args = parser.parse_args()
    ensure_tools()
    size = parse_size(args.size)
    reports = serve.run(size, args.runs, args.workers, args.head_seconds) + fill.run(size, args.runs, args.workers)
    print_and_save(reports, args, size)


if __name__ == "__main__":
    main()

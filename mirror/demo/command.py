"""``hf-mirror demo``: the whole path, offline, in under a minute.

A small self-contained bench (:mod:`mirror.harness.sample_bench`): the generated dataset ``demo/bench-text`` (2 MB
of parquet by default, generated once and kept), the sample Hub serving it (:mod:`mirror.demo.sample_hub`), a fresh
mirror in front of it, and the passes local disk, direct to the sample Hub, mirror cold and mirror warm, with the table.
Every server is a subprocess on a free 127.0.0.1 port, stopped by PID in a ``finally``, on Ctrl-C as well.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mirror.harness.command import at_least, seconds, worker_counts
from mirror.harness.protocol import EXIT_USER_ERROR, HarnessError
from mirror.harness.sample_bench import run_sample_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--size", default="2M", help="parquet bytes of the sample dataset (default 2M; the bench's default is 2G)")
    add("--max-rows", type=at_least(0), default=None, help="rows per pass (default: the whole split)")
    add("--batch-size", type=at_least(1), default=64, help="rows per batch (default 64)")
    add("--workers", default="0", help="DataLoader worker counts, e.g. 0,2 (default 0)")
    add("--num-workers", type=int, default=None, help=argparse.SUPPRESS)  # the flag before --workers
    add("--step-ms", type=seconds(positive=False), default=0.0,
        help="simulated training step per batch in ms (default 0)")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    add("--no-direct", action="store_true", help="skip the pass straight against the sample Hub")
    add("--no-local", action="store_true", help="skip the pass from local disk")
    add("--data-dir", type=Path, default=None, help="where generated datasets are kept (default: the user cache)")
    add("--json", metavar="FILE", type=Path, default=None, help="write all figures to this JSON file")
    add("--plot", metavar="FILE.png", type=Path, default=None, help="plot throughput over time (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    passes = [k for k, skip in (("local", args.no_local), ("direct", args.no_direct), ("cold", False),
                                ("warm", False)) if not skip]
    workers = [args.num_workers] if args.num_workers is not None else worker_counts(args.workers)
    bench_args = argparse.Namespace(
        endpoint=None, size=args.size, seed=0, shards=None, data_dir=args.data_dir, passes=passes, repeat=1,
        batch_size=args.batch_size, max_length=128, workers=workers, shuffle_buffer=0, max_rows=args.max_rows,
        max_seconds=None, step_ms=args.step_ms, device=args.device, json=args.json, plot=args.plot, timeout=300.0)
    start = time.monotonic()
    try:
        report = run_sample_bench(bench_args)
    except (HarnessError, ValueError) as exc:
        kind = exc.kind if isinstance(exc, HarnessError) else "bad_argument"
        print(f"hf-mirror demo: error ({kind}): {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"[demo] done in {time.monotonic() - start:.1f}s. At scale: hf-mirror bench --size 2G --workers 0,4,16 "
          f"--step-ms 50 --json bench.json --plot bench.png\n"
          f"  against your own mirror: hf-mirror bench --endpoint http://127.0.0.1:8090 --dataset <repo> "
          f"--tokenizer <repo>")
    return 0 if report["passes"] else 1

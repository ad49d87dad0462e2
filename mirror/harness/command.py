"""``hf-mirror bench``'s flags and its ``run(args)``."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

from mirror.harness.bench import run_bench
from mirror.harness.passes import SAMPLE_KINDS
from mirror.harness.protocol import EXIT_USER_ERROR, HarnessError
from mirror.harness.sample_bench import PARQUET_BATCH_ROWS, run_sample_bench

# rows each pass reads unless --max-rows or --max-seconds says otherwise: a 50 ms step per 32-row batch caps a pass
# at 640 rows/s, so the 2G sample dataset's 4.5 million rows would take ~2 h a pass (a Hub dataset's split, days);
# 20,000 rows (625 steps, >= 31 s) are well past the first batch's latency and every worker's start (docs/harness.md)
DEFAULT_MAX_ROWS = 20_000


def worker_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of worker counts: {text!r} (e.g. 0,4,16)") from None
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"not a list of worker counts: {text!r} (e.g. 0,4,16)")
    return counts


def _passes(text: str) -> list[str]:
    kinds = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [k for k in kinds if k not in SAMPLE_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown pass {unknown or text!r}; choose from {','.join(SAMPLE_KINDS)}")
    return kinds


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` (a negative batch reached pyarrow before)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, not {text!r}")
        return value
    return parse


def seconds(positive: bool) -> Callable[[str], float]:
    """An argparse type: a time in seconds (or ms), above zero when ``positive``, else zero or more."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 if positive else value >= 0):  # nan fails here
            raise argparse.ArgumentTypeError(f"expected a number {'>' if positive else '>='} 0, not {text!r}")
        if math.isinf(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, not {text!r}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--endpoint", default=None,
        help="the endpoint to measure (your mirror), e.g. http://127.0.0.1:8090; without it the bench runs its own "
             "sample Hub with a generated dataset of --size and fresh mirrors in front of it")
    add("--dataset", default=None, help="with --endpoint: dataset repo id, e.g. HuggingFaceFW/fineweb-edu")
    add("--config", default=None, help="dataset config name (default: the dataset's default)")
    add("--split", default="train", help="split to stream (default train)")
    add("--text-column", default="text", help="column fed to the tokenizer (default text)")
    add("--tokenizer", default=None, help="with --endpoint: model repo whose tokenizer is loaded through it")
    add("--size", default="2G", help="without --endpoint: parquet bytes of the generated dataset (default 2G; "
                                     "kept in --data-dir between runs)")
    add("--shards", type=int, default=None,
        help="without --endpoint: parquet shards of the generated dataset (default max(16, size / 500 MB)); e.g. "
             "64 so that 64 workers each get shards (datasets gives each worker whole shards, idles the rest)")
    add("--seed", type=int, default=0, help="without --endpoint: seed of the generated dataset (default 0)")
    add("--data-dir", type=Path, default=None,
        help="where generated datasets are kept (default $HF_MIRROR_SAMPLE_DATA or ~/.cache/hf-mirror/sample-data)")
    add("--passes", type=_passes, default=list(SAMPLE_KINDS),
        help=f"without --endpoint: which passes (default {','.join(SAMPLE_KINDS)})")
    add("--repeat", type=at_least(1), default=1,
        help="without --endpoint: run every pass N times; the table shows medians")
    add("--batch-size", type=at_least(1), default=32, help="rows per batch (default 32)")
    add("--max-length", type=at_least(1), default=128, help="tokenizer truncation length (default 128)")
    add("--workers", type=worker_counts, default=None,
        help="DataLoader worker counts, one set of passes each, e.g. 0,4,16 (default: 0,4,16 without --endpoint, "
             "0 with it)")
    add("--num-workers", type=int, default=None, help=argparse.SUPPRESS)  # the flag before --workers
    add("--shuffle-buffer", type=at_least(0), default=0, help="IterableDataset.shuffle buffer size; 0 = no shuffle")
    add("--parquet-batch-rows", type=at_least(0), default=None,
        help="rows per Arrow record batch datasets reads from a Parquet file (load_dataset(..., batch_size=N)); "
             "pyarrow reads and decodes that many batches ahead in the background, so it bounds each worker's "
             "read-ahead. 0 = datasets' default (a row group per batch: each worker reads its whole shard ahead). "
             f"Default {PARQUET_BATCH_ROWS} without --endpoint, 0 with it (your dataset may not be Parquet)")
    add("--max-rows", type=at_least(0), default=None,
        help=f"stop each pass after this many rows; 0 = the whole split. Default {DEFAULT_MAX_ROWS:,} unless "
             "--max-seconds is given (a whole 2G pass at --step-ms 50 takes ~2 h)")
    add("--max-seconds", type=seconds(positive=True), default=None, help="stop a pass after this many seconds")
    add("--step-ms", type=seconds(positive=False), default=0.0,
        help="simulated training step per batch in ms (default 0): a sleep on the CPU, calibrated matmuls on a GPU; "
             "makes the data stall meaningful")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    add("--compare-direct", metavar="URL", default=None,
        help="with --endpoint: run the same cold+warm passes against this endpoint too (the Hub, or the upstream)")
    add("--compare-local", metavar="DIR", type=Path, default=None,
        help="with --endpoint: also stream the dataset's files from this local folder (the ceiling)")
    add("--json", metavar="FILE", type=Path, default=None, help="write all figures to this JSON file")
    add("--plot", metavar="FILE.png", type=Path, default=None, help="plot throughput over time (needs matplotlib)")
    add("--timeout", type=seconds(positive=True), default=3600.0,
        help="seconds one pass may take before it is killed (default 3600)")


def settle_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on the mode (a user's dataset behind ``--endpoint`` gets one pass set and datasets'
    own Parquet batches), and the bound on every pass: a bench measures rates, which a Hub-sized split would take
    hours to reach the end of."""
    if args.workers is None:
        args.workers = [args.num_workers] if args.num_workers is not None else [0] if args.endpoint else [0, 4, 16]
    if args.endpoint and args.parquet_batch_rows is None:
        args.parquet_batch_rows = 0
    if args.max_rows is None and args.max_seconds is None:
        args.max_rows = DEFAULT_MAX_ROWS
    return args


def run(args: argparse.Namespace) -> int:
    settle_defaults(args)
    try:
        if args.endpoint:
            if not args.dataset or not args.tokenizer:
                raise HarnessError("missing_repo", "--endpoint needs --dataset and --tokenizer")
            report = run_bench(args)
        else:
            report = run_sample_bench(args)
    except HarnessError as exc:
        print(f"hf-mirror bench: error ({exc.kind}): {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except ValueError as exc:  # a bad --size
        print(f"hf-mirror bench: error (bad_argument): {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0 if report["passes"] else 1

"""``hf-mirror bench``'s flags and its ``run(args)``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mirror.harness.bench import run_bench
from mirror.harness.protocol import EXIT_USER_ERROR, HarnessError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--endpoint", required=True, help="the endpoint to measure (your mirror), e.g. http://127.0.0.1:8090")
    add("--dataset", required=True, help="dataset repo id, e.g. demo/tiny-text")
    add("--config", default=None, help="dataset config name (default: the dataset's default)")
    add("--split", default="train", help="split to stream (default train)")
    add("--text-column", default="text", help="column fed to the tokenizer (default text)")
    add("--tokenizer", required=True, help="model repo whose tokenizer is loaded through the endpoint")
    add("--batch-size", type=int, default=32, help="rows per batch (default 32)")
    add("--max-length", type=int, default=128, help="tokenizer truncation length (default 128)")
    add("--num-workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    add("--shuffle-buffer", type=int, default=0, help="IterableDataset.shuffle buffer size; 0 = no shuffle")
    add("--max-rows", type=int, default=None, help="stop after this many rows per pass")
    add("--max-seconds", type=float, default=None, help="stop a pass after this many seconds")
    add("--step-ms", type=float, default=0.0,
        help="simulated consumer compute per batch in ms (default 0); makes the starvation ratio meaningful")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    add("--compare-direct", metavar="URL", default=None,
        help="run the same cold+warm passes against this endpoint too (the Hub, or the upstream itself)")
    add("--compare-local", metavar="DIR", type=Path, default=None,
        help="also stream the dataset's files from this local folder (the ceiling)")
    add("--json", metavar="FILE", type=Path, default=None, help="write all figures to this JSON file")
    add("--plot", metavar="FILE.png", type=Path, default=None, help="plot throughput over time (needs matplotlib)")
    add("--timeout", type=float, default=600.0, help="seconds one pass may take before it is killed (default 600)")


def run(args: argparse.Namespace) -> int:
    try:
        report = run_bench(args)
    except HarnessError as exc:
        print(f"hf-mirror bench: error ({exc.kind}): {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0 if report["passes"] else 1

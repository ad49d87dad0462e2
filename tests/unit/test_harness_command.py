"""The bench's flags refuse what cannot be a count before any pass starts (a negative Parquet batch reached pyarrow,
which failed every pass with its own message)."""

from __future__ import annotations

import argparse

import pytest

from mirror.harness.command import DEFAULT_MAX_ROWS, add_arguments, settle_defaults


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_counts_are_parsed() -> None:
    args = parse("--parquet-batch-rows", "0", "--batch-size", "8", "--repeat", "3", "--shuffle-buffer", "0",
                 "--step-ms", "0", "--max-seconds", "2.5")
    assert (args.parquet_batch_rows, args.batch_size, args.repeat, args.shuffle_buffer) == (0, 8, 3, 0)
    assert (args.step_ms, args.max_seconds, args.timeout) == (0.0, 2.5, 3600.0)


@pytest.mark.parametrize("argv", [("--parquet-batch-rows", "-5"), ("--batch-size", "0"), ("--repeat", "0"),
                                  ("--max-length", "x"), ("--shuffle-buffer", "-1"), ("--max-seconds", "0"),
                                  ("--max-seconds", "nan"), ("--step-ms", "-1"), ("--step-ms", "inf"),
                                  ("--timeout", "-3")])
def test_impossible_counts_are_refused_naming_the_flag(argv: tuple[str, str]) -> None:
    with pytest.raises(argparse.ArgumentError, match=argv[0]):
        parse(*argv)


def test_a_bench_bounds_each_pass_unless_told() -> None:
    """The issue's own command (``--size 2G --workers 16 --step-ms 50``) must finish: a whole 2G pass at 50 ms steps
    is ~2 h, so without --max-rows or --max-seconds each pass stops at DEFAULT_MAX_ROWS; 0 reads the whole split."""
    assert settle_defaults(parse("--size", "2G", "--workers", "16", "--step-ms", "50")).max_rows == DEFAULT_MAX_ROWS
    assert settle_defaults(parse("--max-rows", "0")).max_rows == 0
    assert settle_defaults(parse("--max-rows", "500")).max_rows == 500
    timed = settle_defaults(parse("--max-seconds", "30"))
    assert (timed.max_rows, timed.max_seconds) == (None, 30)
    theirs = settle_defaults(parse("--endpoint", "http://mirror:8090", "--dataset", "a/b", "--tokenizer", "c/d"))
    assert (theirs.max_rows, theirs.parquet_batch_rows, theirs.workers) == (DEFAULT_MAX_ROWS, 0, [0])
    with pytest.raises(argparse.ArgumentError, match="--max-rows"):
        parse("--max-rows", "-1")

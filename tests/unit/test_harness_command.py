"""The bench's flags refuse what cannot be a count before any pass starts (a negative Parquet batch reached pyarrow,
which failed every pass with its own message)."""

from __future__ import annotations

import argparse

import pytest

from mirror.harness.command import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_counts_are_parsed() -> None:
    args = parse("--parquet-batch-rows", "0", "--batch-size", "8", "--repeat", "3", "--shuffle-buffer", "0")
    assert (args.parquet_batch_rows, args.batch_size, args.repeat, args.shuffle_buffer) == (0, 8, 3, 0)


@pytest.mark.parametrize("argv", [("--parquet-batch-rows", "-5"), ("--batch-size", "0"), ("--repeat", "0"),
                                  ("--max-length", "x"), ("--shuffle-buffer", "-1")])
def test_impossible_counts_are_refused_naming_the_flag(argv: tuple[str, str]) -> None:
    with pytest.raises(argparse.ArgumentError, match=argv[0]):
        parse(*argv)

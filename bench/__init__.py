"""Benchmarks against nginx and direct downloads, run from the repository root as modules:
``.venv/bin/python -m bench.run_all`` (see docs/benchmarks.md). They import the test support, ``tests.support``."""

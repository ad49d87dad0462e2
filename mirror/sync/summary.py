"""The table a sync prints at the end (or, for ``--dry-run``, what it would fetch)."""

from __future__ import annotations

import sys

from mirror.config import format_size
from mirror.sync.run import SyncResult


def print_summary(result: SyncResult, *, pins_note: str | None = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="dry run: nothing was fetched" if result.dry_run else "sync summary",
                  box=box.SIMPLE if sys.stdout.isatty() else box.ASCII)
    for column in ("repo", "revision", "commit", "files", "fetched" if not result.dry_run else "to fetch",
                   "bytes", "status"):
        table.add_column(column, overflow="fold")
    for job in result.jobs:
        if job.error:
            status = f"FAILED: {job.error}"
        else:
            status = "ok" + (f" ({job.note})" if job.note else "")
        count = len(job.missing) if result.dry_run else job.fetched
        size = sum(f.size for f in job.missing) if result.dry_run else job.fetched_bytes
        table.add_row(job.spec.label, job.revision, (job.commit or "-")[:12], str(len(job.files)), str(count),
                      format_size(size), status)
    console.print(table)
    if result.dry_run:
        console.print(f"dry run: {result.to_fetch_files} files, {result.to_fetch_bytes} bytes "
                      f"({format_size(result.to_fetch_bytes)}) to fetch", highlight=False)
    else:
        console.print(f"fetched {result.fetched_files} files, {result.fetched_bytes} bytes "
                      f"({format_size(result.fetched_bytes)}) in {result.elapsed:.1f}s; "
                      f"{len(result.failed)} of {len(result.jobs)} revision(s) failed", highlight=False)
    if pins_note:
        console.print(pins_note, highlight=False)

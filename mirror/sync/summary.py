"""The table a sync prints at the end (or, for ``--dry-run``, what it would fetch)."""

from __future__ import annotations

import sys
from typing import Any

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
    seen: set[str] = set()  # a dry run counts a blob that several revisions share once, on its first row
    for job in result.jobs:
        if job.error:
            status = f"FAILED: {job.error}"
        else:
            status = "ok" + (f" ({job.note})" if job.note else "")
        if result.dry_run:
            own = [f for f in dict((f.etag, f) for f in job.missing).values() if f.etag not in seen]
            seen.update(f.etag for f in own)
            shared = len({f.etag for f in job.missing}) - len(own)
            if shared:
                status += f" (+{shared} shared with a row above)"
            count, size = len(own), sum(f.size for f in own)
        else:
            count, size = job.fetched, job.fetched_bytes
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
    if result.selection is not None:
        _print_selection(console, result, box.SIMPLE if sys.stdout.isatty() else box.ASCII)
    if pins_note:
        console.print(pins_note, highlight=False)


def _print_selection(console: Any, result: SyncResult, table_box: Any) -> None:
    """The [[select]] rules: each selected repo with its status (new, selected, gone) and bytes, the rules whose
    listing failed, and the repos that disappeared upstream (kept in the cache, pinned, never deleted)."""
    from rich.table import Table

    selection = result.selection
    assert selection is not None
    by_label: dict[str, list[Any]] = {}
    for job in result.jobs:
        by_label.setdefault(job.spec.label, []).append(job)
    from rich.markup import escape

    table = Table(title=escape("selection ([[select]] rules)"), box=table_box)
    for column in ("repo", "rule", "status", "files", "bytes", "to fetch" if result.dry_run else "fetched"):
        table.add_column(column, overflow="fold")
    changes = selection.changes
    for spec in selection.specs:
        jobs = by_label.get(spec.label, [])
        files = {f.etag: f.size for job in jobs for f in job.files}
        done = (sum(f.size for job in jobs for f in job.missing) if result.dry_run
                else sum(job.fetched_bytes for job in jobs))
        table.add_row(spec.label, escape((spec.selected_by or "-").removeprefix("[[select]] ")),
                      selection.status(spec.label), str(len(files)),
                      format_size(sum(files.values())), format_size(done))
    for label in selection.named_too:
        table.add_row(label, "-", "selected; its [[repo]] table applies", "", "", "")
    for spec in selection.kept:
        gone = changes is not None and (spec.label in changes.gone or spec.label in changes.still_gone)
        since = changes.gone_since(selection.state, spec.label) if changes and selection.state else None
        status = (("GONE upstream: kept" + (f", since {since}" if since else "")) if gone
                  else "not listed (listing failed): kept")
        table.add_row(spec.label, escape((spec.selected_by or "-").removeprefix("[[select]] ")), status, "", "", "")
    console.print(table)
    for rule in selection.failed:
        console.print(f"FAILED {rule.rule.label}: {rule.error}", highlight=False, markup=False)
    if changes is not None:
        def names(labels: list[str]) -> str:
            return (": " + ", ".join(labels)) if labels else ""

        head = "first run: " if changes.first_run else "since the last run: "
        console.print(f"{head}{len(changes.new)} new{names(changes.new)}; {len(changes.gone)} disappeared upstream "
                      f"(kept, not deleted){names(changes.gone)}; {len(changes.still_gone)} still gone (kept)"
                      f"{names(changes.still_gone)}; {len(changes.back)} listed again{names(changes.back)}",
                      highlight=False, markup=False)
        if result.dry_run:
            console.print(f"dry run: the state file {selection.state.path if selection.state else '-'} is not "
                          "updated", highlight=False)
    total = sum({f.etag: f.size for job in result.jobs if job.spec.selected_by for f in job.files}.values())
    console.print(f"selected: {len(selection.specs)} repo(s), {total} bytes ({format_size(total)}) in their "
                  "selected files", highlight=False)

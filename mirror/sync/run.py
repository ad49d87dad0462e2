"""One sync run: plan every (repo, revision) job, then fetch each missing blob once, however many revisions
share it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from mirror.config import format_size
from mirror.errors import MirrorError
from mirror.sync.backend import Backend
from mirror.sync.jobs import RemoteFile, RevisionJob, error_text, tree_files
from mirror.sync.manifest import Manifest
from mirror.sync.progress import Reporter
from mirror.sync.selection import select


@dataclass
class SyncResult:
    jobs: list[RevisionJob]
    fetched_files: int
    fetched_bytes: int
    to_fetch_files: int
    to_fetch_bytes: int
    dry_run: bool
    elapsed: float

    @property
    def failed(self) -> list[RevisionJob]:
        return [j for j in self.jobs if j.error]


async def _plan(backend: Backend, job: RevisionJob, reporter: Reporter) -> None:
    spec = job.spec
    if spec.token_env is not None:
        job.token = os.environ.get(spec.token_env) or None
        if job.token is None:
            job.error = f"the token variable {spec.token_env} is not set"
            return
    else:
        job.token = backend.default_token  # --upstream-token / HF_TOKEN, as the server uses for anonymous callers
    try:
        job.commit, job.note = await backend.resolve(job)
        entries = await backend.list_tree(job)
        all_files = tree_files(entries)
        chosen = set(select([f.path for f in all_files], spec.allow, spec.ignore))
        job.files = [f for f in all_files if f.path in chosen]
        if not job.files and (spec.allow is not None or spec.ignore is not None):
            job.note = "no file matches the allow/ignore patterns"
        await backend.prepare(job, entries)
        job.missing = [f for f in job.files if not await backend.cached(job, f)]
    except (MirrorError, httpx.HTTPError, ValueError) as exc:
        job.error = error_text(exc)
        return
    if job.stale:
        job.error = job.note
    reporter.info(f"{job.label} -> {job.commit[:12] if job.commit else '?'}: {len(job.files)} files, "
                  f"{len(job.missing)} to fetch ({format_size(sum(f.size for f in job.missing))})")


async def run_sync(manifest: Manifest, backend: Backend, reporter: Reporter, *, concurrency: int,
                   dry_run: bool, on_planned: Callable[[list[RevisionJob]], None] | None = None) -> SyncResult:
    """Plan every job, then fetch each missing blob once. ``on_planned``: told the planned jobs (a warm job's
    totals come from there)."""
    started = time.monotonic()
    jobs = [RevisionJob(spec, revision) for spec in manifest.repos for revision in spec.revisions]
    plan_limit = asyncio.Semaphore(max(1, min(concurrency, 4)))

    async def plan(job: RevisionJob) -> None:
        async with plan_limit:
            await _plan(backend, job, reporter)

    await asyncio.gather(*(plan(job) for job in jobs))
    if on_planned is not None:
        on_planned(jobs)
    if not dry_run and backend.pins_supported:
        backend.pin(manifest)

    # One download per blob, even when revisions share it.
    work: dict[str, tuple[RevisionJob, RemoteFile]] = {}
    sharers: dict[str, list[RevisionJob]] = {}
    for job in jobs:
        for item in job.missing:
            work.setdefault(item.etag, (job, item))
            sharers.setdefault(item.etag, []).append(job)
    to_fetch_bytes = sum(item.size - backend.partial_bytes(item) for _, item in work.values())
    if dry_run:
        for job, item in work.values():
            partial = backend.partial_bytes(item)
            extra = f", {format_size(partial)} already in a partial file" if partial else ""
            reporter.info(f"would fetch {job.label} {item.path} ({format_size(item.size)}{extra})")
        return SyncResult(jobs, 0, 0, len(work), to_fetch_bytes, True, time.monotonic() - started)
    if not work:
        reporter.info(f"nothing to fetch: all {sum(len(j.files) for j in jobs)} selected files of "
                      f"{len(jobs)} revision(s) are cached")
        return SyncResult(jobs, 0, 0, 0, 0, False, time.monotonic() - started)

    reporter.info(f"fetching {len(work)} files, {format_size(to_fetch_bytes)} with concurrency {concurrency}")
    reporter.start(sum(item.size for _, item in work.values()))
    limit = asyncio.Semaphore(max(1, concurrency))
    fetched_files = 0

    async def fetch(etag: str, job: RevisionJob, item: RemoteFile) -> None:
        nonlocal fetched_files
        label = f"{job.spec.repo.repo_id}@{job.revision}/{item.path}"
        async with limit:
            reporter.file_started(etag, label, item.size)
            try:
                got = await backend.fetch(job, item, lambda done: reporter.file_progress(etag, done))
            except (MirrorError, httpx.HTTPError, OSError) as exc:
                message = error_text(exc)
                reporter.file_finished(etag, label, False, message)
                for sharer in sharers[etag]:
                    sharer.failed_files += 1
                    sharer.error = sharer.error or f"{item.path}: {message}"
                return
            if got is None:
                reporter.file_finished(etag, label, True, "already cached")
                return
            reporter.file_finished(etag, label, True, format_size(got))
            fetched_files += 1
            job.fetched_bytes += got
            for sharer in sharers[etag]:
                sharer.fetched += 1

    try:
        await asyncio.gather(*(fetch(etag, job, item) for etag, (job, item) in work.items()))
    finally:
        reporter.stop()
    if fetched_files == 0 and not any(j.failed_files for j in jobs):
        reporter.info(f"nothing to fetch: all {len(work)} selected files were already cached")
    for job in jobs:
        if job.failed_files > 1 and job.error:
            job.error = f"{job.failed_files} files failed; first: {job.error}"
    total = int(getattr(backend, "total_fetched", sum(j.fetched_bytes for j in jobs)))
    return SyncResult(jobs, fetched_files, total, len(work), to_fetch_bytes, False, time.monotonic() - started)

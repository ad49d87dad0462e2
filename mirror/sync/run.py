"""One sync run: plan every (repo, revision) job, then fetch each missing blob once, however many revisions
share it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from mirror.config import format_size
from mirror.errors import ErrorCode, HubError, MirrorError
from mirror.hubjson import tree_files
from mirror.sync.backend import Backend
from mirror.sync.expand import Selection, expand
from mirror.sync.jobs import RemoteFile, RevisionJob, error_text
from mirror.sync.manifest import PARQUET_REF, Manifest
from mirror.sync.progress import Reporter
from mirror.sync.selection import select
from mirror.sync.state import SyncState


@dataclass
class SyncResult:
    jobs: list[RevisionJob]
    fetched_files: int
    fetched_bytes: int
    to_fetch_files: int
    to_fetch_bytes: int
    dry_run: bool
    elapsed: float
    selection: Selection | None = None  # the [[select]] rules' listings, when the manifest has any
    pinned: int = 0  # repos pinned for the manifest (none in a dry run or through --mirror)

    @property
    def failed(self) -> list[RevisionJob]:
        return [j for j in self.jobs if j.error]

    @property
    def ok(self) -> bool:
        """No revision failed and every [[select]] listing answered (the exit code: 0, else 1)."""
        return not self.failed and not (self.selection is not None and self.selection.failed)


async def _plan(backend: Backend, job: RevisionJob, reporter: Reporter) -> None:
    spec = job.spec
    if spec.token_env is not None:
        job.token = os.environ.get(spec.token_env) or None
        if job.token is None:
            job.error = f"the token variable {spec.token_env} is not set"
            return
    else:
        job.token = backend.default_token  # --upstream-token / HF_TOKEN, as the server uses for anonymous callers
    # The conversion branch asked for by ``parquet_branch`` is taken whole: the patterns are written for main's
    # layout, the branch's is {config}/{split}/NNNN.parquet.
    whole = spec.parquet_branch and job.revision == PARQUET_REF
    allow, ignore = (None, None) if whole else (spec.allow, spec.ignore)
    try:
        try:
            job.commit, job.note = await backend.resolve(job)
        except HubError as exc:
            if whole and exc.status == 404 and exc.code == ErrorCode.REVISION_NOT_FOUND:
                job.note = f"no {PARQUET_REF} upstream (not converted)"
                reporter.info(f"{job.label}: {job.note}")
                return
            raise
        entries = await backend.list_tree(job)
        all_files = tree_files(entries)
        chosen = set(select([f.path for f in all_files], allow, ignore))
        job.files = [f for f in all_files if f.path in chosen]
        if not job.files and (allow is not None or ignore is not None):
            job.note = "no file matches the allow/ignore patterns"
        await backend.prepare(job, entries)
        job.missing = []
        for n, item in enumerate(job.files, 1):
            if not await backend.cached(job, item):
                job.missing.append(item)
            if n % 256 == 0:
                await asyncio.sleep(0)  # a stat per file: let the server's clients in between (warm jobs run here)
    except (MirrorError, httpx.HTTPError, ValueError) as exc:
        job.error = error_text(exc)
        job.repo_missing = isinstance(exc, HubError) and exc.code == ErrorCode.REPO_NOT_FOUND
        return
    if job.stale:
        job.error = job.note
    reporter.info(f"{job.label} -> {job.commit[:12] if job.commit else '?'}: {len(job.files)} files, "
                  f"{len(job.missing)} to fetch ({format_size(sum(f.size for f in job.missing))})")


async def run_sync(manifest: Manifest, backend: Backend, reporter: Reporter, *, concurrency: int,
                   dry_run: bool, on_planned: Callable[[list[RevisionJob]], None] | None = None,
                   state: SyncState | None = None) -> SyncResult:
    """List the [[select]] rules (compared with ``state``, updated in memory: the caller saves it), plan every
    job, then fetch each missing blob once. ``on_planned``: told the planned jobs (a warm job's totals come from
    there)."""
    started = time.monotonic()
    selection = await expand(manifest, backend, reporter, state) if manifest.selects else None
    specs = [*manifest.repos, *(selection.specs if selection else ())]
    jobs = [RevisionJob(spec, revision) for spec in specs for revision in spec.all_revisions]
    plan_limit = asyncio.Semaphore(max(1, min(concurrency, 4)))

    async def plan(job: RevisionJob) -> None:
        async with plan_limit:
            await _plan(backend, job, reporter)

    await asyncio.gather(*(plan(job) for job in jobs))
    pinned_count = 0
    if on_planned is not None:
        on_planned(jobs)
    if not dry_run and backend.pins_supported:
        # Selected repos are pinned like named ones; those that disappeared upstream stay pinned (kept). A named
        # repo upstream says does not exist is not pinned (a typo must not hold a pin); other failures keep theirs.
        missing = {job.spec for job in jobs if job.repo_missing}
        missing -= {job.spec for job in jobs if not job.repo_missing}
        pinned = (*(spec for spec in specs if spec not in missing), *(selection.kept if selection else ()))
        backend.pin(replace(manifest, repos=pinned, selects=()))
        pinned_count = len(pinned)

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
        return SyncResult(jobs, 0, 0, len(work), to_fetch_bytes, True, time.monotonic() - started, selection,
                          pinned_count)
    if not work:
        reporter.info(f"nothing to fetch: all {sum(len(j.files) for j in jobs)} selected files of "
                      f"{len(jobs)} revision(s) are cached")
        return SyncResult(jobs, 0, 0, 0, 0, False, time.monotonic() - started, selection, pinned_count)

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
    return SyncResult(jobs, fetched_files, total, len(work), to_fetch_bytes, False, time.monotonic() - started,
                      selection, pinned_count)

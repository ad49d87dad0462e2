"""Warm on request, for automation and init containers: ``POST /api/mirror/warm`` and ``GET /api/mirror/ready``.

A warm job is a one-repo sync run inside the server, on the nightly sync's engine (:func:`mirror.sync.run.run_sync`
with a :class:`~mirror.sync.cache_dir_backend.CacheDirBackend` over the server's own parts): the same fills and
single flight as every client request, so a warm and a download of the same file fetch it once. It reads upstream
with the caller's token (or, in mirror-auth mode, the service token on an authorized caller's behalf), never with
a lent one, and pins nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.access import Caller
from mirror.errors import MirrorError
from mirror.sync.backend import CacheParts
from mirror.sync.cache_dir_backend import CacheDirBackend
from mirror.sync.jobs import RevisionJob, error_text, tree_files
from mirror.sync.manifest import Manifest, RepoSpec
from mirror.sync.run import run_sync
from mirror.sync.selection import select

log = logging.getLogger("hf_mirror.warm")

_KEPT_JOBS = 1000  # finished jobs remembered for GET /api/mirror/warm/{id}; the oldest are forgotten
_MISSING_LISTED = 100  # paths a 503 of /ready names (with the count of all)


@dataclass(frozen=True)
class WarmRequest:
    """What to warm: one revision of one repo, optionally a subset of its files (fnmatch patterns)."""

    repo: hf.RepoRef
    revision: str = "main"
    allow: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None

    @property
    def spec(self) -> RepoSpec:
        return RepoSpec(self.repo, (self.revision,), self.allow, self.ignore)


@dataclass
class WarmJob:
    id: str
    request: WarmRequest
    commit: str
    state: str = "queued"  # queued | running | done | failed
    files_total: int = 0
    files_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0
    errors: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    _progress: dict[str, int] = field(default_factory=dict, repr=False)
    _bytes_cached: int = field(default=0, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "repo": self.request.repo.repo_id, "type": self.request.repo.type.value,
                "revision": self.request.revision, "commit": self.commit, "state": self.state,
                "files_total": self.files_total, "files_done": self.files_done, "bytes_total": self.bytes_total,
                "bytes_done": self.bytes_done, "errors": self.errors}

    # --- the sync run's progress (mirror.sync.progress.Reporter) -------------------------------------------------

    def planned(self, jobs: list[RevisionJob]) -> None:
        for job in jobs:
            self.files_total += len(job.files)
            self.bytes_total += sum(f.size for f in job.files)
            cached = [f for f in job.files if f not in job.missing]
            self.files_done += len(cached)
            self._bytes_cached += sum(f.size for f in cached)
            if job.error:
                self.errors.append(job.error)
        self.bytes_done = self._bytes_cached

    def start(self, total_bytes: int) -> None:
        pass

    def file_started(self, key: str, label: str, size: int) -> None:
        self._progress[key] = 0

    def file_progress(self, key: str, done: int) -> None:
        self._progress[key] = done
        self.bytes_done = self._bytes_cached + sum(self._progress.values())

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        if ok:
            self.files_done += 1
        else:
            self.errors.append(f"{label}: {message}")

    def info(self, message: str) -> None:
        log.info("warm %s: %s", self.id, message)

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class Readiness:
    ready: bool
    commit: str
    files_total: int
    missing: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"ready": self.ready, "commit": self.commit, "files_total": self.files_total,
                "files_missing": len(self.missing), "missing": list(self.missing[:_MISSING_LISTED])}


class _WarmBackend(CacheDirBackend):
    """The sync's cache backend over the server's running parts: the caller's token, no pins, parts left open."""

    pins_supported = False

    def __init__(self, parts: CacheParts, caller: Caller) -> None:
        super().__init__(parts.settings, dry_run=False, parts=parts)
        self.default_token = caller.token
        self.own_token = caller.own_token

    def _caller(self, job: RevisionJob) -> Caller:
        return Caller(job.token, own_token=self.own_token)


class WarmJobs:
    def __init__(self, parts: CacheParts, *, concurrency: int = 4) -> None:
        self.parts = parts
        self.concurrency = concurrency
        self._jobs: OrderedDict[str, WarmJob] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, request: WarmRequest, caller: Caller) -> WarmJob:
        """Resolve the revision now (errors are the caller's: 404, 401...), then warm in the background."""
        backend = _WarmBackend(self.parts, caller)
        probe = RevisionJob(request.spec, request.revision, token=caller.token)
        commit, _note = await backend.resolve(probe)
        job = WarmJob(os.urandom(8).hex(), request, commit)
        self._jobs[job.id] = job
        while len(self._jobs) > _KEPT_JOBS:
            self._jobs.popitem(last=False)
        task = asyncio.create_task(self._run(job, backend))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def get(self, job_id: str) -> WarmJob | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[WarmJob]:
        """The jobs kept (the last 1000), oldest first: the status page shows the running ones."""
        return list(self._jobs.values())

    async def _run(self, job: WarmJob, backend: _WarmBackend) -> None:
        job.state = "running"
        manifest = Manifest(Path("<warm>"), (job.request.spec,))
        try:
            result = await run_sync(manifest, backend, job, concurrency=self.concurrency, dry_run=False,
                                    on_planned=job.planned)
            for failed in result.failed:
                if failed.error and failed.error not in job.errors:
                    job.errors.append(failed.error)
        except Exception as exc:  # noqa: BLE001 - a job's failure is reported by its state, not raised
            log.warning("warm %s failed: %s", job.id, exc)
            job.errors.append(error_text(exc))
        job.state = "failed" if job.errors else "done"
        log.info("warm %s %s %s@%s: %d/%d files", job.id, job.state, job.request.repo.key, job.commit[:12],
                 job.files_done, job.files_total)

    async def ready(self, request: WarmRequest, caller: Caller) -> Readiness:
        """Whether every selected file of the revision is stored: what an init container polls."""
        backend = _WarmBackend(self.parts, caller)
        job = RevisionJob(request.spec, request.revision, token=caller.token)
        job.commit, _note = await backend.resolve(job)
        files = tree_files(await backend.list_tree(job))
        chosen = set(select([f.path for f in files], request.allow, request.ignore))
        selected = [f for f in files if f.path in chosen]
        missing = []
        for item in selected:
            try:
                stored = await backend.cached(job, item)
            except MirrorError:
                stored = False
            if not stored:
                missing.append(item.path)
        return Readiness(not missing, job.commit, len(selected), tuple(sorted(missing)))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

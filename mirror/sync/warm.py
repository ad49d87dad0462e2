"""Warm on request, for automation and init containers: ``POST /api/mirror/warm`` and ``GET /api/mirror/ready``.

A warm job is a one-repo sync run inside the server, on the nightly sync's engine (:func:`mirror.sync.run.run_sync`
with a :class:`~mirror.sync.cache_dir_backend.CacheDirBackend` over the server's own parts): the same fills and
single flight as every client request, so a warm and a download of the same file fetch it once. It reads upstream
with the caller's token (or, in mirror-auth mode, the service token on an authorized caller's behalf), never with
a lent one, and pins nothing.

Bounded, so that one caller cannot stall every other (issue 23): identical warms share one job while it is queued or
running; at most ``warm_jobs`` jobs run at once and ``warm_queue`` more wait (beyond: 503); each caller has a rate
(``warm_rate`` a minute, beyond: 429); a warm selecting more than ``warm_max_bytes`` needs an operator (413); finished
jobs are remembered, with their errors, in bounded memory.

In a fleet (``metadata_url``) a warm runs once whichever nodes are asked: the node that admits it first claims it in
the database and publishes its state there while it runs (every :data:`_PUBLISH_EVERY` seconds; a claim whose node
stops publishing lapses after :data:`_CLAIM_TTL`); a node asked the same warm meanwhile answers with that job
(:class:`FleetJob`), and any node answers its status. The database down, a node runs its warms itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.access import Caller, token_digest
from mirror.config import format_size
from mirror.errors import MirrorError, RetryLater, TooLarge
from mirror.hubjson import tree_files
from mirror.metadata.base import MetadataStore
from mirror.sync.backend import CacheParts
from mirror.sync.cache_dir_backend import CacheDirBackend
from mirror.sync.jobs import RevisionJob, error_text
from mirror.sync.manifest import Manifest, RepoSpec
from mirror.sync.run import run_sync
from mirror.sync.selection import select

log = logging.getLogger("hf_mirror.warm")

_KEPT_JOBS = 1000  # finished jobs remembered for GET /api/mirror/warm/{id}; the oldest are forgotten
_KEPT_ERRORS = 20  # errors a job lists (a repo of 10,000 failing files must not hold 10,000 messages)
_CALLERS = 10_000  # callers whose rate is remembered; the least recently seen is forgotten (a full allowance again)
_QUEUE_RETRY_AFTER = 10.0  # seconds a 503 of a full queue asks the caller to wait
_MISSING_LISTED = 100  # paths a 503 of /ready names (with the count of all)
_PUBLISH_EVERY = 2.0  # seconds between a fleet job's state updates in the database
_CLAIM_TTL = 30.0  # seconds a fleet job's claim outlives its last update (its node died: another may run the warm)


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

    errors_more: int = 0  # errors past the first _KEPT_ERRORS, counted only

    def as_json(self) -> dict[str, Any]:
        errors = [*self.errors, f"... and {self.errors_more} more"] if self.errors_more else self.errors
        return {"id": self.id, "repo": self.request.repo.repo_id, "type": self.request.repo.type.value,
                "revision": self.request.revision, "commit": self.commit, "state": self.state,
                "files_total": self.files_total, "files_done": self.files_done, "bytes_total": self.bytes_total,
                "bytes_done": self.bytes_done, "errors": errors}

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def error(self, message: str) -> None:
        if message in self.errors:
            return
        if len(self.errors) < _KEPT_ERRORS:
            self.errors.append(message)
        else:
            self.errors_more += 1

    # --- the sync run's progress (mirror.sync.progress.Reporter) -------------------------------------------------

    def planned(self, jobs: list[RevisionJob]) -> None:
        for job in jobs:
            self.files_total += len(job.files)
            self.bytes_total += sum(f.size for f in job.files)
            cached = [f for f in job.files if f not in job.missing]
            self.files_done += len(cached)
            self._bytes_cached += sum(f.size for f in cached)
            if job.error:
                self.error(job.error)
        self.bytes_done = self._bytes_cached

    def start(self, total_bytes: int) -> None:
        pass

    def file_started(self, key: str, label: str, size: int) -> None:
        self._progress[key] = 0

    def file_progress(self, key: str, done: int) -> None:
        self._progress[key] = done
        self.bytes_done = self._bytes_cached + sum(self._progress.values())

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        done = self._progress.pop(key, 0)  # only the files in flight are kept (and summed on each progress)
        if ok:
            self.files_done += 1
            self._bytes_cached += done
        else:
            self.error(f"{label}: {message}")
        self.bytes_done = self._bytes_cached + sum(self._progress.values())

    def info(self, message: str) -> None:
        log.info("warm %s: %s", self.id, message)

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class FleetJob:
    """A warm job another node of the fleet runs, as it last published it."""

    id: str
    request: WarmRequest
    commit: str
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetJob | None:
        try:
            repo = hf.RepoRef(hf.RepoType(data["type"]), str(data["repo"]))
            return cls(str(data["id"]), WarmRequest(repo, str(data["revision"])), str(data["commit"]), data)
        except (KeyError, ValueError, TypeError):
            return None

    def as_json(self) -> dict[str, Any]:
        return dict(self.data)

    @property
    def finished(self) -> bool:
        return self.data.get("state") in ("done", "failed")


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


class CallerRate:
    """At most ``per_minute`` requests a minute per caller: a bucket of that many, refilled evenly (0: no limit).
    The last ``callers`` callers seen are remembered, so that random tokens or addresses cannot grow the process."""

    def __init__(self, per_minute: float, *, callers: int = _CALLERS) -> None:
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute)
        self.callers = callers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # who -> (allowance, when counted)

    def take(self, who: str) -> float:
        """0 when ``who`` may go on (one request counted), else the seconds until it may ask again."""
        if self.per_minute <= 0:
            return 0.0
        now = time.monotonic()
        per_second = self.per_minute / 60
        allowance, when = self._buckets.pop(who, (self.capacity, now))
        allowance = min(self.capacity, allowance + (now - when) * per_second)
        wait = 0.0
        if allowance >= 1:
            allowance -= 1
        else:
            wait = (1 - allowance) / per_second
        self._buckets[who] = (allowance, now)
        while len(self._buckets) > self.callers:
            self._buckets.popitem(last=False)
        return wait


_Identity = tuple[WarmRequest, str | None]  # what a job warms, and for which token (None: the content is public)


class WarmJobs:
    def __init__(self, parts: CacheParts, *, concurrency: int = 4, fleet: MetadataStore | None = None) -> None:
        settings = parts.settings
        self.parts = parts
        self.fleet = fleet  # the fleet's database (metadata_url): one job per warm across the nodes
        self.concurrency = concurrency  # fills one job runs at once
        self.running = settings.warm_jobs
        self.queue = settings.warm_queue
        self.max_bytes = settings.warm_max_bytes
        self.rate = CallerRate(settings.warm_rate)
        self._jobs: OrderedDict[str, WarmJob] = OrderedDict()
        self._active: dict[_Identity, WarmJob] = {}  # queued or running, by what they warm: identical warms share
        self._admitting: dict[_Identity, asyncio.Future[WarmJob | FleetJob]] = {}  # being admitted for a POST now
        self._slots = asyncio.Semaphore(self.running)  # jobs running
        self._admit_slots = asyncio.Semaphore(self.running)  # admissions resolving and listing at once
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, request: WarmRequest, caller: Caller, *, who: str = "", operator: bool = False
                     ) -> WarmJob | FleetJob:
        """The job warming ``request`` for ``caller``: the one already queued or running for the same request (and
        token, unless the content is public), else a new one once the revision is resolved and the selection sized
        (errors are the caller's: 404, 401, 413...). ``who``: the caller as the rate counts it (its token's digest,
        else its address). ``operator``: an operator credential, which lifts the size cap."""
        wait = self.rate.take(who)
        if wait:
            raise RetryLater(f"too many warm requests from this caller: at most {self.rate.per_minute:g} a minute",
                             retry_after=wait, policy="warm")
        identity = self._identity(request, caller)
        job = self._active.get(identity)
        if job is not None:
            return job
        pending = self._admitting.get(identity)
        if pending is not None:  # the same warm is being admitted for another request: its answer is this one's
            return await asyncio.shield(pending)
        if len(self._active) + len(self._admitting) >= self.running + self.queue:  # an admission counts as a job
            raise RetryLater(f"the warm queue is full ({self.running} running, {self.queue} waiting); try again later",
                             retry_after=_QUEUE_RETRY_AFTER, status=503, code="WarmQueueFull", policy="warm-queue")
        future: asyncio.Future[WarmJob | FleetJob] = asyncio.get_running_loop().create_future()
        self._admitting[identity] = future
        try:
            async with self._admit_slots:
                job, backend = await self._admit(request, caller, operator)
            held = await self._claim(identity, job)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: those waiting on it raise it themselves
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            del self._admitting[identity]
        if held is not None:  # another node runs this warm: its job is the answer
            future.set_result(held)
            return held
        future.set_result(job)
        self._jobs[job.id] = job
        self._active[identity] = job
        self._forget_old()
        task = asyncio.create_task(self._run(job, backend, identity))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _claim(self, identity: _Identity, job: WarmJob) -> FleetJob | None:
        """The fleet's live job of this warm (another node's), or None once ``job`` holds the claim (or no fleet)."""
        if self.fleet is None:
            return None
        request, digest = identity
        if digest == token_digest(None):  # an anonymous warm is one, whether this node knows the repo public yet
            digest = None
        key = json.dumps([request.repo.key, request.revision, request.allow, request.ignore, digest])
        try:
            held = await self.fleet.claim_job(key, job.id, job.as_json(), _CLAIM_TTL)
        except MirrorError as exc:
            log.warning("warm %s runs without the fleet's claim: %s", job.id, exc)
            return None
        return None if held is None else FleetJob.from_json(held)

    async def _publish(self, job: WarmJob) -> None:
        """A fleet job's state in the database while it runs, so that any node answers its status."""
        assert self.fleet is not None
        while True:
            await asyncio.sleep(_PUBLISH_EVERY)
            try:
                await self.fleet.update_job(job.id, job.as_json(), _CLAIM_TTL)
            except MirrorError as exc:
                log.debug("warm %s state not published: %s", job.id, exc)

    async def find(self, job_id: str) -> WarmJob | FleetJob | None:
        """A job of this node, or (in a fleet) one another node runs or ran."""
        job = self._jobs.get(job_id)
        if job is not None or self.fleet is None:
            return job
        try:
            data = await self.fleet.get_job(job_id)
        except MirrorError:
            return None
        return None if data is None else FleetJob.from_json(data)

    def _identity(self, request: WarmRequest, caller: Caller) -> _Identity:
        """Public content is warmed the same whoever asks; other content with the asker's token, so a job of a
        refused token is never what an entitled caller gets."""
        if self.parts.access.is_public(request.repo, "content"):
            return request, None
        return request, token_digest(caller.token)

    async def _admit(self, request: WarmRequest, caller: Caller, operator: bool) -> tuple[WarmJob, _WarmBackend]:
        backend = _WarmBackend(self.parts, caller)
        probe = RevisionJob(request.spec, request.revision, token=caller.token)
        commit, _note = await backend.resolve(probe)
        if self.max_bytes is not None and not operator:
            probe.commit = commit
            files = tree_files(await backend.list_tree(probe))  # cached by the server: the job lists it again
            chosen = set(select([f.path for f in files], request.allow, request.ignore))
            planned = sum(f.size for f in files if f.path in chosen)
            if planned > self.max_bytes:
                raise TooLarge(f"this warm selects {format_size(planned)}, over the cap of "
                               f"{format_size(self.max_bytes)} for callers without an operator credential "
                               f"(warm_max_bytes); narrow it with allow_patterns, or ask an operator")
        return WarmJob(os.urandom(8).hex(), request, commit), backend

    def _forget_old(self) -> None:
        """Keep the last _KEPT_JOBS finished jobs; queued and running ones are bounded by the queue."""
        excess = len(self._jobs) - _KEPT_JOBS
        if excess <= 0:
            return
        for job_id in [i for i, j in self._jobs.items() if j.finished][:excess]:
            del self._jobs[job_id]

    def get(self, job_id: str) -> WarmJob | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[WarmJob]:
        """The jobs kept (queued, running, and the last 1000 finished), oldest first: the status page shows the
        running ones."""
        return list(self._jobs.values())

    async def _run(self, job: WarmJob, backend: _WarmBackend, identity: _Identity) -> None:
        publisher = asyncio.create_task(self._publish(job)) if self.fleet is not None else None
        try:
            async with self._slots:
                job.state = "running"
                manifest = Manifest(Path("<warm>"), (job.request.spec,))
                result = await run_sync(manifest, backend, job, concurrency=self.concurrency, dry_run=False,
                                        on_planned=job.planned)
                for failed in result.failed:
                    if failed.error:
                        job.error(failed.error)
        except asyncio.CancelledError:
            job.error("stopped: the server shut down")
            raise
        except Exception as exc:  # noqa: BLE001 - a job's failure is reported by its state, not raised
            log.warning("warm %s failed: %s", job.id, exc)
            job.error(error_text(exc))
        finally:
            if self._active.get(identity) is job:
                del self._active[identity]
            job.state = "failed" if job.errors else "done"
            self._forget_old()
            if publisher is not None:
                publisher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publisher
                await self._published_end(job)
        log.info("warm %s %s %s@%s: %d/%d files", job.id, job.state, job.request.repo.key, job.commit[:12],
                 job.files_done, job.files_total)

    async def _published_end(self, job: WarmJob) -> None:
        assert self.fleet is not None
        try:
            await self.fleet.update_job(job.id, job.as_json(), _CLAIM_TTL, finished=True)
        except MirrorError as exc:  # its claim lapses by itself
            log.debug("warm %s end not published: %s", job.id, exc)

    async def ready(self, request: WarmRequest, caller: Caller) -> Readiness:
        """Whether every selected file of the revision is stored: what an init container polls."""
        backend = _WarmBackend(self.parts, caller)
        job = RevisionJob(request.spec, request.revision, token=caller.token)
        job.commit, _note = await backend.resolve(job)
        files = tree_files(await backend.list_tree(job))
        chosen = set(select([f.path for f in files], request.allow, request.ignore))
        selected = [f for f in files if f.path in chosen]
        missing = []
        for n, item in enumerate(selected, 1):
            try:
                stored = await backend.cached(job, item)
            except MirrorError:
                stored = False
            if not stored:
                missing.append(item.path)
            if n % 256 == 0:
                await asyncio.sleep(0)  # a stat per file: other clients get the loop in between
        return Readiness(not missing, job.commit, len(selected), tuple(sorted(missing)))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

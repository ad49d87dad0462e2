"""The status data: one page of cached repos (filtered, sorted and paginated on the server), one repo's detail, fills
and warm jobs in progress, totals, quota and disk, the syncs' last runs, and the traffic history. Everything comes
from the last usage snapshot, in-process counters and small reads done in threads: the request path never scans the
store (``CacheManager.current_snapshot`` refreshes in a thread)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mirror import __version__
from mirror.access import token_digest
from mirror.hf import RepoRef, RepoType
from mirror.metrics import Outcome
from mirror.status.history import StatusHistory
from mirror.sync.record import read_runs

if TYPE_CHECKING:
    from mirror.cache import CacheManager, RepoUsage, UsageSnapshot
    from mirror.config import Settings
    from mirror.fill import FillManager
    from mirror.index import FileEntry
    from mirror.upstream import UpstreamClient

PER_PAGE = 50
MAX_PER_PAGE = 500
_MAX_QUERY = 200
MAX_FILES = 500  # files listed on a repo page (a repo of 100,000 files says how many are left out)
_STATS = 2000  # blobs a repo page looks at on disk (a stat each), in the files' path order
_RECENT_FILES = 10  # the repo page's "recent traffic": the files used last
_DISK_EVERY = 5.0  # seconds the free-disk figure and the sync records are reused (a statvfs and a few small files)
_CONFIRMED_KEPT = 64  # tokens whose lists of confirmed repos are kept
SYNC_LATE = 26 * 3600  # a sync with no success for this long is late (the alert rule HfMirrorSyncLate says the same)
Visible = Callable[[str, str], bool]  # (type, repo id) -> may this page list it (mirror-auth off: public repos only)
# The repo list's orders: the key of each (the name breaks ties), and the direction a click on its header starts with.
SORTS: dict[str, tuple[Callable[[RepoUsage, bool], Any], str]] = {
    "name": (lambda u, _p: (u.repo_id.lower(), u.type), "asc"),
    "type": (lambda u, _p: (u.type, u.repo_id.lower()), "asc"),
    "size": (lambda u, _p: (u.bytes, u.repo_id.lower()), "desc"),
    "files": (lambda u, _p: (u.files, u.repo_id.lower()), "desc"),
    "last_use": (lambda u, _p: (u.last_access, u.repo_id.lower()), "desc"),
    "pinned": (lambda u, p: (p, u.repo_id.lower()), "desc"),
}
TYPES = tuple(t.value for t in RepoType)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value or default), low), high)
    except ValueError:
        return default


def parse_repo(value: str) -> tuple[str, str] | None:
    """``model:acme/x`` -> (``model``, ``acme/x``); None for anything else (the repo page then answers 404)."""
    kind, _, repo_id = value.partition(":")
    parts = repo_id.split("/")
    if kind not in TYPES or not 1 <= len(parts) <= 2 or not all(parts) or len(value) > 300:
        return None
    return kind, repo_id


class StatusBoard:
    def __init__(self, cache: CacheManager, settings: Settings, upstream: UpstreamClient, fills: FillManager,
                 history: StatusHistory, *, visible: Visible | None, warm_jobs: Any = None,
                 quarantine: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.cache = cache
        self.settings = settings
        self.upstream = upstream
        self.fills = fills
        self.history = history
        self.visible = visible
        self.warm_jobs = warm_jobs
        self.started = time.time()  # the page's uptime: this process's (a worker's, under --workers)
        # The snapshot's repos this page may list, computed once per snapshot (a visibility lookup per repo).
        self._listed: tuple[UsageSnapshot | None, list[RepoUsage]] = (None, [])
        self._pins: tuple[float, dict[tuple[str, str], str]] = (0.0, {})
        self._disk: tuple[float, dict[str, Any]] = (0.0, {})
        # Per token digest: the repos listed to it besides the public ones (see _with_confirmed).
        self._confirmed_lists: dict[str, tuple[UsageSnapshot, float, list[RepoUsage]]] = {}
        # The admission policy's quarantine (mirror.admission): blobs stored, never served, until an operator's
        # release; None without a policy.
        self.quarantine = quarantine

    async def _listable(self, snap: UsageSnapshot) -> list[RepoUsage]:
        if self._listed[0] is snap:
            return self._listed[1]
        if self.visible is None:
            listed = list(snap.repos)
        else:
            visible = self.visible
            listed = await asyncio.to_thread(lambda: [u for u in snap.repos if visible(u.type, u.repo_id)])
        self._listed = (snap, listed)
        return listed

    def _confirmed(self, token: str | None) -> Visible | None:
        """For a caller who sent a Hub token: the repos upstream confirmed it may read (within ``access_ttl``, as
        the files are served), so that the gated or private repos it pulled are listed to it, to it only."""
        if not token:
            return None
        subject, ttl, index = token_digest(token), self.settings.access_ttl, self.cache.index

        def allowed(kind: str, repo_id: str) -> bool:
            repo = RepoRef(RepoType(kind), repo_id)
            for what in ("content", "meta"):
                known = index.get_access(subject, what, repo)
                if known and known[0] and time.time() - known[1] < ttl:
                    return True
            return False
        return allowed

    async def _for_caller(self, snap: UsageSnapshot, *, visible: Visible | None, operator: bool,
                          token: str | None) -> tuple[list[RepoUsage], bool]:
        """The snapshot's repos this caller may see, and whether some cached repos are left out for it."""
        if operator:
            listed = list(snap.repos)
        else:
            listed = await self._listable(snap)
            confirmed = self._confirmed(token) if self.visible is not None else None
            if confirmed is not None and token and len(listed) < len(snap.repos):
                listed = await self._with_confirmed(snap, listed, token_digest(token), confirmed)
        if visible is not None:
            allowed = visible
            listed = await asyncio.to_thread(lambda: [u for u in listed if allowed(u.type, u.repo_id)])
        return listed, len(listed) < len(snap.repos)

    async def _with_confirmed(self, snap: UsageSnapshot, listed: list[RepoUsage], subject: str,
                              confirmed: Visible) -> list[RepoUsage]:
        """``listed`` and the snapshot's other repos confirmed for this token: an index lookup per unlisted repo,
        in a thread, kept for this snapshot a few seconds (a page refreshing every 5 s asks once per snapshot)."""
        kept = self._confirmed_lists.get(subject)
        if kept is not None and kept[0] is snap and time.monotonic() - kept[1] < _DISK_EVERY:
            return kept[2]
        shown = {(u.type, u.repo_id) for u in listed}
        mine = await asyncio.to_thread(lambda: [u for u in snap.repos if (u.type, u.repo_id) in shown
                                                or confirmed(u.type, u.repo_id)])
        self._confirmed_lists[subject] = (snap, time.monotonic(), mine)
        while len(self._confirmed_lists) > _CONFIRMED_KEPT:  # random tokens must not grow the process
            self._confirmed_lists.pop(next(iter(self._confirmed_lists)))
        return mine

    async def _pin_sources(self) -> dict[tuple[str, str], str]:
        at, pins = self._pins
        if time.monotonic() - at > 2.0:
            pins = await asyncio.to_thread(self.cache.index.pin_sources)  # a range query over the pins only
            self._pins = (time.monotonic(), pins)
        return pins

    def forget_pins(self) -> None:
        self._pins = (0.0, {})

    def _warm_jobs(self) -> list[Any]:
        return self.warm_jobs.recent() if self.warm_jobs is not None else []

    async def _disk_and_sync(self) -> dict[str, Any]:
        """The cache's filesystem (total, free) and the syncs' last runs: a statvfs and a few small files, read in
        a thread at most every ``_DISK_EVERY`` seconds."""
        at, known = self._disk
        if time.monotonic() - at < _DISK_EVERY:
            return known

        def read() -> dict[str, Any]:
            disk: dict[str, Any] = {}
            with contextlib.suppress(OSError):
                usage = shutil.disk_usage(self.cache.root)
                disk = {"total": usage.total, "used": usage.used, "free": usage.free}
            return {"disk": disk, "runs": read_runs(self.cache.layout)}
        known = await asyncio.to_thread(read)
        self._disk = (time.monotonic(), known)
        return known

    def _sync_runs(self, runs: list[Any]) -> list[dict[str, Any]]:
        now = time.time()
        return [{"manifest": r.manifest, "finished": r.finished, "finished_at": _when(r.finished), "ok": r.ok,
                 "last_success": r.last_success, "last_success_at": _when(r.last_success),
                 "files": r.files, "bytes": r.bytes, "failed": r.failed,
                 # The schedule is cron's or the systemd timer's: the mirror knows only when a run is overdue.
                 "next": None, "late": (now - (r.last_success or 0.0)) > SYNC_LATE}
                for r in runs]

    async def data(self, *, page: str | None = None, q: str | None = None, per_page: str | None = None,
                   sort: str | None = None, order: str | None = None, type: str | None = None,  # noqa: A002
                   pinned: str | None = None, repo: str | None = None, token: str | None = None,
                   hours: float = 6.0, visible: Visible | None = None, operator: bool = False) -> dict[str, Any]:
        """One page of the status (or one repo's, with ``repo``: :meth:`repo_data`); ``visible``: what this caller
        may see besides (a mirror token's patterns); ``operator``: the caller sent the admin token, and sees every
        repo; ``token``: the caller's bearer token, whose confirmed gated or private repos are listed to it."""
        if repo is not None:
            return await self.repo_data(repo, visible=visible, operator=operator, token=token)
        snap = await self.cache.current_snapshot()
        listed, hidden = await self._for_caller(snap, visible=visible, operator=operator, token=token)
        pins = await self._pin_sources()
        query = (q or "").strip()[:_MAX_QUERY]
        sort = sort if sort in SORTS else "name"
        order = order if order in ("asc", "desc") else SORTS[sort][1]
        kind = type if type in TYPES else ""
        pinned = pinned if pinned in ("yes", "no") else ""

        def choose() -> list[RepoUsage]:  # filter and sort in a thread: 100,000 repos take a while
            needle = query.lower()
            chosen = [u for u in listed
                      if (not needle or needle in f"{u.type}:{u.repo_id}".lower())
                      and (not kind or u.type == kind)
                      and (not pinned or ((u.type, u.repo_id) in pins) == (pinned == "yes"))]
            key = SORTS[sort][0]
            chosen.sort(key=lambda u: key(u, (u.type, u.repo_id) in pins), reverse=order == "desc")
            return chosen
        chosen = await asyncio.to_thread(choose)
        size = _int(per_page, PER_PAGE, 1, MAX_PER_PAGE)
        pages = max(1, math.ceil(len(chosen) / size))
        number = _int(page, 1, 1, pages)
        shown = chosen[(number - 1) * size: number * size]
        jobs = self._warm_jobs()
        last_job = {(j.request.repo.type.value, j.request.repo.repo_id): j for j in jobs}
        repos = []
        for u in shown:
            job = last_job.get((u.type, u.repo_id))
            repos.append({
                "type": u.type, "id": u.repo_id, "bytes": u.bytes, "files": u.files, "commits": len(u.commits),
                "pinned": (u.type, u.repo_id) in pins, "pinned_by": pins.get((u.type, u.repo_id)),
                "last_access": _when(u.last_access), "last_access_ts": u.last_access,
                "sync": _sync_state(pins.get((u.type, u.repo_id)), job),
            })
        hits_total = self.history.read()
        served = hits_total.hits + hits_total.misses
        may_list = self._lister(listed, visible=visible, operator=operator, token=token)
        fills = [{"repo": f.spec.repo.key, "path": f.spec.path, "written": f.written, "size": f.spec.size,
                  "sparse": f.sparse} for f in self.fills.active if may_list(f.spec.repo.key)]
        warming = [j.as_json() for j in jobs if j.state in ("queued", "running")
                   and may_list(j.request.repo.key)]
        counts = self._outcomes()
        negative = await asyncio.to_thread(self.cache.index.negative_usage)  # one SQL count
        disk = await self._disk_and_sync()
        return {
            "version": __version__, "started": self.started, "uptime": round(time.time() - self.started, 1),
            "upstream": {"url": self.settings.upstream_display, "healthy": self.upstream.healthy,
                         "last_error": self.upstream.last_error},
            "offline": self.settings.offline,
            "auth_required": self.settings.auth_required,
            "cache_bytes": snap.total_bytes,
            "cache_blobs": snap.total_blobs,
            # Sparse files (ranged reads of large files never completed): their windows, apart from the blobs.
            "sparse_files": snap.sparse_files, "sparse_bytes": snap.sparse_bytes,
            # None: the first count of a large cache is still running (the repos and totals come when it ends).
            "snapshot_age": round(max(0.0, time.time() - snap.taken_at), 1) if snap.taken_at else None,
            "index_bytes": self.cache.index.volume(),
            # Remembered 404s and refusals: bounded (--negative-max-entries/-bytes), their bytes in the quota.
            "negative_entries": negative[0], "negative_bytes": negative[1],
            "max_size": self.settings.max_size,
            "min_free_space": self.settings.min_free_space,
            "disk": disk["disk"],
            "sync_runs": self._sync_runs(disk["runs"]),
            "hits": int(counts.get(Outcome.HIT, 0)), "misses": int(counts.get(Outcome.MISS, 0)),
            "stale": int(counts.get(Outcome.STALE, 0)), "errors": int(counts.get(Outcome.ERROR, 0)),
            "hit_ratio": (hits_total.hits / served) if served else 0.0,
            "fills": fills,
            "warming": warming,
            "q": query, "sort": sort, "order": order, "type": kind, "pinned": pinned,
            "page": number, "pages": pages, "per_page": size, "repos_total": len(chosen),
            # Some cached repos are not listed to this caller (gated or private ones, or outside its token's
            # patterns): the page says so, without naming or counting them.
            "repos_hidden": hidden,
            "repos": repos,
            "history": {"interval": self.history.interval, "points": self.history.series(hours)},
            **({"quarantine": await self._quarantine()} if self.quarantine is not None else {}),
        }

    def _lister(self, listed: list[RepoUsage], *, visible: Visible | None, operator: bool,
                token: str | None) -> Callable[[str], bool]:
        """``model:acme/x`` -> whether the caller may see that repo's fills and warm jobs: a repo it is listed, or
        one not counted yet that passes the list's rules (public or confirmed for its token, and its patterns)."""
        keys: set[str] = set()  # built at the first fill or warm job only: most answers have none
        public = None if operator else self.visible
        confirmed = self._confirmed(token) if public is not None else None

        def may(key: str) -> bool:
            if not keys:
                keys.update(f"{u.type}:{u.repo_id}" for u in listed)
            if key in keys:
                return True
            kind, _, repo_id = key.partition(":")
            if public is not None and not public(kind, repo_id) and not (confirmed and confirmed(kind, repo_id)):
                return False
            return visible is None or visible(kind, repo_id)
        return may

    async def repo_data(self, repo: str, *, visible: Visible | None = None, operator: bool = False,
                        token: str | None = None) -> dict[str, Any]:
        """One cached repo: its revisions, files and sizes, pin (by what, and why), and recent traffic (the files
        used last, fills and warm jobs). ``{"repo": None}`` when it is not cached or not this caller's to see (one
        answer for both: the page does not tell which repos exist)."""
        parsed = parse_repo(repo)
        snap = await self.cache.current_snapshot()
        usage = None
        if parsed is not None:
            usage = next((u for u in snap.repos if (u.type, u.repo_id) == parsed), None)
        if usage is not None and not operator:
            listed, _ = await self._for_caller(snap, visible=visible, operator=False, token=token)
            if usage not in listed:
                usage = None
        common = {"version": __version__, "uptime": round(time.time() - self.started, 1),
                  "auth_required": self.settings.auth_required}
        if usage is None or parsed is None:
            return {**common, "repo": None, "asked": repo[:300]}
        ref = RepoRef(RepoType(parsed[0]), parsed[1])
        files, refs, files_total = await asyncio.to_thread(self._repo_index, ref)
        pins = await self._pin_sources()
        pinned_by = pins.get(parsed)
        key = ref.key
        fills = [{"path": f.spec.path, "written": f.written, "size": f.spec.size}
                 for f in self.fills.active if f.spec.repo.key == key]
        jobs = [j.as_json() for j in self._warm_jobs() if j.request.repo.key == key][-5:]
        by_commit: dict[str, list[dict[str, Any]]] = {}
        for f in files:
            by_commit.setdefault(f["commit"], []).append(f)
        revisions = []
        for commit in sorted(by_commit, key=lambda c: (-max(f["last_use"] or 0 for f in by_commit[c]), c)):
            rows = sorted(by_commit[commit], key=lambda f: f["path"])
            revisions.append({"commit": commit, "refs": sorted(r for r, c in refs.items() if c == commit),
                              "files": len(rows), "bytes": sum(f["size"] for f in rows if f["cached"])})
        recent = sorted((f for f in files if f["last_use"]), key=lambda f: -f["last_use"])[:_RECENT_FILES]
        return {
            **common,
            "repo": {"type": ref.type.value, "id": ref.repo_id, "key": key, "bytes": usage.bytes,
                     "files": usage.files, "last_access": _when(usage.last_access)},
            "pinned": pinned_by is not None, "pinned_by": pinned_by, "pin_reason": _pin_reason(pinned_by),
            "revisions": revisions,
            "refs": [{"name": name, "commit": commit} for name, commit in sorted(refs.items())],
            "files": files[:MAX_FILES], "files_total": files_total,
            "recent": recent, "fills": fills, "warm_jobs": jobs,
        }

    def _repo_index(self, repo: RepoRef) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """The repo's file entries (a range query on its key prefix) with each blob's local state (a stat), and its
        refs (revision -> commit). In a thread."""
        entries: list[FileEntry] = sorted((e for e in self.cache.index.repo_files(repo) if not e.missing and e.etag),
                                          key=lambda e: (e.path, e.commit))
        store = self.cache.store
        files = []
        for e in entries[:_STATS]:
            cached, last_use = False, None
            path = store.cached_path(e.etag)  # local disk, or a bucket's local hot tier: never a request upstream
            if path is not None:
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    cached, last_use = True, max(st.st_atime, st.st_mtime)  # a hit moves the atime (store.touch)
            files.append({"path": e.path, "commit": e.commit, "size": e.size, "lfs": e.lfs, "cached": cached,
                          "last_use": last_use, "last_use_at": _when(last_use)})
        refs: dict[str, str] = {}
        for key in self.cache.index.iter_keys("ref"):  # keys only: a range scan of the refs, no value read
            if len(key) == 4 and (key[1], key[2]) == (repo.type.value, repo.repo_id):
                entry = self.cache.index.get_ref(repo, key[3])
                if entry is not None:
                    refs[key[3]] = entry.commit
        return files, refs, len(entries)

    async def _quarantine(self) -> list[dict[str, Any]]:
        assert self.quarantine is not None
        held = await asyncio.to_thread(self.quarantine)
        visible = self.visible
        return held if visible is None else [h for h in held if visible(*str(h.get("repo", ":")).split(":", 1))]

    def _outcomes(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for metric in self.cache.metrics.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels["outcome"]
                    counts[outcome] = counts.get(outcome, 0.0) + sample.value
        return counts


def _pin_reason(pinned_by: str | None) -> str:
    if pinned_by is None:
        return ""
    if pinned_by == "operator":
        return "pinned by an operator (the page's pin button or the pin API): kept until unpinned"
    return f"listed in the sync manifest {pinned_by}: pinned again at each of its runs"


def _sync_state(pinned_by: str | None, job: Any) -> str:
    parts = []
    if pinned_by and pinned_by != "operator":
        parts.append(f"sync manifest {pinned_by}")
    if job is not None:
        done = f" {job.files_done}/{job.files_total} files" if job.files_total else ""
        parts.append(f"warm {job.state}{done}")
    return ", ".join(parts)

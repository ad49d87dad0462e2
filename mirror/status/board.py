"""The status data: one page of cached repos (searched and paginated on the server), fills and warm jobs in
progress, totals, and the traffic history. Everything comes from the last usage snapshot and in-process counters:
the request path never scans the index or the store (``CacheManager.current_snapshot`` refreshes in a thread)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mirror.status.history import StatusHistory

if TYPE_CHECKING:
    from mirror.cache import CacheManager, RepoUsage, UsageSnapshot
    from mirror.config import Settings
    from mirror.fill import FillManager
    from mirror.upstream import UpstreamClient

PER_PAGE = 50
MAX_PER_PAGE = 500
_MAX_QUERY = 200
Visible = Callable[[str, str], bool]  # (type, repo id) -> may this page list it (mirror-auth off: public repos only)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value or default), low), high)
    except ValueError:
        return default


class StatusBoard:
    def __init__(self, cache: CacheManager, settings: Settings, upstream: UpstreamClient, fills: FillManager,
                 history: StatusHistory, *, visible: Visible | None, warm_jobs: Any = None) -> None:
        self.cache = cache
        self.settings = settings
        self.upstream = upstream
        self.fills = fills
        self.history = history
        self.visible = visible
        self.warm_jobs = warm_jobs
        # The snapshot's repos this page may list, computed once per snapshot (a visibility lookup per repo).
        self._listed: tuple[UsageSnapshot | None, list[RepoUsage]] = (None, [])
        self._pins: tuple[float, dict[tuple[str, str], str]] = (0.0, {})
        # The admission policy's quarantine (mirror.admission): blobs stored, never served, until an operator's
        # release; None without a policy.
        self.quarantine: Callable[[], list[dict[str, Any]]] | None = None

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

    async def data(self, *, page: str | None = None, q: str | None = None, per_page: str | None = None,
                   hours: float = 6.0) -> dict[str, Any]:
        snap = await self.cache.current_snapshot()
        listed = await self._listable(snap)
        query = (q or "").strip()[:_MAX_QUERY]
        if query:
            needle = query.lower()
            listed = [u for u in listed if needle in f"{u.type}:{u.repo_id}".lower()]
        size = _int(per_page, PER_PAGE, 1, MAX_PER_PAGE)
        pages = max(1, math.ceil(len(listed) / size))
        number = _int(page, 1, 1, pages)
        chosen = listed[(number - 1) * size: number * size]
        pins = await self._pin_sources()
        jobs = self._warm_jobs()
        last_job = {(j.request.repo.type.value, j.request.repo.repo_id): j for j in jobs}
        repos = []
        for u in chosen:
            job = last_job.get((u.type, u.repo_id))
            repos.append({
                "type": u.type, "id": u.repo_id, "bytes": u.bytes, "files": u.files, "commits": len(u.commits),
                "pinned": (u.type, u.repo_id) in pins, "pinned_by": pins.get((u.type, u.repo_id)),
                "last_access": _when(u.last_access), "last_access_ts": u.last_access,
                "sync": _sync_state(pins.get((u.type, u.repo_id)), job),
            })
        hits_total = self.history.read()
        served = hits_total.hits + hits_total.misses
        visible = self.visible
        fills = [{"repo": f.spec.repo.key, "path": f.spec.path, "written": f.written, "size": f.spec.size}
                 for f in self.fills.active]
        warming = [j.as_json() for j in jobs if j.state in ("queued", "running")]
        if visible is not None:
            fills = [f for f in fills if visible(*f["repo"].split(":", 1))]
            warming = [j for j in warming if visible(j["type"], j["repo"])]
        counts = self._outcomes()
        negative = await asyncio.to_thread(self.cache.index.negative_usage)  # one SQL count
        return {
            "upstream": {"url": self.settings.upstream_display, "healthy": self.upstream.healthy,
                         "last_error": self.upstream.last_error},
            "offline": self.settings.offline,
            "auth_required": self.settings.auth_required,
            "cache_bytes": snap.total_bytes,
            "cache_blobs": snap.total_blobs,
            # None: the first count of a large cache is still running (the repos and totals come when it ends).
            "snapshot_age": round(max(0.0, time.time() - snap.taken_at), 1) if snap.taken_at else None,
            "index_bytes": self.cache.index.volume(),
            # Remembered 404s and refusals: bounded (--negative-max-entries/-bytes), their bytes in the quota.
            "negative_entries": negative[0], "negative_bytes": negative[1],
            "max_size": self.settings.max_size,
            "hits": int(counts.get("hit", 0)), "misses": int(counts.get("miss", 0)),
            "stale": int(counts.get("stale", 0)),
            "hit_ratio": (hits_total.hits / served) if served else 0.0,
            "fills": fills,
            "warming": warming,
            "q": query, "page": number, "pages": pages, "per_page": size, "repos_total": len(listed),
            "repos": repos,
            "history": {"interval": self.history.interval, "points": self.history.series(hours)},
            **({"quarantine": await self._quarantine()} if self.quarantine is not None else {}),
        }

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


def _sync_state(pinned_by: str | None, job: Any) -> str:
    parts = []
    if pinned_by and pinned_by != "operator":
        parts.append(f"sync manifest {pinned_by}")
    if job is not None:
        done = f" {job.files_done}/{job.files_total} files" if job.files_total else ""
        parts.append(f"warm {job.state}{done}")
    return ", ".join(parts)

"""The service is objects composed over one core (issue #24 item 5): the file side, the API side and the route table's
reads each hold the same ServiceCore, whose state (refs remembered, access probes in flight) is theirs in common.

Built in-process from the real parts on a tmp dir; upstream is a stand-in UpstreamClient that answers from a table
and counts what it was asked (it opens no connection)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mirror import hf
from mirror.access import Caller
from mirror.config import Settings
from mirror.errors import UpstreamUnavailable
from mirror.index import FileEntry
from mirror.metrics import Metrics, Outcome
from mirror.parts import Parts, build_parts
from mirror.routetable import REPO_ROUTES
from mirror.service import ApiService, FileService, MirrorService, ReadService, ServiceCore
from mirror.upstream import UpstreamClient
from mirror.upstream.values import UpstreamAnswer, UpstreamFileMeta
from tests.unit.test_layers import SERVICE_PARTS

REPO = hf.RepoRef(hf.RepoType.MODEL, "acme/tiny")
COMMIT = "a" * 40
ANONYMOUS = Caller(None)


class TableUpstream(UpstreamClient):
    """Upstream as a table: ``answers`` by path (API) and ``files`` by (revision, path) (HEAD); ``down``: every call
    fails as an unreachable upstream does. ``asked`` lists every call; ``gate``, when set, holds each HEAD."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, Metrics())
        self.answers: dict[str, tuple[int, object]] = {}
        self.files: dict[tuple[str, str], UpstreamFileMeta] = {}
        self.asked: list[str] = []
        self.down = False
        self.gate: asyncio.Event | None = None

    async def api(self, method: str, path_qs: str, token: str | None, form: list[tuple[str, str]] | None = None,
                  headers: dict[str, str] | None = None, guard: object = None) -> UpstreamAnswer:
        self.asked.append(f"{method} {path_qs}")
        if self.down:
            raise UpstreamUnavailable("upstream is down")
        status, body = self.answers.get(path_qs.split("?")[0], (404, {"error": "Repository not found"}))
        return UpstreamAnswer(status, {"content-type": "application/json"}, json.dumps(body).encode())

    async def head_file(self, repo: hf.RepoRef, revision: str, path: str, token: str | None,
                        guard: object = None) -> UpstreamFileMeta:
        self.asked.append(f"HEAD {revision}/{path}")
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise UpstreamUnavailable("upstream is down")
        return self.files[(revision, path)]


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    # An address nothing listens on: a part that asked the real upstream would fail the test, not reach the Hub.
    built = build_parts(Settings(cache_dir=tmp_path / "cache", upstream="http://127.0.0.1:9", min_free_space=0))
    try:
        yield built
    finally:
        await built.aclose(grace=0)


@pytest.fixture
async def upstream(parts: Parts) -> AsyncIterator[TableUpstream]:
    table = TableUpstream(parts.settings)
    try:
        yield table
    finally:
        await table.aclose()


@pytest.fixture
def service(parts: Parts, upstream: TableUpstream) -> MirrorService:
    """A service over the parts of ``parts``, asking ``upstream`` (one core, built once, as build_parts does)."""
    return MirrorService(ServiceCore(parts.settings, parts.index, parts.store, upstream, parts.fills, parts.access,
                                     parts.metrics))


async def test_build_parts_composes_the_sides_over_one_core(parts: Parts) -> None:
    service = parts.service
    core = service.core
    assert service.file_service.core is core and service.api_service.core is core and service.read_service.core is core
    assert service.read_service.api_service is service.api_service  # the reads' stale and access rules are the API's
    assert core.index is parts.index and core.upstream is parts.upstream and core.access is parts.access
    assert service.file_service.index is core.index and service.api_service.upstream is core.upstream
    # Composed, not inherited: no side is a core, nor another side.
    for side in (FileService, ApiService, ReadService, MirrorService):
        assert not ({ServiceCore, FileService, ApiService, ReadService} - {side}) & set(side.__mro__)
    # What the layer rule counts as the service's parts (never chained through by a route) is what it holds.
    assert set(vars(service)) | {"admission", "xet"} == SERVICE_PARTS


async def test_a_ref_the_api_side_learns_resolves_a_file_without_asking_upstream(
        service: MirrorService, parts: Parts, upstream: TableUpstream) -> None:
    """The revision route (API side) names main's commit; the file side then finds a file stored at that commit
    through the same memory of refs, with no HEAD upstream."""
    parts.access.record_public(REPO, "content", None)
    service.core.remember_file(REPO, FileEntry(COMMIT, "config.json", "e" * 40, 12))
    assert service.commit_of(REPO, "main") is None
    upstream.answers[REPO.api_path("/revision/main")] = (200, {"id": REPO.repo_id, "sha": COMMIT})

    answer = await service.api(hf.ApiTarget(REPO, "revision", "main", ""), "GET",
                               REPO.api_path("/revision/main"), [], None, ANONYMOUS)
    assert answer.outcome is Outcome.MISS and json.loads(answer.body)["sha"] == COMMIT
    resolved = await service.resolve_file(hf.ResolveTarget(REPO, "main", "config.json"), ANONYMOUS)

    assert (resolved.outcome, resolved.entry.commit, resolved.entry.size) == (Outcome.HIT, COMMIT, 12)
    assert service.commit_of(REPO, "main") == COMMIT
    assert upstream.asked == [f"GET {REPO.api_path('/revision/main')}"]  # the HEAD never went upstream


async def test_a_ref_the_file_side_learns_is_the_api_sides(service: MirrorService, upstream: TableUpstream) -> None:
    """The other way: a HEAD upstream names main's commit, and the API side knows it (``known_commit``, which its
    listings ask for the commit a branch is at, is the core's)."""
    upstream.files[("main", "model.safetensors")] = UpstreamFileMeta(COMMIT, "f" * 64, 1000, None)
    resolved = await service.resolve_file(hf.ResolveTarget(REPO, "main", "model.safetensors"), ANONYMOUS)
    assert resolved.outcome is Outcome.MISS and resolved.entry.lfs
    assert service.api_service.core.known_commit(REPO, "main", fresh=True) == COMMIT
    # And the file itself is now the index's: the next HEAD is a hit, asked of no one.
    again = await service.resolve_file(hf.ResolveTarget(REPO, "main", "model.safetensors"), ANONYMOUS)
    assert again.outcome is Outcome.HIT and upstream.asked == ["HEAD main/model.safetensors"]


async def test_concurrent_heads_share_the_cores_one_access_probe(
        service: MirrorService, upstream: TableUpstream) -> None:
    """Two HEADs of a repo not known public, with one token: one probe upstream, held in the core's table while in
    flight, and both answered by it."""
    caller = Caller("hf_someone", own_token=True)
    service.core.remember_ref(REPO, "main", COMMIT)
    for path in ("a.bin", "b.bin"):
        service.core.remember_file(REPO, FileEntry(COMMIT, path, "e" * 40, 3))
    upstream.files[("main", "a.bin")] = upstream.files[("main", "b.bin")] = UpstreamFileMeta(COMMIT, "e" * 40, 3, None)
    upstream.gate = asyncio.Event()

    heads = [asyncio.create_task(service.resolve_file(hf.ResolveTarget(REPO, "main", p), caller))
             for p in ("a.bin", "b.bin")]
    while not upstream.asked:  # the first HEAD's probe has reached upstream
        await asyncio.sleep(0)
    for _ in range(20):  # let the second HEAD reach its probe too
        await asyncio.sleep(0)
    assert len(service.core.probes) == 1 and len(upstream.asked) == 1
    upstream.gate.set()
    resolved = await asyncio.gather(*heads)

    assert [r.outcome for r in resolved] == [Outcome.HIT, Outcome.HIT] and len(upstream.asked) == 1
    await service.resolve_file(hf.ResolveTarget(REPO, "main", "a.bin"), caller)  # confirmed: no probe at all
    assert len(upstream.asked) == 1


async def test_a_read_cached_per_repo_is_served_stale_by_the_api_sides_rule(
        service: MirrorService, parts: Parts, upstream: TableUpstream) -> None:
    """The route table's reads keep no stale rule of their own: a discussions page cached for a public repo is served
    stale (counted once) when upstream is down; for a repo whose metadata is not public, the core's refusal."""
    route = REPO_ROUTES["discussions"]
    target = hf.ApiTarget(REPO, "discussions", None, "", read=route)
    raw_path = REPO.api_path("/discussions")
    upstream.answers[raw_path] = (200, {"discussions": [{"num": 1}], "count": 1})
    first = await service.read(route, target, raw_path, [], ANONYMOUS)
    assert first.outcome is Outcome.MISS and parts.access.is_public(REPO, "meta")

    upstream.down = True
    stale = await service.read(route, target, raw_path, [], ANONYMOUS, revalidate=True)
    assert stale.outcome is Outcome.STALE and stale.body == first.body
    assert parts.metrics.registry.get_sample_value("hf_mirror_stale_served_total") == 1

    parts.access.record_public(REPO, "meta", None, public=False)  # upstream since said: not for anyone
    stranger = Caller("hf_never_confirmed", own_token=True)  # (the anonymous caller above was, within the grace)
    with pytest.raises(UpstreamUnavailable, match="cannot be confirmed"):
        await service.read(route, target, raw_path, [], stranger, revalidate=True)
    assert parts.metrics.registry.get_sample_value("hf_mirror_stale_served_total") == 1


def test_every_delegating_method_takes_what_its_side_takes() -> None:
    """MirrorService repeats each side's signature: a parameter added to a side and not to the facade would make
    every caller through the facade fail (it did once: ``whole`` on open_xorb, a 500 on every Xet download)."""
    import inspect

    from mirror.service.api import ApiService
    from mirror.service.core import ServiceCore
    from mirror.service.files import FileService
    from mirror.service.reads import ReadService

    checked = 0
    for name, method in inspect.getmembers(MirrorService, inspect.isfunction):
        for side in (FileService, ApiService, ReadService, ServiceCore):
            if not name.startswith("_") and hasattr(side, name):
                facade, own = inspect.signature(method), inspect.signature(getattr(side, name))
                assert list(facade.parameters.values()) == list(own.parameters.values()), (name, facade, own)
                checked += 1
    assert checked >= 15

"""What the service's sides share, built once: the parts (settings, index, store, upstream, fills, access, metrics...),
what is remembered of refs (a branch or tag maps to a commit for ``revision_ttl`` seconds), the questions in flight
(access probes, visibility), and the refusal when a caller's access cannot be confirmed.

The sides (:class:`~mirror.service.files.FileService`, :class:`~mirror.service.api.ApiService`,
:class:`~mirror.service.reads.ReadService`) each hold this one core; its mutable state lives here and nowhere else."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from mirror import hf
from mirror.access import AccessPolicy, Caller, offline_refusal
from mirror.admission import AdmissionGate
from mirror.config import Settings
from mirror.errors import MirrorError, UpstreamUnavailable
from mirror.fill import FillManager
from mirror.index import FileEntry, MetadataIndex
from mirror.metadata.sharing import SharedMetadata
from mirror.metrics import Metrics
from mirror.storage.base import BlobStore
from mirror.upstream import UpstreamClient


class ServiceCore:
    """The parts the service's sides ask, and the state they share (one instance per service)."""

    def __init__(self, settings: Settings, index: MetadataIndex, store: BlobStore, upstream: UpstreamClient,
                 fills: FillManager, access: AccessPolicy, metrics: Metrics,
                 make_room: Callable[[int, int], Awaitable[bool]] | None = None,
                 on_hit: Callable[[str], None] | None = None, admission: AdmissionGate | None = None,
                 xet: Any = None, shared: SharedMetadata | None = None) -> None:
        self.settings = settings
        self.index = index
        self.store = store
        self.upstream = upstream
        self.fills = fills
        self.access = access
        self.metrics = metrics
        self.make_room = make_room
        self.on_hit = on_hit  # a stored blob was served: the scrub checks it (once per file, in the background)
        self.admission = admission  # the admission policy (mirror.admission); None: every file admitted
        # Content-access probes in flight, per (repo, token digest, guard): FileService's, shared by concurrent HEADs.
        self.probes: dict[tuple[str, str, str], asyncio.Future[object]] = {}
        self._visibility: dict[str, asyncio.Future[None]] = {}  # learn_visibility's questions in flight
        # Upstream's Xet hashes (a mirror.xet.XetCatalog, typed Any: mirror.xet imports the service) when the
        # mirror serves Xet: learned from upstream's answers, put back on tree / paths-info answers.
        self.xet = xet
        # The fleet's database behind the index (metadata_url): asked before upstream.
        self.shared = shared

    # --- revisions -------------------------------------------------------------------------------------------------

    def commit_of(self, repo: hf.RepoRef, revision: str, *, fresh: bool = True) -> str | None:
        """The commit this node knows ``revision`` at: a commit names itself; a branch or tag, the commit upstream
        last named for it (``fresh``: only when that was within ``revision_ttl``). Never asks upstream."""
        if hf.is_commit(revision):
            return revision
        if fresh:
            entry = self.index.get_ref_fresh(repo, revision, self.settings.revision_ttl)
        else:
            entry = self.index.get_ref(repo, revision)
        return entry.commit if entry else None

    async def fleet_commit(self, repo: hf.RepoRef, revision: str) -> str | None:
        """What the fleet's database says ``revision`` is (resolved by another node within the ttl), if shared."""
        if self.shared is None or self.settings.offline:
            return None
        return await self.shared.commit_of(repo, revision, self.settings.revision_ttl)

    async def fleet_file(self, repo: hf.RepoRef, commit: str, path: str) -> FileEntry | None:
        """What the fleet's database knows ``path`` is at ``commit`` (another node asked upstream), if shared."""
        return await self.shared.file(repo, commit, path) if self.shared is not None else None

    def known_commit(self, repo: hf.RepoRef, revision: str, *, fresh: bool) -> str | None:
        """:meth:`commit_of`; offline, a ref past its ttl still answers (upstream cannot be asked)."""
        commit = self.commit_of(repo, revision, fresh=fresh)
        if commit is None and fresh and self.settings.offline:  # offline, the ref as last known
            commit = self.commit_of(repo, revision, fresh=False)
        return commit

    def remember_ref(self, repo: hf.RepoRef, revision: str, commit: str) -> None:
        """Upstream named ``commit`` for ``revision``: kept in the index (and the fleet's database) for both sides."""
        if revision != commit and hf.is_commit(commit):
            self.index.put_ref(repo, revision, commit)
            if self.shared is not None:
                self.shared.share_ref(repo, revision, commit)

    def remember_file(self, repo: hf.RepoRef, entry: FileEntry) -> None:
        """What a path is at a commit (or that it is missing), kept in the index (and the fleet's database)."""
        self.index.put_file(repo, entry)
        if self.shared is not None:
            self.shared.share_file(repo, entry)

    async def learn_visibility(self, repo: hf.RepoRef, caller: Caller) -> None:
        """For a caller lent the service token, whose own requests upstream never tell what an anonymous caller may
        read: the repo's info asked anonymously (once per repo while the answer is remembered; concurrent callers
        share it). Public metadata, and public content unless the repo is gated. Unknown when upstream is down."""
        if self.settings.offline or (self.access.visibility(repo, "meta") is not None
                                     and self.access.visibility(repo, "content") is not None):
            return
        task = self._visibility.get(repo.key)
        if task is None:
            task = self._visibility[repo.key] = asyncio.ensure_future(self._ask_visibility(repo, caller))
            task.add_done_callback(lambda _done: self._visibility.pop(repo.key, None))
        await asyncio.shield(task)

    async def _ask_visibility(self, repo: hf.RepoRef, caller: Caller) -> None:
        try:
            answer = await self.upstream.api("GET", repo.api_path(), None, guard=caller.check)
        except MirrorError:
            return  # down, or refused by the operator's lists: not known, so not granted to other origins
        if answer.status_code in (401, 403, 404):
            self.access.record_public(repo, "meta", None, public=False)
            self.access.record_public(repo, "content", None, public=False)
        elif answer.status_code == 200:
            try:
                info = answer.json()
            except ValueError:
                return
            if isinstance(info, dict):
                self.access.record_public(repo, "meta", None)
                self.access.record_public(repo, "content", None, public=not info.get("private") and
                                          info.get("gated") in (False, None))

    def unconfirmed(self, caller: Caller, repo: hf.RepoRef | None = None, kind: str = "content") -> MirrorError:
        """The refusal when a stored answer may not be served stale: upstream could not confirm the caller's access."""
        if self.settings.offline:
            return offline_refusal(caller, unknown=repo is not None and self.access.visibility_unknown(repo, kind))
        return UpstreamUnavailable("Upstream is unreachable and access to this repo cannot be confirmed")

"""Who may read what is cached.

Content cached for one caller is served to another only when the repo is public or upstream has confirmed the
caller's access (remembered per token and repo for ``access_ttl`` seconds). Two kinds of access are checked,
because the Hub answers them differently: ``meta`` (API JSON: a gated repo's listing is public) and ``content``
(file bytes: a gated repo needs an accepted licence). Tokens are only kept as digests.

When upstream cannot be asked (``--offline``, or an outage), a repo last seen public stays public (stale-if-error); a
caller whose access was confirmed keeps it for ``access_grace`` seconds; anything else fails closed, visibility that
was never learned included, unless ``access_fail_open`` (or, offline, ``open_unknown_repos``) is set.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mirror.config import Settings
from mirror.errors import AccessDenied, HubError, MirrorError, UpstreamUnavailable
from mirror.hf import RepoRef
from mirror.index import MetadataIndex
from mirror.metadata.sharing import SharedMetadata

_UNKNOWN_RECHECK = 2.0  # seconds an absent record is trusted before asking the shared index again
_MEMO_ENTRIES = 20_000

Probe = Callable[[str | None], Awaitable[None]]  # raises HubError when the token may not read; None = allowed


def token_digest(token: str | None) -> str:
    return "anon" if not token else hashlib.sha256(token.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Caller:
    """A request's identity: the token sent upstream for it (its own, none, or the mirror's service token), and the
    operator's and mirror token's repo policy, which an upstream redirect to another repo must pass again."""

    token: str | None
    own_token: bool = False
    # The service token, lent to a caller that sent none (--lend-upstream-token): what it unlocks is the operator's
    # to share with the callers, never with every web page they open (see MirrorApp: no CORS grant for it).
    lent: bool = False
    check: Callable[[RepoRef], None] | None = field(default=None, compare=False)


class AccessPolicy:
    def __init__(self, index: MetadataIndex, *, ttl: float, fail_open: bool, grace: float = 0.0,
                 offline: bool = False, open_unknown: bool = False, shared: SharedMetadata | None = None) -> None:
        self.index = index
        self.ttl = ttl
        # How long a confirmed access is honoured while upstream cannot be asked (offline, or an outage): a revoked
        # token keeps working at most this long.
        self.grace = grace
        self.fail_open = fail_open
        self.offline = offline
        # Offline, a repo whose visibility was never learned (seeded by ``cache import``) is closed unless the
        # operator opened such repos explicitly.
        self.open_unknown = open_unknown
        # Random tokens and repo names must not grow the process: a bounded memo in front of the shared index, whose
        # records expire (see MetadataIndex.put_access).
        self._memo: OrderedDict[tuple[str, str, RepoRef], tuple[bool | None, float]] = OrderedDict()
        # The fleet's database (metadata_url): a confirmation another node got counts here too.
        self.shared = shared
        self._fleet_asked: OrderedDict[tuple[str, str, RepoRef], float] = OrderedDict()  # when each was last asked

    @classmethod
    def from_settings(cls, index: MetadataIndex, settings: Settings,
                      shared: SharedMetadata | None = None) -> AccessPolicy:
        return cls(index, ttl=settings.access_ttl, grace=settings.access_grace, fail_open=settings.access_fail_open,
                   offline=settings.offline, open_unknown=settings.open_unknown_repos, shared=shared)

    def record_public(self, repo: RepoRef, kind: str, token: str | None, public: bool = True) -> None:
        """Upstream answered an anonymous request: with success (public) or with an auth error (not public)."""
        if token is None:
            self._remember(("public", kind, repo), public)

    def record_allowed(self, repo: RepoRef, kind: str, token: str | None) -> None:
        self._remember((token_digest(token), kind, repo), True)

    def visibility_unknown(self, repo: RepoRef, kind: str) -> bool:
        """Upstream never told whether ``repo`` is public (a repo seeded by ``cache import``, say)."""
        return self._recall(("public", kind, repo)) is None

    def is_public(self, repo: RepoRef, kind: str) -> bool:
        known = self._recall(("public", kind, repo))
        return bool(known and known[0])

    def visibility(self, repo: RepoRef, kind: str) -> bool | None:
        """Whether an anonymous caller may read ``kind`` of ``repo``; ``None``: not known."""
        known = self._recall(("public", kind, repo))
        return None if known is None else bool(known[0])

    def known_allowed(self, repo: RepoRef, kind: str, caller: Caller) -> bool:
        """Access confirmed for this token within the grace period (used when upstream cannot be asked)."""
        known = self._recall((token_digest(caller.token), kind, repo))
        return bool(known and known[0] and time.time() - known[1] < self.grace)

    def may_serve_stale(self, repo: RepoRef, kind: str, caller: Caller) -> bool:
        return self.is_public(repo, kind) or self.fail_open or self.known_allowed(repo, kind, caller)

    async def check(self, repo: RepoRef, kind: str, caller: Caller, probe: Probe) -> None:
        """Raise unless ``caller`` may read cached ``kind`` data of ``repo``."""
        public = self._recall(("public", kind, repo))
        if public is None and self.shared is not None:
            public = await self._recall_fleet(("public", kind, repo))
        if public is not None and public[0]:
            return  # public until an anonymous upstream request says otherwise (record_public(..., False))
        if self.offline and self.open_unknown and public is None:
            return
        key = (token_digest(caller.token), kind, repo)
        known = self._recall(key)
        # Offline, no confirmation is fresher than the grace period allows.
        trusted_for = min(self.ttl, self.grace) if self.offline else self.ttl
        if known is not None and known[0] and time.time() - known[1] < trusted_for:
            return
        if self.shared is not None and (fleet := await self._recall_fleet(key)) is not None:
            if fleet[0] and time.time() - fleet[1] < trusted_for:
                return
        try:
            await probe(caller.token)
        except UpstreamUnavailable:
            if self.fail_open or self.known_allowed(repo, kind, caller):
                return
            if self.offline:
                raise offline_refusal(caller, unknown=public is None) from None
            raise UpstreamUnavailable(
                "Upstream is unreachable and this repo's access cannot be confirmed for your token; try again later"
            ) from None
        except HubError:
            self._remember(key, False)
            raise
        except MirrorError:
            raise
        self._remember(key, True)
        if caller.token is None:
            self._remember(("public", kind, repo), True)

    def _remember(self, key: tuple[str, str, RepoRef], allowed: bool) -> None:
        value = (allowed, time.time())
        self._memorise(key, value)
        # Shared with the other workers; kept as long as it can be used (the grace period), then dropped.
        self.index.put_access(key[0], key[1], key[2], value, expire=max(self.ttl, self.grace, 3600.0))
        if self.shared is not None:
            self.shared.share_access(key[0], key[1], key[2], allowed)

    async def _recall_fleet(self, key: tuple[str, str, RepoRef]) -> tuple[bool, float] | None:
        """What another node of the fleet confirmed (kept here as well, like a confirmation of our own)."""
        assert self.shared is not None
        asked = self._fleet_asked.get(key)
        if asked is not None and time.time() - asked < _UNKNOWN_RECHECK:
            return None  # the database did not know a moment ago: one query per record per recheck, not per request
        value = await self.shared.access(key[0], key[1], key[2])
        self._fleet_asked[key] = time.time()
        self._fleet_asked.move_to_end(key)
        if len(self._fleet_asked) > _MEMO_ENTRIES:
            self._fleet_asked.popitem(last=False)
        if value is not None:
            self._memorise(key, value)
            self.index.put_access(key[0], key[1], key[2], value, expire=max(self.ttl, self.grace, 3600.0))
        return value

    def _memorise(self, key: tuple[str, str, RepoRef], value: tuple[bool | None, float]) -> None:
        self._memo[key] = value
        self._memo.move_to_end(key)
        if len(self._memo) > _MEMO_ENTRIES:
            self._memo.popitem(last=False)

    def _recall(self, key: tuple[str, str, RepoRef]) -> tuple[bool, float] | None:
        value = self._memo.get(key)
        if value is None or value[0] is None:
            if value is not None and time.time() - value[1] < _UNKNOWN_RECHECK:
                return None
            value = self.index.get_access(key[0], key[1], key[2])
            if value is None:
                self._memorise(key, (None, time.time()))  # remembered absence
                return None
            self._memorise(key, value)
        return value  # type: ignore[return-value]


# What an operator can do about a repo whose visibility an offline mirror never learned: both are named in the
# refusal, since the caller who meets it is often the operator checking an import.
_WAY_OUT = ("it never learned whether this repo is public (a repo seeded by `hf-mirror cache import`?): serve it to "
            "anyone by importing it with `hf-mirror cache import --public PATH`, or serve every repo of unknown "
            "visibility with `hf-mirror serve --offline --open-unknown-repos`")


def offline_refusal(caller: Caller, *, unknown: bool = False) -> AccessDenied:
    """Offline, content that is not public goes only to callers whose access upstream confirmed; ``unknown``: the
    repo's visibility was never learned, and the message names the operator's way out."""
    if caller.token is None:
        if unknown:
            return AccessDenied.unauthenticated(f"The mirror is offline and {_WAY_OUT}")
        return AccessDenied.unauthenticated("This repo is not public and the mirror is offline: send a token whose "
                                            "access the mirror has confirmed")
    if unknown:
        return AccessDenied(f"The mirror is offline and cannot confirm this token's access to this repo; {_WAY_OUT}",
                            status=403)
    return AccessDenied("The mirror is offline and cannot confirm this token's access to this repo", status=403)

"""Who may read what is cached.

Content cached for one caller is served to another only when the repo is public or upstream has confirmed the
caller's access (remembered per token and repo for ``access_ttl`` seconds). Two kinds of access are checked,
because the Hub answers them differently: ``meta`` (API JSON: a gated repo's listing is public) and ``content``
(file bytes: a gated repo needs an accepted licence). Tokens are only kept as digests.

When upstream cannot be asked, a repo last seen public stays public (stale-if-error), and anything else fails
closed unless ``access_fail_open`` is set.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mirror.errors import HubError, MirrorError, UpstreamUnavailable
from mirror.hf import RepoRef
from mirror.index import MetadataIndex

_UNKNOWN_RECHECK = 2.0  # seconds an absent record is trusted before asking the shared index again

Probe = Callable[[str | None], Awaitable[None]]  # raises HubError when the token may not read; None = allowed


def token_digest(token: str | None) -> str:
    return "anon" if not token else hashlib.sha256(token.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Caller:
    """A request's identity: the token sent upstream for it (its own, or the mirror's service token)."""

    token: str | None
    own_token: bool = False


class AccessPolicy:
    def __init__(self, index: MetadataIndex, *, ttl: float, fail_open: bool, offline: bool = False) -> None:
        self.index = index
        self.ttl = ttl
        self.fail_open = fail_open
        # Offline, a repo whose visibility was never learned (seeded by import) is served: the operator put it
        # there. A repo upstream once refused to an anonymous caller stays closed.
        self.offline = offline
        self._memo: dict[tuple[str, str, RepoRef], tuple[bool, float]] = {}

    def record_public(self, repo: RepoRef, kind: str, token: str | None, public: bool = True) -> None:
        """Upstream answered an anonymous request: with success (public) or with an auth error (not public)."""
        if token is None:
            self._remember(("public", kind, repo), public)

    def record_allowed(self, repo: RepoRef, kind: str, token: str | None) -> None:
        self._remember((token_digest(token), kind, repo), True)

    def is_public(self, repo: RepoRef, kind: str) -> bool:
        known = self._recall(("public", kind, repo))
        return bool(known and known[0])

    def known_allowed(self, repo: RepoRef, kind: str, caller: Caller) -> bool:
        """Access confirmed for this token within the TTL (used when upstream cannot be asked)."""
        known = self._recall((token_digest(caller.token), kind, repo))
        return bool(known and known[0] and time.time() - known[1] < self.ttl)

    async def check(self, repo: RepoRef, kind: str, caller: Caller, probe: Probe) -> None:
        """Raise unless ``caller`` may read cached ``kind`` data of ``repo``."""
        public = self._recall(("public", kind, repo))
        if public is not None and public[0]:
            return  # public until an anonymous upstream request says otherwise (record_public(..., False))
        if self.offline and public is None:
            return
        key = (token_digest(caller.token), kind, repo)
        known = self._recall(key)
        if known is not None and time.time() - known[1] < self.ttl:
            if known[0]:
                return
        try:
            await probe(caller.token)
        except UpstreamUnavailable:
            if self.fail_open or (known is not None and known[0]):
                return
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
        self._memo[key] = value
        self.index.put_access(key[0], key[1], key[2], value)  # shared with the other workers

    def _recall(self, key: tuple[str, str, RepoRef]) -> tuple[bool, float] | None:
        value = self._memo.get(key)
        if value is None or value[0] is None:
            if value is not None and time.time() - value[1] < _UNKNOWN_RECHECK:
                return None
            value = self.index.get_access(key[0], key[1], key[2])
            if value is None:
                self._memo[key] = (None, time.time())  # type: ignore[assignment]  # remembered absence
                return None
            self._memo[key] = value
        return value

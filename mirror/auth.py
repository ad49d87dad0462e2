"""Mirror-side access control (off by default) and the operator's allow/deny lists.

Off (the default, a plain intranet): the caller's own ``Authorization: Bearer hf_...`` goes upstream; callers that
send none go upstream with no token, so gated and private content reaches exactly the callers the Hub serves. The
service token (``--upstream-token``) is lent to them only with ``--lend-upstream-token``.

On (a tokens file or a JWT key is configured): every request needs a *mirror* token, which maps to allowed repo
patterns. The mirror token is never sent upstream; the service token is used on the caller's behalf, within the
token's patterns.

Tokens file (TOML)::

    [[token]]
    name = "ci"
    token = "mt_ci_secret"            # or: sha256 = "<hex digest of the token>"
    repos = ["model:acme/*", "dataset:*"]
    admin = true                      # optional: may also unpin and evict (see below)

JWTs carry ``sub`` and ``repos`` (the same patterns), and ``admin: true`` for an operator; HS256 with
``--jwt-secret`` or RS256 with ``--jwt-public-key-file``. Patterns are ``type:glob`` or a bare ``glob`` (any type),
matched with fnmatch, without regard to case (the Hub's repo ids are case-insensitive: ``ACME/Model`` is
``acme/model``).

Operators: the actions that delete or un-protect cached content (unpin, evict) need an operator credential, in either
mode: ``--admin-token``, or (mirror-auth mode) a mirror token marked ``admin``. The admin token is never sent upstream:
in the default mode a caller sending it reads as an anonymous one.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mirror.access import Caller
from mirror.config import ConfigError, Settings
from mirror.errors import AccessDenied
from mirror.hf import RepoRef


def _matches(patterns: tuple[str, ...], repo: RepoRef) -> bool:
    for pattern in patterns:
        kind, sep, glob = pattern.partition(":")
        if not sep:
            kind, glob = "*", pattern
        if (fnmatch.fnmatchcase(repo.type.value, kind.lower())
                and fnmatch.fnmatchcase(repo.repo_id.lower(), glob.lower())):
            return True
    return False


@dataclass(frozen=True)
class RepoFilter:
    """The operator's lists: a repo must match ``allow`` (when given) and must not match ``deny``."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def check(self, repo: RepoRef) -> None:
        if self.deny and _matches(self.deny, repo):
            raise AccessDenied(f"{repo.type.value} {repo.repo_id} is not served by this mirror (denied by policy)")
        if self.allow and not _matches(self.allow, repo):
            raise AccessDenied(f"{repo.type.value} {repo.repo_id} is not served by this mirror (not in its allow list)")


@dataclass(frozen=True)
class Principal:
    name: str
    repos: tuple[str, ...]
    admin: bool = False


def _unauthenticated(message: str) -> AccessDenied:
    return AccessDenied.unauthenticated(message)


class MirrorAuth:
    def __init__(self, settings: Settings) -> None:
        self.required = settings.auth_required
        self.service_token = settings.upstream_token
        self.lend = settings.lend_upstream_token
        self.filter = RepoFilter(settings.allow_repos, settings.deny_repos)
        self._anonymous: Caller | None = None  # the caller without a token (default mode), made on first use
        self._by_digest: dict[str, Principal] = {}
        if settings.auth_tokens_file:
            self._load_tokens(settings.auth_tokens_file)
        self._admin_digest = hashlib.sha256(settings.admin_token.encode()).digest() if settings.admin_token else None
        self._jwt_key: str | bytes | None = settings.jwt_secret
        self._jwt_algorithms = ["HS256"]
        if settings.jwt_public_key_file:
            self._jwt_key = Path(settings.jwt_public_key_file).read_bytes()
            self._jwt_algorithms = ["RS256"]

    def _load_tokens(self, path: Path) -> None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the tokens file {path}: {exc}") from exc
        for number, entry in enumerate(data.get("token", []), 1):
            digest = entry.get("sha256") or (hashlib.sha256(entry["token"].encode()).hexdigest()
                                             if entry.get("token") else None)
            if not digest:
                raise ConfigError(f"{path}: token #{number} needs 'token' or 'sha256'")
            self._by_digest[digest.lower()] = Principal(entry.get("name", f"token{number}"),
                                                        tuple(entry.get("repos", ["*"])), entry.get("admin") is True)

    def caller(self, bearer: str | None) -> tuple[Caller, Principal | None]:
        """Who is calling and which token goes upstream for them; raises 401 in auth mode without a valid token."""
        if not self.required:
            if bearer and not self.is_admin_token(bearer):  # the admin token never goes upstream
                return Caller(bearer, own_token=True, check=self.filter.check), None
            anonymous = self._anonymous  # the same (immutable) caller every time: most requests are this one
            if anonymous is None:
                lent = bool(self.lend and self.service_token)
                anonymous = self._anonymous = Caller(self.service_token if lent else None, lent=lent,
                                                     check=self.filter.check)
            return anonymous, None
        principal = self.principal(bearer)
        return Caller(self.service_token, check=functools.partial(self.authorize, principal)), principal

    def principal(self, bearer: str | None) -> Principal:
        """The mirror token's holder; raises 401 without a valid one."""
        if not bearer:
            raise _unauthenticated("This mirror requires a token: set HF_TOKEN to your mirror token")
        principal = self._verify(bearer)
        if principal is None:
            raise _unauthenticated("Invalid mirror token")
        return principal

    def is_admin_token(self, bearer: str | None) -> bool:
        """``bearer`` is the ``--admin-token`` (compared in constant time)."""
        return bool(bearer and self._admin_digest
                    and hmac.compare_digest(hashlib.sha256(bearer.encode()).digest(), self._admin_digest))

    def is_operator(self, bearer: str | None) -> bool:
        """The admin token, or (mirror-auth mode) a valid mirror token marked admin."""
        if self.is_admin_token(bearer):
            return True
        principal = self._verify(bearer) if self.required and bearer else None
        return principal is not None and principal.admin

    def require_operator(self, bearer: str | None, action: str) -> None:
        """Raise 403 unless ``bearer`` is an operator credential: for the actions that delete or un-protect cached
        content, which no reader of a repo may take for others."""
        if self.is_operator(bearer):
            return
        if self._admin_digest is None and not self.required:
            raise AccessDenied(f"{action} needs an operator credential and none is set on this mirror: start it with "
                               "--admin-token (HF_MIRROR_ADMIN_TOKEN) and send that as Authorization: Bearer, or run "
                               "`hf-mirror cache rm` on the host", code="OperatorRequired")
        raise AccessDenied(f"{action} needs an operator credential: the mirror's --admin-token"
                           + (", or a mirror token marked admin" if self.required else "")
                           + ", sent as Authorization: Bearer", code="OperatorRequired")

    def _verify(self, token: str) -> Principal | None:
        if self.is_admin_token(token):  # the operator: every repo the lists allow
            return Principal("admin", ("*",), admin=True)
        digest = hashlib.sha256(token.encode()).hexdigest()
        for known, principal in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return principal
        if self._jwt_key is not None and token.count(".") == 2:
            import jwt

            try:
                claims = jwt.decode(token, self._jwt_key, algorithms=self._jwt_algorithms,
                                    options={"require": ["exp", "sub"]})
            except jwt.PyJWTError:
                return None
            repos = claims.get("repos", [])
            if isinstance(repos, str):
                repos = [repos]
            return Principal(str(claims["sub"]), tuple(str(r) for r in repos), claims.get("admin") is True)
        return None

    def sees(self, principal: Principal | None, repo: RepoRef) -> bool:
        """Whether the operator's lists and ``principal``'s patterns allow ``repo``: what the ops routes list."""
        try:
            self.authorize(principal, repo)
        except AccessDenied:
            return False
        return True

    def authorize(self, principal: Principal | None, repo: RepoRef) -> None:
        """Raise unless the operator's lists and the caller's token allow ``repo``."""
        self.filter.check(repo)
        if principal is not None and not _matches(principal.repos, repo):
            raise AccessDenied(f"your mirror token ({principal.name}) does not allow {repo.type.value} {repo.repo_id}")

"""``[[select]]`` rules to repos: each rule's listing through upstream's paginated list API (``/api/models?author=
...&filter=...``, every ``Link: <...>; rel="next"`` page; through the mirror with ``--mirror``), its name globs,
and what changed since the manifest's last run (:mod:`mirror.sync.state`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx

from mirror import hf
from mirror.errors import MirrorError
from mirror.sync.backend import Backend
from mirror.sync.jobs import error_text
from mirror.sync.manifest import Manifest, RepoSpec, SelectSpec
from mirror.sync.progress import Reporter
from mirror.sync.state import Changes, SyncState


@dataclass
class RuleResult:
    rule: SelectSpec
    repo_ids: list[str] = field(default_factory=list)  # listed and matching, in listing order
    listed: int = 0  # what upstream listed for the query, before the name globs
    error: str | None = None


@dataclass
class Selection:
    rules: list[RuleResult]
    specs: list[RepoSpec]  # what the run syncs, after the [[repo]] tables (which win over a [[select]])
    kept: list[RepoSpec]  # not synced now but kept pinned: disappeared upstream, or their rule's listing failed
    named_too: list[str]  # selected, but a [[repo]] table names them (its options apply)
    changes: Changes | None = None
    state: SyncState | None = None

    @property
    def failed(self) -> list[RuleResult]:
        return [r for r in self.rules if r.error]

    def status(self, label: str) -> str:
        if self.changes is None:
            return "selected"
        if label in self.changes.new:
            return "new (first run)" if self.changes.first_run else "new"
        if label in self.changes.back:
            return "listed again"
        return "selected"


def _repo_ids(rows: object) -> list[str]:
    if not isinstance(rows, list):
        raise MirrorError("the list API's answer is not a JSON list")
    out = []
    for row in rows:
        repo_id = row.get("id") or row.get("modelId") if isinstance(row, dict) else None
        if isinstance(repo_id, str):
            out.append(repo_id)
    return out


async def _list(backend: Backend, rule: SelectSpec, token: str | None) -> RuleResult:
    result = RuleResult(rule)
    try:
        ids = _repo_ids(await backend.list_repos(rule.type, rule.query(), token))
    except (MirrorError, httpx.HTTPError, ValueError) as exc:
        result.error = f"listing {rule.type.value}s failed: {error_text(exc)}"
        return result
    result.listed = len(ids)
    for repo_id in dict.fromkeys(ids):
        try:
            hf.validate_repo_id(repo_id)
        except MirrorError:
            continue
        if rule.matches(repo_id):
            result.repo_ids.append(repo_id)
    return result


async def expand(manifest: Manifest, backend: Backend, reporter: Reporter, state: SyncState | None) -> Selection:
    """List every rule (one after the other: a few requests each), match, compare with the state (updated in
    memory; the caller saves it after a real run)."""
    named = {spec.label for spec in manifest.repos}
    rules: list[RuleResult] = []
    for rule in manifest.selects:
        if rule.token_env is not None:
            token = os.environ.get(rule.token_env) or None
            if token is None:
                rules.append(RuleResult(rule, error=f"the token variable {rule.token_env} is not set"))
                continue
        else:
            token = backend.default_token
        result = await _list(backend, rule, token)
        rules.append(result)
        if result.error:
            reporter.info(f"{rule.label}: {result.error}")
        else:
            reporter.info(f"{rule.label}: {len(result.repo_ids)} repo(s) selected of {result.listed} listed")
    specs: list[RepoSpec] = []
    seen: set[str] = set()
    named_too: list[str] = []
    listed: dict[str, str] = {}
    for result in rules:
        for repo_id in result.repo_ids:
            spec = result.rule.spec(repo_id)
            listed.setdefault(spec.label, result.rule.key)
            if spec.label in named:
                named_too.append(spec.label)
            elif spec.label not in seen:
                specs.append(spec)
            seen.add(spec.label)
    selection = Selection(rules, specs, [], sorted(set(named_too)), state=state)
    by_key = {rule.key: rule for rule in manifest.selects}
    if state is not None:
        failed = {r.rule.key for r in rules if r.error}
        selection.changes = state.update(listed, set(by_key), failed)
        for label, row in sorted(state.repos.items()):
            if label in seen or label in named or row.get("rule") not in by_key:
                continue
            # Disappeared upstream, or not listed this time because the listing failed: kept (and pinned).
            kind, _, repo_id = label.partition(":")
            selection.kept.append(by_key[row["rule"]].spec(repo_id))
        changes = selection.changes
        if changes.first_run:
            reporter.info(f"first run of this manifest's selection: {len(changes.new)} repo(s) recorded in "
                          f"{state.path}")
        else:
            reporter.info(f"since the last run: {len(changes.new)} new, {len(changes.gone)} disappeared upstream "
                          f"(kept), {len(changes.still_gone)} still gone (kept), {len(changes.back)} listed again")
    return selection

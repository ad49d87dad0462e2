"""The admission gate: the decision for one file from the rules, the Hub's facts (asked upstream once per commit and
remembered: offline and stale answers use what was learned), the scan verdict of its etag and the operator's
releases; then the refusal (:class:`~mirror.errors.PolicyBlocked`) or, in dry-run, a log line.

Evaluated on every request for bytes, never stored with the blob: a blob cached before the policy changed is held
to the policy of now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mirror import hf
from mirror.admission.ledger import Ledger
from mirror.admission.rules import ALLOW, Decision, RepoFacts, Rules, decide
from mirror.admission.scan import ScanVerdict, scan_file
from mirror.errors import HubError, MirrorError, PolicyBlocked
from mirror.upstream import RepoGuard, UpstreamClient

log = logging.getLogger("hf_mirror.admission")


class AdmissionGate:
    def __init__(self, rules: Rules, ledger: Ledger, upstream: UpstreamClient | None, *, offline: bool) -> None:
        self.rules = rules
        self.ledger = ledger
        self.upstream = upstream
        self.offline = offline
        self._facts: dict[tuple[str, str], asyncio.Future[RepoFacts]] = {}  # questions in flight, shared by callers
        self._scans: dict[str, asyncio.Future[ScanVerdict]] = {}

    # --- the decision -----------------------------------------------------------------------------------------

    async def decide(self, repo: hf.RepoRef, commit: str, path: str, etag: str | None, *, token: str | None = None,
                     guard: RepoGuard | None = None) -> Decision:
        """The decision for a file, with what is known now: ``scan`` when its bytes are still to be scanned."""
        facts = await self.facts(repo, commit, path, token, guard) if self.rules.needs_facts else None
        decision = decide(self.rules, repo, path, facts)
        if decision.action == "scan" and etag:
            verdict = self.ledger.verdict(etag)
            if verdict is not None:
                decision = ALLOW if verdict.passed else Decision("quarantine", "mirror-scan", verdict.summary)
        if decision.action == "quarantine" and etag and self.ledger.release_of(etag) is not None:
            return Decision("allow", decision.rule, f"released by an operator ({decision.reason})")
        return decision

    def enforce(self, decision: Decision, repo: hf.RepoRef, path: str, etag: str | None = None) -> None:
        """Raise the refusal ``decision`` says (dry-run: log it, admit)."""
        if not decision.refused:
            return
        verb = "quarantined" if decision.action == "quarantine" else "blocked"
        message = (f"{path} of {repo.key} is {verb} by the mirror's admission policy, rule {decision.rule}: "
                   f"{decision.reason}")
        if self.rules.dry_run:
            log.warning("policy dry-run: would refuse %s %s (%s, rule %s: %s)", repo.key, path, etag or "-",
                        decision.rule, decision.reason)
            return
        log.info("policy: refused %s %s (rule %s: %s)", repo.key, path, decision.rule, decision.reason)
        raise PolicyBlocked(message, rule=decision.rule, path=path, quarantined=decision.action == "quarantine")

    def hold(self, decision: Decision, repo: hf.RepoRef, commit: str, path: str, etag: str) -> None:
        """A quarantine decision on a stored blob: listed (status page, ``policy release``) until released."""
        if decision.action == "quarantine" and not self.rules.dry_run:
            self.ledger.quarantine(etag, {"repo": repo.key, "commit": commit, "path": path, "rule": decision.rule,
                                          "verdict": decision.reason})

    # --- the mirror's own scan --------------------------------------------------------------------------------

    async def scan(self, etag: str, blob: Path | str) -> ScanVerdict:
        """The verdict on a stored blob: remembered per etag; one scan at a time per etag, in a worker thread."""
        known = self.ledger.verdict(etag)
        if known is not None:
            return known
        task = self._scans.get(etag)
        if task is None:
            task = self._scans[etag] = asyncio.ensure_future(self._scan(etag, blob))
            task.add_done_callback(lambda _done: self._scans.pop(etag, None))
        return await asyncio.shield(task)

    async def _scan(self, etag: str, blob: Path | str) -> ScanVerdict:
        started = time.monotonic()
        verdict = await asyncio.to_thread(scan_file, blob, extra_globals=self.rules.scan_allow_globals)
        self.ledger.put_verdict(etag, verdict)
        log.info("policy: scanned %s in %.2f s: %s", etag, time.monotonic() - started, verdict.summary)
        return verdict

    # --- the Hub's facts --------------------------------------------------------------------------------------

    async def facts(self, repo: hf.RepoRef, commit: str, path: str, token: str | None,
                    guard: RepoGuard | None) -> RepoFacts:
        remembered = self.ledger.facts(repo.key, commit)
        fresh = remembered is not None and time.time() - remembered[0] < self.rules.facts_ttl
        if remembered is not None and (fresh or self.offline) and (
                path in remembered[1].file_status or not self.rules.needs_hub_scan or not remembered[1].known):
            return remembered[1]
        if self.offline or self.upstream is None:
            return remembered[1] if remembered is not None else RepoFacts()
        key = (repo.key, f"{commit}:{path}")
        task = self._facts.get(key)
        if task is None:
            task = self._facts[key] = asyncio.ensure_future(self._ask(repo, commit, path, token, guard,
                                                                      remembered[1] if fresh and remembered else None))
            task.add_done_callback(lambda _done: self._facts.pop(key, None))
        found = await asyncio.shield(task)
        if not found.known and remembered is not None:
            return remembered[1]  # upstream down: what was learned before (stale, as other stale answers)
        return found

    async def _ask(self, repo: hf.RepoRef, commit: str, path: str, token: str | None, guard: RepoGuard | None,
                   base: RepoFacts | None) -> RepoFacts:
        assert self.upstream is not None
        try:
            if base is None:
                answer = await self.upstream.api(
                    "GET", f"{repo.api_path()}/revision/{quote(commit, safe='')}?securityStatus=true", token,
                    guard=guard)
                if answer.status_code != 200:
                    return RepoFacts()
                info = answer.json()
                base = RepoFacts.from_info(info if isinstance(info, dict) else {})
            statuses = dict(base.file_status)
            if self.rules.needs_hub_scan:
                statuses.update(await self._file_status(repo, commit, path, token, guard))
            facts = RepoFacts(base.license, base.scans_done, base.files_with_issues, statuses, True)
        except (MirrorError, ValueError) as exc:
            if isinstance(exc, HubError):
                log.info("policy: the Hub's facts of %s@%s: %s", repo.key, commit[:12], exc.message)
            return RepoFacts()
        self.ledger.put_facts(repo.key, commit, facts)
        return facts

    async def _file_status(self, repo: hf.RepoRef, commit: str, path: str, token: str | None,
                           guard: RepoGuard | None) -> dict[str, str]:
        """paths-info ``expand=true``: the file's ``securityFileStatus`` (its ``status``), "" when none is given."""
        answer = await self.upstream.api(  # type: ignore[union-attr]
            "POST", f"{repo.api_path()}/paths-info/{quote(commit, safe='')}", token,
            form=[("paths", path), ("expand", "true")], guard=guard)
        if answer.status_code != 200:
            return {path: ""}
        entries = answer.json()
        out = {path: ""}
        for entry in entries if isinstance(entries, list) else ():
            status = entry.get("securityFileStatus") if isinstance(entry, dict) else None
            if isinstance(status, dict) and entry.get("path") == path:
                out[path] = str(status.get("status") or status.get("level") or "").lower()
        return out

    # --- the status page --------------------------------------------------------------------------------------

    def quarantined(self) -> list[dict[str, Any]]:
        return self.ledger.quarantined()

"""``hf-mirror policy check|release|quarantined``: the admission policy (:mod:`mirror.admission`) from the command
line. ``check REPO[@REV]`` prints each file's decision and the rule behind it (exit 1 when any file is refused);
``release ETAG --why "..."`` lets a quarantined blob out (recorded, with the reason and who); ``quarantined``
lists what is held."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from mirror.admission import Ledger
from mirror.cache.maintenance import repo_at_revision
from mirror.config import Settings
from mirror.errors import MirrorError
from mirror.layout import CacheLayout
from mirror.parts import build_parts

HELP = "the admission policy: check REPO[@REV] (each file's decision), release ETAG, quarantined"


def add_arguments(parser: argparse.ArgumentParser,
                  settings_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True)
    check = sub.add_parser("check", help="print each file's decision and the rule behind it")
    check.add_argument("repo", metavar="REPO[@REV]", help="e.g. acme/tiny-model or acme/tiny-model@v1.0")
    check.add_argument("--type", choices=("model", "dataset", "space"), default="model", help="repo type")
    check.add_argument("--json", action="store_true", help="one JSON object per file")
    release = sub.add_parser("release", help="release a quarantined blob (recorded in admission/releases.jsonl)")
    release.add_argument("etag", help="the blob's etag, as the status page's quarantine lists it")
    release.add_argument("--why", required=True, help="the reason, kept with the release")
    sub.add_parser("quarantined", help="list the quarantined blobs (JSON lines)")
    for child in sub.choices.values():
        settings_arguments(child)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.policy_command == "release":
        return _release(settings, args.etag, args.why)
    if args.policy_command == "quarantined":
        ledger = Ledger(CacheLayout(settings.cache_dir))
        try:
            for record in ledger.quarantined():
                print(json.dumps(record, sort_keys=True))
        finally:
            ledger.close()
        return 0
    return asyncio.run(_check(settings, args))


def _release(settings: Settings, etag: str, why: str) -> int:
    if not why.strip():
        print("hf-mirror policy release: --why must say why", file=sys.stderr)
        return 2
    ledger = Ledger(CacheLayout(settings.cache_dir))
    try:
        held = {r["etag"]: r for r in ledger.quarantined()}
        if etag not in held:
            print(f"hf-mirror policy release: {etag} is not quarantined", file=sys.stderr)
            return 1
        ledger.release(etag, why.strip(), _operator())
    finally:
        ledger.close()
    record = held[etag]
    print(f"released {etag} ({record.get('repo')} {record.get('path')}, rule {record.get('rule')}): {why.strip()}")
    return 0


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


async def _check(settings: Settings, args: argparse.Namespace) -> int:
    repo, revision = repo_at_revision(args.repo, args.type)  # a ConfigError (exit 2) names a malformed one
    parts = build_parts(settings)
    try:
        await parts.open()
        try:
            answer = await parts.upstream.api(
                "GET", f"{repo.api_path()}/revision/{quote(revision, safe='')}?blobs=true",
                settings.upstream_token)
        except MirrorError as exc:
            print(f"hf-mirror policy check: {exc.message}", file=sys.stderr)
            return 2
        if answer.status_code != 200:
            print(f"hf-mirror policy check: upstream answered {answer.status_code} for {repo.key}", file=sys.stderr)
            return 2
        info: Any = answer.json()
        commit = str(info.get("sha", ""))
        gate = parts.admission
        refused = 0
        if gate is None and not args.json:
            print(f"no admission policy is configured: every file of {repo.key}@{commit[:12]} is admitted")
        for sibling in info.get("siblings") or ():
            path = sibling.get("rfilename", "")
            lfs = sibling.get("lfs") if isinstance(sibling.get("lfs"), dict) else None
            etag = (lfs or {}).get("sha256") or sibling.get("blobId") or ""
            if gate is None:
                action, rule, reason = "allow", "-", "no policy"
            else:
                decision = await gate.decide(repo, commit, path, etag, token=settings.upstream_token)
                blob = parts.store.cached_path(etag) if etag else None
                if decision.action == "scan" and blob is not None:  # stored already: its verdict now
                    await gate.scan(etag, blob)
                    decision = await gate.decide(repo, commit, path, etag, token=settings.upstream_token)
                action, rule, reason = decision.action, decision.rule, decision.reason
                if action == "scan":
                    reason = "pickle-class: scanned before its first serve (not fetched yet)"
            refused += action in ("block", "quarantine")
            if args.json:
                print(json.dumps({"repo": repo.key, "commit": commit, "path": path, "etag": etag,
                                  "decision": action, "rule": rule, "reason": reason}))
            else:
                print(f"{action.upper():<10} {rule:<20} {path}  ({reason})")
        if not args.json:
            dry = " (dry-run: served anyway)" if settings.policy_dry_run and refused else ""
            print(f"{repo.key}@{commit[:12]}: {refused} file(s) refused{dry}")
        return 1 if refused else 0
    finally:
        await parts.aclose(grace=0.5)

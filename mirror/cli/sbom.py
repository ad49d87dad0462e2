"""``hf-mirror sbom REPO@REV``: the CycloneDX ML-BOM of a cached revision (:mod:`mirror.audit.sbom`)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from pathlib import Path

from mirror import hf
from mirror.admission.ledger import Ledger
from mirror.audit import INDEX_NAME, AuditIndex
from mirror.audit.follower import index_once
from mirror.cache.maintenance import repo_at_revision
from mirror.config import ConfigError, Settings
from mirror.layout import CacheLayout
from mirror.parts import build_parts

HELP = "write the CycloneDX ML-BOM of a cached revision: files, hashes, licence, the Hub's scan verdict"


def flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("repo", metavar="REPO[@REV]", help="acme/x@main, datasets/acme/x@v1.0, model:acme/x@<sha>")
    parser.add_argument("--output", "-o", type=Path, help="write the BOM here (default: standard output)")
    return parser


def run(args: argparse.Namespace, settings: Settings) -> int:
    repo, revision = repo_at_revision(args.repo)
    if not settings.cache_dir.exists():
        raise ConfigError(f"cache directory {settings.cache_dir} does not exist")
    # Only `sbom` loads cyclonedx-python-lib and jsonschema (a few hundred ms): no other command waits for them.
    from mirror.audit.sbom import NotCached

    try:
        text = asyncio.run(_bom(settings, repo, revision))
    except NotCached as exc:
        print(f"sbom: {exc}", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 0


async def _bom(settings: Settings, repo: hf.RepoRef, revision: str) -> str:
    from mirror.audit.sbom import build_sbom, render

    audit: AuditIndex | None = None
    directory = settings.audit_directory
    if (directory / INDEX_NAME).exists():  # the admission decisions the audit log recorded, caught up first
        index_once(directory, wait=True)
        audit = AuditIndex(directory / INDEX_NAME)
    # The mirror's own scan verdicts, where the admission policy scanned files of this cache.
    layout = CacheLayout(settings.cache_dir)
    ledger = Ledger(layout) if layout.admission_dir.is_dir() else None

    def scan(etag: str) -> tuple[bool, str] | None:
        verdict = ledger.verdict(etag) if ledger is not None else None
        return (verdict.passed, verdict.summary) if verdict is not None else None

    parts = build_parts(settings)
    try:
        await parts.open()
        decisions = functools.partial(audit.decisions, repo.type.value, repo.repo_id) if audit else None
        return render(await build_sbom(parts.index, parts.store, repo, revision, decisions, scan))
    finally:
        await parts.aclose(grace=0)
        if audit is not None:
            audit.close()
        if ledger is not None:
            ledger.close()

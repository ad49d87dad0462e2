"""``cache export``: a repo of the mirror's cache written in the client layout (:mod:`mirror.cache.hubcache`);
huggingface_hub reads it with ``HF_HUB_OFFLINE=1``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mirror import hf
from mirror.cache.hubcache.layout import link_or_copy, repo_folder_name
from mirror.index import MetadataIndex
from mirror.storage.base import BlobStore


@dataclass
class ExportReport:
    folder: Path
    commit: str
    files: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)


def resolve_commit(index: MetadataIndex, repo: hf.RepoRef, revision: str) -> str | None:
    if hf.is_commit(revision):
        return revision
    entry = index.get_ref(repo, revision)
    return entry.commit if entry else None


async def export_repo(store: BlobStore, index: MetadataIndex, repo: hf.RepoRef, revision: str, dest: Path, *,
                link: bool = False) -> ExportReport:
    """Write ``repo`` at ``revision`` as a huggingface_hub cache tree under ``dest``."""
    commit = resolve_commit(index, repo, revision)
    if commit is None:
        raise LookupError(f"{repo.key}: revision {revision!r} is not known to the mirror")
    entries = [e for e in index.files_at(repo, commit)]
    if not any(not e.missing for e in entries):
        raise LookupError(f"{repo.key}@{revision}: no files of commit {commit} are known to the mirror")
    folder = Path(dest).expanduser() / repo_folder_name(repo)
    report = ExportReport(folder, commit)
    blobs_dir = folder / "blobs"
    snapshot = folder / "snapshots" / commit
    blobs_dir.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for entry in sorted(entries, key=lambda e: e.path):
        hf.validate_path(entry.path)
        if entry.missing:
            marker = folder / ".no_exist" / commit / entry.path
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            continue
        source = await store.local_path(entry.etag)  # a bucket blob is copied to the hot tier first
        if source is None or not source.is_file():
            report.missing.append(entry.path)
            continue
        blob = blobs_dir / entry.etag
        if not (blob.is_file() and blob.stat().st_size == entry.size):
            tmp = blobs_dir / f".{entry.etag}.tmp-{os.getpid()}"
            link_or_copy(source, tmp, link)
            os.replace(tmp, blob)
        link_path = snapshot / entry.path
        link_path.parent.mkdir(parents=True, exist_ok=True)
        target = "../" * (entry.path.count("/") + 2) + f"blobs/{entry.etag}"
        if link_path.is_symlink() or link_path.exists():
            if link_path.is_symlink() and os.readlink(link_path) == target:
                report.files += 1
                report.bytes += entry.size
                continue
            link_path.unlink()
        os.symlink(target, link_path)
        report.files += 1
        report.bytes += entry.size
    if not hf.is_commit(revision):
        ref = folder / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)  # no trailing newline: huggingface_hub reads the file verbatim
    tag = Path(dest).expanduser() / "CACHEDIR.TAG"
    if not tag.exists():
        tag.write_text("Signature: 8a477f597d28d172789f06886806bc55\n"
                       "# This file is a cache directory tag created by hf-mirror export.\n")
    return report

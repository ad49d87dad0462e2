"""``cache import``: the mirror seeded from a client cache tree (:mod:`mirror.cache.hubcache`).

Import verifies every blob against its etag (sha256 for LFS, git blob sha1 otherwise), hardlinks it into the store
when it can (copies otherwise), writes the file entries and refs, and synthesises the API JSON the server answers
for these repos (``/revision/{rev}`` info and the tree listings) under the server's own cache keys. Synthesised
listings from an incomplete snapshot are stored as *stale*: an online mirror asks upstream again, an offline one (or
one whose upstream is down) answers from them. Imported refs are stored as unconfirmed for the same reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import scan_cache_dir

from mirror import hf
from mirror.access import AccessPolicy
from mirror.cache.hubcache.api_json import synthesize_api
from mirror.cache.hubcache.layout import REPO_DIR_RE, link_or_copy
from mirror.errors import MirrorError
from mirror.hubjson import lfs_etag
from mirror.index import FileEntry, MetadataIndex
from mirror.integrity import hash_file
from mirror.layout import CacheLayout
from mirror.storage.base import BlobStore

Log = Callable[[str], None]


@dataclass
class ImportReport:
    repos: list[str] = field(default_factory=list)
    files: int = 0
    blobs_added: int = 0
    blobs_present: int = 0
    bytes_added: int = 0
    linked: int = 0
    corrupt: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refs: int = 0


@dataclass(frozen=True)
class _ClientRepo:
    """One repo folder of a client cache, as huggingface_hub's own scanner reads it."""

    repo: hf.RepoRef
    folder: Path
    refs: dict[str, list[str]]  # commit -> the branches and tags pointing at it
    snapshots: dict[str, list[tuple[str, Path, Path]]]  # commit -> (path in the repo, snapshot file, its blob)


def scan_client_cache(path: Path) -> tuple[list[_ClientRepo], list[str]]:
    """PATH is a hub cache (``~/.cache/huggingface/hub``), an HF_HOME (with ``hub/``), or one repo folder.

    Read with huggingface_hub's ``scan_cache_dir``, the owner of that layout; returns the repos and what it
    could not read (its warnings)."""
    path = Path(path).expanduser()
    only: Path | None = None
    if REPO_DIR_RE.match(path.name) and path.is_dir():
        only, path = path, path.parent
    elif not any(REPO_DIR_RE.match(p.name) for p in path.iterdir() if p.is_dir()) and (path / "hub").is_dir():
        path = path / "hub"
    info = scan_cache_dir(path)
    repos, problems = [], [str(w) for w in info.warnings]
    for cached in sorted(info.repos, key=lambda r: (r.repo_type, r.repo_id)):
        if only is not None and cached.repo_path != only:
            continue
        try:
            repo = hf.RepoRef(hf.RepoType(cached.repo_type), hf.validate_repo_id(cached.repo_id))
        except (ValueError, MirrorError):
            problems.append(f"{cached.repo_path.name}: not a repo this mirror can serve")
            continue
        refs: dict[str, list[str]] = {}
        snapshots: dict[str, list[tuple[str, Path, Path]]] = {}
        for revision in sorted(cached.revisions, key=lambda r: r.commit_hash):
            if not hf.is_commit(revision.commit_hash):
                continue
            refs[revision.commit_hash] = sorted(revision.refs)
            snapshots[revision.commit_hash] = sorted(
                (f.file_path.relative_to(revision.snapshot_path).as_posix(), f.file_path, f.blob_path)
                for f in revision.files)
        repos.append(_ClientRepo(repo, cached.repo_path, refs, snapshots))
    return repos, problems


def _read_trees_json(folder: Path, commit: str) -> dict[str, tuple[str, int]] | None:
    try:
        data = json.loads((folder / "trees" / f"{commit}.json").read_text())
        if data.get("format_version") != 1:
            return None
        out = {}
        for path, info in data["files"].items():
            etag = info.get("lfs_sha256") or info["blob_id"]
            out[path] = (etag, int(info["size"]))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _walk_files(root: Path) -> list[tuple[str, Path]]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = Path(dirpath) / name
            out.append((full.relative_to(root).as_posix(), full))
    return sorted(out)


async def _ingest_blob(store: BlobStore, layout: CacheLayout, source: Path, etag: str, *, link: bool, owner: str
                       ) -> tuple[str, int, bool]:
    """Put ``source`` into the store as blob ``etag``: ('added'|'present'|'corrupt'|'busy', size, linked).

    Under the blob's fill lease, so a running server or sync never fills it at the same time."""
    info = await store.stat(etag)
    if info is not None:
        return "present", info.size, False
    if not await store.acquire_lease(etag, owner, 60.0):
        return "busy", 0, False  # a fill of this blob is running: it will commit it
    try:
        if await store.stat(etag) is not None:
            return "present", os.stat(source).st_size, False
        tmp = layout.import_copy(etag)
        linked = await asyncio.to_thread(link_or_copy, source, tmp, link)
        size = os.stat(tmp).st_size
        if not await asyncio.to_thread(hash_file, tmp, etag, size):
            tmp.unlink(missing_ok=True)
            return "corrupt", size, False
        if not linked:
            now = time.time()
            os.utime(tmp, (now, now))
        await store.commit(etag, tmp)
        return "added", size, linked
    finally:
        await store.release_lease(etag, owner)


async def import_tree(path: Path, store: BlobStore, index: MetadataIndex, access: AccessPolicy, layout: CacheLayout,
                      *, link: bool = True, public: bool = False, log: Log = print) -> ImportReport:
    """Seed the mirror from a client cache tree; see the module docstring. ``layout``: the cache's, where the
    copies wait to be hashed (beside the partial files: committing one is a rename)."""
    report = ImportReport()
    owner = f"import:{os.getpid()}"
    client_repos, problems = scan_client_cache(path)
    report.skipped.extend(problems)
    for client_repo in client_repos:
        repo, folder, refs = client_repo.repo, client_repo.folder, client_repo.refs
        report.repos.append(repo.key)
        for commit, revs in refs.items():
            for rev in revs:
                if index.get_ref(repo, rev) is None:
                    index.put_ref_at(repo, rev, commit, 0.0)  # known, never confirmed: re-checked when online
                    report.refs += 1
        for commit, snapshot_files in client_repo.snapshots.items():
            snapshot = folder / "snapshots" / commit
            listed = _read_trees_json(folder, commit)
            files: dict[str, tuple[str, int]] = {}
            for rel, file_path, blob_path in snapshot_files:
                if file_path.is_symlink():
                    blob = blob_path
                    etag = blob.name
                elif listed is not None and rel in listed:
                    blob, etag = file_path, listed[rel][0]
                else:
                    report.skipped.append(f"{repo.key}@{commit[:12]}/{rel}: not a blob link and no tree listing "
                                          "names its etag")
                    continue
                if not (hf.SHA1_RE.match(etag) or hf.SHA256_RE.match(etag)) or not blob.is_file():
                    report.skipped.append(f"{repo.key}@{commit[:12]}/{rel}: blob {etag} missing or misnamed")
                    continue
                outcome, size, linked = await _ingest_blob(store, layout, blob, etag, link=link, owner=owner)
                if outcome == "corrupt":
                    report.corrupt.append(f"{repo.key}@{commit[:12]}/{rel} (blob {etag})")
                    log(f"corrupt: {repo.key} {rel}: blob {etag} does not match its hash; not imported")
                    continue
                if outcome == "busy":
                    report.skipped.append(f"{repo.key}/{rel}: being filled right now")
                if outcome == "added":
                    report.blobs_added += 1
                    report.bytes_added += size
                    report.linked += linked
                elif outcome == "present":
                    report.blobs_present += 1
                size = size or os.stat(blob).st_size
                files[rel] = (etag, size)
                report.files += 1
                if index.get_file(repo, commit, rel) is None:
                    index.put_file(repo, FileEntry(commit, rel, etag, size, lfs=lfs_etag(etag)))
            if listed is not None:  # files the commit has that this cache never downloaded: metadata only
                for rel, (etag, size) in listed.items():
                    if index.get_file(repo, commit, rel) is None:
                        index.put_file(repo, FileEntry(commit, rel, etag, size, lfs=lfs_etag(etag)))
            no_exist = folder / ".no_exist" / commit
            for rel, _ in _walk_files(no_exist) if no_exist.is_dir() else []:
                if index.get_file(repo, commit, rel) is None:
                    index.put_file(repo, FileEntry(commit, rel, missing=True))
            complete = listed is not None
            if complete:  # the whole tree is known: the paths clients probe for are authoritatively absent
                name = repo.repo_id.rsplit("/", 1)[-1]
                for probe in (".huggingface.yaml", "dataset_infos.json", "README.md", f"{name}.py"):
                    if probe not in listed and index.get_file(repo, commit, probe) is None:
                        index.put_file(repo, FileEntry(commit, probe, missing=True))
            synthesize_api(index, repo, commit, listed if listed is not None else files, refs.get(commit, []),
                           complete=complete, modified=snapshot.stat().st_mtime)
            log(f"imported {repo.key}@{commit[:12]} ({', '.join(refs.get(commit, [])) or 'no ref'}): "
                f"{len(files)} files{'' if complete else ' (listing from the snapshot only)'}")
        if public:
            for kind in ("meta", "content"):
                access.record_public(repo, kind, None)
    return report

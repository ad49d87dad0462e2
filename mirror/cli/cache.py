"""``hf-mirror cache ls | du | verify | rm REPO | gc | import PATH | export REPO[@REV] --to DIR``.

Every subcommand works on the cache the settings name, through the server's own parts (:mod:`mirror.parts`): the
cache directory (``--cache-dir``, ``HF_MIRROR_CACHE_DIR`` or ``cache_dir`` in ``--config``) or, with ``storage =
"s3"``, the shared bucket (the cache directory then holds the index and this node's hot tier). It is safe while a
server runs on it: blobs are replaced atomically, fills hold a cross-process
lease that ``gc``, ``rm`` and ``import`` respect, and a blob unlinked while it is being served stays readable to
the reader that has it open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.cache import repo_at_revision, repo_from_spec
from mirror.cache.hubcache.exporter import export_repo
from mirror.cache.hubcache.importer import import_tree
from mirror.cli.settings import add_settings_arguments
from mirror.config import ConfigError, Settings, format_size
from mirror.errors import BadRequest
from mirror.layout import CacheLayout
from mirror.parts import Parts, build_parts
from mirror.storage.base import BlobInfo


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def _table(title: str | None, columns: list[str]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE if sys.stdout.isatty() else box.ASCII)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


# --- ls / du -------------------------------------------------------------------------------------------------------


async def _ls(parts: Parts, args: argparse.Namespace) -> int:
    usage = await parts.cache.usage()
    refs: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for repo_type, repo_id, revision, entry in parts.index.iter_refs():
        refs.setdefault((repo_type, repo_id), []).append((revision, entry.commit))
    known = {(u.type, u.repo_id) for u in usage}
    pinned = parts.index.pinned_repos()
    rows = []
    for u in usage:
        rows.append({
            "repo": f"{u.type}:{u.repo_id}", "files": u.files, "bytes": u.bytes, "commits": list(u.commits),
            "revisions": {rev: commit for rev, commit in sorted(refs.get((u.type, u.repo_id), []))},
            "last_access": u.last_access, "pinned": u.pinned,
        })
    for repo_type, repo_id in sorted(pinned - known):  # pinned but nothing cached yet
        rows.append({"repo": f"{repo_type}:{repo_id}", "files": 0, "bytes": 0, "commits": [],
                     "revisions": {rev: c for rev, c in sorted(refs.get((repo_type, repo_id), []))},
                     "last_access": 0.0, "pinned": True})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = _table(None, ["repo", "revisions", "commits", "files", "size", "last access", "pinned"])
    for row in rows:
        commits = set(row["commits"])
        revisions = ", ".join(f"{rev}={c[:7]}" for rev, c in row["revisions"].items() if c in commits or not commits)
        table.add_row(row["repo"], revisions or "-", ", ".join(c[:7] for c in row["commits"]) or "-",
                      str(row["files"]), format_size(row["bytes"]), _when(row["last_access"]),
                      "yes" if row["pinned"] else "")
    console = _console()
    console.print(table)
    console.print(f"{len(rows)} repo(s), {format_size(sum(r['bytes'] for r in rows))} "
                  "(a blob shared by repos counts in each)")
    return 0


def _store_name(settings: Settings) -> str:
    return f"s3://{settings.s3_bucket}/{settings.s3_prefix}" if settings.storage == "s3" else "local"


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


async def _du(parts: Parts, args: argparse.Namespace) -> int:
    blobs = await parts.cache.blobs()
    owners = parts.cache.blob_repos()
    pinned = parts.index.pinned_repos()
    total = sum(b.size for b in blobs)
    pinned_bytes = sum(b.size for b in blobs if owners.get(b.etag, set()) & pinned)
    orphan = [b for b in blobs if b.etag not in owners]
    partials = [p for p in parts.layout.partials_dir.glob("*")  # this node's disk, for either store
                if CacheLayout.is_partial(p.name)]
    # The disk they take: a sparse one (ranged reads of a large file) is as long as the file, its holes take nothing.
    partial_bytes = sum(p.stat().st_blocks * 512 for p in partials if p.exists())
    sparse = await parts.cache.sparse()
    sparse_bytes = sum(s.held for s in sparse)
    by_type: dict[str, int] = {}
    for b in blobs:
        for repo_type in {t for t, _ in owners.get(b.etag, set())} or {"(no repo)"}:
            by_type[repo_type] = by_type.get(repo_type, 0) + b.size
    data = {
        "cache_dir": str(parts.settings.cache_dir), "store": _store_name(parts.settings),
        "blobs": len(blobs), "blob_bytes": total,
        "pinned_bytes": pinned_bytes, "unpinned_bytes": total - pinned_bytes,
        "unreferenced_blobs": len(orphan), "unreferenced_bytes": sum(b.size for b in orphan),
        "partials": len(partials), "partial_bytes": partial_bytes,
        "sparse_files": len(sparse), "sparse_bytes": sparse_bytes,
        "index_bytes": _dir_bytes(parts.layout.index_dir),
        "max_size": parts.settings.max_size, "by_type": by_type,
    }
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    console = _console()
    quota = parts.settings.max_size
    console.print(f"{parts.settings.cache_dir}" + (f" (blobs in {data['store']})" if data["store"] != "local" else ""))
    console.print(f"  blobs      {len(blobs):>8}  {format_size(total):>10}  ({total} bytes)")
    console.print(f"    pinned             {format_size(pinned_bytes):>10}")
    console.print(f"    unpinned           {format_size(total - pinned_bytes):>10}")
    for repo_type, size in sorted(by_type.items()):
        label = repo_type + "s" if not repo_type.startswith("(") else repo_type
        console.print(f"    {label:<18} {format_size(size):>10}")
    console.print(f"    unreferenced {len(orphan):>5}  {format_size(data['unreferenced_bytes']):>10}  (no index entry)")
    console.print(f"  partials   {len(partials):>8}  {format_size(partial_bytes):>10}  "
                  "(fills in progress or resumable)")
    console.print(f"    sparse   {len(sparse):>8}  {format_size(sparse_bytes):>10}  "
                  "(windows of ranged reads, never completed: in the quota)")
    console.print(f"  index               {format_size(data['index_bytes']):>10}")
    if quota:
        console.print(f"  quota               {format_size(quota):>10}  ({100 * (total + sparse_bytes) / quota:.0f}% "
                      "used)")
    else:
        console.print("  quota               none (set --max-size)")
    return 0


# --- verify / rm / gc ----------------------------------------------------------------------------------------------


async def _verify(parts: Parts, args: argparse.Namespace) -> int:
    console = _console()
    started = time.monotonic()
    report = await parts.cache.verify(remove=not args.keep, jobs=args.jobs)
    owners = parts.cache.blob_repos()
    shared = "the bucket" if parts.settings.storage == "s3" else "the cache"

    def described(blob: BlobInfo) -> str:
        names = ", ".join(f"{t}:{r}" for t, r in sorted(owners.get(blob.etag, set()))) or "no repo"
        return f"{blob.etag} ({format_size(blob.size)}, {names})"

    for blob in report.bad_local:  # S3: a hot-tier copy; the bucket object passed its own check
        action = "kept (--keep)" if args.keep else "removed from this node"
        console.print(f"CORRUPT LOCAL COPY {described(blob)}: {action}; the copy in {shared} is good "
                      "(the next request copies it from there)")
    for blob in report.corrupt:
        action = "kept (--keep)" if args.keep else f"removed from {shared}"
        console.print(f"CORRUPT {described(blob)}: {action}")
    console.print(f"verified {report.checked} blobs ({format_size(report.checked_bytes)}) in "
                  f"{time.monotonic() - started:.1f}s: {len(report.corrupt)} corrupt"
                  + (f", {len(report.bad_local)} corrupt local copies" if report.bad_local else "")
                  + ("" if not report.corrupt or args.keep else "; they are fetched again on the next request"))
    return 1 if report.corrupt or report.bad_local else 0


async def _rm(parts: Parts, args: argparse.Namespace) -> int:
    try:
        repo = repo_from_spec(args.repo)
        hf.validate_repo_id(repo.repo_id)
    except (ValueError, BadRequest) as exc:
        raise ConfigError(f"not a repo: {args.repo!r} (use acme/x, model:acme/x or datasets/acme/x)") from exc
    known = bool(parts.index.repo_files(repo)) or any(
        (t, r) == (repo.type.value, repo.repo_id) for t, r, _rev, _e in parts.index.iter_refs())
    pinned = (repo.type.value, repo.repo_id) in parts.index.pinned_repos()
    if not known and not pinned:
        print(f"{repo.key} is not in the cache", file=sys.stderr)
        return 1
    removed, freed = await parts.cache.remove_repo(repo)
    print(f"removed {repo.key}: {removed} blobs, {format_size(freed)} ({freed} bytes); its index entries are gone"
          + (" (blobs shared with other repos or being filled were kept)" if known else ""))
    if pinned:
        print(f"note: {repo.key} was pinned by a sync manifest: the next sync fetches it again unless you remove "
              "it from the manifest")
    return 0


async def _gc(parts: Parts, args: argparse.Namespace) -> int:
    limit = parts.settings.max_size
    swept = await parts.cache.sweep_partials()
    report = await parts.cache.collect(limit)
    if limit:
        print(f"gc: evicted {report.evicted} blobs ({format_size(report.freed_bytes)}); cache is now "
              f"{format_size(report.total_bytes)} of a {format_size(limit)} quota; "
              f"{swept} stale partial file(s) removed")
        if report.total_bytes > limit:
            print("gc: still over the quota: the rest is pinned or being filled", file=sys.stderr)
    else:
        print(f"gc: no quota set (--max-size): nothing evicted; cache is {format_size(report.total_bytes)}; "
              f"{swept} stale partial file(s) removed")
    return 0


# --- import / export -----------------------------------------------------------------------------------------------


async def _import(parts: Parts, args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory")
    report = await import_tree(path, parts.store, parts.index, parts.access, parts.layout, link=not args.copy,
                               public=args.public)
    for line in report.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    print(f"import: {len(report.repos)} repo(s), {report.files} files; {report.blobs_added} blobs added "
          f"({format_size(report.bytes_added)}, {report.linked} hardlinked), {report.blobs_present} already cached; "
          f"{report.refs} refs; {len(report.corrupt)} corrupt blob(s) not imported")
    if not report.repos:
        print(f"no huggingface_hub repo folders ({{models,datasets,spaces}}--ns--name) under {path}",
              file=sys.stderr)
        return 1
    return 1 if report.corrupt else 0


async def _export(parts: Parts, args: argparse.Namespace) -> int:
    repo, revision = repo_at_revision(args.repo)
    try:
        report = await export_repo(parts.store, parts.index, repo, revision, Path(args.to), link=args.link)
    except LookupError as exc:
        print(f"export: {exc.args[0]}", file=sys.stderr)
        return 1
    for path in report.missing:
        print(f"not cached, not exported: {path}", file=sys.stderr)
    print(f"exported {repo.key}@{revision} (commit {report.commit}): {report.files} files, {format_size(report.bytes)} "
          f"-> {report.folder}")
    if report.missing:
        print(f"export: {len(report.missing)} file(s) of the commit are not cached and were left out (sync or "
              "download them first if clients need them)", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


_COMMANDS = {"ls": _ls, "du": _du, "verify": _verify, "rm": _rm, "gc": _gc, "import": _import, "export": _export}


# --- CLI -----------------------------------------------------------------------------------------------------------


HELP = "inspect and manage the cache: ls, du, verify, rm, gc, import, export"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands. Each takes the settings flags after its name too (the ``cache`` parser has them before), with
    suppressed defaults so a sub-parser's default cannot erase a value given before the subcommand; they are added
    last, so each subcommand's help lists its own options first."""
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    children: list[argparse.ArgumentParser] = []

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        children.append(sub.add_parser(name, help=help_text, description=help_text))
        return children[-1]

    ls = command("ls", "repos in the cache: revisions, commits, files, sizes, last access, pinned")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    du = command("du", "disk usage: blobs (pinned, unpinned, per type), partial files, index, quota")
    du.add_argument("--json", action="store_true", help="machine-readable output")
    verify = command("verify", "re-hash every blob against its etag; corrupt blobs are reported and removed")
    verify.add_argument("--keep", action="store_true", help="report corrupt blobs without removing them")
    verify.add_argument("--jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                        help="blobs hashed in parallel")
    rm = command("rm", "remove a repo: its index entries and the blobs no other repo uses")
    rm.add_argument("repo", help="acme/x, model:acme/x, dataset:acme/x or datasets/acme/x")
    command("gc", "evict least recently used unpinned blobs down to --max-size; drop stale partial files")
    imp = command("import", "seed the mirror from a huggingface_hub cache (~/.cache/huggingface/hub; 1.x and 2.x "
                  "layouts, the 2.x shared blob store included); a missing --cache-dir is created")
    imp.add_argument("path", help="a hub cache folder, an HF_HOME, or one models--ns--name folder")
    imp.add_argument("--copy", action="store_true", help="copy blobs (default: hardlink when on the same disk)")
    imp.add_argument("--public", action="store_true",
                     help="mark the imported repos public: served to anyone while upstream cannot be asked (offline "
                          "or down). Without it their visibility is unknown until upstream is asked: an online "
                          "mirror asks it on first use; an --offline one refuses them unless started with "
                          "--open-unknown-repos")
    exp = command("export", "write a repo revision as a huggingface_hub cache tree (reads with HF_HUB_OFFLINE=1)")
    exp.add_argument("repo", metavar="REPO[@REV]", help="acme/x@main, datasets/acme/x@v1.0, model:acme/x@<sha>")
    exp.add_argument("--to", required=True, type=Path, help="the HF_HUB_CACHE folder to write into")
    exp.add_argument("--link", action="store_true", help="hardlink blobs instead of copying (same disk only)")
    exp.add_argument("--strict", action="store_true",
                     help="exit 1 when some files the mirror knows at the commit are not cached (default: warn)")
    for child in children:
        add_settings_arguments(child, suppress_defaults=True, command="cache")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.cache_command == "import":  # seeding a new mirror: its cache starts here, as ``serve`` would start it
        try:
            settings.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create cache directory {settings.cache_dir}: {exc.strerror}") from exc
    elif not settings.cache_dir.exists():  # any other command on a missing dir is a wrong path, not an empty cache
        raise ConfigError(f"cache directory {settings.cache_dir} does not exist")
    return asyncio.run(_run(_COMMANDS[args.cache_command], settings, args))


async def _run(command: Callable[[Parts, argparse.Namespace], Awaitable[int]], settings: Settings,
               args: argparse.Namespace) -> int:
    parts = build_parts(settings)  # the server's wiring: with storage = "s3", the bucket is the cache
    try:
        await parts.open()
        return await command(parts, args)
    finally:
        await parts.aclose(grace=0)

"""``hf-mirror sync``: pre-fetch the repos of a manifest into the cache (the :mod:`mirror.sync` package), with
its own flags (a parent parser, before the settings flags) and its ``run(args, settings)``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path

from mirror.config import ConfigError, Settings
from mirror.layout import CacheLayout
from mirror.parts import build_parts
from mirror.sync.backend import Backend
from mirror.sync.cache_dir_backend import CacheDirBackend, CountingFillManager
from mirror.sync.manifest import load_manifest
from mirror.sync.mirror_backend import MirrorBackend
from mirror.sync.progress import PlainReporter, Reporter, RichReporter
from mirror.sync.record import record_run
from mirror.sync.run import SyncResult, run_sync
from mirror.sync.state import SyncState, default_state_path
from mirror.sync.summary import print_summary

log = logging.getLogger("hf_mirror.sync")


HELP = "pre-fetch the repos of a manifest into the cache"
DEFAULT_CONCURRENCY = 4


def flags() -> argparse.ArgumentParser:
    """``sync``'s own flags as a parent parser; the settings flags (``--cache-dir``, ``--upstream``, ...) follow."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--manifest", type=Path, required=True,
                        help="TOML manifest of repos (see deploy/sync.example.toml)")
    parser.add_argument("--mirror", metavar="URL",
                        help="drive a running mirror over HTTP instead of the cache directory (no pins then)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched and how many bytes")
    parser.add_argument("--concurrency", type=int, help=f"files fetched in parallel (default: the manifest's, "
                        f"else {DEFAULT_CONCURRENCY})")
    parser.add_argument("--state", type=Path, metavar="FILE",
                        help="where the [[select]] rules' last listing is kept (default: <cache-dir>/sync-state/"
                        "<hash of the manifest path>.json; with --mirror, under $XDG_STATE_HOME/hf-mirror)")
    parser.add_argument("--progress", choices=("auto", "bars", "plain"), default="auto",
                        help="progress bars (terminal) or plain log lines (default: auto)")
    return parser


def _configure_logging(settings: Settings) -> None:
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    # Fill and upstream chatter stays at warning unless asked for: the reporter prints per-file lines.
    logging.basicConfig(level=max(level, logging.WARNING), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run(args: argparse.Namespace, settings: Settings) -> int:
    _configure_logging(settings)
    manifest = load_manifest(args.manifest)
    concurrency = args.concurrency or manifest.concurrency or DEFAULT_CONCURRENCY
    if concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    bars = args.progress == "bars" or (args.progress == "auto" and sys.stdout.isatty())
    reporter: Reporter = RichReporter() if bars else PlainReporter()
    backend: Backend
    layout = CacheLayout(settings.cache_dir)  # where the run's state and record go (--mirror: no parts are built)
    if args.mirror:
        if not args.mirror.startswith(("http://", "https://")):
            raise ConfigError(f"--mirror must be an http(s) URL, got {args.mirror!r}")
        backend = MirrorBackend(args.mirror, settings, dry_run=args.dry_run)
        pins_note = ("note: repos are not pinned in --mirror mode (the mirror has no pin endpoint); run "
                     "`hf-mirror sync --cache-dir DIR` on the mirror host to pin them against eviction")
    else:
        parts = build_parts(settings, fill_manager=CountingFillManager)  # the one wiring, as serve and cache use
        parts.upstream.use_sync_rate()  # --sync-rate during --sync-hours, else --upstream-rate (issue 18)
        backend = CacheDirBackend(settings, dry_run=args.dry_run, parts=parts, owns_parts=True)
        pins_note = None if args.dry_run else "pinned"
    target = args.mirror or str(settings.cache_dir)
    state = None
    if manifest.selects:
        state_path = args.state or default_state_path(manifest.source, layout, args.mirror)
        state = SyncState.load(state_path, manifest.source)
    rules = f", {len(manifest.selects)} [[select]] rule(s)" if manifest.selects else ""
    reporter.info(f"sync {manifest.path} -> {target}{' (dry run)' if args.dry_run else ''}: "
                  f"{len(manifest.repos)} repo(s){rules}")

    async def main() -> SyncResult:
        try:
            return await run_sync(manifest, backend, reporter, concurrency=concurrency, dry_run=args.dry_run,
                                  state=state)
        finally:
            await _close(backend.aclose())

    # systemd and timeouts stop with SIGTERM: treated as Ctrl-C (fills cancelled, partial files kept, exit 130).
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        result = asyncio.run(main())
    except KeyboardInterrupt:
        reporter.stop()
        print("sync interrupted: partial files are kept, run it again to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not args.mirror and not args.dry_run:  # for the server's /metrics: the cache directory is what both see
        record_run(layout, manifest.source, ok=result.ok, files=result.fetched_files,
                   size=result.fetched_bytes, failed=len(result.failed))
    if state is not None and not args.dry_run:
        state.save()  # the listing is recorded even when some repos failed: they are retried, not "new" again
    if pins_note == "pinned":
        pins_note = f"pinned {result.pinned} repo(s) for {manifest.source}"
    print_summary(result, pins_note=pins_note)
    return 0 if result.ok else 1


async def _close(closing: Awaitable[None]) -> None:
    try:
        await closing
    except Exception as exc:  # noqa: BLE001 - closing must not hide the run's result
        log.warning("closing: %s", exc)

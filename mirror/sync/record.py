"""The last run of each manifest synced into a cache directory, for the server's ``/metrics`` (a sync is another
process, maybe a cron job: the cache directory is what both see).

Where: ``<cache_dir>/sync-runs/<sha256 of the manifest's path>[:16].json``, written atomically after each
run that is not ``--dry-run`` (``--mirror`` runs write nothing there: that cache is another host's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mirror.layout import CacheLayout

log = logging.getLogger("hf_mirror.sync")

@dataclass(frozen=True)
class RunRecord:
    manifest: str  # the manifest file's name (a label on /metrics: names, never paths)
    finished: float  # unix time the run ended
    ok: bool  # every revision and listing succeeded (exit code 0)
    last_success: float | None  # the end of the latest run that was ok, this one or an earlier one
    files: int = 0  # files fetched by this run
    bytes: int = 0
    failed: int = 0  # revisions that failed


def _path(layout: CacheLayout, manifest_source: str) -> Path:
    digest = hashlib.sha256(manifest_source.encode()).hexdigest()[:16]
    return layout.sync_runs_dir / f"{digest}.json"


def record_run(layout: CacheLayout, manifest_source: str, *, ok: bool, files: int, size: int, failed: int,
               now: float | None = None) -> RunRecord:
    """Write this run's record (the previous success kept when this run failed)."""
    now = time.time() if now is None else now
    path = _path(layout, manifest_source)
    previous = _read(path)
    record = RunRecord(Path(manifest_source).name, now, ok,
                       now if ok else (previous.last_success if previous else None), files, size, failed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".run-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(record), f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return record


def read_runs(layout: CacheLayout) -> list[RunRecord]:
    """Every manifest's last run recorded in this cache directory (unreadable records skipped)."""
    folder = layout.sync_runs_dir
    if not folder.is_dir():
        return []
    return [r for p in sorted(folder.glob("*.json")) if (r := _read(p)) is not None]


def _read(path: Path) -> RunRecord | None:
    try:
        data = json.loads(path.read_text())
        return RunRecord(str(data["manifest"]), float(data["finished"]), bool(data["ok"]),
                         None if data.get("last_success") is None else float(data["last_success"]),
                         int(data.get("files", 0)), int(data.get("bytes", 0)), int(data.get("failed", 0)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("sync run record %s unreadable: %s", path, exc)
        return None

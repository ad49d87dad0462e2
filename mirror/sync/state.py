"""What a manifest's ``[[select]]`` rules listed at its last run: a small JSON file per manifest, so a run can say
which repos are new upstream and which disappeared (kept in the cache and pinned, flagged, never deleted).

Where: ``<cache_dir>/sync-state/<sha256 of the manifest's absolute path>[:16].json`` with ``--cache-dir``; with
``--mirror URL`` the key also holds the URL and the file is under ``$XDG_STATE_HOME/hf-mirror/sync-state/``
(``~/.local/state``); ``--state FILE`` names it. Written atomically (a temporary file, then a rename), only by runs
that are not ``--dry-run``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror.layout import CacheLayout

log = logging.getLogger("hf_mirror.sync")

VERSION = 1


def default_state_path(manifest_source: str, layout: CacheLayout, mirror_url: str | None) -> Path:
    if mirror_url is None:
        key, home = manifest_source, layout
    else:  # that cache is another host's: this user's state directory, laid out as a cache's
        key = f"{manifest_source}\n{mirror_url.rstrip('/')}"
        home = CacheLayout(Path(os.environ.get("XDG_STATE_HOME") or Path("~/.local/state").expanduser()) / "hf-mirror")
    return home.sync_state_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@dataclass
class Changes:
    """What this run's listings say against the last run's."""

    first_run: bool
    new: list[str] = field(default_factory=list)  # labels ("dataset:org/name") first listed now
    gone: list[str] = field(default_factory=list)  # listed last run, not now: disappeared upstream
    still_gone: list[str] = field(default_factory=list)  # disappeared at an earlier run, still not listed
    back: list[str] = field(default_factory=list)  # flagged gone before, listed again now

    def gone_since(self, state: SyncState, label: str) -> str | None:
        since = state.repos.get(label, {}).get("gone_since")
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(since)) if since else None


@dataclass
class SyncState:
    path: Path
    manifest: str
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> first_seen, last_seen, rule, gone_since
    last_run: float | None = None

    @classmethod
    def load(cls, path: Path, manifest: str) -> SyncState:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, manifest)
        except (OSError, ValueError) as exc:
            log.warning("sync state %s unreadable (%s): starting afresh", path, exc)
            return cls(path, manifest)
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("repos"), dict):
            log.warning("sync state %s is not a version %d state file: starting afresh", path, VERSION)
            return cls(path, manifest)
        return cls(path, manifest, {k: v for k, v in data["repos"].items() if isinstance(v, dict)},
                   data.get("last_run"))

    def known(self, rule: str) -> list[str]:
        """Labels last listed (or kept as gone) by a rule."""
        return sorted(label for label, row in self.repos.items() if row.get("rule") == rule)

    def gone_labels(self) -> list[str]:
        return sorted(label for label, row in self.repos.items() if row.get("gone_since"))

    def update(self, listed: dict[str, str], rules: set[str], failed_rules: set[str],
               now: float | None = None) -> Changes:
        """``listed``: label -> rule key of every repo listed now; ``rules``: the manifest's rule keys; a
        ``failed_rules`` listing says nothing of its repos (none is flagged gone). Rows of rules no longer in the
        manifest are dropped (removed from the manifest is not gone upstream)."""
        now = time.time() if now is None else now
        changes = Changes(first_run=self.last_run is None)
        for label in list(self.repos):
            if self.repos[label].get("rule") not in rules:
                del self.repos[label]
        for label, rule in sorted(listed.items()):
            row = self.repos.get(label)
            if row is None:
                changes.new.append(label)
                self.repos[label] = {"first_seen": now, "last_seen": now, "rule": rule, "gone_since": None}
                continue
            if row.get("gone_since"):
                changes.back.append(label)
            row.update(last_seen=now, rule=rule, gone_since=None)
        for label, row in sorted(self.repos.items()):
            if label in listed or row.get("rule") in failed_rules:
                continue
            if row.get("gone_since"):
                changes.still_gone.append(label)
            else:
                row["gone_since"] = now
                changes.gone.append(label)
        return changes

    def save(self, now: float | None = None) -> None:
        self.last_run = time.time() if now is None else now
        data = {"version": VERSION, "manifest": self.manifest, "last_run": self.last_run, "repos": self.repos}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sync-state-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

"""What the admission policy remembers, under ``{cache_dir}/admission`` (``CacheLayout.admission_dir``): the scan
verdict per etag (content is immutable: one scan per blob, ever), the quarantine (files stored but never served, with
the rule and verdict), the operator's releases (also appended to ``releases.jsonl``, never rewritten), and the Hub's
facts per commit.

A diskcache (SQLite) like the index: every worker process and the CLI (``policy release``) share it safely.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import diskcache

from mirror.admission.rules import RepoFacts
from mirror.admission.scan import ScanVerdict
from mirror.layout import CacheLayout


class Ledger:
    def __init__(self, layout: CacheLayout) -> None:
        self.root = layout.admission_dir
        self.root.mkdir(parents=True, exist_ok=True)
        self._db = diskcache.Cache(str(layout.admission_db), eviction_policy="none", size_limit=2**40)
        self.releases_log = layout.releases_log

    def close(self) -> None:
        self._db.close()

    # --- the mirror's own scan ------------------------------------------------------------------------------------

    def verdict(self, etag: str) -> ScanVerdict | None:
        data = self._db.get(("verdict", etag))
        if not isinstance(data, dict):
            return None
        return ScanVerdict(bool(data["passed"]), tuple(data["findings"]), int(data["pickles"]))

    def put_verdict(self, etag: str, verdict: ScanVerdict) -> None:
        self._db.set(("verdict", etag), {"passed": verdict.passed, "findings": list(verdict.findings),
                                         "pickles": verdict.pickles, "at": time.time()})

    # --- quarantine and releases ----------------------------------------------------------------------------------

    def quarantine(self, etag: str, record: dict[str, Any]) -> None:
        if self._db.get(("quarantine", etag)) is None:
            self._db.set(("quarantine", etag), {**record, "etag": etag, "at": time.time()})

    def quarantined(self) -> list[dict[str, Any]]:
        """Every quarantined blob, newest first, with its release if an operator gave one."""
        out = []
        for key in list(self._db.iterkeys()):
            if isinstance(key, tuple) and key[0] == "quarantine":
                record = self._db.get(key)
                if isinstance(record, dict):
                    out.append({**record, "released": self.release_of(key[1])})
        return sorted(out, key=lambda r: -float(r.get("at", 0)))

    def release_of(self, etag: str) -> dict[str, Any] | None:
        data = self._db.get(("release", etag))
        return data if isinstance(data, dict) else None

    def release(self, etag: str, why: str, by: str) -> dict[str, Any]:
        """An operator's release: recorded in the ledger and appended to ``releases.jsonl`` (the record of who let
        what through, and why)."""
        record = {"etag": etag, "why": why, "by": by, "at": time.time(),
                  "quarantine": self._db.get(("quarantine", etag))}
        line = json.dumps(record, sort_keys=True) + "\n"
        with open(self.releases_log, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._db.set(("release", etag), record)
        return record

    # --- the Hub's facts per commit -------------------------------------------------------------------------------

    def facts(self, repo_key: str, commit: str) -> tuple[float, RepoFacts] | None:
        data = self._db.get(("facts", repo_key, commit))
        if not isinstance(data, dict):
            return None
        return float(data["at"]), RepoFacts.from_json(data["facts"])

    def put_facts(self, repo_key: str, commit: str, facts: RepoFacts) -> None:
        self._db.set(("facts", repo_key, commit), {"at": time.time(), "facts": facts.as_json()})

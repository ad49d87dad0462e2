"""Every name of the cache directory, spelled once: where a blob, a fill in progress and its notes, the index, the
ledgers and the records live under ``--cache-dir``, and how a bucket shared by a fleet names its objects.

The layout is a value over the cache's root (no I/O): :func:`mirror.parts.build_parts` builds it once from
``Settings.cache_dir`` and hands it to the parts that touch the disk (the store, the index, the cache manager, the
ledgers). The on-disk names are a contract with every existing cache (and an nginx ``alias`` to ``blobs/``)::

    <cache>/blobs/<etag[:2]>/<etag>            verified, immutable blobs (the local store; the S3 store's hot tier)
    <cache>/partials/<etag>.part               a fill in progress (never served as complete)
    <cache>/partials/<etag>.part.prefix        how far a parallel fill's bytes are contiguous (mirror.fill.copy)
    <cache>/partials/<etag>.part.windows       which windows a sparse fill holds beyond that (mirror.fill.copy)
    <cache>/partials/<etag>.lease              a fill's flock lease, JSON {owner, pid, started} (local store)
    <cache>/partials/<etag>.import-<pid>       a ``cache import`` copy on its way into the store
    <cache>/hot-tmp/<etag>.<pid>.<random>      a bucket blob on its way into the hot tier (S3 store)
    <cache>/index/                             the metadata index (diskcache: refs, files, API JSON)
    <cache>/fill-leases/                       the embedded metadata's fill leases (diskcache)
    <cache>/admission/db/                      the admission policy's ledger (diskcache)
    <cache>/admission/releases.jsonl           every operator release, appended
    <cache>/audit/                             the audit log, unless ``audit_dir`` puts it elsewhere (mirror.audit)
    <cache>/sync-runs/<digest>.json            each manifest's last sync run, for /metrics (mirror.sync.record)
    <cache>/sync-state/<digest>.json           each manifest's last [[select]] listing (mirror.sync.state)
    <cache>/xet-secret                         the node's Xet token signing secret (mirror.xet.tokens)

    s3://<bucket>/<prefix>blobs/<etag[:2]>/<etag>   committed blobs of a fleet (:class:`BucketLayout`)
    s3://<bucket>/<prefix>leases/<etag>             the bucket's fill leases
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

_PARTIAL = ".part"
_LEASE = ".lease"
_PREFIX_NOTE = ".prefix"  # after the partial's own name: <etag>.part.prefix
_WINDOWS_MAP = ".windows"  # <etag>.part.windows
_REPLACING = ".tmp"  # a note written beside its final name, then renamed over it
_NOTES = (_PREFIX_NOTE, _WINDOWS_MAP)


def blob_name(etag: str) -> str:
    """A blob's name under ``blobs/``, sharded by its first two hex digits: the same on disk, in the hot tier, in
    a bucket, and in an nginx ``X-Accel-Redirect`` to the ``blobs/`` alias."""
    return f"{etag[:2]}/{etag}"


@dataclass(frozen=True)
class CacheLayout:
    """The paths under one cache directory (``root``)."""

    root: Path

    # --- the directories ---------------------------------------------------------------------------------------------

    @cached_property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @cached_property
    def partials_dir(self) -> Path:
        return self.root / "partials"

    @cached_property
    def hot_tmp_dir(self) -> Path:
        return self.root / "hot-tmp"

    @cached_property
    def index_dir(self) -> Path:
        return self.root / "index"

    @cached_property
    def fill_leases_dir(self) -> Path:
        return self.root / "fill-leases"

    @cached_property
    def admission_dir(self) -> Path:
        return self.root / "admission"

    @property
    def admission_db(self) -> Path:
        return self.admission_dir / "db"

    @property
    def releases_log(self) -> Path:
        return self.admission_dir / "releases.jsonl"

    @cached_property
    def audit_dir(self) -> Path:
        """The audit log's default home (``audit_dir`` in the settings may name another)."""
        return self.root / "audit"

    @cached_property
    def sync_runs_dir(self) -> Path:
        return self.root / "sync-runs"

    @cached_property
    def sync_state_dir(self) -> Path:
        return self.root / "sync-state"

    @cached_property
    def xet_secret(self) -> Path:
        return self.root / "xet-secret"

    # --- blobs -------------------------------------------------------------------------------------------------------

    def blob(self, etag: str) -> Path:
        return self.blobs_dir / etag[:2] / etag

    def hot_download(self, etag: str) -> Path:
        """A fresh name for one download of ``etag`` into the hot tier (several processes may fetch it at once)."""
        return self.hot_tmp_dir / f"{etag}.{os.getpid()}.{uuid.uuid4().hex[:8]}"

    # --- fills in progress -------------------------------------------------------------------------------------------

    def partial(self, etag: str) -> Path:
        return self.partials_dir / f"{etag}{_PARTIAL}"

    def lease(self, etag: str) -> Path:
        return self.partials_dir / f"{etag}{_LEASE}"

    def import_copy(self, etag: str) -> Path:
        """Where ``cache import`` copies (or links) a file before it is hashed and committed: beside the partials,
        on the same filesystem as the blobs, named so that no fill mistakes it for a partial file."""
        return self.partials_dir / f"{etag}.import-{os.getpid()}"

    @staticmethod
    def prefix_note(partial: Path) -> Path:
        """``<partial>.prefix``: how far a parallel fill's bytes are contiguous."""
        return partial.with_name(partial.name + _PREFIX_NOTE)

    @staticmethod
    def windows_map(partial: Path) -> Path:
        """``<partial>.windows``: the windows a sparse fill holds beyond its contiguous prefix."""
        return partial.with_name(partial.name + _WINDOWS_MAP)

    @staticmethod
    def notes(partial: Path) -> tuple[Path, Path]:
        """Every note a fill keeps beside its partial file: removed with it."""
        return CacheLayout.prefix_note(partial), CacheLayout.windows_map(partial)

    @staticmethod
    def replacing(note: Path) -> Path:
        """Where a note is written before it is renamed over ``note`` (readers never see half of one)."""
        return note.with_name(note.name + _REPLACING)

    @staticmethod
    def is_partial(name: str) -> bool:
        return name.endswith(_PARTIAL) and len(name) > len(_PARTIAL)

    @staticmethod
    def etag_of_partial(name: str) -> str | None:
        """``<etag>.part`` -> ``<etag>``; None for any other name in ``partials/``."""
        return name[: -len(_PARTIAL)] if CacheLayout.is_partial(name) else None

    @staticmethod
    def partial_of_note(name: str) -> str | None:
        """The partial file's name a note belongs to (``<etag>.part.prefix``, ``.windows``, either ``.tmp``, ->
        ``<etag>.part``); None for any other name."""
        if name.endswith(_REPLACING):
            name = name[: -len(_REPLACING)]
        for suffix in _NOTES:
            if name.endswith(suffix) and CacheLayout.is_partial(name[: -len(suffix)]):
                return name[: -len(suffix)]
        return None


@dataclass(frozen=True)
class BucketLayout:
    """The object keys of a bucket shared by a fleet, under ``prefix`` (``""`` or ending in ``/``)."""

    prefix: str = ""

    @property
    def blobs_prefix(self) -> str:
        return f"{self.prefix}blobs/"

    def blob_key(self, etag: str) -> str:
        return self.blobs_prefix + blob_name(etag)

    def lease_key(self, etag: str) -> str:
        return f"{self.prefix}leases/{etag}"

    def etag_of_blob_key(self, key: str) -> str | None:
        """``<prefix>blobs/ab/<etag>`` -> ``<etag>``; None for a hidden or foreign key."""
        name = key[len(self.blobs_prefix):].rsplit("/", 1)[-1] if key.startswith(self.blobs_prefix) else ""
        return name if name and not name.startswith(".") else None

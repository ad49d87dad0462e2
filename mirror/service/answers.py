"""What the service answers, as values a route sends without deciding anything: a file's metadata
(:class:`ResolvedFile`), where its bytes come from (:class:`Cached`, :class:`Filling` or :class:`Relay`), and an API
call's answer (:class:`ApiResult`). Each carries the request's :class:`~mirror.metrics.Outcome`, decided once."""

from __future__ import annotations

from dataclasses import dataclass

from mirror import hf
from mirror.fill import Fill
from mirror.index import FileEntry
from mirror.metrics import Outcome
from mirror.storage.base import PeerAddress

# FileEntry too: the entry of a ResolvedFile, for the routes (which never import the index themselves).
__all__ = ["ApiResult", "BlobSource", "Cached", "FileEntry", "Filling", "Relay", "ResolvedFile"]


@dataclass(frozen=True)
class ResolvedFile:
    repo: hf.RepoRef
    entry: FileEntry
    outcome: Outcome  # HIT (metadata from the index) | MISS (asked upstream) | STALE (upstream failed)
    cdn_url: str | None = None


@dataclass(frozen=True)
class Cached:
    """The blob is a committed file on this disk."""

    path: str
    outcome: Outcome


@dataclass(frozen=True)
class Filling:
    """The blob is being filled: its bytes are read as they are written (:meth:`FillManager.reading`)."""

    fill: Fill
    outcome: Outcome


@dataclass(frozen=True)
class Relay:
    """The bytes ``start..end`` come from upstream, relayed without being stored
    (:meth:`~mirror.service.files.FileService.relay_file`): there is no disk room for the blob (a passthrough), or the
    Range lies far beyond what its fill has (a miss). ``peer``: another node of the fleet fills the file, or holds the
    Range as the windows of a paused sparse fill; the Range is relayed from that node, upstream only if that node no
    longer answers."""

    resolved: ResolvedFile
    token: str | None
    start: int
    end: int
    outcome: Outcome
    peer: PeerAddress | None = None


BlobSource = Cached | Filling | Relay


@dataclass(frozen=True)
class ApiResult:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    outcome: Outcome


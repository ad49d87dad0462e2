"""The windows this node holds of files no fill leases now, as the fleet sees them (``--metadata-url``, ``--node-url``).

A sparse fill that pauses (no reader for ``sparse_linger`` seconds) gives its fill lease back, and with it the only
record that this node holds windows of the file. Before the lease goes, the fill records its windows here
(:meth:`HeldWindows.publish`): this node's ``--node-url``, a fresh random token, the spans held. Another node asked a
Range those spans cover reads it from this node's peer route with that token (as it reads a fill in progress with the
token its lease publishes), and the route answers from the sparse partial file only, never from upstream; a Range the
file no longer holds wholly is refused, and the asking node fills it itself.

The record goes when the windows do: the quota's eviction of the partial file, the sweep of old partial files, the
blob's commit (by any node: then the windows of every node are forgotten, the blob is whole in the shared store), or a
refusal (the asking node drops a record that its node no longer honours). A failure of the database costs only the
relay: every call here logs it and answers as if nothing were held.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Sequence

from mirror.errors import MirrorError
from mirror.metadata.base import MetadataStore, WindowsRecord
from mirror.storage.base import PeerAddress

log = logging.getLogger("hf_mirror.metadata")


class HeldWindows:
    """This node's records of held windows in the fleet's database, and its reads of the other nodes' records."""

    def __init__(self, metadata: MetadataStore, node_url: str) -> None:
        self.metadata = metadata
        self.node_url = node_url.rstrip("/")

    async def publish(self, etag: str, held: Sequence[tuple[int, int]]) -> None:
        """This node holds ``held`` (``[start, done)`` spans) of ``etag``, readable by the token recorded now."""
        try:
            await self.metadata.put_windows(etag, PeerAddress(self.node_url, secrets.token_urlsafe(24)), held)
        except MirrorError as exc:
            log.warning("could not record the held windows of %s for the fleet: %s", etag, exc)

    async def forget(self, etag: str) -> None:
        """This node's windows of ``etag`` are gone (evicted, swept)."""
        await self._drop(etag, self.node_url)

    async def committed(self, etag: str) -> None:
        """The blob is whole in the shared store: nobody's windows of it are asked any more."""
        await self._drop(etag, None)

    async def refused(self, etag: str, peer: PeerAddress) -> None:
        """``peer`` did not answer a Range its record of ``etag`` covers: that record (with that token) goes."""
        await self._drop(etag, peer.url, peer.token)

    async def others(self, etag: str) -> list[WindowsRecord]:
        """The other nodes' records of ``etag``'s windows (none when the database cannot say)."""
        try:
            records = await self.metadata.get_windows(etag)
        except MirrorError as exc:
            log.info("the fleet's held windows of %s cannot be read: %s", etag, exc)
            return []
        return [record for record in records if record.peer.url != self.node_url]

    async def opens(self, etag: str, token: str) -> bool:
        """``token`` is the one this node's record of ``etag`` carries (any worker process of the node may ask)."""
        try:
            records = await self.metadata.get_windows(etag)
        except MirrorError as exc:
            log.info("the fleet's held windows of %s cannot be read: %s", etag, exc)
            return False
        return any(r.peer.url == self.node_url and hmac.compare_digest(r.peer.token, token) for r in records)

    async def _drop(self, etag: str, url: str | None, token: str | None = None) -> None:
        try:
            await self.metadata.drop_windows(etag, url, token)
        except MirrorError as exc:
            log.warning("could not drop the held windows of %s from the fleet's record: %s", etag, exc)


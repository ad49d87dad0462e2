"""The server keeps the audit index up with the audit files: every few seconds, in a thread, off the request path.

The requests only append lines (:mod:`mirror.audit.log`); what was written but not indexed yet (the last seconds,
or everything after a ``kill -9``) is indexed by the next catch-up here, or by ``hf-mirror audit`` before it
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from mirror.audit.index import INDEX_NAME, AuditIndex

log = logging.getLogger("hf_mirror.audit")


class IndexFollower:
    def __init__(self, directory: Path, interval: float = 2.0) -> None:
        self.directory = directory
        self.interval = interval
        self._index: AuditIndex | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="audit-index")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self._catch_up)
            except Exception as exc:  # noqa: BLE001 - the index is rebuilt from the files: a failed pass waits
                log.warning("audit index not updated (the next pass or `hf-mirror audit` will): %s", exc)

    def _catch_up(self) -> None:
        if self._index is None:
            self._index = AuditIndex(self.directory / INDEX_NAME)
        self._index.catch_up(self.directory)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._index is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._catch_up)
            self._index.close()

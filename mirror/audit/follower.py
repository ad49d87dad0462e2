"""The server keeps the audit index up with the audit files: a child process, every few seconds, off the serving
process.

Indexing costs several times what writing an event does (parse, four B-tree inserts): in the serving process it
would take a warm path's CPU on every download (docs/benchmarks.md); in its own process it takes another core. The
requests only append lines (:mod:`mirror.audit.log`); what was written but not indexed yet (the last seconds, or
everything after a ``kill -9``) is indexed by the next pass, or by ``hf-mirror audit`` before it answers.

One child per serving process (``--workers N``: N children); a lock file lets one of them index at a time, the
others skip their pass. A child whose parent is gone (``kill -9``) exits at its next pass.

    python -m mirror.audit.follower DIR INTERVAL PARENT_PID     (what the server starts)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from mirror.audit.index import INDEX_NAME, AuditIndex

log = logging.getLogger("hf_mirror.audit")
_LOCK_NAME = "index.lock"


class IndexFollower:
    def __init__(self, directory: Path, interval: float = 2.0) -> None:
        self.directory = directory
        self.interval = interval
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mirror.audit.follower", str(self.directory), str(self.interval), str(os.getpid())],
            stdin=subprocess.DEVNULL, start_new_session=False)

    async def aclose(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._proc.wait, 10)
            if self._proc.poll() is None:
                self._proc.kill()
                await asyncio.to_thread(self._proc.wait)
        # The last events of this process, indexed before it exits (shutdown: time is not the requests' here).
        try:
            await asyncio.to_thread(index_once, self.directory, True)
        except Exception as exc:  # noqa: BLE001 - the next pass or `hf-mirror audit` indexes them
            log.warning("audit index not updated at shutdown: %s", exc)


def index_once(directory: Path, wait: bool = False) -> int:
    """One pass under the lock (``wait``: for it, else skip when another process holds it); returns the rows."""
    with open(directory / _LOCK_NAME, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return 0
        index = AuditIndex(directory / INDEX_NAME)
        try:
            return index.catch_up(directory)
        finally:
            index.close()


def follow(directory: Path, interval: float, parent: int) -> None:
    while os.getppid() == parent:
        try:
            index_once(directory)
        except Exception as exc:  # noqa: BLE001 - the files are the record: a failed pass waits for the next
            print(f"hf-mirror audit index: pass failed, next in {interval:g} s: {exc}", file=sys.stderr)
        time.sleep(interval)


if __name__ == "__main__":
    try:
        follow(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
    except KeyboardInterrupt:
        pass

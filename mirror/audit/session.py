"""Client sessions: one download of one file by one client, however many requests it takes, is one audit event.

A download starts at byte 0 (no ``Range``, or one from 0) and opens a session: its first answer is the event. A
request that continues a download (a ``Range`` that starts past byte 0: a resume after a cut, the later ranges of a
parallel download, an Xet client's later reconstructions) rolls up into the client's open session for the file,
if it came back within ``idle`` seconds; otherwise it opens one (one event more, never one less). The client is
its caller, address (not port: a resume opens a new connection) and User-Agent. Two downloads from byte 0 are two
events, whoever sends them: two processes of one host and library cannot be told apart, and both took the file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class Sessions:
    """The open sessions of this process, least recently seen first; bounded (``max_open``): past it the oldest
    closes early, and its client's next request opens a new session (one more event, never one less)."""

    def __init__(self, idle: float, max_open: int = 200_000) -> None:
        self.idle = idle
        self.max_open = max_open
        self._seen: OrderedDict[Hashable, float] = OrderedDict()

    def opens(self, key: Hashable, now: float, continuation: bool = False) -> bool:
        """Whether a request of ``key`` at ``now`` opens a session (then it gets an event), or, a ``continuation``
        of a download in an open session, rolls up into it."""
        seen = self._seen
        last = seen.get(key)
        seen[key] = now
        seen.move_to_end(key)
        while seen:  # close the sessions idle too long (the first ones: least recently seen)
            first_key, first_seen = next(iter(seen.items()))
            if now - first_seen <= self.idle and len(seen) <= self.max_open:
                break
            del seen[first_key]
        return not continuation or last is None or now - last > self.idle

    def __len__(self) -> int:
        return len(self._seen)

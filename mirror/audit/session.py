"""Client sessions: the requests of one client for one file, rolled up into the one audit event of its first answer.

A resumed download (``Range: bytes=N-`` after a cut), an Xet client's many reconstructions and byte ranges, a
client asking the same file again: all one session while the client comes back within ``idle`` seconds. The client
is its caller, address (not port: a resume opens a new connection) and User-Agent.
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

    def opens(self, key: Hashable, now: float) -> bool:
        """Whether a request of ``key`` at ``now`` opens a session (then it gets an event), else it rolls up."""
        seen = self._seen
        last = seen.get(key)
        seen[key] = now
        seen.move_to_end(key)
        while seen:  # close the sessions idle too long (the first ones: least recently seen)
            first_key, first_seen = next(iter(seen.items()))
            if now - first_seen <= self.idle and len(seen) <= self.max_open:
                break
            del seen[first_key]
        return last is None or now - last > self.idle

    def __len__(self) -> int:
        return len(self._seen)

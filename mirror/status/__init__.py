"""The status page for operators (issue 19): what is cached (paginated, searchable), fills in progress, traffic over
the last hours as small inline SVG charts, and pin / unpin / evict / warm buttons.

- :mod:`mirror.status.history`: a ring buffer of per-minute samples of the request and byte counters;
- :mod:`mirror.status.board`: the status data for one page of repos, from the last usage snapshot (never a scan on
  the request path, see ``CacheManager.current_snapshot``);
- :mod:`mirror.status.page`: the server-rendered HTML, with a small inline script for the buttons (no build step).
"""

from mirror.status.board import StatusBoard
from mirror.status.history import StatusHistory
from mirror.status.page import render_status_page

__all__ = ["StatusBoard", "StatusHistory", "render_status_page"]

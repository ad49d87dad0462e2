"""The status page for operators (issues 19 and 29): what is cached (filtered, sorted, paginated; a page per repo),
quota and disk, the syncs' last runs, fills in progress, traffic over the last hours on time-axis charts, pin / unpin
/ evict / warm buttons; it refreshes itself in place.

- :mod:`mirror.status.history`: a ring buffer of per-minute samples of the request, byte, error and latency counters;
- :mod:`mirror.status.board`: the status data for one page of repos or one repo, from the last usage snapshot (never
  a scan on the request path, see ``CacheManager.current_snapshot``);
- :mod:`mirror.status.charts`: the inline SVG charts;
- :mod:`mirror.status.page` and :mod:`mirror.status.repopage`: the server-rendered HTML;
- :mod:`mirror.status.assets`: the pages' inline script (buttons, refresh) and style (no build step).
"""

from mirror.status.board import StatusBoard
from mirror.status.history import StatusHistory
from mirror.status.page import render_status_page
from mirror.status.repopage import render_repo_page

__all__ = ["StatusBoard", "StatusHistory", "render_repo_page", "render_status_page"]

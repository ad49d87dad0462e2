"""The fill engine: one download per blob, streamed to every waiting client while it is hashed and stored.

- :mod:`mirror.fill.state`: :class:`FillSpec` (what to fetch) and :class:`Fill` (how far it got; what readers wait on);
- :mod:`mirror.fill.manager`: :class:`FillManager`, single flight per blob (a table here, a lease across processes),
  the fill task, and the readers of a fill in progress;
- :mod:`mirror.fill.download`: the download from upstream (resume, retry, verify, commit);
- :mod:`mirror.fill.peer`: following a fill that another process or node leads;
- :mod:`mirror.fill.resume`: the one resume loop (single stream and each window): retry, backoff, expired URLs;
- :mod:`mirror.fill.copy`: the one body copy, into the partial file in a worker thread, hashed beside the reads;
- :mod:`mirror.fill.windows`: a parallel fill in Range windows;
- :mod:`mirror.fill.threads`: the worker threads, owned by the manager, and the rule for cancelling one.

Policy: no web framework and no HTTP client type here; upstream bytes arrive as :mod:`mirror.upstream` values.
"""

from mirror.fill.manager import FillManager
from mirror.fill.peer import PEER_ROUTE, fill_url
from mirror.fill.state import Fill, FillSpec

__all__ = ["PEER_ROUTE", "Fill", "FillManager", "FillSpec", "fill_url"]

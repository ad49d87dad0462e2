"""The upstream Hub, as the rest of the mirror sees it: a client that returns the mirror's own values.

- :mod:`mirror.upstream.client`: :class:`UpstreamClient`, the Hub's requests (file metadata, file bytes, API);
- :mod:`mirror.upstream.connection`: the connection under it (both transports, redirects by hand, auth only to the
  upstream's origin, health, scrubbed errors), and :mod:`mirror.upstream.retry`, the one retry policy for 429/5xx;
- :mod:`mirror.upstream.bulk`: the bulk transport (urllib3 in a worker thread) and its :class:`BulkBody`;
- :mod:`mirror.upstream.values`: what the client returns (file metadata, whole answers, relayed bodies, a fill's
  file body);
- :mod:`mirror.upstream.errors`: upstream error answers as the exceptions of :mod:`mirror.errors`.

Only this package imports an HTTP client library (httpx, urllib3).
"""

from mirror.errors import RangeIgnored, UrlExpired
from mirror.upstream.bulk import BulkBody
from mirror.upstream.client import UpstreamClient
from mirror.upstream.connection import RepoGuard
from mirror.upstream.errors import hub_error
from mirror.upstream.rate import RateLimit
from mirror.upstream.values import FileBody, RelayBody, UpstreamAnswer, UpstreamFileMeta

__all__ = ["BulkBody", "FileBody", "RangeIgnored", "RateLimit", "RelayBody", "RepoGuard", "UpstreamAnswer",
           "UpstreamClient", "UpstreamFileMeta", "UrlExpired", "hub_error"]

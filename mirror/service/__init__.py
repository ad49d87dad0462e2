"""The pull-through policy. Returns values, never web-framework objects.

- Refs are mutable, content is immutable: a branch or tag maps to a commit for ``revision_ttl`` seconds; what a
  path is at a commit, and the blob behind an etag, never change once known.
- Content is local-first: a cached blob is served without asking upstream (after an access check for repos that
  are not public). Metadata is remote-first once its TTL is over, with a stale fallback when upstream fails.
- One fill per blob (:mod:`mirror.fill`).
- The service decides where a file's bytes come from (:class:`Cached`, :class:`Filling` or :class:`Relay`: the route
  only sends them) and the request's :class:`~mirror.metrics.Outcome`, once.

Policy: no web framework and no HTTP client type here. Upstream answers arrive as :mod:`mirror.upstream` values; index
keys are built by :mod:`mirror.index`.

- :mod:`mirror.service.answers`: the values a route sends (ResolvedFile; Cached | Filling | Relay; ApiResult);
- :mod:`mirror.service.core`: what both sides share (the parts, refs remembered, the unconfirmed-access refusal);
- :mod:`mirror.service.files`: resolve a file, check content access, decide where its bytes come from;
- :mod:`mirror.service.listing`: a cached tree listing read back as file entries;
- :mod:`mirror.service.api`: cached API JSON, its stale fallback, the relay of uncached read routes;
- :mod:`mirror.service.reads`: the routes of the route table (mirror.routetable), cached as it says.
"""

from mirror.service.files import FileService
from mirror.service.reads import ReadService


class MirrorService(FileService, ReadService):
    """The one service a mirror's routes and its sync ask: the file side and the API side, over shared parts."""


__all__ = ["MirrorService"]

"""The read routes of the Hub the mirror serves beyond files and repo metadata: one table, as data.

For each route: where it is (a sub-route of a repo, ``/api/{type}s/{repo}/{sub}/...``, or a fixed path), how its
answer is cached, which query parameters it reads (only those go upstream and make up a cache key: junk in a query
string neither reaches upstream nor grows the index) and who may read it. Every route here is relayed with the
caller's own Hub token or none, never the service token (that one is for sync and public content, see README).

How an answer is cached (:class:`Caching`):

- ``REPO``: per repo (and revision), for ``revision_ttl`` seconds; served only to callers the repo's policy lets read
  its metadata (allow/deny lists, mirror-token scopes, gated/private access);
- ``SHARED``: lists and searches that are not about one repo, for ``read_ttl`` seconds, keyed by the route's query
  and by the token sent upstream (a listing with a token shows that user's private repos: it is never shared);
- ``CALLER``: answers about the caller (whoami, settings, write access), keyed by a hash of the caller's token;
- ``NONE``: relayed as it arrives, never stored.

Who may read (:class:`Reader`): ``REPO``: whoever the repo's policy lets read its metadata; ``ANYONE``; ``OWN``:
the caller, with their own token (the mirror adds nothing: upstream decides).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Caching(StrEnum):
    REPO = "repo"
    SHARED = "shared"
    CALLER = "caller"
    NONE = "none"


class Reader(StrEnum):
    REPO = "repo"
    ANYONE = "anyone"
    OWN = "own"


_ALL_TYPES = frozenset({"model", "dataset", "space"})
_PAGES = frozenset({"cursor", "limit", "p"})


@dataclass(frozen=True)
class ReadRoute:
    """One read route. ``name``: the sub-route after a repo id, or the fixed path template (``{x}``: one segment)."""

    name: str
    caching: Caching
    reader: Reader
    params: frozenset[str] = frozenset()
    types: frozenset[str] = _ALL_TYPES  # repo-scoped: the repo types the sub-route exists for
    arity: tuple[int, int | None] = (0, 0)  # repo-scoped: how many segments follow the sub-route (None: any)


def _repo(sub: str, caching: Caching, reader: Reader = Reader.REPO, params: frozenset[str] = frozenset(),
          types: frozenset[str] = _ALL_TYPES, arity: tuple[int, int | None] = (0, 0)) -> tuple[str, ReadRoute]:
    return sub, ReadRoute(sub, caching, reader, params, types, arity)


# Sub-routes of one repo, /api/{type}s/{repo}/{sub}[/{args}] (the info, revision, tree, paths-info, refs, commits,
# treesize, parquet and xet-read-token routes are hf.API_READ_ROUTES', with their own service).
REPO_ROUTES: dict[str, ReadRoute] = dict([
    _repo("discussions", Caching.REPO, params=frozenset({"p", "type", "status", "author", "search", "sort"}),
          arity=(0, 1)),
    _repo("likers", Caching.REPO, params=_PAGES),
    _repo("compare", Caching.REPO, arity=(1, 1)),
    _repo("leaderboard", Caching.REPO, params=frozenset({"base_model"}), types=frozenset({"dataset"})),
    _repo("croissant", Caching.REPO, types=frozenset({"dataset"})),
    _repo("safetensors-metadata", Caching.REPO, types=frozenset({"model"}), arity=(1, None)),
    _repo("runtime", Caching.REPO, types=frozenset({"space"})),
    # About the caller's rights on the repo: only their own token says.
    _repo("auth-check", Caching.CALLER, Reader.OWN, arity=(0, 1)),
    _repo("lfs-files", Caching.CALLER, Reader.OWN, params=_PAGES | {"xet"}),
    _repo("user-access-request", Caching.CALLER, Reader.OWN, params=_PAGES, arity=(1, 1)),
    _repo("variables", Caching.CALLER, Reader.OWN, types=frozenset({"space"})),
    _repo("secrets", Caching.CALLER, Reader.OWN, types=frozenset({"space"})),
])

# What list_models / list_datasets / list_spaces (huggingface_hub, huggingface.js) send.
_LISTING = _PAGES | frozenset({
    "search", "author", "filter", "sort", "direction", "full", "cardData", "config", "expand", "expand[]", "gated",
    "inference", "inference_provider", "pipeline_tag", "num_parameters", "apps", "linked", "models", "datasets",
    "library", "language", "task_categories", "task_ids", "size_categories", "benchmark", "dataset_name", "other",
    "sdk", "trained_dataset", "fetch_config", "emissions_thresholds", "model_name",
})


def _fixed(pattern: str, caching: Caching, reader: Reader = Reader.ANYONE,
           params: frozenset[str] = frozenset()) -> ReadRoute:
    return ReadRoute(pattern, caching, reader, params)


# Routes that are not about one repo, by path template. The first fixed segment after /api/{type}s/ of each one
# (semantic-search, hardware, ...) is never read as a repo namespace (see RESERVED).
FIXED_ROUTES: tuple[ReadRoute, ...] = (
    _fixed("/api/models", Caching.SHARED, params=_LISTING),
    _fixed("/api/datasets", Caching.SHARED, params=_LISTING),
    _fixed("/api/spaces", Caching.SHARED, params=_LISTING),
    _fixed("/api/models-tags-by-type", Caching.SHARED, params=frozenset({"type"})),
    _fixed("/api/datasets-tags-by-type", Caching.SHARED, params=frozenset({"type"})),
    _fixed("/api/spaces/semantic-search", Caching.SHARED,
           params=frozenset({"q", "filter", "sdk", "includeNonRunning", "limit"})),
    _fixed("/api/spaces/hardware", Caching.SHARED),
    _fixed("/api/spaces/templates", Caching.SHARED),
    _fixed("/api/spaces/zero-gpu/quota", Caching.CALLER, Reader.OWN),
    _fixed("/api/whoami-v2", Caching.CALLER, Reader.OWN),
    _fixed("/api/users/{user}/likes", Caching.SHARED, params=_PAGES),
    _fixed("/api/users/{user}/overview", Caching.SHARED),
    _fixed("/api/users/{user}/followers", Caching.SHARED, params=_PAGES),
    _fixed("/api/users/{user}/following", Caching.SHARED, params=_PAGES),
    _fixed("/api/organizations/{org}/overview", Caching.SHARED),
    _fixed("/api/organizations/{org}/members", Caching.SHARED, params=_PAGES | {"search"}),
    _fixed("/api/organizations/{org}/followers", Caching.SHARED, params=_PAGES),
    _fixed("/api/organizations/{org}/settings/repositories", Caching.CALLER, Reader.OWN, params=_PAGES),
    _fixed("/api/settings/repositories", Caching.CALLER, Reader.OWN, params=_PAGES),
    _fixed("/api/settings/webhooks", Caching.CALLER, Reader.OWN),
    _fixed("/api/settings/webhooks/{id}", Caching.CALLER, Reader.OWN),
    _fixed("/api/collections", Caching.SHARED, params=_PAGES | {"owner", "item", "sort", "q"}),
    _fixed("/api/collections/{ns}/{slug}", Caching.SHARED),
    _fixed("/api/papers/search", Caching.SHARED, params=frozenset({"q", "limit"})),
    _fixed("/api/papers/{id}", Caching.SHARED),
    _fixed("/papers/{id}.md", Caching.SHARED),
    _fixed("/api/daily_papers", Caching.SHARED,
           params=_PAGES | {"sort", "date", "week", "month", "submitter"}),
    _fixed("/api/jobs/hardware", Caching.SHARED),
    _fixed("/api/buckets/{ns}", Caching.CALLER, Reader.OWN, params=_PAGES | {"search"}),
    # Kernels are repos of a type the mirror does not hold: relayed as they are, never stored.
    _fixed("/api/kernels/{ns}/{name}", Caching.NONE, Reader.OWN, params=frozenset({"expand", "expand[]"})),
    _fixed("/api/kernels/{ns}/{name}/revision/{rev}", Caching.NONE, Reader.OWN,
           params=frozenset({"expand", "expand[]"})),
)

# Fixed segments the Hub serves under /api/{type}s/: never a repo namespace or name.
RESERVED: dict[str, frozenset[str]] = {
    plural: frozenset(r.name.split("/")[3] for r in FIXED_ROUTES
                      if r.name.startswith(f"/api/{plural}/") and "{" not in r.name.split("/")[3])
    for plural in ("models", "datasets", "spaces")
}

# One segment of a path template: a user, org, collection slug, paper id, webhook id...
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_ROUTES_BY_DEPTH: dict[int, tuple[tuple[ReadRoute, tuple[str, ...]], ...]] = {}
for _route in FIXED_ROUTES:
    _parts = tuple(_route.name.split("/")[1:])
    _ROUTES_BY_DEPTH[len(_parts)] = (*_ROUTES_BY_DEPTH.get(len(_parts), ()), (_route, _parts))


def match_fixed(path: str) -> ReadRoute | None:
    """The fixed route a raw path (no query, no trailing slash) is, or ``None``. Literal segments win over ``{x}``."""
    segments = path.split("/")[1:]
    best: tuple[int, ReadRoute] | None = None
    for route, parts in _ROUTES_BY_DEPTH.get(len(segments), ()):
        literal = 0
        for part, segment in zip(parts, segments, strict=True):
            if part.startswith("{"):
                suffix = part[part.index("}") + 1:]
                if not segment.endswith(suffix) or not _SEGMENT.match(segment[: len(segment) - len(suffix)] or "-"):
                    break
            elif part != segment:
                break
            else:
                literal += 1
        else:
            if best is None or literal > best[0]:
                best = (literal, route)
    return best[1] if best else None

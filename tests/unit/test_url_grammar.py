"""Property tests on the URL grammar: ``hf.parse_resolve`` splits valid resolve paths into their parts and never
lets a path escape (moved from tests/e2e/test_security.py, whose fuzzed requests go through a real mirror)."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirror import hf
from mirror.errors import BadRequest

SEGMENT = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=20)


@given(ns=SEGMENT, name=SEGMENT, rev=SEGMENT, path=st.lists(SEGMENT, min_size=1, max_size=4))
def test_valid_resolve_urls_parse_to_their_parts(ns, name, rev, path):
    raw = f"/{ns}/{name}/resolve/{rev}/{'/'.join(path)}"
    try:
        target = hf.parse_resolve(raw)
    except BadRequest:
        # Only names the Hub rejects too: dot segments, leading/trailing dots or dashes, '--', '..'.
        assert any(s in ("..", ".") or ".." in s or "--" in s or s[0] in ".-" or s[-1] in ".-"
                   for s in (ns, name, rev, *path)), raw
        return
    assert target is not None
    assert target.repo.repo_id == f"{ns}/{name}" and target.revision == rev and target.path == "/".join(path)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.text(st.characters(codec="latin-1"), max_size=80))
def test_arbitrary_resolve_paths_never_escape(raw):
    try:
        target = hf.parse_resolve("/acme/tiny-model/resolve/main/" + raw)
    except BadRequest:
        return
    if target is not None:
        parts = target.path.split("/")
        assert ".." not in parts and "" not in parts and "\\" not in target.path and "\x00" not in target.path
        assert not target.path.startswith("/")


# --- the route table (mirror.routetable) ------------------------------------------------------------------------

def test_fixed_segments_under_a_repo_type_are_never_repos():
    for path in ("/api/spaces/semantic-search", "/api/spaces/hardware", "/api/spaces/templates",
                 "/api/spaces/zero-gpu/quota"):
        route = hf.classify(path)
        assert route.kind is hf.RouteKind.LISTING and route.api is None and route.read is not None, path
        assert route.read.name == path and hf.parse_api(path) is None, path
    assert hf.classify("/api/spaces/hardware/x").kind is hf.RouteKind.UNKNOWN  # no space named hardware/x
    assert hf.classify("/api/spaces/acme/hardware").api is None  # a write sub-route of a space named "acme"
    assert hf.classify("/api/spaces/acme/tiny-space").api.repo.repo_id == "acme/tiny-space"


def test_table_routes_of_a_repo_carry_the_repo_and_their_arguments():
    cases = {
        "/api/models/acme/tiny-model/discussions": ("model:acme/tiny-model", "discussions", ""),
        "/api/datasets/acme/d/discussions/7": ("dataset:acme/d", "discussions", "7"),
        "/api/models/acme/m/compare/v1..main": ("model:acme/m", "compare", "v1..main"),
        "/api/models/acme/m/safetensors-metadata/sub/model.safetensors.index.json":
            ("model:acme/m", "safetensors-metadata", "sub/model.safetensors.index.json"),
        "/api/spaces/acme/s/runtime": ("space:acme/s", "runtime", ""),
        "/api/datasets/acme/d/croissant": ("dataset:acme/d", "croissant", ""),
        "/api/models/acme/m/auth-check/write": ("model:acme/m", "auth-check", "write"),
    }
    for path, (key, sub, args) in cases.items():
        route = hf.classify(path)
        assert route.kind is hf.RouteKind.API and route.read is not None, path
        assert (route.api.repo.key, route.api.sub, route.api.path) == (key, sub, args), path
        assert route.methods == ("GET", "HEAD"), path
    # A sub-route on a repo type that has none, or with too many segments: refused, never relayed.
    for path in ("/api/models/acme/m/croissant", "/api/models/acme/m/runtime", "/api/models/acme/m/likers/x",
                 "/api/models/acme/m/xet-write-token/main", "/api/models/acme/m/discussions/1/status"):
        assert hf.classify(path).kind is hf.RouteKind.UNKNOWN, path


def test_fixed_routes_match_their_templates_only():
    assert hf.classify("/api/users/ada/likes").read.name == "/api/users/{user}/likes"
    assert hf.classify("/api/collections/acme/tiny-0123").read.name == "/api/collections/{ns}/{slug}"
    assert hf.classify("/papers/2401.00001.md").read.name == "/papers/{id}.md"
    assert hf.classify("/api/papers/search").read.name == "/api/papers/search"  # the literal wins over {id}
    for path in ("/papers/2401.00001", "/api/users/ada/secrets", "/api/users/%2e%2e/likes", "/api/collections/a"):
        assert hf.classify(path).kind is hf.RouteKind.UNKNOWN, path

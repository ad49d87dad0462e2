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

"""The metadata index in-process on a temporary directory: its key schema (each kind under its documented parts),
what is remembered as negative and expires, pins by source, a repo's removal, and two workers on one index.
(The bounds of the negative entries: test_negative_entries.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirror.hf import RepoRef, RepoType
from mirror.index import (
    NEGATIVE_TTL,
    READ_KEEP,
    ApiEntry,
    FileEntry,
    MetadataIndex,
    api_query_key,
    api_route_key,
    blob_key,
)
from mirror.layout import CacheLayout

REPO = RepoRef(RepoType.MODEL, "acme/tiny")
OTHER = RepoRef(RepoType.DATASET, "acme/tiny")  # the same id, another type: another repo
COMMIT = "a" * 40


@pytest.fixture
def index(tmp_path: Path) -> Iterator[MetadataIndex]:
    index = MetadataIndex(CacheLayout(tmp_path).index_dir)
    yield index
    index.close()


def api_entry(status: int = 200) -> ApiEntry:
    return ApiEntry(status, (("content-type", "application/json"),), b"{}", time.time())


# --- the key schema ---------------------------------------------------------------------------------------------------


def test_each_kind_is_keyed_by_its_documented_parts(index: MetadataIndex) -> None:
    index.put_ref(REPO, "main", COMMIT)
    index.put_file(REPO, FileEntry(COMMIT, "sub/config.json", "b" * 40, 10))
    index.put_api(REPO, COMMIT, api_route_key("tree", "sub"), api_query_key([], None), api_entry())
    index.put_public(REPO, True)
    index.pin_repo(REPO)
    assert list(index.iter_keys("ref")) == [("ref", "model", "acme/tiny", "main")]
    assert list(index.iter_keys("file")) == [("file", "model", "acme/tiny", COMMIT, "sub/config.json")]
    assert list(index.iter_keys("api")) == [("api", "model", "acme/tiny", COMMIT, "tree:sub", "")]
    assert list(index.iter_keys("public")) == [("public", "model", "acme/tiny")]
    assert list(index.iter_keys("pin")) == [("pin", "model", "acme/tiny")]


def test_repos_of_other_types_never_share_entries(index: MetadataIndex) -> None:
    index.put_ref(REPO, "main", COMMIT)
    index.put_file(REPO, FileEntry(COMMIT, "config.json", "b" * 40, 10))
    assert index.get_ref(OTHER, "main") is None
    assert index.get_file(OTHER, COMMIT, "config.json") is None
    assert index.get_file(REPO, COMMIT, "config.json") == FileEntry(COMMIT, "config.json", "b" * 40, 10)


def test_equivalent_queries_share_one_key() -> None:
    assert api_query_key([("recursive", "True"), ("expand", "false")], None) == api_query_key(
        [("expand", "False"), ("recursive", "true")], None)
    assert api_query_key([("cursor", "xyz"), ("a", "1")], None) == "a=1&cursor=xyz"  # the cursor last
    assert api_query_key([], [("b", "True"), ("a", "x")]) == "|a=x&b=true"


def test_blob_names_are_hex_digests() -> None:
    sha256, sha1 = "0" * 64, "f" * 40
    assert blob_key(sha256) == sha256 and blob_key(sha1) == sha1
    other = blob_key('W/"not-a-digest"')
    assert other.startswith("x") and len(other) == 65 and other == blob_key('W/"not-a-digest"')


# --- time to live ----------------------------------------------------------------------------------------------------


def test_a_ref_is_fresh_for_its_ttl_then_stale_but_still_known(index: MetadataIndex,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1_000_000.0
    monkeypatch.setattr(time, "time", lambda: now)
    index.put_ref(REPO, "main", COMMIT)
    assert index.get_ref_fresh(REPO, "main", ttl=60).commit == COMMIT  # type: ignore[union-attr]
    now += 59.5
    assert index.get_ref_fresh(REPO, "main", ttl=60) is not None
    now += 1
    assert index.get_ref_fresh(REPO, "main", ttl=60) is None  # past the TTL: asked upstream again
    assert index.get_ref(REPO, "main").commit == COMMIT  # type: ignore[union-attr]  # still there for a stale answer
    index.put_ref(REPO, "main", "b" * 40)  # confirmed again: fresh from now
    assert index.get_ref_fresh(REPO, "main", ttl=60).commit == "b" * 40  # type: ignore[union-attr]


def test_a_file_entry_and_api_json_do_not_expire_but_a_read_route_answer_does(index: MetadataIndex,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What a path is at a commit never changes (kept for good); an answer of the route table is kept READ_KEEP
    seconds (a stale fallback), then culled."""
    index.put_file(REPO, FileEntry(COMMIT, "config.json", "b" * 40, 10))
    index.put_api(REPO, COMMIT, "info:", "", api_entry())
    index.put_read("/api/whoami-v2", "anon", "", api_entry())
    later = time.time() + READ_KEEP + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert index.cull_expired() == 1
    assert index.get_read("/api/whoami-v2", "anon", "") is None
    assert index.get_file(REPO, COMMIT, "config.json") is not None
    assert index.get_api(REPO, COMMIT, "info:", "") is not None


# --- negative entries -------------------------------------------------------------------------------------------------


def test_remembered_absences_and_refusals_are_negative_and_expire(index: MetadataIndex,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    index.put_file(REPO, FileEntry(COMMIT, "config.json", "b" * 40, 10))
    index.put_api(REPO, COMMIT, "info:", "", api_entry())
    assert index.negative_usage() == (0, 0)  # what exists is never negative
    index.put_file(REPO, FileEntry(COMMIT, "nope.bin", missing=True))
    index.put_api(REPO, "main", "info:", "", api_entry(404))
    index.put_access("public", "content", REPO, (False, time.time()), expire=60)
    assert index.negative_usage()[0] == 3
    assert index.get_file(REPO, COMMIT, "nope.bin") == FileEntry(COMMIT, "nope.bin", missing=True)
    # Each expires (a 404 after NEGATIVE_TTL): once past it, a cull drops all three and nothing else.
    later = time.time() + NEGATIVE_TTL + 1
    with monkeypatch.context() as clock:
        clock.setattr(time, "time", lambda: later)
        assert index.cull_expired() == 3
    assert index.negative_usage() == (0, 0)
    assert index.get_file(REPO, COMMIT, "config.json") is not None


def test_an_allowed_access_is_not_negative(index: MetadataIndex) -> None:
    index.put_access("public", "meta", REPO, (True, 1.0))
    assert index.get_access("public", "meta", REPO) == (True, 1.0)
    assert index.negative_usage() == (0, 0)


# --- pins -------------------------------------------------------------------------------------------------------------


def test_a_manifest_replaces_its_own_pins_and_leaves_the_others(index: MetadataIndex) -> None:
    a, b, c = (RepoRef(RepoType.MODEL, f"acme/{n}") for n in "abc")
    index.set_pins([a, b], "nightly.toml")
    index.pin_repo(c)  # the operator's
    index.set_pins([b], "nightly.toml")
    assert index.pin_sources() == {("model", "acme/b"): "nightly.toml", ("model", "acme/c"): "operator"}
    assert index.pinned_repos() == {("model", "acme/b"), ("model", "acme/c")}


def test_the_operator_does_not_take_over_a_manifests_pin_and_unpin_says_whose_it_was(index: MetadataIndex) -> None:
    index.set_pins([REPO], "nightly.toml")
    index.pin_repo(REPO)
    assert index.pin_sources() == {("model", "acme/tiny"): "nightly.toml"}
    assert index.unpin_repo(REPO) == "nightly.toml"
    assert index.unpin_repo(REPO) is None and index.pinned_repos() == set()


def test_deleting_a_repo_removes_its_entries_only(index: MetadataIndex) -> None:
    for repo in (REPO, OTHER):
        index.put_ref(repo, "main", COMMIT)
        index.put_file(repo, FileEntry(COMMIT, "config.json", "b" * 40, 10))
        index.put_api(repo, COMMIT, "info:", "", api_entry())
        index.put_public(repo, True)
        index.pin_repo(repo)
    index.put_access("public", "meta", REPO, (True, 1.0))
    assert index.delete_repo(REPO) == 5
    assert index.get_ref(REPO, "main") is None and index.get_file(REPO, COMMIT, "config.json") is None
    assert index.get_public(REPO) is None and index.pinned_repos() == {("dataset", "acme/tiny")}
    assert index.get_file(OTHER, COMMIT, "config.json") is not None and index.get_ref(OTHER, "main") is not None
    assert index.get_access("public", "meta", REPO) == (True, 1.0)  # access records are kept


# --- two workers ------------------------------------------------------------------------------------------------------


def test_a_worker_sees_a_ref_another_refreshed(tmp_path: Path) -> None:
    first, second = MetadataIndex(CacheLayout(tmp_path).index_dir), MetadataIndex(CacheLayout(tmp_path).index_dir)
    try:
        first.put_ref_at(REPO, "main", "1" * 40, fetched_at=100.0)
        assert second.get_ref(REPO, "main").commit == "1" * 40  # type: ignore[union-attr]
        second.put_ref_at(REPO, "main", "2" * 40, fetched_at=200.0)
        assert first.get_ref(REPO, "main").commit == "2" * 40  # type: ignore[union-attr]
        assert first.get_ref_fresh(REPO, "main", ttl=60) is None  # confirmed long ago: asked again
        first.put_ref(REPO, "main", "3" * 40)
        assert first.get_ref_fresh(REPO, "main", ttl=60).commit == "3" * 40  # type: ignore[union-attr]
    finally:
        first.close()
        second.close()

"""The sync manifest's ``[[select]]`` tables and the nightly state file (moved from tests/e2e/test_sync_select.py,
which runs the selections against the emulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mirror import hf
from mirror.layout import CacheLayout
from mirror.sync.manifest import PARQUET_REF, ManifestError, parse_manifest
from mirror.sync.state import SyncState, default_state_path


def test_select_tables_parse() -> None:
    manifest = parse_manifest({"select": [
        {"type": "dataset", "author": "acme", "name": ["tiny-*", "big-?"], "filter": ["format:parquet"],
         "revisions": ["main", "v1"], "allow": ["*.parquet"], "parquet_branch": True, "token_env": "T"},
        {"author": "acme", "filter": "transformers", "search": "tiny"},
    ]}, Path("m.toml"))
    first, second = manifest.selects
    assert first.type is hf.RepoType.DATASET and first.names == ("tiny-*", "big-?")
    assert first.query() == [("author", "acme"), ("filter", "format:parquet")]
    assert first.matches("acme/tiny-x") and first.matches("acme/big-1")
    assert not first.matches("acme/big-12") and not first.matches("other/tiny-x")
    spec = first.spec("acme/tiny-x")
    assert spec.all_revisions == ("main", "v1", PARQUET_REF) and spec.allow == ("*.parquet",)
    assert spec.token_env == "T" and spec.selected_by and "#1" in spec.selected_by
    assert second.type is hf.RepoType.MODEL and second.names is None
    assert second.query() == [("author", "acme"), ("filter", "transformers"), ("search", "tiny")]
    assert second.spec("acme/x").all_revisions == ("main",)


def test_example_select_block_parses() -> None:
    """The commented [[select]] example of deploy/sync.example.toml, uncommented, is a valid manifest."""
    import tomllib

    from tests.support.mirror_proc import REPO_ROOT

    text = (REPO_ROOT / "deploy" / "sync.example.toml").read_text()
    block = text[text.index("\n# [[select]]\n") + 1:]
    toml = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    rule, = parse_manifest(tomllib.loads(toml), Path("example")).selects
    assert rule.type is hf.RepoType.DATASET and rule.author == "stanfordnlp" and rule.parquet_branch
    assert rule.query() == [("author", "stanfordnlp"), ("filter", "format:parquet"), ("search", "imdb")]


@pytest.mark.parametrize("data, message", [
    ({"select": [{"type": "dataset"}]}, "author .* is required"),
    ({"select": [{"author": "acme/x"}]}, "one organisation or user name"),
    ({"select": [{"author": "acme", "id": "acme/x"}]}, "unknown key.*\\[\\[repo\\]\\]"),
    ({"select": [{"author": "acme", "name": "acme/*"}]}, "without its author"),
    ({"select": [{"author": "acme", "name": 3}]}, "name must be a glob"),
    ({"select": [{"author": "acme", "filter": [1]}]}, "filter must be a list"),
    ({"select": [{"author": "acme", "parquet_branch": True}]}, "only for datasets"),
    ({"select": [{"author": "acme", "type": "dataset", "parquet_branch": "yes"}]}, "true or false"),
    ({"select": [{"author": "acme", "type": "modle"}]}, "type must be"),
    ({"select": [{"author": "acme"}, {"author": "acme"}]}, "repeats \\[\\[select\\]\\] #1"),
    ({"repo": [{"id": "a/b", "parquet_branch": True}]}, "only for datasets"),
    ({"select": {"author": "acme"}}, "\\[\\[select\\]\\] tables"),
])
def test_select_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(data, Path("m.toml"))


def test_state_changes_and_atomic_save(tmp_path: Path) -> None:
    path = default_state_path("/etc/sync.toml", CacheLayout(tmp_path), None)
    assert path.parent == tmp_path / "sync-state" and path.suffix == ".json"
    assert default_state_path("/etc/sync.toml", CacheLayout(tmp_path), "http://m:8080") != path
    state = SyncState.load(path, "/etc/sync.toml")
    first = state.update({"dataset:o/a": "r1", "dataset:o/b": "r1", "model:o/c": "r2"}, {"r1", "r2"}, set(), 1.0)
    assert first.first_run and first.new == ["dataset:o/a", "dataset:o/b", "model:o/c"]
    state.save(1.0)
    assert not list(path.parent.glob(".sync-state-*"))  # the temporary file was renamed
    state = SyncState.load(path, "/etc/sync.toml")
    # o/b disappeared, o/d is new; r2's listing failed: model:o/c is not flagged gone.
    second = state.update({"dataset:o/a": "r1", "dataset:o/d": "r1"}, {"r1", "r2"}, {"r2"}, 2.0)
    assert not second.first_run
    assert (second.new, second.gone, second.still_gone) == (["dataset:o/d"], ["dataset:o/b"], [])
    assert state.repos["model:o/c"]["gone_since"] is None
    state.save(2.0)
    state = SyncState.load(path, "/etc/sync.toml")
    third = state.update({"dataset:o/a": "r1", "dataset:o/d": "r1"}, {"r1", "r2"}, set(), 3.0)
    assert third.still_gone == ["dataset:o/b"] and third.gone == ["model:o/c"]
    fourth = state.update({"dataset:o/b": "r1"}, {"r1"}, set(), 4.0)  # r2 removed from the manifest: rows dropped
    assert fourth.back == ["dataset:o/b"] and "model:o/c" not in state.repos
    path.write_text("{not json")
    assert SyncState.load(path, "x").repos == {}  # unreadable: afresh, with a warning

"""The sync manifest and its patterns: ``parse_manifest`` errors, the example manifest, and ``select`` against
huggingface_hub's own filter (moved from tests/e2e/test_sync.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mirror.sync.manifest import ManifestError, load_manifest, parse_manifest
from mirror.sync.selection import select
from tests.support.mirror_proc import REPO_ROOT


def test_example_manifest_parses() -> None:
    manifest = load_manifest(REPO_ROOT / "deploy" / "sync.example.toml")
    assert manifest.repos[0].repo.repo_id == "openai-community/gpt2"
    assert manifest.repos[0].revisions == ("main",)
    assert manifest.repos[0].allow == ("*.json", "*.safetensors", "*.txt")


@pytest.mark.parametrize("data, message", [
    ({"repo": [{"type": "model", "id": "a/b", "revision": ["main"]}]}, "unknown key"),
    ({"repo": [{"type": "modle", "id": "a/b"}]}, "type must be"),
    ({"repo": [{"type": "model"}]}, "id"),
    ({"repo": [{"type": "model", "id": "a/b", "revisions": []}]}, "revisions"),
    ({"repo": [{"id": "a/b"}, {"id": "a/b"}]}, "twice"),
    ({"concurrency": 0, "repo": []}, "concurrency"),
    ({"repos": []}, "unknown key"),
])
def test_manifest_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(data, Path("m.toml"))


def test_patterns_match_huggingface_hub() -> None:
    from huggingface_hub.utils import filter_repo_objects

    paths = ["config.json", "sub/nested.txt", "sub/deeper/x.json", "model.safetensors", "README.md", ".gitattributes",
             "data/train-00000-of-00001.parquet", "Data/x.PARQUET"]
    cases = [(None, None), (["*.json"], None), (["sub/"], None), (None, ["*.md", ".*"]), (["data/*"], ["*.md"]),
             (["*.parquet", "*.json"], ["sub/*"]), (["[Dd]ata/*"], None)]
    for allow, ignore in cases:
        assert select(paths, allow, ignore) == list(
            filter_repo_objects(paths, allow_patterns=allow, ignore_patterns=ignore)), (allow, ignore)

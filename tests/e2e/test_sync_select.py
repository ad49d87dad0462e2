"""``[[select]]`` rules in the sync manifest (issue 19, item 5) and ``parquet_branch`` (issue 20, item 2): repos
listed by author, type, name glob and the Hub's list filters through the paginated list API, synced like named
ones; a nightly run reports the repos new upstream since its last run and those that disappeared (kept, pinned,
flagged); ``--dry-run`` shows the selection and its bytes; through ``--cache-dir`` and through ``--mirror``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mirror.sync.manifest import PARQUET_REF
from tests.e2e.test_sync import blobs_in, cli, fetched_bytes, run_emulator, sync_cmd, write_manifest
from tests.support.mirror_proc import MirrorProcess

PARQUET = "acme/tiny-parquet"

# --- integration -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # page_size=2: the list API answers in pages of two, so every listing follows Link cursors.
    with run_emulator(tmp_path_factory.mktemp("emu-select"), page_size=2) as handle:
        yield handle


def etags_of(emu: Any, repo_type: str, repo_id: str, rev: str, paths: list[str] | None = None) -> set[str]:
    files = emu.files
    return {files.etag(repo_type, repo_id, rev, p) for p in (paths or files.paths(repo_type, repo_id, rev))}


def nightly_manifest(path: Path, names: str) -> Path:
    return write_manifest(path, f"""
[[select]]
type = "dataset"
author = "acme"
name = {names}
allow = ["*.parquet", "README.md"]

[[select]]
type = "model"
author = "acme"
filter = ["transformers"]
allow = ["config.json"]
""")


def listing_requests(emu: Any) -> list[str]:
    return [r["path"] for r in emu.requests() if r["path"].startswith(("/api/datasets?", "/api/models?"))]


def test_nightly_selection_picks_up_new_repos_and_flags_gone_ones(emu: Any, tmp_path: Path) -> None:
    """Through --cache-dir: dry run (selection and bytes), first run, a repo created upstream is new and fetched at
    the next run, a repo deleted upstream is flagged and kept (blobs and pin), the run after that is idempotent."""
    emu.create_repo("dataset", "acme/sel-doomed", {"README.md": b"# doomed\n", "d.parquet": b"D" * 3000})
    emu.create_repo("dataset", "acme/sel-alpha", {"README.md": b"# alpha\n", "a.parquet": b"A" * 5000,
                                                  "notes.txt": b"not selected by allow\n"})
    emu.create_repo("dataset", "acme/other-beta", {"b.parquet": b"B" * 7000})  # outside the name glob
    emu.create_repo("model", "acme/sel-model-untagged", {"config.json": b"{}"})  # not tagged transformers
    manifest = nightly_manifest(tmp_path / "nightly.toml", '["sel-*", "tiny-parquet"]')
    cache = tmp_path / "cache"
    expected = (etags_of(emu, "dataset", "acme/sel-doomed", "main")
                | etags_of(emu, "dataset", "acme/sel-alpha", "main", ["README.md", "a.parquet"])
                | etags_of(emu, "dataset", PARQUET, "main", [p for p in emu.files.paths("dataset", PARQUET, "main")
                                                             if p.endswith((".parquet", "README.md"))])
                | etags_of(emu, "model", "acme/tiny-model", "main", ["config.json"]))
    sizes = {}
    for repo_type, repo_id in (("dataset", "acme/sel-doomed"), ("dataset", "acme/sel-alpha"), ("dataset", PARQUET),
                               ("model", "acme/tiny-model")):
        for p in emu.files.paths(repo_type, repo_id, "main"):
            sizes[emu.files.etag(repo_type, repo_id, "main", p)] = emu.files.size(repo_type, repo_id, "main", p)
    total = sum(sizes[e] for e in expected)

    emu.reset_stats()
    dry = cli(*sync_cmd(manifest, cache, emu.url, "--dry-run"))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"dry run: {len(expected)} files, {total} bytes" in dry.stdout
    assert f"selected: 4 repo(s), {total} bytes" in dry.stdout
    for label in ("dataset:acme/sel-doomed", "dataset:acme/sel-alpha", f"dataset:{PARQUET}", "model:acme/tiny-model"):
        assert label in dry.stdout
    for excluded in ("acme/other-beta", "acme/tiny-jsonl", "acme/big-data", "sel-model-untagged", "gated-model"):
        assert excluded not in dry.stdout  # name globs and the filter select
    assert "first run: 4 new" in dry.stdout and "is not updated" in dry.stdout
    assert not blobs_in(cache) and not (cache / "sync-state").exists()
    pages = listing_requests(emu)
    assert any("cursor=" in p for p in pages), pages  # the listing followed the Link pages
    assert any("filter=transformers" in p for p in pages) and any("author=acme" in p for p in pages)

    first = cli(*sync_cmd(manifest, cache, emu.url))
    assert first.returncode == 0, first.stdout + first.stderr
    assert blobs_in(cache) == expected
    assert fetched_bytes(first.stdout) == total
    assert "first run: 4 new" in first.stdout
    assert len(list((cache / "sync-state").glob("*.json"))) == 1

    # Overnight: a repo appears upstream, another disappears.
    emu.create_repo("dataset", "acme/sel-fresh", {"README.md": b"# fresh\n", "f.parquet": b"F" * 4000})
    doomed_blobs = etags_of(emu, "dataset", "acme/sel-doomed", "main")
    emu.delete_repo("dataset", "acme/sel-doomed")
    second = cli(*sync_cmd(manifest, cache, emu.url))
    assert second.returncode == 0, second.stdout + second.stderr
    fresh = {emu.files.etag("dataset", "acme/sel-fresh", "main", p) for p in ("README.md", "f.parquet")}
    assert fresh <= blobs_in(cache)  # the new repo's files were fetched
    assert expected <= blobs_in(cache)  # nothing deleted: the gone repo's blobs are still there
    assert doomed_blobs <= blobs_in(cache)
    assert "since the last run: 1 new: dataset:acme/sel-fresh; 1 disappeared upstream (kept, not deleted): " \
           "dataset:acme/sel-doomed" in second.stdout
    row = next(line for line in second.stdout.splitlines() if "acme/sel-doomed" in line and "GONE" in line)
    assert "kept" in row
    assert fetched_bytes(second.stdout) == sum(emu.files.size("dataset", "acme/sel-fresh", "main", p)
                                               for p in ("README.md", "f.parquet"))
    listing = json.loads(cli("cache", "ls", "--json", "--cache-dir", str(cache)).stdout)
    pinned = {row["repo"]: row["pinned"] for row in listing}
    assert pinned["dataset:acme/sel-doomed"] and pinned["dataset:acme/sel-fresh"]

    third = cli(*sync_cmd(manifest, cache, emu.url))
    assert third.returncode == 0, third.stdout + third.stderr
    assert "nothing to fetch" in third.stdout and fetched_bytes(third.stdout) == 0
    assert "0 new; 0 disappeared upstream (kept, not deleted); 1 still gone (kept): dataset:acme/sel-doomed" \
           in third.stdout


def test_parquet_branch_fetches_the_conversion(emu: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "pq.toml", f"""
[[repo]]
type = "dataset"
id = "{PARQUET}"
allow = ["README.md"]
parquet_branch = true

[[select]]
type = "dataset"
author = "acme"
name = "tiny-jsonl"
parquet_branch = true
""")
    cache = tmp_path / "cache"
    result = cli(*sync_cmd(manifest, cache, emu.url))
    assert result.returncode == 0, result.stdout + result.stderr
    converted = etags_of(emu, "dataset", PARQUET, PARQUET_REF)  # the whole branch: the patterns do not apply
    assert converted | etags_of(emu, "dataset", PARQUET, "main", ["README.md"]) \
        | etags_of(emu, "dataset", "acme/tiny-jsonl", "main") == blobs_in(cache)
    assert "no refs/convert/parquet upstream" in result.stdout  # tiny-jsonl has no conversion: a note, no failure
    listing = json.loads(cli("cache", "ls", "--json", "--cache-dir", str(cache)).stdout)
    revisions = {row["repo"]: row["revisions"] for row in listing}
    assert revisions[f"dataset:{PARQUET}"][PARQUET_REF] == emu.files.commit("dataset", PARQUET, PARQUET_REF)


def test_selection_through_a_running_mirror(emu: Any, tmp_path: Path) -> None:
    emu.create_repo("dataset", "acme/mir-one", {"README.md": b"# one\n", "one.parquet": b"1" * 2500})
    manifest = nightly_manifest(tmp_path / "nightly.toml", '"mir-*"')
    state = tmp_path / "state.json"
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror:
        cmd = ["sync", "--manifest", str(manifest), "--mirror", mirror.url, "--state", str(state)]
        dry = cli(*cmd, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "dataset:acme/mir-one" in dry.stdout and "model:acme/tiny-model" in dry.stdout
        assert not state.exists()
        emu.reset_stats()
        first = cli(*cmd)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "first run: 2 new" in first.stdout
        assert etags_of(emu, "dataset", "acme/mir-one", "main") <= blobs_in(tmp_path / "cache")
        assert listing_requests(emu)  # the mirror relayed the listing (the sync itself knows no upstream)
        emu.create_repo("dataset", "acme/mir-two", {"two.parquet": b"2" * 1500})
        second = cli(*cmd)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "since the last run: 1 new: dataset:acme/mir-two" in second.stdout
        assert emu.files.etag("dataset", "acme/mir-two", "main", "two.parquet") in blobs_in(tmp_path / "cache")


def test_a_failed_listing_fails_the_run_and_flags_nothing(emu: Any, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.toml", """
[[select]]
type = "dataset"
author = "acme"
name = "tiny-parquet"
token_env = "HF_MIRROR_TEST_UNSET_TOKEN"
""")
    result = cli(*sync_cmd(manifest, tmp_path / "cache", emu.url))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED [[select]] #1" in result.stdout and "HF_MIRROR_TEST_UNSET_TOKEN" in result.stdout


def test_hub_like_listing(emu: Any) -> None:
    """huggingface_hub's own list_models/list_datasets against the emulator (author, filter, pages)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=emu.url, token=False)
    assert [m.id for m in api.list_models(author="acme", filter="transformers")] == ["acme/tiny-model"]
    datasets = [d.id for d in api.list_datasets(author="acme")]
    assert {"acme/tiny-parquet", "acme/tiny-jsonl", "acme/big-data"} <= set(datasets) and len(datasets) > 2
    assert [d.id for d in api.list_datasets(author="acme", filter="format:parquet")] == [PARQUET]
    assert "acme/private-model" not in [m.id for m in api.list_models(author="acme")]
    with_token = HfApi(endpoint=emu.url, token="hf_good_token")
    assert "acme/private-model" in [m.id for m in with_token.list_models(author="acme")]

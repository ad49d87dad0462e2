"""mirror.hubjson: the one reader of the Hub's tree entries and Link pagination."""

from __future__ import annotations

from mirror.hubjson import TREE_QUERY, TreeFile, lfs_etag, listing_pages, next_link, next_page_query, tree_files

SHA1 = "a" * 40
SHA256 = "b" * 64


def test_tree_entries_read_by_one_rule() -> None:
    entries = [
        {"type": "directory", "oid": SHA1, "size": 0, "path": "sub"},
        {"type": "file", "oid": SHA1, "size": 12, "path": "config.json"},
        {"type": "file", "oid": SHA1, "size": 9, "path": "sub/w.bin", "xetHash": "c" * 64,
         "lfs": {"oid": SHA256, "size": 9, "pointerSize": 130}},
        {"type": "file", "oid": SHA1, "size": 9, "path": "old.bin", "lfs": {"sha256": SHA256, "size": 9}},
        {"type": "file", "oid": "not-a-sha", "size": 1, "path": "odd"},  # no known shape: no file
        {"type": "file", "oid": SHA1, "size": 1, "path": "lfs-sha1", "lfs": {"oid": SHA1}},
        {"type": "file", "oid": SHA1, "path": "no-size"},
        "junk",
    ]
    assert tree_files(entries) == [TreeFile("config.json", SHA1, 12, False),
                                   TreeFile("sub/w.bin", SHA256, 9, True, "c" * 64),
                                   TreeFile("old.bin", SHA256, 9, True)]
    assert lfs_etag(SHA256) and not lfs_etag(SHA1)


def test_link_pagination_as_the_clients_read_it() -> None:
    value = '<https://hub/api/models/a/b/tree/main?recursive=true&cursor=xyz>; rel="next"'
    assert next_link(value) == "https://hub/api/models/a/b/tree/main?recursive=true&cursor=xyz"
    assert next_link('<https://x/1>; rel="prev", <https://x/3>; rel=next') == "https://x/3"
    assert next_link("") is None and next_link(None) is None and next_link('<https://x/1>; rel="prev"') is None
    assert next_page_query([("Content-Type", "x"), ("Link", value)]) == [("recursive", "true"), ("cursor", "xyz")]
    assert next_page_query([("content-type", "x")]) is None


def test_listing_pages_derive_the_directories() -> None:
    files = [{"type": "file", "oid": SHA1, "size": 1, "path": p} for p in ("a/b/c.txt", "top.txt")]
    pages = listing_pages(files)
    assert [e["path"] for e in pages[""]] == ["a", "top.txt"]
    assert [e["path"] for e in pages["a"]] == ["a/b"] and [e["path"] for e in pages["a/b"]] == ["a/b/c.txt"]
    assert TREE_QUERY == [("recursive", "true"), ("expand", "false")]

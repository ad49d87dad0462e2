"""The status pages' HTML without a server: every value escaped, links from one base, the time axis labelled, one
line per chart, the repo page's sections (issue 29, item 4)."""

from __future__ import annotations

import re
import time

from mirror.status import render_repo_page, render_status_page
from mirror.status.board import parse_repo
from mirror.status.charts import time_chart

EVIL = "acme/<script>alert(1)</script>"


def _history(n: int = 10, interval: float = 60.0) -> dict:
    now = time.time()
    return {"interval": interval, "points": [
        {"t": now - interval * (n - i), "hits": i, "misses": 1, "hit_ratio": i / (i + 1), "bytes_served": 1000 * i,
         "bytes_fetched": 1000 * i, "errors": i % 2, "upstream_errors": 1, "upstream_latency": None if i % 3 else 0.2}
        for i in range(n)]}


def test_the_list_escapes_every_value_and_builds_links_from_one_base():
    data = {"repos": [{"type": "model", "id": EVIL, "bytes": 1, "files": 1, "pinned": True,
                       "pinned_by": "<b>x</b>", "sync": "<i>"}], "repos_total": 1, "q": "\"><script>",
            "upstream": {"url": "<u>", "healthy": True}, "history": _history(),
            "sync_runs": [{"manifest": "<m>", "finished_at": "", "ok": True, "files": 0, "bytes": 0, "failed": 0,
                           "last_success_at": "", "late": False, "next": None}],
            "warming": [], "fills": [{"repo": "model:<f>", "path": "<px>", "written": 1, "size": 2}]}
    page = render_status_page(data, base="/mirror")
    assert "<script>alert" not in page and "<b>x</b>" not in page and "<m>" not in page and "<px>" not in page
    assert page.count("<script>") == 1  # the page's own
    links = re.findall(r"href='([^']*)'", page)
    assert links and all(link.startswith("/mirror/") for link in links), links
    assert 'data-base="/mirror"' in page
    assert "onclick" not in page and "onsubmit" not in page and "onchange" not in page


def test_each_chart_has_a_labelled_time_axis_a_legend_and_lines_that_never_share_a_chart():
    now = 1_700_000_000.0
    times = [now - 60 * i for i in range(30, 0, -1)]
    svg = time_chart("c", "Bytes", times, 60, [("served", "#36c", [float(i) for i in range(30)])],
                     fmt=lambda v: f"{v:g}")
    labels = re.findall(r'text-anchor="middle">(\d\d:\d\d)</text>', svg)
    assert 3 <= len(labels) <= 7 and labels == sorted(labels)
    assert svg.count("<polyline") == 1 and "served" in svg
    page = render_status_page({"history": _history()})
    for chart in ("hit-ratio", "bytes-served", "bytes-fetched", "latency"):
        block = page.split(f'id="chart-{chart}"')[1].split("</svg>")[0]
        assert block.count('class="series"') == 1, chart
    errors = page.split('id="chart-errors"')[1].split("</svg>")[0]
    assert errors.count('class="series"') == 2 and "<polyline" not in errors  # bars side by side


def test_the_repo_page_lists_revisions_files_and_the_pin_and_a_missing_repo_says_not_found():
    data = {"version": "1", "uptime": 5, "repo": {"type": "model", "id": EVIL, "key": f"model:{EVIL}", "bytes": 10,
                                                   "files": 2, "last_access": ""},
            "pinned": True, "pinned_by": "nightly.toml", "pin_reason": "listed in the sync manifest nightly.toml",
            "revisions": [{"commit": "a" * 40, "refs": ["main"], "files": 2, "bytes": 10}],
            "refs": [{"name": "main", "commit": "a" * 40}],
            "files": [{"path": "<x>.json", "commit": "a" * 40, "size": 4, "lfs": False, "cached": True,
                       "last_use": 1.0, "last_use_at": "then"}], "files_total": 3, "recent": [], "fills": [],
            "warm_jobs": []}
    page = render_repo_page(data)
    assert "<script>alert" not in page and "&lt;x&gt;.json" in page and "pinned (nightly.toml)" in page
    assert "1 of 3 files listed" in page and "aaaaaaaaaaaa" in page
    missing = render_repo_page({"repo": None, "asked": "<q>"})
    assert "id='not-found'" in missing and "<q>" not in missing


def test_repo_names_are_parsed_strictly():
    assert parse_repo("model:acme/x") == ("model", "acme/x")
    assert parse_repo("dataset:x") == ("dataset", "x")
    for bad in ("acme/x", "thing:acme/x", "model:", "model:a//b", "model:a/b/c"):
        assert parse_repo(bad) is None, bad

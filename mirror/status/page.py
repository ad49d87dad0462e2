"""The status page: server-rendered HTML from the status data (:class:`mirror.status.StatusBoard`), every value
escaped here. The layout: version, uptime and upstream; quota and disk bars, totals; the syncs' last runs; the
traffic charts (:mod:`mirror.status.charts`); fills and warm jobs in progress; the warm form; the cached repos,
filtered, sorted and paginated, each linking to its repo page (:mod:`mirror.status.repopage`). The sections marked
``data-live`` are what the page's script swaps at each refresh (:mod:`mirror.status.assets`).

Every link and URL is built from ``base`` (the mirror's path prefix, empty at the root), one argument."""

from __future__ import annotations

import html
import time
from typing import Any
from urllib.parse import urlencode

from mirror.config import format_size as _size
from mirror.status.assets import SCRIPT, STYLE
from mirror.status.charts import traffic_charts

REFRESH = 5  # seconds between the page's refreshes, by default (``?refresh=N``, 0: none)
esc = html.escape
_COLUMNS = (("type", "type", ""), ("name", "repo", ""), ("size", "size", "num"), ("files", "files", "num"),
            ("last_use", "last use", ""), ("pinned", "pinned", ""))


def duration(seconds: float) -> str:
    """``3 d 4 h``, ``2 h 5 min``, ``7 min``, ``12 s``: an uptime or an age, for people."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return f"{days} d {hours % 24} h"
    if hours:
        return f"{hours} h {minutes % 60} min"
    return f"{minutes} min"


def href(base: str, **params: Any) -> str:
    """A URL of the status pages: ``base`` + ``/`` + the non-empty parameters."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{base}/" + (f"?{query}" if query else "")


def bar(used: float, total: float, *, mark: float | None = None, label: str) -> str:
    """A horizontal bar ``used`` of ``total`` (orange from 80 %, red from 95 %); ``mark``: a line at that value."""
    share = min(max(used / total, 0.0), 1.0) if total else 0.0
    level = " full" if share >= 0.95 else " warn" if share >= 0.8 else ""
    line = f"<i style='left:{min(mark / total, 1.0):.1%}'></i>" if mark and total else ""
    return (f"<div class='bar{level}' role='meter' aria-label='{esc(label)}' aria-valuemin='0' aria-valuemax='100' "
            f"aria-valuenow='{share * 100:.0f}'><span style='width:{share:.1%}'></span>{line}</div>")


def header(data: dict[str, Any], base: str) -> str:
    """The pages' top line: name, version, uptime, upstream health, when the page last refreshed."""
    upstream = data.get("upstream") or {}
    health, tone = {True: ("up", "good"), False: ("DOWN", "bad"), None: ("not contacted yet", "")}[
        upstream.get("healthy")]
    uptime = f"up {duration(data['uptime'])}" if "uptime" in data else ""
    upstream_line = (f"<span>Upstream <b>{esc(upstream.get('url', ''))}</b>: <span class='{tone}' "
                     f"id='upstream-health'>{health}</span>{' (offline mode)' if data.get('offline') else ''}</span>"
                     ) if upstream else ""
    return (f"<header><h1><a href='{esc(href(base))}'>hf-mirror</a></h1>"
            f"<span id='version'>version {esc(str(data.get('version', '')))}</span>"
            f"<span id='uptime'>{esc(uptime)}</span>{upstream_line}"
            f"<span id='refreshed' class='muted' role='status'></span></header>")


def token_field(auth_required: bool) -> str:
    # One field for the buttons' and the refresh's bearer token (kept in sessionStorage): in mirror-auth mode the
    # mirror token; else a Hub token (pin or warm a gated or private repo, and see the ones it may read), or the
    # operator's --admin-token (unpin, evict, and every cached repo listed).
    label = ("Mirror token" if auth_required
             else "Token (your Hub token: pin, warm and see the gated or private repos it may read; the admin token: "
                  "unpin, evict, every repo listed)")
    return (f"<p><label>{label}: <input id='token' type='password' autocomplete='off'></label></p>"
            "<div id='action-result' role='status'></div>")


def document(title: str, body: str, *, base: str, refresh: int) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{STYLE}</style></head>
<body data-base="{esc(base)}" data-refresh="{int(refresh)}">
{body}
<script>{SCRIPT}</script>
</body></html>"""


def _summary(data: dict[str, Any]) -> str:
    # The quota counts the blobs and the windows sparse files hold.
    used, quota = data.get("cache_bytes", 0) + data.get("sparse_bytes", 0), data.get("max_size")
    disk = data.get("disk") or {}
    if quota:
        quota_card = (f"<div class='big'><span id=\"disk-usage\">{_size(used)} of {_size(quota)}</span></div>"
                      f"{bar(used, quota, label='cache quota used')}"
                      f"<div class='muted'>{used / quota:.0%} of the quota (--max-size); the least recently used "
                      f"unpinned blobs go first</div>")
    else:
        quota_card = (f"<div class='big'><span id=\"disk-usage\">{_size(used)} (no quota)</span></div>"
                      f"{bar(used, disk.get('total', 0), label='cache share of the disk')}"
                      f"<div class='muted'>no --max-size: the cache grows until the disk's free-space floor</div>")
    if disk:
        floor = data.get("min_free_space") or 0
        disk_card = (f"<div class='big'><span id='disk-free'>{_size(disk['free'])} free</span></div>"
                     f"{bar(disk['used'], disk['total'], mark=disk['total'] - floor, label='disk used')}"
                     f"<div class='muted'>{_size(disk['used'])} of {_size(disk['total'])} used; fills keep "
                     f"{_size(floor)} free (the line)</div>")
    else:
        disk_card = "<div class='muted'>not measured</div>"
    age = data.get("snapshot_age")
    counted = ("still counting: a large cache takes a while after a start" if age is None
               else f"counted {age:g} s ago")
    hits, misses, stale, errors = (data.get(k, 0) for k in ("hits", "misses", "stale", "errors"))
    return f"""<div class="cards">
<div class="card"><h3>Cache</h3>{quota_card}</div>
<div class="card"><h3>Disk</h3>{disk_card}</div>
<div class="card"><h3>Hit ratio</h3><div class="big"><span id="hit-ratio">{data.get('hit_ratio', 0):.1%}</span></div>
<div class="muted"><span id="hit-count">{hits}</span> hits, <span id="miss-count">{misses}</span> misses, {stale} stale,
<span id="error-count">{errors}</span> errors since the start</div></div>
<div class="card"><h3>Contents</h3>
<div class="big"><span id="blob-count">{data.get('cache_blobs', 0)}</span> blobs</div>
<div class="muted"><span id="sparse-count">{data.get('sparse_files', 0)}</span> sparse files holding
<span id="sparse-bytes">{_size(data.get('sparse_bytes', 0))}</span> (windows of ranged reads, never completed; in the
quota)</div>
<div class="muted">{counted}; index {_size(data.get('index_bytes', 0))}, 404s remembered:
{data.get('negative_entries', 0)} ({_size(data.get('negative_bytes', 0))})</div></div>
</div>"""


def _sync(data: dict[str, Any]) -> str:
    runs = data.get("sync_runs") or []
    if not runs:
        return ("<p class='muted'>No sync run recorded in this cache directory (each <code>hf-mirror sync "
                "--cache-dir</code> run that is not a dry run records one).</p>")
    rows = "".join(
        f"<tr data-manifest='{esc(r['manifest'])}'><td>{esc(r['manifest'])}</td><td>{esc(r['finished_at'])}</td>"
        f"<td class='{'good' if r['ok'] else 'bad'}'>{'ok' if r['ok'] else 'FAILED'}</td>"
        f"<td class=num>{r['files']}</td><td class=num>{_size(r['bytes'])}</td><td class=num>{r['failed']}</td>"
        f"<td>{esc(r['last_success_at']) or 'never'}"
        f"{' <span class=bad>late: no success for over 26 h</span>' if r['late'] else ''}</td>"
        f"<td class='muted'>{esc(r['next']) if r.get('next') else 'the scheduler&#8217;s (cron or systemd timer)'}"
        f"</td></tr>"
        for r in runs)
    return (f"<div class='scroll'><table id='sync-runs'><tr><th>manifest</th><th>last run</th><th>result</th>"
            f"<th class=num>files</th><th class=num>fetched</th><th class=num>failed</th><th>last success</th>"
            f"<th>next run</th></tr>{rows}</table></div>")


def _fills(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr{' class=sparse' if f.get('sparse') else ''}><td>{esc(f['repo'])}</td><td>{esc(f['path'])}"
        f"{' <span class=muted>(sparse: the windows of ranged reads)</span>' if f.get('sparse') else ''}</td>"
        f"<td>{_size(f['written'])} / {_size(f['size'])}</td>"
        f"<td><progress max='{f['size'] or 1}' value='{f['written']}'></progress></td></tr>"
        for f in data.get("fills", [])
    ) + "".join(
        f"<tr class='warm'><td>{esc(j['type'])}:{esc(j['repo'])}</td><td>warm {esc(j['revision'])} "
        f"({esc(j['state'])}, {j['files_done']}/{j['files_total']} files)</td>"
        f"<td>{_size(j['bytes_done'])} / {_size(j['bytes_total'])}</td>"
        f"<td><progress max='{j['bytes_total'] or 1}' value='{j['bytes_done']}'></progress></td></tr>"
        for j in data.get("warming", [])
    ) or "<tr><td colspan=4>none</td></tr>"
    return (f"<div class='scroll'><table id='fills'><tr><th>repo</th><th>file</th><th>progress</th><th></th></tr>"
            f"{rows}</table></div>")


def actions(kind: str, repo_id: str, pinned: bool) -> str:
    """A repo's buttons (the script reads their data attributes: no handler takes the repo's name)."""
    attrs = f"data-type='{esc(kind)}' data-repo='{esc(repo_id)}'"
    pin = "unpin" if pinned else "pin"
    evict = "" if pinned else f"<button {attrs} data-action='evict'>evict</button>"
    return f"<button {attrs} data-action='{pin}'>{pin}</button>{evict}<button {attrs} data-action='warm'>warm</button>"


def _repo_list(data: dict[str, Any], base: str) -> str:
    q, kind, pinned = data.get("q", ""), data.get("type", ""), data.get("pinned", "")
    sort, order = data.get("sort", "name"), data.get("order", "asc")
    page, pages, total = data.get("page", 1), data.get("pages", 1), data.get("repos_total", 0)
    per_page = data.get("per_page", 50)
    keep = {"q": q, "type": kind, "pinned": pinned, "per_page": per_page if per_page != 50 else None}

    def column(key: str, title: str, cls: str) -> str:
        if key == sort:
            arrow, flip = (" &#9650;", "desc") if order == "asc" else (" &#9660;", "asc")
        else:
            arrow, flip = "", ""
        link = href(base, **keep, sort=key, order=flip or None)
        return (f"<th class='{cls}' data-sort='{key}'><a data-nav href='{esc(link)}'>{esc(title)}</a>{arrow}</th>")

    rows = "".join(
        f"<tr data-repo='{esc(r['type'])}:{esc(r['id'])}'><td>{esc(r['type'])}</td>"
        f"<td><a class='repo-link' href='{esc(href(base, repo=r['type'] + ':' + r['id']))}'>{esc(r['id'])}</a></td>"
        f"<td class=num data-bytes='{r['bytes']}'>{_size(r['bytes'])}</td><td class=num>{r['files']}</td>"
        f"<td>{esc(r.get('last_access', ''))}</td>"
        f"<td class='pin-state{' pinned' if r.get('pinned') else ''}'>"
        f"{'pinned' + (' (' + esc(r['pinned_by']) + ')' if r.get('pinned_by') else '') if r.get('pinned') else ''}"
        f"</td><td>{esc(r.get('sync', ''))}</td><td>{actions(r['type'], r['id'], bool(r.get('pinned')))}</td></tr>"
        for r in data.get("repos", [])
    )
    if not rows:
        filtered = q or kind or pinned
        rows = f"<tr><td colspan=8>{'no cached repo matches' if filtered else 'nothing cached yet'}</td></tr>"
    first = (page - 1) * per_page + 1 if total else 0
    nav = [f"<span id='repo-count'>{first}&ndash;{min(page * per_page, total)} of {total}</span>"]
    where = {**keep, "sort": sort if sort != "name" else None, "order": order if sort != "name" or order != "asc"
             else None}
    if page > 1:
        nav.append(f"<a id='prev-page' data-nav href='{esc(href(base, **where, page=page - 1))}'>&larr; previous</a>")
    nav.append(f"<span id='page-number'>page {page} of {pages}</span>")
    if page < pages:
        nav.append(f"<a id='next-page' data-nav href='{esc(href(base, **where, page=page + 1))}'>next &rarr;</a>")
    hidden = ""
    if data.get("repos_hidden"):
        hidden = ("<p class='note' id='repos-hidden'>Some cached repos are not listed: gated and private repos are "
                  "shown only to callers who may read them (type your Hub token, or the admin token, in the token "
                  "field below)" + (", and a mirror token sees only the repos its patterns allow"
                                    if data.get("auth_required") else "") + ".</p>")
    head = "".join(column(*c) for c in _COLUMNS)
    return (f"{hidden}<nav>{' '.join(nav)}</nav><div class='scroll'><table id='repos'><tr>{head}<th>sync</th><th></th>"
            f"</tr>{rows}</table></div>")


def _filters(data: dict[str, Any], base: str) -> str:
    def options(name: str, choices: tuple[tuple[str, str], ...], chosen: str) -> str:
        return (f"<select name='{name}' id='filter-{name}'>" + "".join(
            f"<option value='{v}'{' selected' if v == chosen else ''}>{label}</option>" for v, label in choices)
            + "</select>")
    hidden = "".join(f"<input type='hidden' name='{k}' value='{esc(str(data.get(k)))}'>"
                     for k in ("sort", "order") if data.get(k))
    return (f"<form id='search' class='row' method='get' action='{esc(href(base))}' data-nav>"
            f"<input name='q' value='{esc(data.get('q', ''))}' placeholder='search repos' size='24'>"
            + options("type", (("", "all types"), ("model", "models"), ("dataset", "datasets"),
                               ("space", "spaces")), data.get("type", ""))
            + options("pinned", (("", "pinned or not"), ("yes", "pinned"), ("no", "not pinned")),
                      data.get("pinned", ""))
            + f"{hidden}<button type='submit'>filter</button></form>")


def render_status_page(data: dict[str, Any], *, base: str = "", refresh: int = REFRESH) -> str:
    interval = (data.get("history") or {}).get("interval", 60)
    points = len((data.get("history") or {}).get("points", []))
    span = duration(points * interval)
    body = f"""{header(data, base)}
<main>
<section id="summary" data-live>{_summary(data)}</section>
<h2>Sync</h2>
<section id="sync" data-live>{_sync(data)}</section>
<h2>Traffic <span class="muted">last {span}, one point per {interval:g} s, server time ({esc(time.strftime('%Z'))}),
this process's</span></h2>
<section id="charts" class="charts" data-live>{traffic_charts(data.get('history') or {})}</section>
<h2>Fills and warm jobs in progress</h2>
<section id="fills-section" data-live>{_fills(data)}</section>
<h2>Warm a repo</h2>
<form id="warm-form" class="row">Fetch a repo's files now (cached or not):
<select id="warm-type"><option>model</option><option>dataset</option><option>space</option></select>
<input id="warm-repo" placeholder="org/name" size="30">
<button type="button" id="warm-button" data-action="warm" data-form="1">warm</button></form>
<h2>Cached repos</h2>
{_filters(data, base)}
{token_field(bool(data.get('auth_required')))}
<section id="repo-list" data-live>{_repo_list(data, base)}</section>
</main>"""
    return document("hf-mirror status", body, base=base, refresh=refresh)

"""The status page: server-rendered HTML from the status data. No build step: inline SVG charts drawn here, and a
small inline script for the pin / unpin / evict / warm buttons (the page reads fine without it)."""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import urlencode

from mirror.config import format_size as _size

_W, _H = 560, 90  # chart size in px


def _polyline(values: list[float | None], top: float, color: str, label: str, width: float = 1.5) -> str:
    if not values:
        return ""
    step = _W / max(1, len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if segments[-1]:
                segments.append([])
            continue
        y = _H - 4 - (v / top if top else 0) * (_H - 12)
        segments[-1].append(f"{i * step:.1f},{y:.1f}")
    lines = []
    for points in segments:
        if len(points) == 1:  # a single point: a dot
            x, y = points[0].split(",")
            lines.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
        elif points:
            lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{" ".join(points)}"/>')
    return f'<g class="series" data-label="{html.escape(label)}">{"".join(lines)}</g>'


def _chart(chart_id: str, title: str, series: list[tuple[str, str, list[float | None]]], top: float,
           top_label: str) -> str:
    legend = " ".join(f'<span style="color:{color}">&#9632; {html.escape(name)}</span>' for name, color, _ in series)
    body = "".join(_polyline(values, top, color, name, 3.0 if i == 0 and len(series) > 1 else 1.5)
                   for i, (name, color, values) in enumerate(series))
    return (f'<figure><figcaption>{html.escape(title)} {legend}</figcaption>'
            f'<svg id="{chart_id}" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
            f'aria-label="{html.escape(title)}"><rect width="{_W}" height="{_H}" fill="#fafafa" stroke="#ddd"/>'
            f'<text x="4" y="11" font-size="10" fill="#888">{html.escape(top_label)}</text>{body}</svg></figure>')


def _charts(history: dict[str, Any]) -> str:
    points = history.get("points", [])
    interval = history.get("interval", 60)
    ratio = [p["hit_ratio"] for p in points]
    served = [float(p["bytes_served"]) for p in points]
    fetched = [float(p["bytes_fetched"]) for p in points]
    top = max([*served, *fetched, 1.0])
    seconds = len(points) * interval
    span = (f"last {seconds / 3600:.1f} h" if seconds >= 7200 else f"last {seconds / 60:.0f} min") + \
        f", one point per {interval:g} s"
    return (_chart("chart-hit-ratio", f"Hit ratio ({span})", [("hit ratio", "#2a7", ratio)], 1.0, "100%")
            + _chart("chart-bytes", f"Bytes per {interval:g} s",
                     [("served", "#36c", served), ("fetched", "#c63", fetched)], top, _size(top)))


def _qs(**params: Any) -> str:
    return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "")})


_SCRIPT = """
const out = () => document.getElementById('action-result');
const base = document.body.dataset.base || '';  // the mirror's path prefix behind a proxy (mirror.front)
function token() {
  const field = document.getElementById('token');
  if (field && field.value) { sessionStorage.setItem('hfMirrorToken', field.value); return field.value; }
  return sessionStorage.getItem('hfMirrorToken');
}
async function mirrorAction(button) {
  let {action, type, repo} = button.dataset;
  if (button.dataset.form) {  // the warm form: any repo, cached or not
    type = document.getElementById('warm-type').value;
    repo = document.getElementById('warm-repo').value.trim();
  }
  const headers = {'Content-Type': 'application/json'};
  const tok = token();
  if (tok) headers['Authorization'] = 'Bearer ' + tok;
  const warm = action === 'warm';
  const url = base + (warm ? '/api/mirror/warm' : `/api/mirror/repos/${type}/${repo}/${action}`);
  const body = JSON.stringify(warm ? {repo, type} : {});
  let response, data = {};
  try {
    response = await fetch(url, {method: 'POST', headers, body});
    data = await response.json().catch(() => ({}));
  } catch (e) {
    out().textContent = `${action} ${type}:${repo}: ${e}`;
    return {ok: false};
  }
  const box = out();
  box.dataset.status = response.status;
  if (!response.ok) {
    box.textContent = `${action} ${type}:${repo} failed: ${response.status} ${data.error || ''}`;
    return {ok: false, status: response.status, data};
  }
  box.textContent = `${action} ${type}:${repo}: ${warm ? 'queued' : 'ok'}` +
      (data.freed_bytes !== undefined ? ` (${data.blobs} blobs, ${data.freed_bytes} bytes freed)` : '');
  if (warm) pollWarm(data.id, `${type}:${repo}`);
  else setTimeout(() => location.reload(), 400);
  return {ok: true, status: response.status, data};
}
async function pollWarm(id, name) {
  const headers = {};
  const tok = token();
  if (tok) headers['Authorization'] = 'Bearer ' + tok;
  for (;;) {
    const r = await fetch(`${base}/api/mirror/warm/${id}`, {headers});
    const job = await r.json().catch(() => ({}));
    out().textContent = `warm ${name}: ${job.state} ${job.files_done}/${job.files_total} files, ` +
        `${job.bytes_done}/${job.bytes_total} bytes`;
    if (!r.ok || job.state === 'done' || job.state === 'failed') return job;
    await new Promise(ok => setTimeout(ok, 1000));
  }
}
document.addEventListener('click', event => {
  const button = event.target.closest('button[data-action]');
  if (button) mirrorAction(button);
});
"""

_STYLE = """body{font-family:sans-serif;margin:2em;color:#222} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:14px} th{background:#f3f3f3}
td.num{text-align:right} figure{display:inline-block;margin:0 1.5em 1em 0} figcaption{font-size:13px}
button{font-size:12px;margin:0 2px} .pinned{color:#a60;font-weight:bold} #action-result{min-height:1.2em;color:#036}
nav{margin:.5em 0}"""


def render_status_page(data: dict[str, Any], base: str = "") -> str:
    """The page; ``base``: the path prefix the mirror is served under (its forms and scripts' URLs start with it)."""
    esc = html.escape
    fills = "".join(
        f"<tr><td>{esc(f['repo'])}</td><td>{esc(f['path'])}</td><td>{_size(f['written'])} / {_size(f['size'])}</td>"
        f"<td><progress max='{f['size'] or 1}' value='{f['written']}'></progress></td></tr>"
        for f in data.get("fills", [])
    ) + "".join(
        f"<tr class='warm'><td>{esc(j['type'])}:{esc(j['repo'])}</td><td>warm {esc(j['revision'])} "
        f"({esc(j['state'])}, {j['files_done']}/{j['files_total']} files)</td>"
        f"<td>{_size(j['bytes_done'])} / {_size(j['bytes_total'])}</td>"
        f"<td><progress max='{j['bytes_total'] or 1}' value='{j['bytes_done']}'></progress></td></tr>"
        for j in data.get("warming", [])
    ) or "<tr><td colspan=4>none</td></tr>"

    def actions(r: dict[str, Any]) -> str:
        attrs = f"data-type='{esc(r['type'])}' data-repo='{esc(r['id'])}'"
        pin = "unpin" if r.get("pinned") else "pin"
        evict = "" if r.get("pinned") else f"<button {attrs} data-action='evict'>evict</button>"
        return (f"<button {attrs} data-action='{pin}'>{pin}</button>{evict}"
                f"<button {attrs} data-action='warm'>warm</button>")

    repos = "".join(
        f"<tr data-repo='{esc(r['type'])}:{esc(r['id'])}'><td>{esc(r['type'])}</td><td>{esc(r['id'])}</td>"
        f"<td class=num>{_size(r['bytes'])}</td><td class=num>{r['files']}</td>"
        f"<td>{esc(r.get('last_access', ''))}</td>"
        f"<td class='pin-state{' pinned' if r.get('pinned') else ''}'>"
        f"{'pinned' + (' (' + esc(r['pinned_by']) + ')' if r.get('pinned_by') else '') if r.get('pinned') else ''}"
        f"</td><td>{esc(r.get('sync', ''))}</td><td>{actions(r)}</td></tr>"
        for r in data.get("repos", [])
    )
    if not repos:
        repos = ("<tr><td colspan=8>no cached repo matches</td></tr>" if data.get("q")
                 else "<tr><td colspan=8>nothing cached yet</td></tr>")
    quota = data.get("max_size")
    usage = _size(data.get("cache_bytes", 0)) + (f" of {_size(quota)}" if quota else " (no quota)")
    upstream = data.get("upstream", {})
    health = {True: "up", False: "DOWN", None: "not contacted yet"}[upstream.get("healthy")]
    q = data.get("q", "")
    page, pages, total, per_page = data.get("page", 1), data.get("pages", 1), data.get("repos_total", 0), \
        data.get("per_page", 50)
    first = (page - 1) * per_page + 1 if total else 0
    last = min(page * per_page, total)
    nav = [f"<span id='repo-count'>{first}&ndash;{last} of {total}</span>"]
    if page > 1:
        nav.append(f"<a id='prev-page' href='{esc(_qs(q=q, page=page - 1))}'>&larr; previous</a>")
    nav.append(f"<span id='page-number'>page {page} of {pages}</span>")
    if page < pages:
        nav.append(f"<a id='next-page' href='{esc(_qs(q=q, page=page + 1))}'>next &rarr;</a>")
    # One field for the buttons' bearer token (kept in sessionStorage): in mirror-auth mode the mirror token; else a
    # Hub token for pin / warm of gated or private repos, or the operator's --admin-token for unpin / evict.
    label = ("Mirror token for the buttons" if data.get("auth_required")
             else "Token for the buttons (your Hub token to pin or warm a gated or private repo; the admin token to "
                  "unpin or evict)")
    token_field = f"<p><label>{label}: <input id='token' type='password' autocomplete='off'></label></p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hf-mirror status</title>
<style>{_STYLE}</style>
</head><body{f' data-base="{esc(base)}"' if base else ''}>
<h1>hf-mirror</h1>
<ul>
<li>Upstream: <b>{esc(upstream.get('url', ''))}</b> — <span id="upstream-health">{health}</span>
{('(offline mode)' if data.get('offline') else '')}</li>
<li>Disk: <span id="disk-usage">{usage}</span>, <span id="blob-count">{data.get('cache_blobs', 0)}</span> blobs
 ({'still counting: a large cache takes a while after a start' if data.get('snapshot_age') is None
   else f"as of {data['snapshot_age']:g} s ago"})</li>
<li>Hit ratio: <span id="hit-ratio">{data.get('hit_ratio', 0):.1%}</span>
 ({data.get('hits', 0)} hits, {data.get('misses', 0)} misses, {data.get('stale', 0)} stale)</li>
</ul>
<section id="charts">{_charts(data.get('history', {}))}</section>
<h2>Fills in progress</h2>
<form id="warm-form" onsubmit="return false">Warm a repo now: <select id="warm-type"><option>model</option>
<option>dataset</option><option>space</option></select> <input id="warm-repo" placeholder="org/name" size="30">
<button type="button" id="warm-button" data-action="warm" data-form="1">warm</button></form>
<table id="fills"><tr><th>repo</th><th>file</th><th>progress</th><th></th></tr>{fills}</table>
<h2>Cached repos</h2>
<form id="search" method="get" action="{esc(base)}/"><input name="q" value="{esc(q)}" placeholder="search repos">
<button type="submit">search</button></form>
{token_field}<div id="action-result" role="status"></div>
<nav>{' '.join(nav)}</nav>
<table id="repos"><tr><th>type</th><th>repo</th><th>size</th><th>files</th><th>last use</th><th>pinned</th>
<th>sync</th><th></th></tr>{repos}</table>
<script>{_SCRIPT}</script>
</body></html>"""

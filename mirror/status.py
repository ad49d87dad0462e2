"""The status page: server-rendered HTML from the status data (no build step, no JavaScript needed)."""

from __future__ import annotations

import html
from typing import Any


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def render_status_page(data: dict[str, Any]) -> str:
    esc = html.escape
    fills = "".join(
        f"<tr><td>{esc(f['repo'])}</td><td>{esc(f['path'])}</td><td>{_size(f['written'])} / {_size(f['size'])}</td>"
        f"<td><progress max='{f['size'] or 1}' value='{f['written']}'></progress></td></tr>"
        for f in data.get("fills", [])
    ) or "<tr><td colspan=4>none</td></tr>"
    repos = "".join(
        f"<tr><td>{esc(r['type'])}</td><td>{esc(r['id'])}</td><td>{_size(r['bytes'])}</td><td>{r['files']}</td>"
        f"<td>{esc(r.get('last_access', ''))}</td></tr>"
        for r in data.get("repos", [])
    ) or "<tr><td colspan=5>nothing cached yet</td></tr>"
    quota = data.get("max_size")
    usage = _size(data.get("cache_bytes", 0)) + (f" of {_size(quota)}" if quota else " (no quota)")
    upstream = data.get("upstream", {})
    health = {True: "up", False: "DOWN", None: "not contacted yet"}[upstream.get("healthy")]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hf-mirror status</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px}}</style>
</head><body>
<h1>hf-mirror</h1>
<ul>
<li>Upstream: <b>{esc(upstream.get('url', ''))}</b> — <span id="upstream-health">{health}</span>
{('(offline mode)' if data.get('offline') else '')}</li>
<li>Disk: <span id="disk-usage">{usage}</span>, {data.get('cache_blobs', 0)} blobs</li>
<li>Hit ratio: <span id="hit-ratio">{data.get('hit_ratio', 0):.1%}</span>
 ({data.get('hits', 0)} hits, {data.get('misses', 0)} misses, {data.get('stale', 0)} stale)</li>
</ul>
<h2>Fills in progress</h2>
<table id="fills"><tr><th>repo</th><th>file</th><th>progress</th><th></th></tr>{fills}</table>
<h2>Cached repos</h2>
<table id="repos"><tr><th>type</th><th>repo</th><th>size</th><th>files</th><th>last use</th></tr>{repos}</table>
</body></html>"""

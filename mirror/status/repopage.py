"""One cached repo's page (``/?repo=model:acme/x``, its data at ``/api/mirror/status?repo=...``): its revisions and
files with their sizes and whether each blob is on this disk, its pin (by what, and why), and recent traffic (the
files used last, fills and warm jobs), with the same buttons as the list. Server-rendered from
:meth:`mirror.status.StatusBoard.repo_data`, every value escaped; the ``data-live`` sections refresh in place."""

from __future__ import annotations

from typing import Any

from mirror.config import format_size as _size
from mirror.status.page import REFRESH, actions, document, esc, header, href, token_field


def _short(commit: str) -> str:
    return commit[:12]


def _summary(data: dict[str, Any]) -> str:
    repo = data["repo"]
    if data.get("pinned"):
        pin = (f"<span class='pinned' id='pin-state'>pinned ({esc(data['pinned_by'])})</span> "
               f"<span class='muted' id='pin-reason'>{esc(data.get('pin_reason', ''))}</span>")
    else:
        pin = "<span id='pin-state'>not pinned</span> <span class='muted'>(evicted least recently used first)</span>"
    return (f"<div class='cards'><div class='card'><h3>Size</h3><div class='big'>{_size(repo['bytes'])}</div>"
            f"<div class='muted'>{repo['files']} blobs on disk</div></div>"
            f"<div class='card'><h3>Last use</h3><div class='big'>{esc(repo['last_access']) or '&ndash;'}</div></div>"
            f"<div class='card'><h3>Pin</h3><div>{pin}</div></div></div>"
            f"<p>{actions(repo['type'], repo['id'], bool(data.get('pinned')))}</p>")


def _revisions(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{esc(', '.join(r['refs'])) or '<span class=muted>(by commit)</span>'}</td>"
        f"<td><code>{esc(_short(r['commit']))}</code></td><td class=num>{r['files']}</td>"
        f"<td class=num>{_size(r['bytes'])}</td></tr>"
        for r in data.get("revisions", [])
    ) or "<tr><td colspan=4>none</td></tr>"
    return (f"<div class='scroll'><table id='revisions'><tr><th>branches and tags</th><th>commit</th>"
            f"<th class=num>files</th><th class=num>on disk</th></tr>{rows}</table></div>")


def _traffic(data: dict[str, Any]) -> str:
    recent = "".join(
        f"<tr><td>{esc(f['path'])}</td><td><code>{esc(_short(f['commit']))}</code></td>"
        f"<td>{esc(f['last_use_at'])}</td></tr>"
        for f in data.get("recent", [])
    ) or "<tr><td colspan=3>no file on this disk</td></tr>"
    moving = "".join(
        f"<tr><td>fill {esc(f['path'])}</td><td>{_size(f['written'])} / {_size(f['size'])}</td></tr>"
        for f in data.get("fills", [])
    ) + "".join(
        f"<tr><td>warm {esc(j['revision'])}: {esc(j['state'])}</td><td>{j['files_done']}/{j['files_total']} files, "
        f"{_size(j['bytes_done'])} / {_size(j['bytes_total'])}</td></tr>"
        for j in data.get("warm_jobs", [])
    ) or "<tr><td colspan=2>none</td></tr>"
    return (f"<div class='scroll'><table id='recent-files'><tr><th>file used last</th><th>commit</th><th>when</th>"
            f"</tr>{recent}</table></div><h3>Fills and warm jobs</h3>"
            f"<div class='scroll'><table id='repo-jobs'><tr><th>what</th><th>progress</th></tr>{moving}</table></div>")


def _files(data: dict[str, Any]) -> str:
    refs: dict[str, list[str]] = {}
    for r in data.get("refs", []):
        refs.setdefault(r["commit"], []).append(r["name"])
    rows = "".join(
        f"<tr data-path='{esc(f['path'])}'><td>{esc(f['path'])}</td>"
        f"<td><code>{esc(_short(f['commit']))}</code> {esc(', '.join(refs.get(f['commit'], [])))}</td>"
        f"<td class=num data-bytes='{f['size']}'>{_size(f['size'])}</td><td>{'LFS' if f['lfs'] else ''}</td>"
        f"<td>{'yes' if f['cached'] else '<span class=muted>no</span>'}</td><td>{esc(f['last_use_at'])}</td></tr>"
        for f in data.get("files", [])
    ) or "<tr><td colspan=6>none</td></tr>"
    total, shown = data.get("files_total", 0), len(data.get("files", []))
    more = f"<p class='muted'>{shown} of {total} files listed (by path).</p>" if total > shown else ""
    return (f"<div class='scroll'><table id='files'><tr><th>file</th><th>revision</th><th class=num>size</th>"
            f"<th>storage</th><th>on this disk</th><th>last use</th></tr>{rows}</table></div>{more}")


def render_repo_page(data: dict[str, Any], *, base: str = "", refresh: int = REFRESH) -> str:
    back = f"<p><a id='back' href='{esc(href(base))}'>&larr; all cached repos</a></p>"
    repo = data.get("repo")
    if repo is None:
        body = (f"{header(data, base)}<main>{back}<h2>Not found</h2><p id='not-found'>No cached repo "
                f"<code>{esc(data.get('asked', ''))}</code> that this page may show you (not cached, or gated or "
                f"private and your token not confirmed for it).</p>{token_field(False)}</main>")
        return document("hf-mirror: repo not found", body, base=base, refresh=0)
    hub = f"{esc(repo['type'])} {esc(repo['id'])}"
    body = f"""{header(data, base)}
<main>{back}
<h2 id="repo-title">{hub}</h2>
<section id="repo-summary" data-live>{_summary(data)}</section>
<h2>Revisions</h2>
<section id="repo-revisions" data-live>{_revisions(data)}</section>
<h2>Recent traffic</h2>
<section id="repo-traffic" data-live>{_traffic(data)}</section>
<h2>Files</h2>
<section id="repo-files" data-live>{_files(data)}</section>
{token_field(bool(data.get('auth_required')))}
</main>"""
    return document(f"hf-mirror: {repo['key']}", body, base=base, refresh=refresh)

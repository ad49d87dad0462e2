"""The status pages' inline script and style sheet (no build step, no CDN: the mirror runs on intranets).

The script does three things, and the pages read fine without it:

- the buttons: pin / unpin / evict / warm, with the bearer token of the one token field (kept in the tab's
  ``sessionStorage``), then the warm job followed until it ends;
- the refresh: every ``data-refresh`` seconds it fetches the page it shows (same URL, the token sent) and swaps each
  ``[data-live]`` section for the new one, so the numbers, charts and tables move without a reload; nothing is asked
  while the tab is hidden, and the refresh runs at once when it shows again. The sections are rendered and escaped on
  the server, once, for the first load and for every refresh alike;
- the list's links and filter form (``data-nav``) change the address and refresh in place, without a reload.

Every URL is built from ``BASE`` (the body's ``data-base``: the mirror's path prefix, empty at the root)."""

SCRIPT = """
const BASE = document.body.dataset.base || '';
const EVERY = Number(document.body.dataset.refresh || 0) * 1000;
const out = () => document.getElementById('action-result');
function token() {
  const field = document.getElementById('token');
  if (field && field.value) { sessionStorage.setItem('hfMirrorToken', field.value); return field.value; }
  return sessionStorage.getItem('hfMirrorToken');
}
function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  const tok = token();
  if (tok) headers['Authorization'] = 'Bearer ' + tok;
  return headers;
}
let asked = 0;  // the latest refresh wins: an older answer arriving late is dropped
async function refresh() {
  if (document.hidden) return false;
  const mine = ++asked;
  const stamp = document.getElementById('refreshed');
  try {
    const response = await fetch(location.pathname + location.search, {headers: authHeaders(), cache: 'no-store'});
    const text = await response.text();
    if (mine !== asked) return false;
    const fresh = new DOMParser().parseFromString(text, 'text/html');
    if (fresh.getElementById('not-found')) {  // the repo shown was evicted (or hidden): say so, as a load would
      document.querySelector('main').innerHTML = fresh.querySelector('main').innerHTML;
    }
    for (const live of document.querySelectorAll('[data-live]')) {
      const next = fresh.getElementById(live.id);
      if (next) live.innerHTML = next.innerHTML;  // rendered and escaped by the server; scripts in it never run
    }
    document.body.dataset.refreshes = Number(document.body.dataset.refreshes || 0) + 1;
    if (stamp) stamp.textContent = response.ok ? 'updated ' + new Date().toLocaleTimeString()
                                               : `refresh answered ${response.status}`;
    return response.ok;
  } catch (e) {
    if (stamp) stamp.textContent = 'refresh failed: ' + e;
    return false;
  }
}
if (EVERY > 0) setInterval(refresh, EVERY);
document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });
if (sessionStorage.getItem('hfMirrorToken')) refresh();  // the repos this token may see besides the public ones
function navigate(url) {
  history.pushState(null, '', url);
  return refresh();
}
window.addEventListener('popstate', () => refresh());
async function mirrorAction(button) {
  let {action, type, repo} = button.dataset;
  if (button.dataset.form) {  // the warm form: any repo, cached or not
    type = document.getElementById('warm-type').value;
    repo = document.getElementById('warm-repo').value.trim();
  }
  const headers = authHeaders({'Content-Type': 'application/json'});
  const warm = action === 'warm';
  const url = warm ? `${BASE}/api/mirror/warm` : `${BASE}/api/mirror/repos/${type}/${repo}/${action}`;
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
  else setTimeout(refresh, 400);
  return {ok: true, status: response.status, data};
}
async function pollWarm(id, name) {
  for (;;) {
    const r = await fetch(`${BASE}/api/mirror/warm/${encodeURIComponent(id)}`, {headers: authHeaders()});
    const job = await r.json().catch(() => ({}));
    out().textContent = `warm ${name}: ${job.state} ${job.files_done}/${job.files_total} files, ` +
        `${job.bytes_done}/${job.bytes_total} bytes`;
    if (!r.ok || job.state === 'done' || job.state === 'failed') { refresh(); return job; }
    await new Promise(ok => setTimeout(ok, 1000));
  }
}
document.addEventListener('click', event => {
  const button = event.target.closest('button[data-action]');
  if (button) { mirrorAction(button); return; }
  const link = event.target.closest('a[data-nav]');
  if (link && !event.ctrlKey && !event.metaKey && !event.shiftKey) {
    event.preventDefault();
    navigate(link.href);
  }
});
document.addEventListener('submit', event => {
  if (event.target.id === 'warm-form') {  // Enter in the warm field: a warm, not a navigation
    event.preventDefault();
    mirrorAction(document.getElementById('warm-button'));
    return;
  }
  const form = event.target.closest('form[data-nav]');
  if (!form) return;
  event.preventDefault();
  // The list's order and page size stay as they are (the form's hidden copies are the first load's); a new filter
  // starts at page 1.
  const params = new URLSearchParams(location.search);
  params.delete('page');
  for (const field of form.elements) {
    if (field.name && field.type !== 'hidden') params.set(field.name, field.value);
  }
  for (const [key, value] of [...params]) if (!value) params.delete(key);
  navigate(form.action.split('?')[0] + (params.toString() ? '?' + params : ''));
});
document.addEventListener('change', event => {
  if (event.target.closest('form[data-nav]') && event.target.tagName === 'SELECT') {
    event.target.form.requestSubmit();
  }
  if (event.target.id === 'token') refresh();
});
"""

STYLE = """
*{box-sizing:border-box} body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fff}
header{display:flex;flex-wrap:wrap;gap:.4em 1.5em;align-items:baseline;padding:.8em 1.5em;background:#f4f6f8;
  border-bottom:1px solid #dde} header h1{margin:0;font-size:1.4em} header a{color:inherit;text-decoration:none}
main{padding:0 1.5em 2em} h2{font-size:1.15em;margin:1.4em 0 .5em} .muted{color:#666;font-size:13px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:.8em;margin-top:1em}
.card{border:1px solid #dde;border-radius:6px;padding:.6em .8em} .card h3{margin:0 0 .3em;font-size:13px;color:#555;
  font-weight:600;text-transform:uppercase;letter-spacing:.03em} .big{font-size:1.35em;font-weight:600}
.bar{height:12px;background:#e8ebef;border-radius:6px;overflow:hidden;margin:.35em 0;position:relative}
.bar>span{display:block;height:100%;background:#3a7bd5} .bar.warn>span{background:#e69a1e}
.bar.full>span{background:#d33} .bar>i{position:absolute;top:0;bottom:0;width:2px;background:#222}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:.6em 1.2em}
figure.chart{margin:0;display:flex;flex-direction:column;justify-content:flex-end}
figure.chart svg{width:100%;height:auto;display:block}
figcaption{font-size:13px;margin-bottom:2px} .key{margin-left:.8em;color:#444;white-space:nowrap}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
.scroll{overflow-x:auto} table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #e3e3e3;padding:4px 8px;font-size:14px;text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600;white-space:nowrap} th a{color:inherit} td.num,th.num{text-align:right}
td code{font-size:12px} button{font-size:12px;margin:0 2px} .pinned{color:#a60;font-weight:bold}
.bad{color:#c22;font-weight:bold} .good{color:#282} #action-result{min-height:1.2em;color:#036}
form.row{display:flex;flex-wrap:wrap;gap:.5em;align-items:center;margin:.4em 0} nav{margin:.5em 0;display:flex;
  gap:1em;flex-wrap:wrap} .note{background:#fff8e1;border:1px solid #f0d98c;padding:.4em .7em;border-radius:4px;
  font-size:14px} progress{width:8em}
"""

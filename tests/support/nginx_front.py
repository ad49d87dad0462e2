"""Run the real nginx front (deploy/nginx.conf) unprivileged in a temp prefix, for tests.

``render_nginx_conf(tmpdir, mirror_port, listen_port, cache_dir)`` rewrites the handful of host-specific lines of
deploy/nginx.conf (upstream address, listen port, blobs alias, pid, logs, temp paths, worker counts) and returns the
rendered file;
``NginxFront`` starts nginx on it in the foreground and stops it again::

    conf = render_nginx_conf(tmp_path, mirror_port=8090, listen_port=free_port(), cache_dir=cache)
    with NginxFront(conf) as front:
        urllib.request.urlopen(front.url + "/healthz")

Every rewrite must match exactly once, so a drift between deploy/nginx.conf and this module fails loudly.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO_ROOT / "deploy" / "nginx.conf"
NGINX_TLS_CONF = REPO_ROOT / "deploy" / "nginx-tls.conf"
BLOBS_PREFIX = "/_hf_mirror_blobs/"


def nginx_binary() -> str | None:
    """The nginx executable (PATH, then the usual sbin dirs), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sub_once(pattern: str, replacement: str, text: str) -> str:
    new, count = re.subn(pattern, lambda _m: replacement, text, flags=re.MULTILINE)
    if count != 1:
        raise AssertionError(f"deploy/nginx.conf: expected exactly one match for {pattern!r}, found {count}")
    return new


def render_nginx_conf(
    tmpdir: Path | str,
    mirror_port: int,
    listen_port: int,
    cache_dir: Path | str,
    *,
    mirror_host: str = "127.0.0.1",
    listen_host: str = "127.0.0.1",
    tls_port: int | None = None,
    certfile: Path | str | None = None,
    keyfile: Path | str | None = None,
    source: Path = NGINX_CONF,
    path_prefix: str | None = None,
    strip_prefix: bool = False,
) -> Path:
    """Render deploy/nginx.conf into ``tmpdir`` (its nginx prefix) so it runs unprivileged; return the conf path.

    The front listens on ``listen_host:listen_port``, proxies to ``mirror_host:mirror_port`` and serves
    X-Accel-Redirect blobs from ``<cache_dir>/blobs/``. With ``tls_port`` (and ``certfile``/``keyfile``) the
    deploy/nginx-tls.conf snippet is rendered too and included, listening on ``listen_host:tls_port``.
    pid, logs and temp dirs live under ``tmpdir``; run it with ``nginx -p tmpdir -c <returned path>``
    (``NginxFront`` does). Logs: ``tmpdir/logs/{error,access}.log``.

    ``path_prefix`` (e.g. ``/hf``): the mirror is mounted there instead of at ``/``, as docs/operations.md shows
    ("Under a path prefix"): the full path passed on (run the mirror with ``--root-path``), or with
    ``strip_prefix`` the prefix stripped from the raw request URI and said in ``X-Forwarded-Prefix`` (run the
    mirror with ``--trusted-proxies`` naming the front).
    """
    tmp = Path(tmpdir).resolve()
    logs = tmp / "logs"
    temp = tmp / "temp"
    for sub in (logs, temp):
        sub.mkdir(parents=True, exist_ok=True)
    blobs = Path(cache_dir).resolve() / "blobs"
    text = source.read_text()
    text = _sub_once(r"^(\s*)server\s+127\.0\.0\.1:8090;", f"        server {mirror_host}:{mirror_port};", text)
    text = _sub_once(r"^\s*listen\s+8080;", f"        listen {listen_host}:{listen_port};", text)
    text = _sub_once(r"^\s*alias\s+/var/cache/hf-mirror/blobs/;", f"            alias {blobs}/;", text)
    text = _sub_once(r"^pid\s+\S+;", f"pid {tmp / 'nginx.pid'};", text)
    # Small and within an unprivileged process's open-files limit.
    text = _sub_once(r"^worker_processes\s+\S+;", "worker_processes 2;", text)
    text = _sub_once(r"^(\s*)worker_connections\s+\d+;", "    worker_connections 512;", text)
    text = _sub_once(r"^error_log\s+\S+", f"error_log {logs / 'error.log'}", text)
    text = _sub_once(r"^(\s*)access_log\s+/var/log/nginx/access\.log", f"    access_log {logs / 'access.log'}", text)
    temp_paths = "".join(
        f"    {name}_temp_path {temp / name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = _sub_once(r"^http \{\n", "http {\n" + temp_paths, text)
    if path_prefix is not None:
        text = mount_under(text, path_prefix, strip=strip_prefix)
    if os.geteuid() == 0:
        # As root nginx would drop its workers to `nobody`, who cannot read pytest's 0700 tmp dirs.
        text = "user root root;\n" + text
    if tls_port is not None:
        if not (certfile and keyfile):
            raise ValueError("tls_port needs certfile and keyfile")
        tls = NGINX_TLS_CONF.read_text()
        tls = _sub_once(r"^listen\s+8443\s+ssl;", f"listen {listen_host}:{tls_port} ssl;", tls)
        tls = _sub_once(r"^ssl_certificate\s+\S+;", f"ssl_certificate {Path(certfile).resolve()};", tls)
        tls = _sub_once(r"^ssl_certificate_key\s+\S+;", f"ssl_certificate_key {Path(keyfile).resolve()};", tls)
        tls = _sub_once(r"^ssl_session_cache\s+\S+;", "ssl_session_cache shared:hf_mirror_tls:1m;", tls)
        tls_path = tmp / "hf-mirror-tls.conf"
        tls_path.write_text(tls)
        text = _sub_once(r"^\s*# include /etc/nginx/hf-mirror-tls\.conf;", f"        include {tls_path};", text)
    out = tmp / "nginx.conf"
    out.write_text(text)
    return out


def mount_under(text: str, prefix: str, *, strip: bool) -> str:
    """deploy/nginx.conf with the mirror's ``location /`` moved to ``location {prefix}/`` (docs/operations.md).

    Passed on as is, the raw request URI keeps its encoding (``refs%2Fpr%2F1``); stripped, it is cut from
    ``$request_uri`` (never from nginx's decoded ``$uri``, as ``proxy_pass http://hf_mirror/;`` would) and the
    front says what it cut. Either way a client's own ``X-Forwarded-Prefix`` is replaced, never passed on."""
    prefix = "/" + prefix.strip("/")
    text = _sub_once(r"^(\s*)location / \{\n", f"        location {prefix}/ {{\n", text)
    if strip:
        text = _sub_once(r"^(\s*)upstream hf_mirror \{", "    map $request_uri $hf_mirror_uri {\n"
                         f"        ~^{re.escape(prefix)}(/.*)$ $1;\n        default /;\n    }}\n\n"
                         "    upstream hf_mirror {", text)
        text = _sub_once(r"^(\s*)proxy_pass http://hf_mirror;", "            proxy_pass http://hf_mirror$hf_mirror_uri;",
                         text)
        text = _sub_once(r'^(\s*)proxy_set_header X-Forwarded-Prefix "";',
                         f"            proxy_set_header X-Forwarded-Prefix {prefix};", text)
    return text


def nginx_test(conf: Path, nginx: str | None = None) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on a rendered conf (prefix = its directory); returns the finished process."""
    binary = nginx or nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx is not installed")
    prefix = conf.parent
    cmd = [binary, "-t", "-p", f"{prefix}/", "-c", str(conf), "-e", str(prefix / "logs" / "error.log")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def _listen_port(conf: Path) -> int:
    match = re.search(r"^\s*listen\s+(?:[\d.]+:)?(\d+);", conf.read_text(), flags=re.MULTILINE)
    if not match:
        raise ValueError(f"no plain listen port in {conf}")
    return int(match.group(1))


class NginxFront:
    """nginx running in the foreground on a rendered conf; a context manager. ``url`` is the plain-HTTP base."""

    def __init__(self, conf: Path, nginx: str | None = None, host: str = "127.0.0.1") -> None:
        self.conf = conf
        self.prefix = conf.parent
        self.nginx = nginx or nginx_binary()
        self.port = _listen_port(conf)
        self.url = f"http://{host}:{self.port}"
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def error_log(self) -> str:
        path = self.prefix / "logs" / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 10.0) -> NginxFront:
        if self.nginx is None:
            raise FileNotFoundError("nginx is not installed")
        cmd = [self.nginx, "-p", f"{self.prefix}/", "-c", str(self.conf), "-e", str(self.prefix / "logs" / "error.log")]
        self.proc = subprocess.Popen([*cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited with {self.proc.returncode}: {err}\n{self.error_log}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nginx did not listen on {self.port} within {timeout}s\n{self.error_log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: fast shutdown of master and workers
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> NginxFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

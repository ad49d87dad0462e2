"""Running the ASGI app under uvicorn: one process, or several workers sharing the cache directory.

Worker processes rebuild the very same Settings from ``HF_MIRROR__SETTINGS`` (JSON written by the CLI), so the
settings keep one home even across the process boundary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mirror.app import MirrorApp, create_app
from mirror.config import Settings
from mirror.logs import setup_logging

_SETTINGS_ENV = "HF_MIRROR__SETTINGS"
_WANTED_OPEN_FILES = 1 << 16  # each client of a fill holds a socket and a file: 1,024 would cap us near 500

log = logging.getLogger("hf_mirror")


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with keep-alive for HTTP/1.0 clients that ask for it, as nginx grants it.

    uvicorn closes every HTTP/1.0 connection after one response; load tools such as ``ab`` speak 1.0 with
    ``Connection: keep-alive`` and would otherwise measure TCP handshakes instead of the mirror.
    """

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and self.scope.get("http_version") == "1.0" and self.parser.should_keep_alive():
            cycle.keep_alive = True
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"keep-alive")]


def _to_json(settings: Settings) -> str:
    return json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(settings).items()})


def _from_json(text: str) -> Settings:
    data = json.loads(text)
    for key in ("allow_repos", "deny_repos"):
        data[key] = tuple(data.get(key) or ())
    for key in ("cache_dir", "auth_tokens_file", "jwt_public_key_file", "ssl_certfile", "ssl_keyfile"):
        if data.get(key):
            data[key] = Path(data[key])
    return Settings(**data)


def worker_app() -> MirrorApp:
    """uvicorn factory for worker processes."""
    settings = _from_json(os.environ[_SETTINGS_ENV])
    setup_logging(settings.log_level, settings.log_format, (settings.upstream_token or "",))
    return create_app(settings)


def raise_open_file_limit() -> int:
    """Lift the soft RLIMIT_NOFILE towards the hard limit, as nginx's ``worker_rlimit_nofile`` does; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    return soft


def serve(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, (settings.upstream_token or "",))
    limit = raise_open_file_limit()  # before the workers fork: they inherit it
    if limit < 4096:
        log.warning("open-file limit is %d: at about half that many concurrent clients the mirror refuses more "
                    "(raise it with ulimit -n or LimitNOFILE=)", limit)
    common = dict(
        host=settings.host, port=settings.port, log_config=None, access_log=False, proxy_headers=True,
        timeout_graceful_shutdown=int(settings.shutdown_grace) + 5, h11_max_incomplete_event_size=64 * 1024,
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        server_header=False, http=HttpProtocol,
    )
    if settings.workers > 1:
        os.environ[_SETTINGS_ENV] = _to_json(settings)
        uvicorn.run("mirror.server:worker_app", factory=True, workers=settings.workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)

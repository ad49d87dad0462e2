"""Running the ASGI app under uvicorn: one process, or several workers sharing the cache directory.

Worker processes rebuild the very same Settings from ``HF_MIRROR__SETTINGS`` (JSON written by the CLI), so the
settings keep one home even across the process boundary.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import gc
import logging
import os
import resource
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httptools
import uvicorn
from prometheus_client import multiprocess
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from mirror.app import MirrorApp, create_app
from mirror.asgi import HEAD_BOUNDED
from mirror.config import Settings
from mirror.errors import BadRequest, HeadersTooLarge, MirrorError, RequestTimeout
from mirror.front import Front, wanted
from mirror.logs import setup_logging
from mirror.metrics import MULTIPROC_ENV
from mirror.routes.common import error_parts

_SETTINGS_ENV = "HF_MIRROR__SETTINGS"
_WANTED_OPEN_FILES = 1 << 16  # each client of a fill holds a socket and a file: 1,024 would cap us near 500
# Bounds on a client's request head (Settings.max_header_bytes / header_timeout) and on a silent keep-alive
# connection between requests (uvicorn's own timer).
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_HEADER_TIMEOUT = 10.0
KEEP_ALIVE_TIMEOUT = 5
_SLICE = 64 * 1024  # most bytes fed to the parser at once
# After an error answer, how long the client has to take it before the connection is cut: a graceful close waits
# for the write buffer to drain and, over TLS, for the client's close_notify (asyncio waits 30 s for it).
CLOSE_GRACE = 2.0

log = logging.getLogger("hf_mirror")
_CHECKED_HEADERS = 4096  # response headers remembered as checked (a hot file's etag and commit, the constant ones)
_checked: dict[tuple[bytes, bytes], bytes] = {}  # (name, value) -> the lowercased name; shared by every cycle


class ResponseCycle(RequestResponseCycle):
    """uvicorn's request cycle, writing a response head from headers it has checked before.

    uvicorn checks each header of each response against two regexes and lowercases its name (about 0.7 us a
    header; a file's answer carries 14). The mirror's headers repeat: the CORS pair, the date, a hot file's etag,
    commit and disposition. A header that passed the very same checks once is remembered (bounded) and written
    without them; a new one is checked exactly as uvicorn does, so a CR or LF in a header still never reaches the
    wire. Everything else (bodies, an access-logging server, a paused or closed transport) is uvicorn's own send.
    """

    async def send(self, message: Any) -> None:
        if (message["type"] != "http.response.start" or self.response_started or self.disconnected
                or self.flow.write_paused or self.access_log):
            await super().send(message)
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        checked = _checked
        for raw_name, value in (*self.default_headers, *message.get("headers", ())):
            key = (raw_name, value)
            name = checked.get(key)
            if name is None:
                if HEADER_RE.search(raw_name):
                    raise RuntimeError("Invalid HTTP header name.")
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
                name = raw_name.lower()
                if len(checked) >= _CHECKED_HEADERS:
                    checked.clear()
                checked[key] = name
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                if b"close" in [token.lower().strip() for token in value.split(b",")]:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True  # neither a length nor chunked said: uvicorn's default
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with bounds on what a client can make it hold, and keep-alive for HTTP/1.0.

    * ``max_header_bytes``: uvicorn and httptools accumulate the URL and every header without limit (a 160 MiB
      header was buffered whole before the app could refuse it). Here the bytes a request head takes are counted
      as they arrive, and fed to the parser in slices that never take the count past the cap: over it, the client
      gets a Hub-shaped 431 and the connection is closed, before the excess is read. Trailers of a chunked body
      (headers too) and chunk framing count against the same cap between two pieces of body.
    * ``header_timeout``: from the connection's start, and on keep-alive from the first bytes of the next request,
      a client has this long to complete its request line and headers (one byte every few seconds used to keep a
      connection forever). A silent connection between two requests is uvicorn's keep-alive timeout's to close
      (it starts when the response is handed to the kernel, while a slow client may still be reading it). A
      response being sent and a body being uploaded after complete headers are never cut by either.
    * After an error answer (408, 431, 400) the connection is closed, and cut ``CLOSE_GRACE`` later if the close has
      not completed: neither a client that does not read nor one that never ends its TLS session keeps it open.
    * HTTP/1.0 keep-alive: uvicorn closes every HTTP/1.0 connection after one response; load tools such as ``ab``
      speak 1.0 with ``Connection: keep-alive`` and would otherwise measure TCP handshakes instead of the mirror.

    uvicorn builds the protocol with ``(config, server_state, app_state, _loop)``; :func:`protocol_factory` binds the
    limits with ``functools.partial`` (picklable, so it also reaches the ``--workers`` processes).
    """

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_header_bytes = max(int(max_header_bytes), 1024)
        self.header_timeout = float(header_timeout)
        self._unparsed = 0  # bytes fed since the last piece of body or the last complete request: head, framing
        self._head_complete = False  # the current request's line and headers are parsed
        self._header_timer: asyncio.TimerHandle | None = None
        self._abort_timer: asyncio.TimerHandle | None = None

    # Connection life.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        unparsed = self._unparsed + len(data)
        if len(data) <= _SLICE and unparsed <= self.max_header_bytes:
            # The common case (a whole request head, well under the cap): one feed, no slicing (_feed inlined: this
            # runs for every request).
            self._unparsed = unparsed
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self._feed_failed(exc)
                return
            if self.transport.is_closing():
                return
        else:
            view = memoryview(data)
            while view:
                # A slice never holds more than the room left under the cap (plus one byte, to see it crossed), nor
                # more than _SLICE: whatever the parser is given, it buffers at most the cap and one slice.
                size = min(len(view), _SLICE, max(self.max_header_bytes + 1 - self._unparsed, 1))
                piece, view = view[:size], view[size:]
                self._unparsed += size
                if not self._feed(piece):
                    return
                if self._unparsed > self.max_header_bytes:
                    self._refuse_oversized()
                    return
        if self._header_timer is None:  # a head has begun: it is due within header_timeout (unless one is answered)
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.pipeline:  # self._idle(), inlined
                self._arm_header_timer()

    def _feed(self, piece: bytes | memoryview) -> bool:
        """Give the parser ``piece``; False when the connection is done with (a bad request, an upgrade, closed)."""
        try:
            self.parser.feed_data(piece)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._feed_failed(exc)
            return False
        return not self.transport.is_closing()

    def _feed_failed(self, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    # Parser callbacks.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_complete = False

    def on_headers_complete(self) -> None:
        self._head_complete = True
        if self._header_timer is not None:
            self._cancel_header_timer()
        self.scope[HEAD_BOUNDED] = True
        super().on_headers_complete()
        cycle = self.cycle
        if type(cycle) is RequestResponseCycle:  # uvicorn builds its own class; its task has not run a line yet
            cycle.__class__ = ResponseCycle
        if cycle is not None and self.scope.get("http_version") == "1.0" and self.parser.should_keep_alive():
            cycle.keep_alive = True
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"keep-alive")]

    def on_body(self, body: bytes) -> None:
        self._unparsed = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._unparsed = 0
        self._head_complete = False
        super().on_message_complete()

    # Bounds.
    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        if self.header_timeout > 0:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _idle(self) -> bool:
        """No request is being answered or waiting to be: the connection only waits for a head."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self.transport is None or self.transport.is_closing() or not self._idle():
            return
        if self._unparsed and not self._head_complete:  # a head was begun: say why it is cut
            self._send_error(RequestTimeout(f"request line and headers not received within {self.header_timeout:g}s"))
        else:
            self._close()

    def _refuse_oversized(self) -> None:
        if self._head_complete or not self._idle():
            # Trailers or chunk framing, or a pipelined head behind a response in progress: nothing can be answered.
            self._close()
            return
        self._send_error(HeadersTooLarge(f"request line and headers exceed {self.max_header_bytes} bytes"))

    def send_400_response(self, msg: str) -> None:
        self._send_error(BadRequest(msg))

    def _send_error(self, exc: MirrorError) -> None:
        """A Hub-shaped error written straight to the transport, then the connection closed."""
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        status, headers, body = error_parts(exc)
        out = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, *headers, (b"connection", b"close")]:
            out += [name, b": ", value, b"\r\n"]
        out += [b"\r\n", body]
        self.transport.write(b"".join(out))
        self._close()

    def _close(self) -> None:
        """Close the connection, and cut it if it is not gone within CLOSE_GRACE: a client that trickles a head
        and never reads its answer (or never ends its TLS session) must not keep it open."""
        self.transport.close()
        if self._abort_timer is None:
            self._abort_timer = self.loop.call_later(CLOSE_GRACE, self.transport.abort)


def protocol_factory(settings: Settings) -> Callable[..., HttpProtocol]:
    """The protocol uvicorn builds for each connection, with the settings' bounds bound in (picklable for workers)."""
    return functools.partial(
        HttpProtocol,
        max_header_bytes=getattr(settings, "max_header_bytes", None) or DEFAULT_MAX_HEADER_BYTES,
        header_timeout=getattr(settings, "header_timeout", None) or DEFAULT_HEADER_TIMEOUT,
    )


def mounted_app(settings: Settings) -> MirrorApp | Front:
    """The app uvicorn runs: the mirror, inside :class:`mirror.front.Front` only when a path prefix or a trusted
    front is configured (otherwise nothing is added in front of the hot path)."""
    app = create_app(settings)
    return Front(app, settings.root_path, settings.trusted_proxies) if wanted(settings) else app


def worker_app() -> MirrorApp | Front:
    """uvicorn factory for worker processes."""
    settings = Settings.model_validate_json(os.environ[_SETTINGS_ENV])  # as built: no source read again
    setup_logging(settings.log_level, settings.log_format, (settings.upstream_token or "",))
    # A worker that ends (a restart by uvicorn) takes its live gauges (fills in flight) out of the sum with it.
    atexit.register(multiprocess.mark_process_dead, os.getpid())
    app = mounted_app(settings)
    gc.freeze()
    return app


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


@contextlib.contextmanager
def shared_metrics() -> Iterator[Path]:
    """A directory where every worker of this run keeps its counters (prometheus_client's multiprocess mode), so
    that ``/metrics`` counts all of them whichever worker answers the scrape. Set in the environment before the
    workers start (prometheus_client reads it at import). An operator's own ``PROMETHEUS_MULTIPROC_DIR`` is used,
    emptied first (counters of an earlier run would add up with this one's); otherwise a fresh temporary directory,
    removed when the server stops."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix="hf-mirror-metrics-"))
    os.environ[MULTIPROC_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def serve(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, (settings.upstream_token or "",))
    limit = raise_open_file_limit()  # before the workers fork: they inherit it
    if limit < 4096:
        log.warning("open-file limit is %d: at about half that many concurrent clients the mirror refuses more "
                    "(raise it with ulimit -n or LimitNOFILE=)", limit)
    common = dict(
        host=settings.host, port=settings.port, log_config=None, access_log=False,
        # With --trusted-proxies the Front runs uvicorn's proxy-headers layer itself, on that list (mirror.front).
        proxy_headers=not settings.trusted_proxies,
        timeout_graceful_shutdown=int(settings.shutdown_grace) + 5, h11_max_incomplete_event_size=64 * 1024,
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        server_header=False, http=protocol_factory(settings), timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
    )
    # Several processes count into shared files: the workers, or one process an operator pointed at a directory.
    counting = shared_metrics() if settings.workers > 1 or os.environ.get(MULTIPROC_ENV) else contextlib.nullcontext()
    with counting:
        if settings.workers > 1:
            os.environ[_SETTINGS_ENV] = settings.model_dump_json()
            uvicorn.run("mirror.server:worker_app", factory=True, workers=settings.workers, **common)
        else:
            app = mounted_app(settings)
            # What the imports and the app's construction made lives as long as the process: out of the collector's
            # sight, a full collection no longer walks it (one took ~60 ms every few thousand warm requests).
            gc.freeze()
            uvicorn.run(app, **common)

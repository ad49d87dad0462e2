"""Settings: the one home of configuration.

Precedence, lowest first: defaults < TOML file (``--config``) < ``HF_MIRROR_<NAME>`` env vars < CLI
flags.
Only the CLI and the app factory build a :class:`Settings`; everything else receives it, or a part of it, as an
argument.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror.errors import redact_url

ENV_PREFIX = "HF_MIRROR_"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4, "p": 1000**5}


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message says which and why."""


def parse_size(value: str | int | None) -> int | None:
    """Parse ``10GiB``, ``500G``, ``1.5 TB`` or a byte count; ``None``/``0``/empty mean unlimited."""
    if value is None or value == "" or value == 0:
        return None
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ConfigError(f"cannot parse size {value!r}: use a byte count or e.g. 500G, 1.5TiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    binary = "i" in unit
    prefix = unit[:1] if unit[:1] in "kmgtp" else ""
    multiplier = 1024 ** "kmgtp".index(prefix) * 1024 if (binary and prefix) else _SIZE_UNITS[prefix]
    return int(number * multiplier) or None


def format_size(n: float) -> str:
    """A byte count for people, in decimal units: ``512 B``, ``1.5 MB``, ``2.0 TB`` (``parse_size`` reads it back)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass(frozen=True)
class Settings:
    """Every knob of the mirror. Field names are the TOML keys and, upper-cased, the env var suffixes."""

    host: str = "127.0.0.1"
    port: int = 8090
    upstream: str = "https://huggingface.co"
    cache_dir: Path = field(default_factory=lambda: Path("~/.cache/hf-mirror").expanduser())
    offline: bool = False
    revision_ttl: float = 300.0
    upstream_token: str | None = None
    workers: int = 1
    log_format: str = "text"
    log_level: str = "info"
    access_log: bool = True
    # Upstream timeouts (seconds) and retry policy.
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    total_timeout: float = 0.0  # 0: no overall bound on a metadata request besides connect/read
    upstream_retries: int = 4
    retry_backoff_max: float = 8.0
    # Fill engine.
    fill_on_disconnect: str = "continue"  # continue | cancel
    fill_chunk_size: int = 8 * 1024 * 1024  # most bytes a fill hashes and announces to its readers at once
    lease_stale_seconds: float = 30.0
    # A file of at least this many bytes is fetched upstream as ``fill_connections`` concurrent Range windows of
    # ``fill_window`` bytes (a long, lossy path gives one TCP connection a fraction of the link). 0: never.
    parallel_fill_threshold: int = 64 * 1024**2
    fill_connections: int = 8
    fill_window: int = 32 * 1024**2
    # Upstream bandwidth, bytes/s (0: unlimited): ``upstream_rate`` is shared by every fill of the process;
    # ``sync_rate`` bounds the ``sync`` command instead, during ``sync_hours`` ("HH-HH" local time, e.g. "08-18";
    # empty: always) — outside them the sync runs at ``upstream_rate``.
    upstream_rate: int = 0
    sync_rate: int = 0
    sync_hours: str = ""
    # Serving.
    serve_chunk_size: int = 4 * 1024 * 1024
    accel_redirect: str | None = None
    # Disk.
    max_size: int | None = None
    # Free disk a new fill must leave under cache_dir. Short of it, least recently used blobs are evicted (local
    # storage) and, if that is not enough, the file is relayed from upstream without being stored.
    min_free_space: int | None = 256 * 1024**2
    gc_interval: float = 600.0
    # The scrub re-hashes stored blobs in the background at most this many bytes per second (0: off): every blob
    # once a cycle, and a blob right after its first hit in this process, so a blob corrupted on disk is served at
    # most until its check ends, then refetched.
    scrub_rate: int = 32 * 1024**2
    # Blob storage (issue 9): ``local`` keeps blobs under cache_dir; ``s3`` keeps them in an S3-compatible bucket
    # shared by every node, with cache_dir as a bounded local hot tier. Credentials come from the standard AWS
    # sources (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profiles, instance/pod roles), never from these settings.
    storage: str = "local"
    s3_endpoint: str | None = None  # None: AWS S3 itself; e.g. http://seaweedfs:8333 or https://minio.example
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_region: str = "us-east-1"
    hot_tier_max_size: int | None = 20 * 1024**3  # bound of the local copy of bucket blobs (LRU); 0: unbounded
    # The URL other nodes of the fleet reach this one at. Published in the fill leases of a shared bucket, so that
    # a node following another's fill streams it from that node at once instead of waiting for its commit.
    node_url: str | None = None
    # Access (issue 6).
    access_ttl: float = 300.0
    # How long a caller's confirmed access to non-public content is honoured when upstream cannot be asked
    # (--offline, or an outage). Past it, the caller is refused until upstream confirms again.
    access_grace: float = 86400.0
    access_fail_open: bool = False
    # The service token goes upstream for the nightly sync and for public content only. Lent to callers that send
    # no token only when the operator says so: then every anonymous caller reads what the token can read.
    lend_upstream_token: bool = False
    # Offline, content whose visibility upstream never told (seeded by ``cache import``) is closed unless this is set.
    open_unknown_repos: bool = False
    auth_tokens_file: Path | None = None
    jwt_secret: str | None = None
    jwt_public_key_file: Path | None = None
    allow_repos: tuple[str, ...] = ()
    deny_repos: tuple[str, ...] = ()
    max_paths_info: int = 1000
    # The dataset viewer's host upstream (issue 20): by default the one the Hub's client derives from the upstream,
    # ``https://datasets-server.<upstream host>``; ``off`` answers the viewer host from the cache only.
    viewer_upstream: str | None = None
    # Xet (issue 17): files upstream marks as Xet-backed carry the mirror's own Xet hints (token route, CAS under
    # ``/_xet``), so hf_xet clients download through the mirror (files over 50 GB included). On by default: every
    # client generation tested (huggingface_hub 2.x, 1.33, 0.36, each with its hf_xet) downloads through it (README).
    # Off: every Xet hint is stripped and clients download over plain HTTP. ``xet_token_ttl``: seconds a Xet token /
    # byte-range URL lives.
    serve_xet: bool = True
    xet_token_ttl: float = 900.0
    # Bounds on what a caller can make the process hold: request line + headers, the time to send them, and the
    # upstream JSON the mirror caches (relayed bodies stream).
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    max_api_body: int = 32 * 1024**2
    # TLS for the embedded server.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # Graceful shutdown bound (seconds) for fills in flight.
    shutdown_grace: float = 20.0

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"upstream must be an http(s) URL, got {self.upstream!r}")
        object.__setattr__(self, "upstream", self.upstream.rstrip("/"))
        scheme, _, rest = self.upstream.partition("://")
        derived = f"{scheme}://datasets-server.{rest.rpartition('@')[2]}"  # never the upstream's credentials
        viewer = (self.viewer_upstream or derived).rstrip("/")
        if viewer not in ("off", "none") and not viewer.startswith(("http://", "https://")):
            raise ConfigError(f"viewer_upstream must be an http(s) URL or 'off', got {viewer!r}")
        object.__setattr__(self, "viewer_upstream", viewer)
        object.__setattr__(self, "upstream_token", self.upstream_token or None)  # "" (an unset compose var): none
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, got {self.port}")
        if self.revision_ttl < 0:
            raise ConfigError("revision_ttl must be >= 0 seconds")
        if self.fill_on_disconnect not in ("continue", "cancel"):
            raise ConfigError("fill_on_disconnect must be 'continue' or 'cancel'")
        if self.log_format not in ("text", "json"):
            raise ConfigError("log_format must be 'text' or 'json'")
        if self.workers < 1:
            raise ConfigError("workers must be >= 1")
        if self.storage not in ("local", "s3"):
            raise ConfigError(f"storage must be 'local' or 's3', got {self.storage!r}")
        if self.storage == "s3" and not self.s3_bucket:
            raise ConfigError("storage = 's3' needs s3_bucket")
        if self.s3_endpoint and not self.s3_endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"s3_endpoint must be an http(s) URL, got {self.s3_endpoint!r}")
        if self.node_url and not self.node_url.startswith(("http://", "https://")):
            raise ConfigError(f"node_url must be an http(s) URL, got {self.node_url!r}")
        if not self.max_header_bytes or self.max_header_bytes < 4096:
            raise ConfigError("max_header_bytes must be at least 4K")
        if self.header_timeout <= 0 or self.access_grace < 0:
            raise ConfigError("header_timeout must be > 0 and access_grace >= 0 seconds")
        if self.fill_connections < 1 or self.fill_window < 1024**2:
            raise ConfigError("fill_connections must be >= 1 and fill_window at least 1M")
        if self.sync_hours and not re.fullmatch(r"\d{1,2}-\d{1,2}", self.sync_hours):
            raise ConfigError(f"sync_hours must look like 08-18, got {self.sync_hours!r}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("ssl_certfile and ssl_keyfile must be given together")

    @property
    def upstream_display(self) -> str:
        """The upstream URL fit for messages, logs and the status page: any ``user:password@`` replaced."""
        return redact_url(self.upstream)

    @property
    def auth_required(self) -> bool:
        """Mirror-side access control is on when a tokens file or a JWT key is configured."""
        return bool(self.auth_tokens_file or self.jwt_secret or self.jwt_public_key_file)

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict fit for logs and the status page: secrets replaced."""
        out = dataclasses.asdict(self)
        for key in ("upstream_token", "jwt_secret"):
            if out.get(key):
                out[key] = "***"
        out["upstream"] = self.upstream_display
        out["viewer_upstream"] = redact_url(self.viewer_upstream or "")
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _coerce(name: str, raw: Any) -> Any:
    """Turn a TOML/env/CLI value into the field's type, with a clear error."""
    kind = str(_FIELDS[name].type)
    try:
        if name in ("scrub_rate", "upstream_rate", "sync_rate", "parallel_fill_threshold", "fill_window"):
            return parse_size(raw) or 0  # 0: off
        if name in ("max_size", "hot_tier_max_size", "min_free_space", "max_header_bytes", "max_api_body"):
            return parse_size(raw)
        if kind.startswith("bool"):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        if kind.startswith("tuple"):
            items = raw if isinstance(raw, list | tuple) else str(raw).split(",")
            return tuple(str(item).strip() for item in items if str(item).strip())
        if "Path" in kind:
            return Path(str(raw)).expanduser() if raw not in (None, "") else None
        return None if raw is None else str(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value for {name}: {raw!r}") from exc


def load_settings(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    *,
    hf_token_env: bool = False,
) -> Settings:
    """Merge defaults, the TOML file, ``HF_MIRROR_*`` env vars and CLI values (``None`` = not given)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    config_file = config_file or (Path(env[ENV_PREFIX + "CONFIG"]) if env.get(ENV_PREFIX + "CONFIG") else None)
    if config_file is not None:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {config_file}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from exc
        data = data.get("mirror", data)
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"unknown setting(s) in {config_file}: {', '.join(unknown)}")
        values.update({k: _coerce(k, v) for k, v in data.items()})
    for name in _FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw)
    # HF_TOKEN is the conventional home of a Hub token: the sync and cache commands may take it, ``serve`` never
    # does (a token picked up silently would be used for every caller's public downloads).
    if hf_token_env and "upstream_token" not in values and env.get("HF_TOKEN"):
        values["upstream_token"] = env["HF_TOKEN"]
    for name, raw in (cli or {}).items():
        if raw is not None and name in _FIELDS:
            values[name] = _coerce(name, raw)
    return Settings(**values)

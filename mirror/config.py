"""Settings: the one home of configuration, a pydantic-settings model.

Precedence, lowest first: defaults < TOML file (``--config``, or env ``HF_MIRROR_CONFIG``) < ``HF_MIRROR_<NAME>``
env vars < CLI flags (the keyword arguments). pydantic-settings does the layering and the coercion; sizes read as
``500G``/``1.5TiB`` anywhere; every error is a :class:`ConfigError` with one readable line.
Only the CLI and the app factory build a :class:`Settings`; everything else receives it, or a part of it, as an
argument.
"""

from __future__ import annotations

import os
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ByteSize,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mirror.errors import ConfigError, redact_url
from mirror.layout import CacheLayout

ENV_PREFIX = "HF_MIRROR_"
_BYTE_SIZE = TypeAdapter(ByteSize)
# Shown as *** in logs, errors and the status page.
_SECRETS = ("upstream_token", "jwt_secret", "xet_signing_secret", "admin_token")


def parse_size(value: str | int | None) -> int | None:
    """Parse ``10GiB``, ``500G``, ``1.5 TB`` or a byte count (pydantic's ``ByteSize``: ``G`` is 10^9, ``GiB``
    2^30); ``None``/``0``/empty mean unlimited."""
    if value is None or value == "" or value == 0:
        return None
    if isinstance(value, int):
        return value
    try:
        return int(_BYTE_SIZE.validate_python(str(value).strip())) or None
    except ValidationError:
        raise ConfigError(f"cannot parse size {value!r}: use a byte count or e.g. 500G, 1.5TiB") from None


def format_size(n: float) -> str:
    """A byte count for people, in IEC units as the README writes them: ``512 B``, ``1.5 MiB``, ``2.0 TiB`` (one
    unit system on the page, in the CLI and in logs; ``parse_size`` reads it back)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _flag(value: Any) -> Any:
    return False if isinstance(value, str) and not value.strip() else value  # an empty env var: off


def _items(value: Any) -> Any:
    return str(value).split(",") if isinstance(value, str) else value  # "a, b" (env, flags) or a TOML list


def _strip_items(value: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(item.strip() for item in value if item.strip())


def _http_url(url: str | None) -> str | None:
    if url and not url.startswith(("http://", "https://")):
        raise ValueError("must be an http(s) URL")
    return url


# A path prefix: what a URL path may carry unescaped, segment by segment (no dot segments, no query, no quoting).
_MOUNT_PATH = re.compile(r"(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*")


def _mount_path(path: str) -> str:
    """``hf/``, ``/hf``, ``/hf/`` -> ``/hf``; ``/`` and empty -> ``""`` (no prefix)."""
    path = "/" + path.strip().strip("/") if path.strip().strip("/") else ""
    if not _MOUNT_PATH.fullmatch(path):
        raise ValueError(f"must be a plain URL path such as /hf (letters, digits, - _ . ~ between slashes), got "
                         f"{path!r}")
    return path


# Value types shared by the fields: a size (``500G``; 0 or empty: unlimited, None), a byte count or rate (``32M``;
# 0: off), a flag (empty: off), a path (``~`` expanded; empty: None), a comma-separated list, an http(s) URL.
Size = Annotated[int | None, BeforeValidator(parse_size)]
Bytes = Annotated[int, BeforeValidator(lambda value: parse_size(value) or 0)]
Flag = Annotated[bool, BeforeValidator(_flag)]
UserPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]
OptionalPath = Annotated[UserPath | None, BeforeValidator(lambda value: value or None)]
Items = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_items), AfterValidator(_strip_items)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
PolicyAction = Literal["allow", "block", "quarantine"]

# What the sources of one build read besides the keyword arguments: the TOML file, and whether HF_TOKEN counts.
_BUILD: ContextVar[tuple[Path | None, bool]] = ContextVar("settings_build", default=(None, False))


class Settings(BaseSettings):
    """Every knob of the mirror. Field names are the TOML keys and, upper-cased, the env var suffixes.

    ``Settings(**flags, _config_file=path, _hf_token_env=...)`` layers the sources; a bad value raises
    :class:`ConfigError`. ``_hf_token_env``: ``HF_TOKEN`` stands in for a service token not configured otherwise."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", validate_default=True,
                                      coerce_numbers_to_str=True)

    host: str = "127.0.0.1"
    port: int = Field(8090, gt=0, lt=65536)
    upstream: Annotated[HttpUrl, AfterValidator(lambda url: url.rstrip("/"))] = "https://huggingface.co"
    cache_dir: UserPath = Path("~/.cache/hf-mirror")
    offline: Flag = False
    revision_ttl: float = Field(300.0, ge=0)
    # The route table's lists, searches and per-caller answers (mirror.routetable): fresh this long; an answer
    # larger than read_cache_entry is relayed, never stored.
    read_ttl: float = Field(60.0, ge=0)
    read_cache_entry: Bytes = 1024**2
    upstream_token: str | None = None
    workers: int = Field(1, ge=1)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "info"
    access_log: Flag = True
    # Upstream timeouts (seconds) and retry policy.
    connect_timeout: float = Field(10.0, gt=0)
    read_timeout: float = Field(30.0, gt=0)
    total_timeout: float = 0.0  # 0: no overall bound on a metadata request besides connect/read
    upstream_retries: int = 4
    retry_backoff_max: float = 8.0
    # Fill engine.
    fill_on_disconnect: Literal["continue", "cancel"] = "continue"
    fill_chunk_size: int = 8 * 1024 * 1024  # most bytes a fill hashes and announces to its readers at once
    lease_stale_seconds: float = 30.0
    # A file of at least this many bytes is fetched upstream as ``fill_connections`` concurrent Range windows of
    # ``fill_window`` bytes (a long, lossy path gives one TCP connection a fraction of the link). 0: never.
    parallel_fill_threshold: Bytes = 64 * 1024**2
    fill_connections: int = Field(8, ge=1)
    fill_window: Bytes = Field(32 * 1024**2, ge=1024**2)
    # A window whose rate over the last ``fill_hedge_after`` seconds is under 1/8 of the others' (or nil) is asked
    # again from where it stands on a fresh connection (a hedged request), at most ``fill_hedges`` times a fill.
    fill_hedges: int = Field(4, ge=0)
    fill_hedge_after: float = Field(2.0, gt=0)
    # A Range on a file of at least ``sparse_fill_threshold`` bytes (0: never) that is not stored fetches only the
    # windows it covers plus ``sparse_read_ahead`` bytes after each, kept in a sparse partial file; the rest of the file
    # is fetched once a full download (or the sync, or a warm job) asks for it, or once ``sparse_complete_share`` of
    # it is held.
    sparse_fill_threshold: Bytes = 1024**3
    sparse_read_ahead: Bytes = 32 * 1024**2
    sparse_complete_share: float = Field(0.5, gt=0, le=1)
    # A sparse fill with no reader and no window asked keeps its lease this many seconds before it pauses (its windows
    # kept on disk); meanwhile the other nodes of a fleet relay their Ranges of the file from it.
    sparse_linger: float = Field(2.0, gt=0)
    # Upstream bandwidth, bytes/s (0: unlimited): ``upstream_rate`` is shared by every fill of the process;
    # ``sync_rate`` bounds the ``sync`` command instead, during ``sync_hours`` ("HH-HH" local time, e.g. "08-18";
    # empty: always) — outside them the sync runs at ``upstream_rate``.
    upstream_rate: Bytes = 0
    sync_rate: Bytes = 0
    sync_hours: str = ""
    # Serving.
    serve_chunk_size: int = 4 * 1024 * 1024
    accel_redirect: str | None = None
    # Behind a reverse proxy under a path (mirror.front): ``root_path`` is where the mirror is mounted (``/hf``:
    # stripped from requests that carry it, written into every URL the mirror writes); ``trusted_proxies`` are the
    # fronts (addresses, CIDRs, ``*``) whose ``X-Forwarded-Prefix`` (and ``X-Forwarded-Proto``/``-For``) the mirror
    # believes. Empty: no ``X-Forwarded-Prefix`` is believed (a client must not write its own prefix into the URLs
    # the mirror hands others), and uvicorn's default for the other two stays.
    root_path: Annotated[str, AfterValidator(_mount_path)] = ""
    trusted_proxies: Items = ()
    # Disk.
    max_size: Size = None
    # Free disk a new fill must leave under cache_dir. Short of it, least recently used blobs are evicted (local
    # storage) and, if that is not enough, the file is relayed from upstream without being stored.
    min_free_space: Size = 256 * 1024**2
    gc_interval: float = 600.0
    # Remembered 404s and refusals (anyone's input: any path or repo name can be asked for) kept in the index at
    # most: the oldest go first. Their bytes count in the quota (``max_size``).
    negative_max_entries: int = Field(10_000, ge=0)
    negative_max_bytes: Bytes = 16 * 1024**2
    # The scrub re-hashes stored blobs in the background at most this many bytes per second (0: off): every blob
    # once a cycle, and a blob right after its first hit in this process, so a blob corrupted on disk is served at
    # most until its check ends, then refetched.
    scrub_rate: Bytes = 32 * 1024**2
    # Blob storage (issue 9): ``local`` keeps blobs under cache_dir; ``s3`` keeps them in an S3-compatible bucket
    # shared by every node, with cache_dir as a bounded local hot tier. Credentials come from the standard AWS
    # sources (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profiles, instance/pod roles), never from these settings.
    storage: Literal["local", "s3"] = "local"
    s3_endpoint: HttpUrl | None = None  # None: AWS S3 itself; e.g. http://seaweedfs:8333 or https://minio.example
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_region: str = "us-east-1"
    hot_tier_max_size: Size = 20 * 1024**3  # bound of the local copy of bucket blobs (LRU); 0: unbounded
    # The URL other nodes of the fleet reach this one at. Published in the fill leases of a shared bucket, so that
    # a node following another's fill streams it from that node at once instead of waiting for its commit.
    node_url: HttpUrl | None = None
    # The fleet's shared metadata and coordination (issue 25): a PostgreSQL DSN, postgresql://USER@HOST:PORT/DB.
    # None: the embedded default (this node's index; fill leases in the bucket for storage s3), as before.
    metadata_url: str | None = None
    # Lifetime of a fill lease the database grants (its clock decides): a dead or frozen filler is taken over after
    # this, and a holder renews every third of it.
    fleet_lease_seconds: float = Field(10.0, gt=0, le=300)
    # How long a node waits for the fleet's database to answer (a new connection, or one from the pool) before it
    # reports the metadata unavailable: a fill that needs a lease fails after this while the database is down.
    metadata_connect_timeout: float = Field(10.0, gt=0)
    # How long a read the node can do without (a shared answer, a held-windows record: upstream or its own fill
    # answers instead) waits for a database connection: a database gone away costs a request this long, not the
    # connect timeout. At most the connect timeout.
    metadata_read_timeout: float = Field(2.0, gt=0)
    # Access (issue 6).
    access_ttl: float = 300.0
    # How long a caller's confirmed access to non-public content is honoured when upstream cannot be asked
    # (--offline, or an outage). Past it, the caller is refused until upstream confirms again.
    access_grace: float = Field(86400.0, ge=0)
    access_fail_open: Flag = False
    # The service token goes upstream for the nightly sync and for public content only. Lent to callers that send
    # no token only when the operator says so: then every anonymous caller reads what the token can read.
    lend_upstream_token: Flag = False
    # Offline, content whose visibility upstream never told (seeded by ``cache import``) is closed unless this is set.
    open_unknown_repos: Flag = False
    auth_tokens_file: OptionalPath = None
    jwt_secret: str | None = None
    jwt_public_key_file: OptionalPath = None
    # The operator's credential for the actions that delete or un-protect cached content (unpin, evict), sent as
    # ``Authorization: Bearer``; never sent upstream. Unset (and no admin mirror token): those actions are refused
    # over HTTP and left to ``hf-mirror cache`` on the host.
    admin_token: str | None = None
    allow_repos: Items = ()
    deny_repos: Items = ()
    max_paths_info: int = 1000
    # The dataset viewer's host upstream (issue 20): by default the one the Hub's client derives from the upstream,
    # ``https://datasets-server.<upstream host>`` (``datasets-server.<IP address>`` is reached at that address with
    # the name as Host: mirror.upstream.viewer); ``off`` answers the viewer host from the cache only.
    viewer_upstream: str | None = Field(None, validate_default=True)
    # Xet (issue 17): files upstream marks as Xet-backed carry the mirror's own Xet hints (token route, CAS under
    # ``/_xet``), so hf_xet clients download through the mirror (files over 50 GB included). On by default: every
    # client generation tested (huggingface_hub 2.x, 1.33, 0.36, each with its hf_xet) downloads through it (README).
    # Off: every Xet hint is stripped and clients download over plain HTTP. ``xet_token_ttl``: seconds a Xet token /
    # byte-range URL lives. ``xet_signing_secret``: the key Xet tokens are signed with; the same on every node of a
    # fleet, so that any node accepts any node's tokens (unset: with metadata_url, one generated once in the fleet's
    # database; else one generated per cache dir, in `xet-secret`).
    serve_xet: Flag = True
    xet_token_ttl: float = 900.0
    xet_signing_secret: str | None = None
    # Bounds on what a caller can make the process hold: request line + headers, the time to send them, and the
    # upstream JSON the mirror caches (relayed bodies stream).
    max_header_bytes: Bytes = Field(64 * 1024, ge=4096)
    header_timeout: float = Field(10.0, gt=0)
    max_api_body: Size = 32 * 1024**2
    # Warm on request (POST /api/mirror/warm), bounded so that no caller can stall the clients: identical warms share
    # one job; at most ``warm_jobs`` run at once and ``warm_queue`` more wait (beyond: 503 + Retry-After); each
    # caller (its token's digest, else its address) may ask ``warm_rate`` warms a minute (beyond: 429 + Retry-After;
    # 0: no limit); a warm selecting more than ``warm_max_bytes`` (0: no cap) needs an operator credential (413).
    warm_jobs: int = Field(2, ge=1)
    warm_queue: int = Field(16, ge=0)
    warm_rate: float = Field(60.0, ge=0)
    warm_max_bytes: Size = 50 * 1000**3
    # The audit log (issue 27, mirror.audit): one JSON line per file served and per refusal, under ``audit_dir``
    # (default ``<cache_dir>/audit``), files rotated past ``audit_file_size``, never deleted by the mirror. On by
    # default: the question "who took this model, and when" comes after the download, when it is too late to turn
    # a log on. A client's requests for one file within ``audit_session_seconds`` of each other are one event.
    audit_log: Flag = True
    audit_dir: OptionalPath = None
    audit_file_size: Bytes = Field(64 * 1024**2, ge=4096)
    audit_session_seconds: float = Field(3600.0, ge=0)
    # TLS for the embedded server.
    ssl_certfile: OptionalPath = None
    ssl_keyfile: OptionalPath = None
    # Graceful shutdown bound (seconds) for fills in flight.
    shutdown_grace: float = 20.0
    # The admission policy (issue 27; mirror.admission): what the mirror lets through to callers, per file. The
    # TOML file's ``[policy]`` table holds these without the prefix (``dry_run = true``); env HF_MIRROR_POLICY_*.
    # Nothing set: every file is admitted, as before. Actions: "allow", "block" (refused, never fetched) or
    # "quarantine" (fetched and stored, refused until an operator releases its etag).
    policy_dry_run: Flag = False  # log what would be refused, serve it anyway
    # The Hub's own scan: securityRepoStatus (model info ?securityStatus=true) and per-file securityFileStatus
    # (paths-info expand=true). "unscanned": scansDone false (an empty issue list means nothing then), or no
    # verdict could be learned (upstream down and none remembered).
    policy_hub_unsafe: PolicyAction = "allow"
    policy_hub_caution: PolicyAction = "allow"
    policy_hub_unscanned: PolicyAction = "allow"
    # File names (fnmatch globs on the base name, or on the whole path when the glob has a "/"): when
    # ``policy_allow_files`` is set only matching files pass; ``policy_block_files`` always refuses.
    policy_allow_files: Items = ()
    policy_block_files: Items = ()
    # Licences of cardData.license (an SPDX expression; "a OR b" passes when one side does). Missing or "unknown",
    # and "other", are their own cases.
    policy_allow_licenses: Items = ()
    policy_deny_licenses: Items = ()
    policy_license_unknown: PolicyAction = "allow"
    policy_license_other: PolicyAction = "allow"
    # Publishers: namespaces (``acme``), optionally per repo type (``dataset:acme``), ``*`` for any.
    policy_allow_publishers: Items = ()
    policy_deny_publishers: Items = ()
    # The mirror's own scan of pickle-class files (and anything that is a zip or a pickle inside) before their
    # first serve: only known-safe globals pass; a file that fails is quarantined. Extra globals the scan admits
    # (``module.name``), e.g. a team's own classes.
    policy_scan: Flag = False
    policy_scan_allow_globals: Items = ()
    # Seconds the Hub's verdict and licence of a commit are trusted before they are asked again (the Hub rescans).
    policy_facts_ttl: float = Field(3600.0, ge=0)

    def __init__(self, _config_file: Path | None = None, _hf_token_env: bool = False, **values: Any) -> None:
        build = _BUILD.set((_config_file, _hf_token_env))
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None
        finally:
            _BUILD.reset(build)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file, hf_token_env = _BUILD.get()
        config_file = config_file or (Path(os.environ[ENV_PREFIX + "CONFIG"]) if os.environ.get(ENV_PREFIX + "CONFIG")
                                      else None)
        sources = [init_settings, env_settings]
        if config_file is not None:
            sources.append(_TomlSource(settings_cls, config_file))
        # HF_TOKEN is the conventional home of a Hub token: the sync and cache commands may take it, ``serve`` never
        # does (a token picked up silently would be used for every caller's public downloads).
        if hf_token_env and os.environ.get("HF_TOKEN"):
            sources.append(InitSettingsSource(settings_cls, {"upstream_token": os.environ["HF_TOKEN"]}))
        return tuple(sources)

    @field_validator("upstream_token", "admin_token")
    @classmethod
    def _blank_is_none(cls, token: str | None) -> str | None:
        return token or None  # "" (an unset compose var): none

    @field_validator("xet_signing_secret")
    @classmethod
    def _long_enough(cls, secret: str | None) -> str | None:
        if secret and len(secret) < 32:  # a guessable key would let anyone sign Xet tokens for any repo
            raise ValueError("must be at least 32 characters, e.g. the output of `openssl rand -hex 32`")
        return secret or None

    @field_validator("viewer_upstream")
    @classmethod
    def _viewer_default(cls, viewer: str | None, info: ValidationInfo) -> str | None:
        scheme, _, rest = str(info.data.get("upstream", "")).partition("://")
        derived = f"{scheme}://datasets-server.{rest.rpartition('@')[2]}"  # never the upstream's credentials
        return (viewer or derived).rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        viewer = self.viewer_upstream or ""
        if viewer not in ("off", "none") and not viewer.startswith(("http://", "https://")):
            raise ConfigError(f"viewer_upstream must be an http(s) URL or 'off', got {redact_url(viewer)!r}")
        if self.storage == "s3" and not self.s3_bucket:
            raise ConfigError("storage = 's3' needs s3_bucket")
        if self.metadata_url is not None and not self.metadata_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"metadata_url must be a postgresql:// URL, got {redact_url(self.metadata_url)!r}")
        hours = re.fullmatch(r"(\d{1,2})-(\d{1,2})", self.sync_hours) if self.sync_hours else None
        if self.sync_hours and (hours is None or int(hours[1]) > 23 or int(hours[2]) > 24 or hours[1] == hours[2]):
            raise ConfigError(f"sync_hours must be two different hours like 08-18 (start 0-23, end 0-24), got "
                              f"{self.sync_hours!r}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("ssl_certfile and ssl_keyfile must be given together")
        return self

    @property
    def upstream_display(self) -> str:
        """The upstream URL fit for messages, logs and the status page: any ``user:password@`` replaced."""
        return redact_url(self.upstream)

    @property
    def policy_active(self) -> bool:
        """Any admission rule configured (mirror.admission): without one the mirror admits every file, unchanged."""
        return any(getattr(self, name) != field.default for name, field in type(self).model_fields.items()
                   if name.startswith("policy_") and name not in ("policy_dry_run", "policy_facts_ttl"))

    @property
    def audit_directory(self) -> Path:
        return self.audit_dir or CacheLayout(self.cache_dir).audit_dir

    @property
    def auth_required(self) -> bool:
        """Mirror-side access control is on when a tokens file or a JWT key is configured."""
        return bool(self.auth_tokens_file or self.jwt_secret or self.jwt_public_key_file)

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict fit for logs and the status page: secrets replaced."""
        out = self.model_dump()
        for key in _SECRETS:
            if out.get(key):
                out[key] = "***"
        out["upstream"] = self.upstream_display
        out["viewer_upstream"] = redact_url(self.viewer_upstream or "")
        if self.metadata_url:
            out["metadata_url"] = redact_url(self.metadata_url)  # a DSN may carry a password
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


class _TomlSource(TomlConfigSettingsSource):
    """The ``--config`` file: its keys, or those of its ``[mirror]`` table; a missing file, bad TOML or a key that
    is no setting is an error naming the file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        if not Path(path).is_file():
            raise ConfigError(f"config file not found: {path}")
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file_path} is not valid TOML: {exc}") from exc
        policy = data.pop("policy", None)
        data = dict(data.get("mirror", data))
        if isinstance(policy, dict):  # the [policy] table: its keys are the policy_* settings without the prefix
            data.update({f"policy_{key}": value for key, value in policy.items()})
        elif policy is not None:
            raise ConfigError(f"[policy] in {file_path} must be a table")
        unknown = sorted(set(data) - set(Settings.model_fields))
        if unknown:
            raise ConfigError(f"unknown setting(s) in {file_path}: {', '.join(unknown)}")
        return data


def _one_line(exc: ValidationError) -> str:
    """A validation failure as the CLI prints it: the checks across settings as they are, else the setting, its
    value (secrets and URL credentials hidden) and why."""
    lines = []
    for error in exc.errors(include_url=False):
        cause, name, value = error.get("ctx", {}).get("error"), ".".join(map(str, error["loc"])), error["input"]
        if not name:
            lines.append(str(cause or error["msg"]))
        elif error["type"] == "extra_forbidden":
            lines.append(f"unknown setting: {name}")
        else:
            value = "***" if name in _SECRETS else redact_url(repr(value))
            lines.append(f"invalid value for {name}: {value} ({cause or error['msg']})")
    return "; ".join(lines)

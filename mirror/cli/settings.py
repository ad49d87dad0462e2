"""The settings flags (``--host``, ``--cache-dir``, ...): one parent parser (``parents=[settings_flags()]``) shared
by ``serve``, ``sync`` and ``cache``, and the :class:`Settings` the CLI builds from them and hands down.

Every flag is also env ``HF_MIRROR_<NAME>`` and a key of ``--config``. ``serve``'s flags are a contract used by
deploy files and outside checks: extend them, never break them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.config import Settings

# The settings flags in groups, for help: each command shows the groups it uses (``COMMAND_GROUPS``) and still
# accepts every other flag (hidden), so no command line that worked before stops working.
SETTING_GROUPS: dict[str, tuple[str, ...]] = {
    "settings file": ("config",),
    "cache and quota": ("cache_dir", "max_size", "min_free_space", "negative_max_entries", "negative_max_bytes"),
    "background work": ("gc_interval", "scrub_rate"),
    "upstream": ("upstream", "upstream_token", "lend_upstream_token", "offline", "revision_ttl", "connect_timeout",
                 "read_timeout", "viewer_upstream"),
    "fills and bandwidth": ("parallel_fill_threshold", "fill_connections", "fill_window", "fill_hedges",
                            "fill_hedge_after", "sparse_fill_threshold", "sparse_read_ahead",
                            "sparse_complete_share", "sparse_linger", "upstream_rate",
                            "sync_rate", "sync_hours", "fill_on_disconnect"),
    "listener": ("host", "port", "workers", "root_path", "trusted_proxies", "ssl_certfile", "ssl_keyfile",
                 "header_timeout", "max_header_bytes", "accel_redirect"),
    "callers and access": ("access_ttl", "access_grace", "open_unknown_repos", "auth_tokens_file", "jwt_secret",
                           "jwt_public_key_file", "allow_repos", "deny_repos", "admin_token"),
    "warm jobs": ("warm_jobs", "warm_queue", "warm_rate", "warm_max_bytes"),
    "xet": ("serve_xet", "xet_token_ttl", "xet_signing_secret"),
    "fleet (storage s3)": ("storage", "s3_endpoint", "s3_bucket", "s3_prefix", "s3_region", "hot_tier_max_size",
                           "lease_stale_seconds", "node_url", "metadata_url", "fleet_lease_seconds",
                           "metadata_connect_timeout", "metadata_read_timeout"),
    "admission policy": ("policy_dry_run", "policy_scan", "policy_scan_allow_globals", "policy_hub_unsafe",
                         "policy_hub_caution", "policy_hub_unscanned", "policy_allow_files", "policy_block_files",
                         "policy_allow_licenses", "policy_deny_licenses", "policy_license_unknown",
                         "policy_license_other", "policy_allow_publishers", "policy_deny_publishers",
                         "policy_facts_ttl"),
    "logs": ("log_format", "log_level"),
    "audit log": ("audit_log", "audit_dir", "audit_file_size", "audit_session_seconds"),
}
_GROUP_OF = {dest: title for title, dests in SETTING_GROUPS.items() for dest in dests}
OTHER_GROUP = "more settings"
COMMAND_GROUPS: dict[str, tuple[str, ...] | None] = {
    "serve": None,  # every group
    "sync": ("settings file", "cache and quota", "upstream", "fills and bandwidth", "fleet (storage s3)", "logs"),
    "cache": ("settings file", "cache and quota", "fleet (storage s3)", "logs"),
    "policy": ("settings file", "cache and quota", "upstream", "admission policy", "logs"),
    "audit": ("settings file", "cache and quota", "audit log"),
    "sbom": ("settings file", "cache and quota", "fleet (storage s3)"),
}


def add_settings_arguments(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False,
                           command: str = "serve") -> None:
    """The flags that build :class:`Settings` (also env ``HF_MIRROR_<NAME>`` and keys of ``--config``), in titled
    groups; flags of groups ``command`` does not use are accepted but left out of its help.

    ``suppress_defaults``: a flag not given leaves no attribute (for sub-parsers: their defaults must not erase a
    value given before the subcommand)."""
    shown = COMMAND_GROUPS[command]
    groups: dict[str, Any] = {}

    def add(*flags: str, **options: Any) -> None:
        if suppress_defaults:
            options["default"] = argparse.SUPPRESS
        title = _GROUP_OF.get(flags[0].removeprefix("--").replace("-", "_"), OTHER_GROUP)
        if shown is not None and title not in shown:
            options["help"] = argparse.SUPPRESS
        if title not in groups:
            note = ("each setting is also HF_MIRROR_<NAME> or a key of the --config file; every setting of `hf-mirror "
                    "serve --help` is accepted") if title == "settings file" else None
            groups[title] = parser.add_argument_group(title, note)
        groups[title].add_argument(*flags, **options)

    add("--config", type=Path, help="TOML file with settings (keys as the flags, with underscores)")
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port to listen on (default 8090)")
    add("--upstream", help="Hub to mirror (default https://huggingface.co; another mirror works too)")
    add("--cache-dir", type=Path, help="where blobs and the index live (default ~/.cache/hf-mirror)")
    add("--offline", action="store_true", default=None, help="never contact upstream; serve only what is cached")
    add("--revision-ttl", type=float, help="seconds a branch/tag -> commit mapping is trusted (default 300)")
    add("--upstream-token", help="service Hub token: used for the sync and public content, never lent to callers "
        "unless --lend-upstream-token (serve does not read HF_TOKEN)")
    add("--lend-upstream-token", action="store_true", default=None,
        help="UNSAFE on a shared network: callers that send no token read what the service token can read")
    add("--serve-xet", action=argparse.BooleanOptionalAction, default=None,
        help="Xet through the mirror: its own token route and CAS for files upstream marks as Xet-backed (needed "
        "for files over 50 GB; on by default); --no-serve-xet strips every Xet hint (plain HTTP only)")
    add("--xet-token-ttl", type=float, help="seconds a Xet token or byte-range URL of the mirror lives (default 900)")
    add("--xet-signing-secret", help="key (32+ characters) the mirror signs its Xet tokens with: the same on every "
        "node of a fleet, so any node accepts any node's tokens (default: one generated once in the fleet's "
        "database with --metadata-url, else in the cache dir)")
    add("--workers", type=int, help="worker processes (default 1); they share one cache and one fill per file")
    add("--max-size", help="disk quota for blobs, e.g. 500G; least recently used unpinned blobs are evicted")
    add("--gc-interval", type=float, help="seconds between periodic passes that check the quota against what every "
        "worker wrote and drop expired index entries (default 600; fills keep the quota as they start)")
    add("--negative-max-entries", type=int, help="remembered 404s and refusals the index keeps at most, the oldest "
        "dropped first (default 10000)")
    add("--negative-max-bytes", help="bytes those entries may hold in the index, e.g. 16M (default 16MiB); counted "
        "in --max-size")
    add("--scrub-rate", help="bytes/s the background scrub may read to re-hash stored blobs, e.g. 32M (default; 0: "
        "off): a blob after its first hit, and the whole store every 6 h")
    add("--min-free-space", help="free disk a new fill must leave, e.g. 10G (default 256M): short of it, old blobs "
        "are evicted, else the file is relayed without being stored")
    add("--storage", choices=("local", "s3"),
        help="where blobs live: local (under --cache-dir) or s3 (a bucket shared by several nodes)")
    add("--s3-endpoint", help="S3-compatible endpoint URL (default: AWS S3); credentials from AWS_* env vars")
    add("--s3-bucket", help="bucket holding the blobs and fill leases (storage s3)")
    add("--s3-prefix", help="key prefix inside the bucket, e.g. hf-mirror/ (storage s3)")
    add("--s3-region", help="bucket region (default us-east-1)")
    add("--hot-tier-max-size", help="bound of the local disk copy of bucket blobs, e.g. 200G (storage s3; LRU)")
    add("--lease-stale-seconds", type=float,
        help="fill lease lifetime in seconds: a dead node's fill is taken over after this (storage s3; default 30)")
    add("--node-url", help="URL the other nodes reach this node at, e.g. http://node-1:8090: they stream its "
        "fills in progress from it (storage s3)")
    add("--metadata-url", help="the fleet's PostgreSQL database, postgresql://USER@HOST:PORT/DB: fill leases "
        "(and shared metadata) for every node (default: none, each node alone; docs/scale-out.md)")
    add("--fleet-lease-seconds", type=float,
        help="lifetime of a fill lease the database grants: a dead or frozen filler is taken over after this "
        "(with --metadata-url; default 10)")
    add("--metadata-connect-timeout", type=float,
        help="seconds a node waits for the fleet's database to answer before it reports it unavailable (with "
        "--metadata-url; default 10)")
    add("--metadata-read-timeout", type=float,
        help="seconds a read the node can do without (a shared answer; it asks upstream instead) waits for the "
        "fleet's database (with --metadata-url; default 2, at most --metadata-connect-timeout)")
    add("--parallel-fill-threshold", help="files of at least this size are fetched upstream over several "
        "connections, e.g. 64M (default; 0: never)")
    add("--fill-connections", type=int, help="concurrent Range requests of one large fill (default 8)")
    add("--fill-window", help="bytes of one Range request of a parallel fill, e.g. 32M (default)")
    add("--fill-hedges", type=int, help="lagging windows of one parallel fill asked again on a fresh connection, "
        "at most (default 4; 0: never)")
    add("--fill-hedge-after", type=float, help="seconds over which a window's rate is judged against the others' "
        "(default 2): under 1/8 of their median, or nothing, and it is hedged")
    add("--sparse-fill-threshold", help="a Range on a file of at least this size fetches only its windows, kept "
        "in a sparse partial file, e.g. 1G (default; 0: never)")
    add("--sparse-read-ahead", help="bytes fetched past a Range of a sparse fill, e.g. 32M (default)")
    add("--sparse-complete-share", type=float, help="share of a sparse file held that has the rest fetched "
        "(default 0.5)")
    add("--sparse-linger", type=float, help="seconds a sparse fill with no reader keeps its lease before it pauses, "
        "its windows kept (default 2); meanwhile other nodes of a fleet relay their Ranges of the file from it")
    add("--upstream-rate", help="upstream bandwidth cap shared by every fill, bytes/s, e.g. 100M (default 0: none)")
    add("--sync-rate", help="upstream bandwidth cap of the sync command, e.g. 20M (default 0: --upstream-rate)")
    add("--sync-hours", help="local hours when --sync-rate applies, e.g. 08-18 (default: always)")
    add("--accel-redirect", help="nginx internal location prefix for cache hits, e.g. /_hf_mirror_blobs/")
    add("--root-path", help="the path the mirror is served under behind a reverse proxy, e.g. /hf: stripped from "
        "requests that carry it, and carried by every URL the mirror writes (default: none)")
    add("--trusted-proxies", help="comma-separated addresses or CIDRs of the fronts whose X-Forwarded-Prefix, "
        "-Proto and -For the mirror believes, e.g. 127.0.0.1,10.0.0.0/8 (default: X-Forwarded-Prefix never believed)")
    add("--log-format", choices=("text", "json"), help="log line format (default text)")
    add("--log-level", help="debug, info, warning, error (default info)")
    add("--connect-timeout", type=float, help="upstream connect timeout in seconds (default 10)")
    add("--read-timeout", type=float, help="upstream read timeout in seconds (default 30)")
    add("--fill-on-disconnect", choices=("continue", "cancel"),
        help="what a fill does when its last client leaves (default continue)")
    add("--access-ttl", type=float, help="seconds a caller's confirmed access to a gated/private repo is kept")
    add("--access-grace", type=float, help="seconds a confirmed access is honoured while upstream cannot be asked "
        "(offline or down; default 86400)")
    add("--open-unknown-repos", action="store_true", default=None,
        help="offline, serve repos whose visibility was never learned (e.g. seeded by cache import) to anyone")
    add("--viewer-upstream", help="the dataset viewer's host upstream (default: datasets-server.<upstream host>; "
        "datasets-server.<IP address> is reached at that address with the name as Host, as a chained mirror "
        "answers it); off: answer the viewer from the cache only")
    add("--warm-jobs", type=int, help="warm jobs (POST /api/mirror/warm) running at once (default 2)")
    add("--warm-queue", type=int, help="warm jobs waiting beyond --warm-jobs (default 16); beyond it, 503")
    add("--warm-rate", type=float, help="warm requests a caller (token, else address) may make a minute "
        "(default 60; 0: no limit); beyond it, 429 with Retry-After")
    add("--warm-max-bytes", help="largest warm, in selected bytes, a caller without an operator credential may "
        "start, e.g. 50G (default; 0: no cap); beyond it, 413")
    add("--header-timeout", type=float, help="seconds a client has to send its request line and headers (default 10)")
    add("--max-header-bytes", help="cap on request line + headers (default 64K); larger requests get 431")
    add("--ssl-certfile", type=Path, help="TLS certificate for the embedded server")
    add("--ssl-keyfile", type=Path, help="TLS private key for the embedded server")
    add("--auth-tokens-file", type=Path, help="TOML file of mirror tokens: turns on mirror-side access control")
    add("--jwt-secret", help="HS256 secret for mirror JWTs: turns on mirror-side access control")
    add("--jwt-public-key-file", type=Path, help="RS256 public key (PEM) for mirror JWTs")
    add("--admin-token", help="the operator's token (sent as Authorization: Bearer) for unpin and evict over HTTP; "
        "unset: refused, use hf-mirror cache on the host")
    add("--allow-repos", help="comma-separated patterns, e.g. 'model:meta-llama/*,dataset:*'")
    add("--deny-repos", help="comma-separated patterns, e.g. 'space:*'")
    # The admission policy (issue 27): also the [policy] table of --config, without the policy_ prefix.
    actions = ("allow", "block", "quarantine")
    add("--policy-dry-run", action="store_true", default=None,
        help="log what the admission policy would refuse, and serve it anyway")
    add("--policy-scan", action="store_true", default=None,
        help="scan pickle-class files before their first serve (allowlist-first); a failed file is quarantined")
    add("--policy-scan-allow-globals", help="extra globals the scan admits, comma-separated module.name")
    add("--policy-hub-unsafe", choices=actions, help="files the Hub's scan marks unsafe (default allow)")
    add("--policy-hub-caution", choices=actions, help="files the Hub's scan marks caution (default allow)")
    add("--policy-hub-unscanned", choices=actions,
        help="repos the Hub has not scanned yet, or whose verdict is unknown (default allow)")
    add("--policy-allow-files", help="only files matching these globs pass, e.g. '*.safetensors,*.gguf,*.json'")
    add("--policy-block-files", help="files matching these globs are refused, e.g. '*.bin,*.pt,*.pkl,*.py'")
    add("--policy-allow-licenses", help="only these licences (cardData.license) pass, e.g. 'mit,apache-2.0'")
    add("--policy-deny-licenses", help="these licences are refused, e.g. 'gpl-3.0,agpl-3.0'")
    add("--policy-license-unknown", choices=actions, help="repos whose card declares no licence (default allow)")
    add("--policy-license-other", choices=actions, help="repos whose licence is 'other' (default allow)")
    add("--policy-allow-publishers", help="only these namespaces pass, e.g. 'acme,dataset:HuggingFaceFW'")
    add("--policy-deny-publishers", help="these namespaces are refused, e.g. 'model:evil-org'")
    add("--policy-facts-ttl", type=float, help="seconds the Hub's verdict and licence of a commit are trusted "
        "(default 3600)")
    add("--audit-log", action=argparse.BooleanOptionalAction, default=None,
        help="one JSON line per file served and per refusal, for `hf-mirror audit` (on by default)")
    add("--audit-dir", type=Path, help="where the audit log and its index live (default <cache-dir>/audit)")
    add("--audit-file-size", help="size past which an audit file is rotated, e.g. 64M (default)")
    add("--audit-session-seconds", type=float, help="a client's requests for one file within this many seconds "
        "of each other (resumes, Xet ranges) are one audit event (default 3600)")


def settings_flags(*, suppress_defaults: bool = False, command: str = "serve") -> argparse.ArgumentParser:
    """The settings flags as a parent parser (``parents=[...]``), with ``command``'s groups in its help."""
    parent = argparse.ArgumentParser(add_help=False)
    add_settings_arguments(parent, suppress_defaults=suppress_defaults, command=command)
    return parent


def settings_from_args(args: argparse.Namespace, *, hf_token_env: bool = False) -> Settings:
    """The flags given (a flag left out is ``None``) over env, ``--config`` and the defaults."""
    dests = vars(settings_flags().parse_args([]))  # every settings flag's name (and nothing else of ``args``)
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if k in dests and k != "config" and v is not None}
    return Settings(**flags, _config_file=getattr(args, "config", None), _hf_token_env=hf_token_env)


def with_settings(run: Callable[[argparse.Namespace, Settings], int], *,
                  hf_token_env: bool = True) -> Callable[[argparse.Namespace], int]:
    """A command's ``run(args, settings)`` as the parser's ``func(args)``: the settings are built from the flags.

    ``hf_token_env``: the command may take its service token from ``HF_TOKEN`` (sync, cache); ``serve`` never does,
    since a token picked up silently would serve every caller's downloads."""

    def func(args: argparse.Namespace) -> int:
        return run(args, settings_from_args(args, hf_token_env=hf_token_env))

    return func


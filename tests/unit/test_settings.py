"""Settings (mirror/config.py, a pydantic-settings model) and the flags that build them (mirror/cli/settings.py):
precedence flag > env > TOML > default, sizes from every source, one-line errors naming the setting, HF_TOKEN
(sync and cache only), the JSON the worker processes rebuild them from."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirror.cli import main
from mirror.cli.commands import build_parser
from mirror.cli.settings import settings_from_args
from mirror.config import ConfigError, Settings, parse_size


def from_cli(*argv: str, hf_token_env: bool = False) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]), hf_token_env=hf_token_env)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mirror.toml"
    path.write_text(text)
    return path


def test_defaults(settings_env: pytest.MonkeyPatch) -> None:
    settings = from_cli()
    assert (settings.host, settings.port, settings.upstream) == ("127.0.0.1", 8090, "https://huggingface.co")
    assert settings.cache_dir == Path("~/.cache/hf-mirror").expanduser()
    assert settings.max_size is None and settings.min_free_space == 256 * 1024**2 and settings.upstream_token is None
    assert settings.viewer_upstream == "https://datasets-server.huggingface.co"


def test_precedence_flag_over_env_over_toml_over_default(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'port = 9001\nhost = "0.0.0.0"\nrevision_ttl = 60\nlog_level = "debug"\n')
    settings_env.setenv("HF_MIRROR_PORT", "9002")
    settings_env.setenv("HF_MIRROR_HOST", "10.0.0.1")
    settings = from_cli("--config", str(config), "--port", "9003")
    assert settings.port == 9003  # flag over env and TOML
    assert settings.host == "10.0.0.1"  # env over TOML
    assert settings.revision_ttl == 60.0 and settings.log_level == "debug"  # TOML over the defaults
    assert settings.workers == 1  # default
    settings_env.setenv("HF_MIRROR_CONFIG", str(config))  # the file named by env instead of --config
    assert from_cli().revision_ttl == 60.0


def test_mirror_table_of_the_toml_file(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_toml(tmp_path, '[mirror]\nupstream = "https://hub.example/"\noffline = true\n')
    settings = from_cli("--config", str(config))
    assert settings.upstream == "https://hub.example" and settings.offline is True


def test_sizes_from_flags_env_and_toml(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_toml(tmp_path, 'max_size = "1.5TiB"\nhot_tier_max_size = 1000\nmin_free_space = "0"\n')
    settings_env.setenv("HF_MIRROR_SCRUB_RATE", "10M")
    settings_env.setenv("HF_MIRROR_MAX_HEADER_BYTES", "16K")
    settings = from_cli("--config", str(config), "--fill-window", "2MiB")
    assert settings.max_size == int(1.5 * 1024**4)  # TOML
    assert settings.hot_tier_max_size == 1000 and settings.min_free_space is None  # 0: unlimited
    assert settings.scrub_rate == 10_000_000 and settings.max_header_bytes == 16_000  # env
    assert settings.fill_window == 2 * 1024**2  # flag
    settings_env.setenv("HF_MIRROR_MAX_SIZE", "500G")
    assert from_cli("--config", str(config)).max_size == 500 * 1000**3  # env over TOML
    assert Settings(upstream_rate="0").upstream_rate == 0 and Settings(max_size=0).max_size is None
    assert parse_size("1.5 TB") == 1_500_000_000_000 and parse_size("") is None


def test_env_values_are_coerced(settings_env: pytest.MonkeyPatch) -> None:
    settings_env.setenv("HF_MIRROR_OFFLINE", "yes")
    settings_env.setenv("HF_MIRROR_ACCESS_LOG", "")  # an empty variable: off
    settings_env.setenv("HF_MIRROR_ALLOW_REPOS", "model:meta-llama/*, dataset:*")
    settings_env.setenv("HF_MIRROR_CACHE_DIR", "~/mirror-cache")
    settings_env.setenv("HF_MIRROR_UPSTREAM_TOKEN", "")  # an unset compose variable: no token
    settings = from_cli()
    assert settings.offline is True and settings.access_log is False
    assert settings.allow_repos == ("model:meta-llama/*", "dataset:*")
    assert settings.cache_dir == Path("~/mirror-cache").expanduser()
    assert settings.upstream_token is None
    assert from_cli("--cache-dir", "~/other").cache_dir == Path("~/other").expanduser()


def test_unknown_toml_key_is_named(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_toml(tmp_path, "port = 9000\nmax_sise = '10G'\n")
    with pytest.raises(ConfigError) as caught:
        from_cli("--config", str(config))
    assert str(caught.value) == f"unknown setting(s) in {config}: max_sise"
    with pytest.raises(ConfigError, match="config file not found"):
        from_cli("--config", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="is not valid TOML"):
        from_cli("--config", str(write_toml(tmp_path, "port = \n")))


@pytest.mark.parametrize(("source", "setting"), [
    ({"HF_MIRROR_MAX_SIZE": "lots"}, "max_size"),
    ({"HF_MIRROR_PORT": "eighty"}, "port"),
    ({"HF_MIRROR_WORKERS": "0"}, "workers"),
    ({"HF_MIRROR_STORAGE": "nfs"}, "storage"),
    ({"HF_MIRROR_OFFLINE": "maybe"}, "offline"),
    ({"HF_MIRROR_UPSTREAM": "ftp://user:secret@hub.example"}, "upstream"),
    ({"HF_MIRROR_SYNC_HOURS": "8h"}, "sync_hours"),
    ({"HF_MIRROR_SYNC_HOURS": "25-3"}, "sync_hours"),
    ({"HF_MIRROR_READ_TIMEOUT": "0"}, "read_timeout"),
    ({"HF_MIRROR_UPSTREAM_RATE": "-5M"}, "upstream_rate"),
    ({"HF_MIRROR_SYNC_HOURS": "08-08"}, "sync_hours"),
    ({"HF_MIRROR_STORAGE": "s3"}, "s3_bucket"),
    ({"HF_MIRROR_SSL_CERTFILE": "cert.pem"}, "ssl_keyfile"),
])
def test_bad_value_is_one_line_naming_the_setting(settings_env: pytest.MonkeyPatch, source: dict[str, str],
                                                   setting: str) -> None:
    for name, value in source.items():
        settings_env.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        from_cli()
    message = str(caught.value)
    assert setting in message and "\n" not in message and "pydantic" not in message and "secret" not in message


def test_cli_prints_a_configuration_error(settings_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--max-size", "5X"]) == 2
    err = capsys.readouterr().err
    assert err == ("hf-mirror: configuration error: invalid value for max_size: '5X' (cannot parse size '5X': use a "
                   "byte count or e.g. 500G, 1.5TiB)\n")


def test_hf_token_is_read_by_sync_and_cache_only(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings_env.setenv("HF_TOKEN", "hf_from_env")
    assert from_cli().upstream_token is None  # serve never reads it
    assert from_cli(hf_token_env=True).upstream_token == "hf_from_env"
    assert from_cli("--upstream-token", "hf_flag", hf_token_env=True).upstream_token == "hf_flag"
    config = write_toml(tmp_path, 'upstream_token = "hf_toml"\n')
    assert from_cli("--config", str(config), hf_token_env=True).upstream_token == "hf_toml"
    settings_env.setenv("HF_MIRROR_UPSTREAM_TOKEN", "hf_mirror_env")
    assert from_cli(hf_token_env=True).upstream_token == "hf_mirror_env"


def test_credentials_of_the_upstream_are_redacted(settings_env: pytest.MonkeyPatch) -> None:
    settings = from_cli("--upstream", "https://user:secret@hub.example/", "--upstream-token", "hf_x")
    assert settings.upstream == "https://user:secret@hub.example"
    assert settings.upstream_display == "https://***@hub.example"
    assert settings.viewer_upstream == "https://datasets-server.hub.example"  # never the upstream's credentials
    redacted = settings.redacted()
    assert redacted["upstream"] == "https://***@hub.example" and redacted["upstream_token"] == "***"
    assert isinstance(redacted["cache_dir"], str)


def test_xet_signing_secret_from_every_source_and_never_shown(settings_env: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    secret = "s" * 40
    assert from_cli().xet_signing_secret is None  # one generated per cache dir
    assert from_cli("--xet-signing-secret", secret).xet_signing_secret == secret
    config = write_toml(tmp_path, f'xet_signing_secret = "{secret}"\n')
    assert from_cli("--config", str(config)).xet_signing_secret == secret
    settings_env.setenv("HF_MIRROR_XET_SIGNING_SECRET", secret)
    assert from_cli().redacted()["xet_signing_secret"] == "***"
    settings_env.setenv("HF_MIRROR_XET_SIGNING_SECRET", "short-and-guessable")
    with pytest.raises(ConfigError) as caught:
        from_cli()
    assert "xet_signing_secret" in str(caught.value) and "guessable" not in str(caught.value)


def test_json_round_trip_for_the_workers(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = from_cli("--workers", "3", "--max-size", "10G", "--allow-repos", "model:a/*,dataset:b/*",
                        "--auth-tokens-file", str(tmp_path / "tokens.toml"), "--cache-dir", str(tmp_path))
    settings_env.setenv("HF_MIRROR_PORT", "9999")  # a worker rebuilds what the CLI built: no source is read again
    rebuilt = Settings.model_validate_json(settings.model_dump_json())
    assert rebuilt == settings and rebuilt.port == 8090
    assert rebuilt.allow_repos == ("model:a/*", "dataset:b/*") and isinstance(rebuilt.auth_tokens_file, Path)


def test_frozen_and_model_copy(settings_env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    with pytest.raises(ValueError):
        settings.port = 1  # type: ignore[misc]
    changed = settings.model_copy(update={"offline": True})
    assert changed.offline and not settings.offline and hash(changed) != hash(settings)


def test_each_command_help_lists_its_own_options_first_and_only_its_settings(capsys: pytest.CaptureFixture) -> None:
    """Issue 29: a command's own options come first; settings it does not use are accepted but not shown."""
    from mirror.cli import build_parser

    parser = build_parser()
    for argv, own, unused in ((["sync"], "--manifest", "--accel-redirect"),
                              (["cache", "ls"], "--json", "--host"),
                              (["cache", "import"], "--public", "--jwt-secret")):
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, "--help"])
        text = capsys.readouterr().out
        assert text.index(own) < text.index("--cache-dir") and unused not in text, (argv, text)
    args = parser.parse_args(["cache", "ls", "--host", "0.0.0.0", "--json"])  # hidden, still accepted
    assert args.host == "0.0.0.0" and args.json
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.startswith("hf-mirror ")


def test_admin_token_from_flag_env_and_toml_and_redacted(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert from_cli().admin_token is None
    config = write_toml(tmp_path, 'admin_token = "adm_toml"\n')
    assert from_cli("--config", str(config)).admin_token == "adm_toml"
    settings_env.setenv("HF_MIRROR_ADMIN_TOKEN", "adm_env")
    assert from_cli("--config", str(config)).admin_token == "adm_env"
    settings = from_cli("--admin-token", "adm_flag")
    assert settings.admin_token == "adm_flag" and settings.redacted()["admin_token"] == "***"
    settings_env.setenv("HF_MIRROR_ADMIN_TOKEN", "")
    assert from_cli().admin_token is None  # an unset compose variable: none

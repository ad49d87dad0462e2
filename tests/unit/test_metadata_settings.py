"""``metadata_url`` (issue 25): a flag, an env var and a TOML key like every serve setting; validated; never shown with
its password; absent, a node builds the embedded store and the bucket's own leases, exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirror.config import ConfigError
from mirror.metadata import EmbeddedMetadata, open_metadata
from mirror.parts import build_parts
from mirror.storage.s3.leases import Leases
from tests.unit.test_settings import from_cli, write_toml

DSN = "postgresql://mirror:secret@db.example:5432/hf"


def test_metadata_url_from_every_source(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert from_cli().metadata_url is None and from_cli().fleet_lease_seconds == 10.0
    assert from_cli("--metadata-url", DSN, "--fleet-lease-seconds", "4").fleet_lease_seconds == 4.0
    assert from_cli("--metadata-url", DSN).metadata_url == DSN
    config = write_toml(tmp_path, f'metadata_url = "{DSN}"\nfleet_lease_seconds = 6\n')
    assert from_cli("--config", str(config)).metadata_url == DSN
    settings_env.setenv("HF_MIRROR_METADATA_URL", DSN)
    settings = from_cli()
    assert settings.metadata_url == DSN
    assert settings.redacted()["metadata_url"] == "postgresql://***@db.example:5432/hf"


def test_metadata_url_must_name_postgresql(settings_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        from_cli("--metadata-url", "mysql://root:hunter2@db/hf")
    assert "metadata_url" in str(caught.value) and "hunter2" not in str(caught.value)


def test_metadata_connect_timeout_from_every_source_and_down_to_the_store(settings_env: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    assert from_cli().metadata_connect_timeout == 10.0
    assert from_cli("--metadata-connect-timeout", "2.5").metadata_connect_timeout == 2.5
    config = write_toml(tmp_path, "metadata_connect_timeout = 4\n")
    assert from_cli("--config", str(config)).metadata_connect_timeout == 4.0
    settings_env.setenv("HF_MIRROR_METADATA_CONNECT_TIMEOUT", "3")
    assert from_cli().metadata_connect_timeout == 3.0
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError) as caught:
            from_cli("--metadata-connect-timeout", bad)
        assert "metadata_connect_timeout" in str(caught.value)
    pytest.importorskip("psycopg")
    settings = from_cli("--cache-dir", str(tmp_path / "cache"), "--metadata-url", DSN)
    parts = build_parts(settings)  # nothing connects before the store is opened
    try:
        assert parts.metadata.connect_timeout == 3.0  # type: ignore[union-attr]  # the PostgreSQL store's
    finally:
        parts.index.close()


def test_metadata_read_timeout_from_every_source_and_never_past_the_connect_timeout(
        settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert from_cli().metadata_read_timeout == 2.0
    assert from_cli("--metadata-read-timeout", "0.5").metadata_read_timeout == 0.5
    config = write_toml(tmp_path, "metadata_read_timeout = 1.5\n")
    assert from_cli("--config", str(config)).metadata_read_timeout == 1.5
    settings_env.setenv("HF_MIRROR_METADATA_READ_TIMEOUT", "0.25")
    assert from_cli().metadata_read_timeout == 0.25
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError) as caught:
            from_cli("--metadata-read-timeout", bad)
        assert "metadata_read_timeout" in str(caught.value)
    pytest.importorskip("psycopg")
    for flags, expected in ((("--metadata-read-timeout", "0.75"), 0.75),
                            (("--metadata-read-timeout", "9", "--metadata-connect-timeout", "4"), 4.0)):
        settings = from_cli("--cache-dir", str(tmp_path / "cache"), "--metadata-url", DSN, *flags)
        parts = build_parts(settings)
        try:
            assert parts.metadata.read_timeout == expected  # type: ignore[union-attr]  # the PostgreSQL store's
        finally:
            parts.index.close()


def test_without_a_database_a_node_is_built_as_before(settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("aiobotocore")
    settings = from_cli("--cache-dir", str(tmp_path / "cache"), "--storage", "s3", "--s3-bucket", "b")
    parts = build_parts(settings)
    try:
        assert isinstance(parts.metadata, EmbeddedMetadata)
        assert isinstance(parts.store.leases, Leases)  # type: ignore[attr-defined]  # the bucket's lease objects
        assert parts.fills.lease_ttl == settings.lease_stale_seconds
        assert not (tmp_path / "cache" / "fill-leases").exists()  # nothing new on disk
    finally:
        parts.index.close()
    embedded = open_metadata(from_cli("--cache-dir", str(tmp_path)), parts.index, parts.layout)
    assert isinstance(embedded, EmbeddedMetadata)

"""``metadata_url`` (issue 25): a flag, an env var and a TOML key like every serve setting; validated; never shown with
its password; absent, a node builds the embedded store and the bucket's own leases, exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def store_of(tmp_path: Path, *flags: str) -> Any:
    """The PostgreSQL store a node with ``flags`` builds (nothing connects before it is opened)."""
    parts = build_parts(from_cli("--cache-dir", str(tmp_path / "cache"), "--metadata-url", DSN, *flags))
    parts.index.close()
    return parts.metadata


@pytest.mark.parametrize(("key", "default", "given"), [("metadata_connect_timeout", 10.0, 2.5),
                                                       ("metadata_read_timeout", 2.0, 0.5)])
def test_metadata_timeouts_from_every_source(settings_env: pytest.MonkeyPatch, tmp_path: Path, key: str,
                                             default: float, given: float) -> None:
    flag = "--" + key.replace("_", "-")
    assert getattr(from_cli(), key) == default
    assert getattr(from_cli(flag, str(given)), key) == given
    assert getattr(from_cli("--config", str(write_toml(tmp_path, f"{key} = 1.5\n"))), key) == 1.5
    settings_env.setenv("HF_MIRROR_" + key.upper(), "0.25")
    assert getattr(from_cli(), key) == 0.25
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError) as caught:
            from_cli(flag, bad)
        assert key in str(caught.value)


def test_metadata_timeouts_reach_the_store_and_a_read_never_waits_past_the_connect_timeout(
        settings_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    store = store_of(tmp_path, "--metadata-connect-timeout", "3", "--metadata-read-timeout", "0.75")
    assert (store.connect_timeout, store.read_timeout) == (3.0, 0.75)
    assert store_of(tmp_path, "--metadata-read-timeout", "9", "--metadata-connect-timeout", "4").read_timeout == 4.0
    assert store_of(tmp_path).read_timeout == 2.0


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

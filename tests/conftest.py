"""Shared fixtures: the Hub emulator and a mirror in front of it, both real processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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

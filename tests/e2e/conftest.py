"""Fixtures several e2e modules share: a Hub emulator sized by the module, and a fleet of mirror nodes on one bucket.

``emu`` here serves a module that names its generated files in ``EMULATOR_FILES`` (keyword arguments of
``run_emulator``: ``big_file_size``, ``huge_file_size``); a module that defines its own ``emu`` fixture uses that one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import s3_server
from tests.support.fleet import Fleet
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator


@pytest.fixture(scope="module")
def module_emulator(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    ) -> Iterator[EmulatorHandle]:
    """One emulator per module, with the generated files of the module's ``EMULATOR_FILES``."""
    with run_emulator(tmp_path_factory.mktemp("emu"), **request.module.EMULATOR_FILES) as handle:
        yield handle


@pytest.fixture
def emu(module_emulator: EmulatorHandle) -> Iterator[EmulatorHandle]:
    """The module's emulator with no faults and its counters at zero for each test (faults cleared after it too)."""
    module_emulator.clear_faults()
    module_emulator.reset_stats()
    yield module_emulator
    module_emulator.clear_faults()


@pytest.fixture
def fleet(s3: s3_server.S3Server, tmp_path: Path) -> Iterator[Fleet]:
    """No node yet: a fresh prefix of the module's bucket; every node the test starts is stopped after it."""
    out = Fleet(s3, tmp_path)
    try:
        yield out
    finally:
        out.stop()

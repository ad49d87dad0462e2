"""``hf-mirror cache ls|du|verify|rm|gc|import|export``: the subcommands are :mod:`mirror.cachecli`'s."""

from __future__ import annotations

import argparse

from mirror import cachecli
from mirror.cli.settings import settings_flags

HELP = "inspect and manage the cache: ls, du, verify, rm, gc, import, export"
run = cachecli.run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands, each taking the settings flags after its name too (the ``cache`` parser has them before)."""
    cachecli.add_arguments(parser, settings_flags(suppress_defaults=True))

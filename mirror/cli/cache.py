"""``hf-mirror cache ls|du|verify|rm|gc|import|export``: the subcommands are :mod:`mirror.cachecli`'s."""

from __future__ import annotations

import argparse

from mirror import cachecli
from mirror.cli.settings import add_settings_arguments

HELP = "inspect and manage the cache: ls, du, verify, rm, gc, import, export"
run = cachecli.run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands, each taking the settings flags after its name too (the ``cache`` parser has them before),
    listed after the subcommand's own options."""
    cachecli.add_arguments(parser, lambda child: add_settings_arguments(child, suppress_defaults=True,
                                                                       command="cache"))

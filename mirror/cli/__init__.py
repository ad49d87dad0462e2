"""``hf-mirror`` / ``python -m mirror``: serve, sync, cache, bench, demo.

:mod:`.commands` is the command table and ``main``; :mod:`.settings` the settings flags, one parent parser shared
by :mod:`.serve`, :mod:`.sync` and :mod:`.cache`; each command's own flags sit next to its ``run``. The CLI builds
:class:`mirror.config.Settings` from the flags and hands it down (``run(args, settings)``): nothing below the CLI
imports it.
``serve``'s flags are a contract used by deploy files and outside checks: extend them, never break them.
"""

from mirror.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]

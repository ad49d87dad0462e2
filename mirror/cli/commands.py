"""The ``hf-mirror`` command table (``build_parser``) and ``main``: parse, run the command, map errors to exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from mirror import __version__
from mirror.cli import audit, cache, policy, sbom, serve, sync
from mirror.cli.settings import add_settings_arguments, settings_flags, with_settings
from mirror.config import ConfigError
from mirror.demo import command as demo
from mirror.harness import command as bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-mirror", description="A self-hosted Hugging Face Hub mirror.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, func: Callable[[argparse.Namespace], int],
                parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
        child = sub.add_parser(name, help=help_text, description=help_text, parents=list(parents))
        child.set_defaults(func=func)
        return child

    command("serve", serve.HELP, with_settings(serve.run, hf_token_env=False), [settings_flags()])
    command("sync", sync.HELP, with_settings(sync.run), [sync.flags(), settings_flags(command="sync")])
    # The settings flags before the subcommand, and (each subcommand's, after its own options) after it.
    cache.add_arguments(command("cache", cache.HELP, with_settings(cache.run), [settings_flags(command="cache")]))
    policy.add_arguments(command("policy", policy.HELP, with_settings(policy.run), [settings_flags(command="policy")]),
                         lambda child: add_settings_arguments(child, suppress_defaults=True, command="policy"))
    command("audit", audit.HELP, with_settings(audit.run), [audit.flags(), settings_flags(command="audit")])
    command("sbom", sbom.HELP, with_settings(sbom.run), [sbom.flags(), settings_flags(command="sbom")])
    bench.add_arguments(command("bench", "measure data loading through an endpoint into a training loop",
                                bench.run))
    demo.add_arguments(command("demo", "sample hub + mirror + bench, offline, in under a minute", demo.run))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"hf-mirror: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line, whatever the command was doing (sync prints its own and returns 130)
        print(f"hf-mirror {args.command}: interrupted", file=sys.stderr)
        return 130

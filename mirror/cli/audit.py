"""``hf-mirror audit``: who took which file, and when, from the audit log (:mod:`mirror.audit`).

The index first catches up with the audit files (what the server wrote since its last pass, or before a crash),
then answers from its indexes: newest first, at most ``--limit`` events.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from mirror.audit import INDEX_NAME, AuditIndex, AuditQuery
from mirror.audit.event import OUTCOMES, parse_time
from mirror.audit.follower import index_once
from mirror.config import ConfigError, Settings

HELP = "who took which file, and when: query the audit log (--repo, --path, --caller, --since)"
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--repo", help="acme/x, or model:acme/x / dataset:acme/x for one repo type")
    parser.add_argument("--path", help="a file's path in the repo (exact)")
    parser.add_argument("--caller", help="a mirror token's name, token:<digest> of a Hub token, or anon")
    parser.add_argument("--since", help="from this time on: 2026-01-31, 2026-01-31T12:00:00Z, or an age: 15m, 2h, 7d")
    parser.add_argument("--until", help="before this time (same forms as --since)")
    parser.add_argument("--outcome", choices=OUTCOMES, help="only events with this outcome")
    parser.add_argument("--limit", type=int, default=100, help="newest events shown at most (default 100)")
    parser.add_argument("--count", action="store_true", help="print the number of matching events only")
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    return parser


def when(text: str | None, now: float | None = None) -> float | None:
    """``--since``/``--until``: an ISO 8601 time (no zone: UTC) or an age (``15m``, ``2h``, ``7d``)."""
    if not text:
        return None
    match = _AGO.match(text.strip())
    if match:
        return (now or time.time()) - float(match.group(1)) * _UNIT[match.group(2)]
    try:
        return parse_time(text)
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (use 2026-01-31T12:00:00Z or an age: 15m, 2h, 7d)") from None


def run(args: argparse.Namespace, settings: Settings) -> int:
    directory = settings.audit_directory
    if not directory.is_dir():
        print(f"no audit log in {directory} (serve writes it there; see --audit-dir)", file=sys.stderr)
        return 1
    query = AuditQuery(repo=args.repo, path=args.path, caller=args.caller, since=when(args.since),
                       until=when(args.until), outcome=args.outcome, limit=max(args.limit, 0))
    index_once(directory, wait=True)  # what the server wrote since its last pass (or before a crash) first
    index = AuditIndex(directory / INDEX_NAME)
    try:
        if args.count:
            print(index.count(query))
            return 0
        for event in index.query(query):
            if args.json:
                print(json.dumps(event))
            else:
                size = "-" if event["bytes"] is None else event["bytes"]
                decided = f" rule={event['rule']}" if event["rule"] else ""
                print(f"{event['ts']} {event['outcome']:<11} {event['caller']} {event['client']} "
                      f"{event['repo_type']}:{event['repo_id']}@{(event['commit'] or event['revision'] or '-')[:12]} "
                      f"{event['path']} {size}{decided}")
    finally:
        index.close()
    return 0

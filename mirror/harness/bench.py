"""A whole bench: pre-flight, every pass in turn (with a display), then the report, the JSON and the plot."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mirror.harness.endpoint import preflight
from mirror.harness.passes import (
    PassOutcome,
    PassSpec,
    PendingPass,
    await_ready,
    finish_pass,
    plan_passes,
    start_pass,
    stop_pass,
)
from mirror.harness.plot import write_plot
from mirror.harness.protocol import HarnessError
from mirror.harness.report import build_report, print_report


def run_bench(args: argparse.Namespace, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Bench a given endpoint (``--endpoint``). Raises HarnessError on a user error (after printing what ran)."""
    preflight(args.endpoint, args.dataset, args.tokenizer)
    if args.compare_direct:
        preflight(args.compare_direct, args.dataset, args.tokenizer)
    if args.compare_local is not None and not Path(args.compare_local).is_dir():
        raise HarnessError("missing_local_dir", f"--compare-local {args.compare_local}: not a directory")
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-bench-"))
    try:
        return run_passes(args, plan_passes(args, root), labels or {})
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_passes(args: argparse.Namespace, specs: list[PassSpec], labels: dict[str, str],
               hub: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``specs`` one at a time (starting and stopping their mirrors), then report, write the JSON and the plot."""
    tty = sys.stdout.isatty()
    outcomes: list[PassOutcome] = []
    # every pass's interpreter is started (and imports torch/datasets/transformers) up front and the first
    # measurement waits until all are ready; idle ones block on stdin, so only one pass at a time measures
    pending = [start_pass(spec, args) for spec in specs]
    try:
        for p in pending:
            await_ready(p, args.timeout)
        for p in pending:
            if p.spec.service is not None:
                p.spec.service.start()
            outcomes.append(_run_with_display(p, args, tty, hub))
            if p.spec.stop_service_after and p.spec.service is not None:
                p.spec.service.stop()
            if outcomes[-1].error is not None:
                break
    finally:
        for p in pending:
            stop_pass(p)
            if p.spec.service is not None:
                p.spec.service.stop()
    labels = {**{s.name: s.label for s in specs if s.label}, **labels}
    report = {**build_report(args, outcomes, labels), **(extra or {})}
    print_report(report, tty)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        message = write_plot(outcomes, args.plot, labels)
        print(message)
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        err = failed[0].error or {}
        kind = str(err.get("kind", "pass_failed"))
        message = f"pass {failed[0].spec.name}: {err.get('message', '')}"
        if kind == "pass_failed":
            print(f"hf-mirror bench: {message}", file=sys.stderr)
            report["passes"] = []
            return report
        raise HarnessError(kind, message)
    return report


def _run_with_display(pending: PendingPass, args: argparse.Namespace, tty: bool, hub: str | None) -> PassOutcome:
    spec = pending.spec
    if not tty:
        print(f"[bench] {spec.name}: running against {spec.local_dir or spec.endpoint}", flush=True)
        outcome = finish_pass(pending, args, lambda event: None, hub)
        if outcome.result:
            r = outcome.result
            first = f"{r['ttfb_s']:.2f}s" if r.get("ttfb_s") is not None else "n/a"
            print(f"[bench] {spec.name}: {r['rows']} rows in {r['total_s']:.2f}s, first batch {first}, "
                  f"upstream requests {r.get('upstream_requests')}", flush=True)
        return outcome
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed} rows"),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task(spec.name, total=args.max_rows or None, rate="")

        def update(event: dict[str, Any]) -> None:
            rate = f"{event['rows'] / event['t']:.0f} rows/s" if event.get("t") else ""
            progress.update(task, completed=event["rows"], rate=rate)

        return finish_pass(pending, args, update, hub)

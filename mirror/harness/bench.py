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
from mirror.harness.passes import PassOutcome, PendingPass, finish_pass, plan_passes, start_pass, stop_pass
from mirror.harness.plot import write_plot
from mirror.harness.protocol import HarnessError
from mirror.harness.report import build_report, print_report


def run_bench(args: argparse.Namespace, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every pass and report. Raises HarnessError on a user error (after printing what ran)."""
    preflight(args.endpoint, args.dataset, args.tokenizer)
    if args.compare_direct:
        preflight(args.compare_direct, args.dataset, args.tokenizer)
    if args.compare_local is not None and not Path(args.compare_local).is_dir():
        raise HarnessError("missing_local_dir", f"--compare-local {args.compare_local}: not a directory")
    tty = sys.stdout.isatty()
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-bench-"))
    outcomes: list[PassOutcome] = []
    # every pass's interpreter is started (and imports torch/datasets/transformers) up front; idle ones block on
    # stdin, so only one pass at a time measures, and none runs while another measures
    pending = [start_pass(spec, args) for spec in plan_passes(args, root)]
    try:
        for p in pending:
            outcomes.append(_run_with_display(p, args, tty))
            if outcomes[-1].error is not None:
                break
    finally:
        for p in pending:
            stop_pass(p)
        shutil.rmtree(root, ignore_errors=True)
    report = build_report(args, outcomes, labels or {})
    print_report(report, tty)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        message = write_plot(outcomes, args.plot, labels or {})
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


def _run_with_display(pending: PendingPass, args: argparse.Namespace, tty: bool) -> PassOutcome:
    spec = pending.spec
    if not tty:
        print(f"[bench] {spec.name}: running against {spec.local_dir or spec.endpoint}", flush=True)
        outcome = finish_pass(pending, args, lambda event: None)
        if outcome.result:
            r = outcome.result
            print(f"[bench] {spec.name}: {r['rows']} rows in {r['total_s']:.2f}s, first batch {r['ttfb_s']:.2f}s",
                  flush=True)
        return outcome
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed} rows"),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task(spec.name, total=args.max_rows, rate="")

        def update(event: dict[str, Any]) -> None:
            rate = f"{event['rows'] / event['t']:.0f} rows/s" if event.get("t") else ""
            progress.update(task, completed=event["rows"], rate=rate)

        return finish_pass(pending, args, update)

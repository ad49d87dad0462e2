"""The figures of a bench: the JSON report, and its table on a terminal or in plain text."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.harness.passes import PassOutcome


def build_report(args: argparse.Namespace, outcomes: list[PassOutcome], labels: dict[str, str]) -> dict[str, Any]:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("func", "command")}
    passes = [dict(o.result, label=labels.get(o.spec.name, o.spec.name)) for o in outcomes if o.result is not None]
    notes: list[str] = []
    if passes:
        first = passes[0]
        if not first.get("torch"):
            notes.append("torch is not installed: measured the loading side only (no DataLoader, no device "
                         "transfer); pip install torch==2.13.0 for the full pipeline")
        elif first.get("device") == "cpu":
            notes.append(f"no GPU used ({first.get('device_note')}): batches stay on the CPU, "
                         "so there is no host-to-device transfer to measure")
    notes.append("MB/s = bytes received on the pass's sockets (HTTP headers+bodies, metadata and tokenizer "
                 "included) / pass time; 'served' = diff of the endpoint's hf_mirror_served_bytes_total "
                 "(bodies only; only for a mirror, and only exact when nothing else uses it meanwhile)")
    return {"config": config, "passes": passes, "notes": notes,
            "errors": [dict(o.error, name=o.spec.name) for o in outcomes if o.error is not None],
            "timelines": {o.spec.name: o.timeline for o in outcomes}}


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:{spec}}{suffix}"


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("pass", lambda r: str(r["label"])),
    ("rows", lambda r: str(r["rows"])),
    ("first batch", lambda r: _fmt(r["ttfb_s"], ".2f", " s")),
    ("total", lambda r: _fmt(r["total_s"], ".2f", " s")),
    ("rows/s", lambda r: _fmt(r["rows_per_s"], ",.0f")),
    ("tokens/s", lambda r: _fmt(r["tokens_per_s"], ",.0f")),
    ("MB read", lambda r: _fmt(r["read_bytes"] / 1e6 if r["read_bytes"] is not None else None, ".3f")),
    ("MB/s", lambda r: _fmt(r["read_mb_per_s"], ".2f")),
    ("served MB", lambda r: _fmt(r["endpoint_bytes_served"] / 1e6 if r.get("endpoint_bytes_served") is not None
                                 else None, ".3f")),
    ("H2D GB/s", lambda r: _fmt(r["h2d_gb_per_s"], ".2f")),
    ("starved", lambda r: _fmt(r["starvation_ratio"] * 100 if r["starvation_ratio"] is not None else None,
                               ".0f", "%")),
]


def print_report(report: dict[str, Any], tty: bool) -> None:
    passes = report["passes"]
    if passes:
        env = passes[0]
        header = (f"device={env['device']} torch={env.get('torch') or 'absent'} batch={report['config']['batch_size']}"
                  f" workers={report['config']['num_workers']} max_length={report['config']['max_length']}")
        if tty:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=f"hf-mirror bench: {report['config']['dataset']} ({header})")
            for name, _ in COLUMNS:
                table.add_column(name, justify="left" if name == "pass" else "right")
            for r in passes:
                table.add_row(*(fn(r) for _, fn in COLUMNS))
            console = Console()
            console.print(table)
            for note in report["notes"]:
                console.print(f"note: {note}", style="dim", markup=False, highlight=False)
        else:
            print(f"hf-mirror bench: {report['config']['dataset']} ({header})")
            rows = [[name for name, _ in COLUMNS]] + [[fn(r) for _, fn in COLUMNS] for r in passes]
            widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
            for row in rows:
                print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                     strict=True))))
            for note in report["notes"]:
                print(f"note: {note}")
    for err in report["errors"]:
        print(f"pass {err['name']} failed ({err.get('kind')}): {err.get('message')}", file=sys.stderr)

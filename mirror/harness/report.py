"""The figures of a bench: the JSON report, and its table on a terminal or in plain text."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.harness.passes import PassOutcome


def build_report(args: argparse.Namespace, outcomes: list[PassOutcome], labels: dict[str, str]) -> dict[str, Any]:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("func", "command")}
    runs = [dict(o.result, label=labels.get(o.spec.name, o.spec.name)) for o in outcomes if o.result is not None]
    passes = _medians(runs)
    notes: list[str] = []
    if passes:
        first = passes[0]
        if not first.get("torch"):
            notes.append("torch is not installed: no DataLoader and no device; workers are forked processes that "
                         "each stream the shards datasets gives DataLoader worker i (pip install torch==2.13.0 "
                         "for the full pipeline)")
        elif first.get("device") == "cpu":
            notes.append(f"no GPU used ({first.get('device_note')}): batches stay on the CPU, "
                         "so there is no host-to-device transfer to measure")
    if len(passes) < len(runs):
        once = [str(p.get("label") or p["name"]) for p in passes if p.get("runs", 1) == 1]
        notes.append(f"each figure is the median of {max(p.get('runs', 1) for p in passes)} runs (every run in "
                     f"'runs')" + (f"; run once: {', '.join(once)}" if once else ""))
    notes.append("MB/s = bytes the pass read (sockets: HTTP headers+bodies, metadata and tokenizer included; local: "
                 "read() bytes) / pass time; stall = share of the step loop's wall time spent waiting for a batch; "
                 "upstream = what reached the sample Hub (or, against your own mirror, the mirror's /metrics); "
                 "CPU s = CPU seconds of the pass and its loader workers; server CPU s = the mirror's and the sample "
                 "Hub's during the pass (only for the servers the bench runs)")
    return {"config": config, "passes": passes, "notes": notes, "summary": summarize(passes),
            "runs": runs if len(passes) < len(runs) else [],
            "errors": [dict(o.error, name=o.spec.name) for o in outcomes if o.error is not None],
            "timelines": {o.spec.name: o.timeline for o in outcomes}}


def _medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per pass group (a pass and its ``--repeat`` runs): numeric figures are the median over the runs."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(str(r.get("group") or r["name"]), []).append(r)
    out = []
    for group, members in groups.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        row = dict(members[0], name=group, runs=len(members))
        for key, value in members[0].items():
            values = [m.get(key) for m in members]
            if isinstance(value, int | float) and not isinstance(value, bool) and \
                    all(isinstance(v, int | float) for v in values):
                row[key] = statistics.median(values)  # type: ignore[type-var]
        out.append(row)
    return out


def summarize(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the targets in docs/harness.md are read from, per worker count (sample bench pass names)."""
    by = {p["name"]: p for p in passes}
    out: dict[str, Any] = {}
    for w in sorted({p.get("workers", 0) for p in passes}):
        local, direct = by.get(f"local-w{w}"), by.get(f"direct-w{w}")
        cold, warm = by.get(f"mirror-cold-w{w}"), by.get(f"mirror-warm-w{w}")
        entry: dict[str, Any] = {}
        if warm and local and local.get("rows_per_s"):
            entry["warm_over_local_rows_per_s"] = warm["rows_per_s"] / local["rows_per_s"]
        if warm:
            entry["warm_stall_fraction"] = warm["stall_fraction"]
            entry["warm_upstream_data_requests"] = warm.get("upstream_data_requests")
            entry["warm_upstream_requests"] = warm.get("upstream_requests")
        if cold and direct and direct.get("total_s"):
            entry["cold_over_direct_time"] = cold["total_s"] / direct["total_s"]
        if cold:
            entry["cold_upstream_requests"] = cold.get("upstream_requests")
            entry["cold_upstream_bytes"] = cold.get("upstream_bytes")
        if direct:
            entry["direct_upstream_requests"] = direct.get("upstream_requests")
        if entry:
            out[f"workers={w}"] = entry
    return out


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:{spec}}{suffix}"


def _mb(value: Any) -> str:
    return _fmt(value / 1e6 if value is not None else None, ",.1f")


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("pass", lambda r: str(r["label"])),
    ("rows", lambda r: f"{r['rows']:,.0f}"),
    ("first batch", lambda r: _fmt(r["ttfb_s"], ".2f", " s")),
    ("total", lambda r: _fmt(r["total_s"], ".1f", " s")),
    ("rows/s", lambda r: _fmt(r["rows_per_s"], ",.0f")),
    ("tokens/s", lambda r: _fmt(r["tokens_per_s"], ",.0f")),
    ("MB/s", lambda r: _fmt(r["read_mb_per_s"], ",.1f")),
    ("stall", lambda r: _fmt(r["stall_fraction"] * 100 if r.get("stall_fraction") is not None else None,
                             ".0f", "%")),
    ("upstream req (data)", lambda r: "n/a" if r.get("upstream_requests") is None else
     f"{r['upstream_requests']:,.0f}" + (f" ({r['upstream_data_requests']:,.0f})"
                                         if r.get("upstream_data_requests") is not None else "")),
    ("upstream MB", lambda r: _mb(r.get("upstream_bytes"))),
    ("H2D GB/s", lambda r: _fmt(r["h2d_gb_per_s"], ".2f")),
    ("CPU s", lambda r: _fmt(r.get("cpu_s"), ".1f")),
    ("server CPU s", lambda r: _fmt(_server_cpu_s(r), ".1f")),
]


def _server_cpu_s(r: dict[str, Any]) -> float | None:
    """CPU the servers the bench runs spent on the pass: the mirror's and the sample Hub's (None: none measured)."""
    parts = [r.get("endpoint_cpu_s"), r.get("upstream_cpu_s")]
    return None if all(p is None for p in parts) else sum(p for p in parts if p is not None)


def print_report(report: dict[str, Any], tty: bool) -> None:
    passes = report["passes"]
    if passes:
        env = passes[0]
        header = (f"device={env['device']} torch={env.get('torch') or 'absent'} batch={report['config']['batch_size']}"
                  f" workers={','.join(map(str, report['config']['workers']))}"
                  f" step={report['config']['step_ms']:g}ms max_length={report['config']['max_length']}")
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

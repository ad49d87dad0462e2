"""Warm HEAD /resolve: the mirror's request rate for a cached file beside nginx answering HEAD of the very same file
(the blob in the mirror's cache, served as a static file), at ``--connections`` keep-alive connections (``ab -k``).

With ``--baseline PATH`` (another checkout, e.g. ``git worktree add /tmp/old <commit>``) that tree's mirror runs too,
on its own cache, and every round measures nginx, the mirror and the baseline in turn: a paired before/after on a
machine whose load moves between rounds. Medians of the rounds, and the ratios. Each mirror's CPU time per answer
(its process's CPU-seconds over the requests ab completed) is reported too: on a loaded machine it moves far less
than a rate does.

    python -m bench.head [--rounds 5] [--seconds 5] [--connections 32] [--baseline /tmp/old] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
from pathlib import Path

import httpx

from bench.common import (
    Nginx,
    Report,
    ab_head,
    blob_path,
    cpu_seconds,
    emulator,
    ensure_tools,
    machine,
    median_of,
    write_json,
)
from tests.support.mirror_proc import MirrorProcess

REPO = "acme/tiny-model"
FILE = "config.json"
RESOLVE = f"/{REPO}/resolve/main/{FILE}"


def _start_and_fill(proc: MirrorProcess) -> None:
    proc.cache_dir.parent.mkdir(parents=True)
    proc.start()
    httpx.get(proc.url + RESOLVE, follow_redirects=True, timeout=30).raise_for_status()  # fills the cache


def run(rounds: int, seconds: int, connections: int, baseline: Path | None) -> Report:
    with emulator(1 << 20) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-head-") as tmp:
        etag = emu.files.etag("model", REPO, "main", FILE)
        trees = {"mirror": None, "baseline": baseline} if baseline else {"mirror": None}
        procs = {name: MirrorProcess(emu.url, Path(tmp) / name / "cache", **({"cwd": tree} if tree else {}))
                 for name, tree in trees.items()}
        try:
            with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:  # side by side: each takes seconds
                list(pool.map(_start_and_fill, procs.values()))
            cache = procs["mirror"].cache_dir
            blob = blob_path(cache, etag, wait=10)
            with Nginx(cache / "blobs", Path(tmp) / "nginx", 1) as nginx:
                urls = {"nginx": f"{nginx.url}/{blob.relative_to(cache / 'blobs')}",
                        **{name: proc.url + RESOLVE for name, proc in procs.items()}}
                for url in urls.values():
                    ab_head(url, 1, connections)  # warm-up: connections, imports, caches
                results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
                for _ in range(rounds):
                    for name, url in urls.items():
                        proc = procs.get(name)
                        before = cpu_seconds(proc.proc.pid) if proc and proc.proc else 0.0
                        result = ab_head(url, seconds, connections)
                        if proc and proc.proc:  # the mirror's own CPU per answer: steadier than a rate on a busy box
                            result["cpu_us"] = (cpu_seconds(proc.proc.pid) - before) / max(result["requests"], 1) * 1e6
                        results[name].append(result)
        finally:
            for proc in procs.values():
                proc.stop()
    med = {name: median_of(runs) for name, runs in results.items()}
    report = Report(f"Warm HEAD /resolve of a cached file, {connections} connections, {rounds} rounds of {seconds} s")
    for name in procs:
        label = "mirror" if name == "mirror" else f"baseline ({baseline})"
        report.add(f"requests/s, {label}", med[name]["rps"], med["nginx"]["rps"], "req/s",
                   "nginx HEAD of the same file", failed=int(med[name]["failed"]),
                   rounds=[round(r["rps"]) for r in results[name]])
        report.add(f"p99 latency, {label}", med[name]["p99_ms"], med["nginx"]["p99_ms"], "ms", "nginx",
                   higher_is_better=False)
    if not baseline:
        report.add("CPU per request, mirror", med["mirror"]["cpu_us"], med["mirror"]["cpu_us"], "us", "itself",
                   higher_is_better=False, rounds=[round(r["cpu_us"], 1) for r in results["mirror"]])
    if baseline:
        report.add("requests/s, mirror against baseline", med["mirror"]["rps"], med["baseline"]["rps"], "req/s",
                   "baseline mirror", round_ratios=[round(o["rps"] / b["rps"], 3) for o, b in
                                                    zip(results["mirror"], results["baseline"], strict=True)])
        report.add("CPU per request, mirror against baseline", med["mirror"]["cpu_us"], med["baseline"]["cpu_us"],
                   "us", "baseline mirror", higher_is_better=False,
                   mirror_rounds=[round(r["cpu_us"], 1) for r in results["mirror"]],
                   baseline_rounds=[round(r["cpu_us"], 1) for r in results["baseline"]],
                   round_ratios=[round(b["cpu_us"] / o["cpu_us"], 3) for o, b in
                                 zip(results["mirror"], results["baseline"], strict=True)])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="seconds of ab per target and round")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--baseline", type=Path, help="another source tree whose mirror runs beside this one")
    parser.add_argument("--json")
    args = parser.parse_args()
    ensure_tools()
    report = run(args.rounds, args.seconds, args.connections, args.baseline)
    report.print()
    write_json(args.json, [report], {**machine(), "rounds": args.rounds, "seconds": args.seconds,
                                     "connections": args.connections, "baseline": str(args.baseline or "")})


if __name__ == "__main__":
    main()
